// Package capie2e drives capi-inplace's Cluster API path with Cluster API's own
// controllers: core, KubeadmControlPlane, kubeadm bootstrap and CAPD's in-memory backend
// run as processes (test/capienv) against a real API server, the manager runs as a process
// registered through an ExtensionConfig, and a user's version bump on a ClusterClass
// Cluster is all that starts a rollout. The updater is the external updater simulator,
// acting on the in-memory workload Nodes (their readiness, and the kubelet version Cluster
// API v1.14 compares before it calls a machine up to date).
package capie2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env        *testenv.Environment
	capi       *capienv.Controllers
	workDir    string
	kubeconfig string
	managerBin string
	certs      *manager.ServingCerts
	mgr        *manager.Process
	// recorder stands between Cluster API and the manager: the ExtensionConfig names it.
	recorder *capienv.HookRecorder
	watcher  client.WithWatch
	nodes    *capienv.WorkloadNodes
	ctx      = context.Background()
	// failed: a spec failed, so the work directory (every process's log) is kept.
	failed bool
)

// updaterSetting names the updater of every cluster of the suite, through the
// ExtensionConfig's settings as an operator would: the simulator's kind.
const updaterSetting = "ExternalUpgrader/default"

func TestCAPIE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.RunWhole(t, "capi-inplace on Cluster API's own controllers")
}

var _ = BeforeSuite(func() {
	root, err := testenv.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	Expect(capienv.Built(root)).To(Succeed())

	workDir, err = os.MkdirTemp("", "capi-inplace-capie2e-")
	Expect(err).NotTo(HaveOccurred())
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	watcher, err = client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	kubeconfig = filepath.Join(workDir, "kubeconfig")
	Expect(env.WriteKubeconfig(kubeconfig)).To(Succeed())

	By("starting Cluster API's controllers (one set a machine at a time: CAPD's in-memory backend has fixed ports)")
	capi, err = capienv.Start(ctx, env, workDir, 20*time.Minute)
	Expect(err).NotTo(HaveOccurred())

	By("starting the manager and registering it with Cluster API")
	managerBin, err = manager.Build(ctx, env.RepoRoot, workDir)
	Expect(err).NotTo(HaveOccurred())
	certs, err = manager.NewServingCerts(filepath.Join(workDir, "manager-certs"))
	Expect(err).NotTo(HaveOccurred())
	startManager()
	recorder, err = capienv.NewHookRecorder(certs.Dir, certs.CAPEM, fmt.Sprintf("https://127.0.0.1:%d", mgr.WebhookPort),
		capi.ExtensionClientAuth())
	Expect(err).NotTo(HaveOccurred())
	Expect(capienv.RegisterExtension(ctx, env.Client, "capi-inplace", recorder.URL, certs.CAPEM,
		map[string]string{extension.DefaultUpdaterSetting: updaterSetting})).To(Succeed())
	nodes = capienv.NewWorkloadNodes(env.Client, env.Scheme)
})

// startManager starts the manager, with short poll intervals (and so one-second
// UpdateMachine retries) for in-memory nodes that upgrade in a second, and points the
// recorder at it.
func startManager() {
	logFile := filepath.Join(workDir, "manager.log")
	var err error
	mgr, err = manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kubeconfig, CertDir: certs.Dir, LogFile: logFile,
		ExtraArgs: []string{"--poll-interval=500ms",
			// The hooks require the client certificates Cluster API's core and KCP present.
			"--hook-client-ca=" + capi.ExtensionClientCA()}})
	Expect(err).NotTo(HaveOccurred())
	if err := mgr.WaitReady(time.Minute); err != nil {
		log, _ := os.ReadFile(logFile)
		Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
	}
	if recorder != nil {
		Expect(recorder.SetTarget(fmt.Sprintf("https://127.0.0.1:%d", mgr.WebhookPort))).To(Succeed())
	}
}

var _ = ReportAfterEach(func(report SpecReport) {
	if report.Failed() {
		failed = true
	}
	if report.Failed() && capi != nil {
		AddReportEntry("Cluster API controllers' logs (last lines; whole logs in "+workDir+")", capi.Logs(80))
		log, _ := os.ReadFile(filepath.Join(workDir, "manager.log"))
		AddReportEntry("manager log (last 16 KiB)", tail(log, 16<<10))
	}
})

var _ = AfterSuite(func() {
	defer func() {
		if workDir != "" && !failed {
			_ = os.RemoveAll(workDir)
		}
	}()
	if mgr != nil {
		_ = mgr.Stop()
	}
	if recorder != nil {
		_ = recorder.Close()
	}
	if capi != nil {
		Expect(capi.Stop()).To(Succeed())
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
