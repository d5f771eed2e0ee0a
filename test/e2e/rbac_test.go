package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater/jobupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/manifests"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

const managerServiceAccount = "system:serviceaccount:capi-inplace-system:capi-inplace-manager"

// installRBAC creates, for real, the namespace, service account and RBAC that
// config/default renders.
func installRBAC() {
	GinkgoHelper()
	objs, err := manifests.Build(env.RepoRoot, "config/default")
	Expect(err).NotTo(HaveOccurred())
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			Expect(env.Client.Create(ctx, o)).To(Succeed(), "%s %s", o.GetKind(), o.GetName())
		}
	}
}

// impersonatingKubeconfig writes a kubeconfig whose requests the API server authorizes
// as the manager's service account (administrator credentials that impersonate it).
func impersonatingKubeconfig(path string) {
	GinkgoHelper()
	data, err := env.Kubeconfig()
	Expect(err).NotTo(HaveOccurred())
	cfg, err := clientcmd.Load(data)
	Expect(err).NotTo(HaveOccurred())
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = managerServiceAccount
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:capi-inplace-system", "system:authenticated"}
	}
	Expect(clientcmd.WriteToFile(*cfg, path)).To(Succeed())
}

// jobUpdaterWorkload makes this API server the workload cluster of Cluster cluster (its
// kubeconfig Secret), creates JobUpdater/nodes, and completes the Jobs it creates until
// the spec ends.
func jobUpdaterWorkload(ns, cluster string) {
	GinkgoHelper()
	admin, err := env.Kubeconfig()
	Expect(err).NotTo(HaveOccurred())
	Expect(env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: workloadcluster.KubeconfigSecretName(cluster), Namespace: ns},
		Data:       map[string][]byte{workloadcluster.KubeconfigSecretKey: admin},
	})).To(Succeed())
	Expect(env.Client.Create(ctx, &inplacev1.JobUpdater{
		ObjectMeta: metav1.ObjectMeta{Name: "nodes", Namespace: ns},
		Spec:       inplacev1.JobUpdaterSpec{Image: "registry.example/kubeadm-upgrader:v1", Namespace: "kube-system"},
	})).To(Succeed())
	stop := make(chan struct{})
	DeferCleanup(func() { close(stop) })
	go completeJobs(stop, "kube-system")
}

// completeJobs plays the Job controller of the workload cluster: every Job the JobUpdater
// creates in namespace succeeds after a moment.
func completeJobs(stop <-chan struct{}, namespace string) {
	defer GinkgoRecover()
	for {
		select {
		case <-stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
		jobs := &batchv1.JobList{}
		if err := env.Client.List(ctx, jobs, client.InNamespace(namespace), client.HasLabels{jobupdater.NodeUpdateUIDLabel}); err != nil {
			continue
		}
		for i := range jobs.Items {
			job := &jobs.Items[i]
			if len(job.Status.Conditions) > 0 {
				continue
			}
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur := &batchv1.Job{}
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), cur); err != nil {
					return err
				}
				now := metav1.Now()
				cur.Status.StartTime, cur.Status.CompletionTime, cur.Status.Succeeded = &now, &now, 1
				cur.Status.Conditions = []batchv1.JobCondition{
					{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
					{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
				}
				return env.Client.Status().Update(ctx, cur)
			})
		}
	}
}

var _ = Describe("The manager under its rendered RBAC", Ordered, func() {
	It("carries an ExternalUpgradeRequest through to completion as its service account, without a forbidden request", func() {
		installRBAC()
		kc := filepath.Join(workDir, "manager-sa.kubeconfig")
		impersonatingKubeconfig(kc)
		logFile := filepath.Join(workDir, "manager-rbac.log")
		proc, err := manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kc, CertDir: certs.Dir, LogFile: logFile,
			LeaderElect: true, LeaderElectionNamespace: "capi-inplace-system"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(proc.Stop()).To(Succeed()) })
		if err := proc.WaitReady(time.Minute); err != nil {
			log, _ := os.ReadFile(logFile)
			Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
		}

		// A cluster whose workload cluster is this API server, two workers, a JobUpdater.
		ns, err := fixtures.Namespace(ctx, env.Client, "rbac")
		Expect(err).NotTo(HaveOccurred())
		_, err = fixtures.Cluster(ctx, env.Client, ns, "kubeadm", "", map[string]string{inplacev1.UpdaterAnnotation: "JobUpdater/nodes"})
		Expect(err).NotTo(HaveOccurred())
		_, machines, err := fixtures.MachineDeployment(ctx, env.Client, ns, "kubeadm", "workers", "v1.35.2", 2)
		Expect(err).NotTo(HaveOccurred())
		jobUpdaterWorkload(ns, "kubeadm")

		hooks := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.ExternalHookPort), must(manager.ClientTLSConfig(certs.Dir)), externalCatalog())
		req := &hooksv1.ExternalUpgradeRequestRequest{
			MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
			NewMachineSpec:       hooksv1.NewMachineSpec{Version: "v1.36.3"},
		}
		req.Cluster.Name, req.Cluster.Namespace = "kubeadm", ns
		resp := &hooksv1.ExternalUpgradeRequestResponse{}
		Expect(hooks.Call(ctx, hooksv1.ExternalUpgradeRequest, "external-upgrade-request", req, resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)

		task := &inplacev1.UpgradeTask{}
		Eventually(func(g Gomega) inplacev1.TaskPhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: resp.UpgradeTaskName}, task)).To(Succeed())
			return task.Status.Phase
		}, 2*time.Minute, 250*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(task.Status.Progress).To(Equal("2/2"))
		for _, m := range machines {
			got := &clusterv1.Machine{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), got)).To(Succeed())
			cond := meta.FindStatusCondition(got.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
			Expect(cond).NotTo(BeNil(), "machine %s", m.Name)
			Expect(cond.Status).To(Equal(metav1.ConditionTrue))
			Expect(got.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, "v1.36.3"))
		}

		log, err := os.ReadFile(logFile)
		Expect(err).NotTo(HaveOccurred())
		for _, line := range strings.Split(string(log), "\n") {
			Expect(strings.ToLower(line)).NotTo(ContainSubstring("forbidden"), "the rendered RBAC lacks a permission the manager uses")
		}
	})
})

func must[T any](v T, err error) T {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	return v
}
