package kubeadmupdater_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/kubeadmupdater"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

var (
	env        *testenv.Environment
	k8s        client.Client
	kubeconfig []byte
	ctx        = context.Background()
	seq        atomic.Int64
)

func TestKubeadmUpdater(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "KubeadmUpdater on a real API server")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(GinkgoLogr)
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s = env.Client
	kubeconfig, err = env.Kubeconfig()
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// newUpdater is the KubeadmUpdater as main.go wires it, with a short poll: c reads and
// writes on the management cluster, live reads from the API server.
func newUpdater(c client.Client, live client.Reader) *kubeadmupdater.Updater {
	return &kubeadmupdater.Updater{
		Client:       c,
		Clusters:     &workloadcluster.Clients{Reader: live, Scheme: env.Scheme},
		NodeImage:    "ghcr.io/capi-inplace/capi-inplace:v0.0.0-test",
		PollInterval: 50 * time.Millisecond,
		Ledger:       &disruption.Ledger{Live: live, Client: c},
	}
}

// startManager starts a manager running the NodeUpdate reconciler with the KubeadmUpdater,
// watching only ns, and stops it when the test ends.
func startManager(ns string, tune func(*nodeupdater.Reconciler)) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	registry := nodeupdater.NewRegistry()
	Expect(registry.Register(newUpdater(mgr.GetClient(), mgr.GetAPIReader()).Registration())).To(Succeed())
	r := &nodeupdater.Reconciler{
		Registry:               registry,
		PollInterval:           50 * time.Millisecond,
		UpdaterRecheckInterval: 100 * time.Millisecond,
		RetryBaseDelay:         100 * time.Millisecond,
		RetryMaxDelay:          200 * time.Millisecond,
		MaxAttempts:            100,
	}
	if tune != nil {
		tune(r)
	}
	Expect(r.SetupWithManager(mgr, controller.Options{})).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		defer GinkgoRecover()
		done <- mgr.Start(mctx)
	}()
	DeferCleanup(func() {
		cancel()
		Eventually(done, 30*time.Second).Should(Receive(BeNil()))
	})
}

func newNamespace(prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, seq.Add(1))}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// createKubeconfigSecret creates CAPI's kubeconfig Secret of cluster, pointing at the
// test API server itself (the self-managed case).
func createKubeconfigSecret(ns, cluster string) {
	GinkgoHelper()
	Expect(k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cluster + "-kubeconfig", Namespace: ns},
		Data:       map[string][]byte{"value": kubeconfig},
	})).To(Succeed())
}
