package harvesteradapter_test

import (
	"context"
	"fmt"
	"regexp"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/rancher/wrangler/v3/pkg/name"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

var _ = Describe("An UpgradePlan whose cluster upgrade Job fails", func() {
	It("fails with the Job's pod's own words first, then the Job and its reason, and keeps the pod's words in a ConfigMap its cleanup leaves", func() {
		// A workload API server of its own: the suite's runs every cluster upgrade Job with
		// Rancher's installer image as it is, and this one's image is broken.
		wl, err := testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(wl.Stop)
		// Rancher's installer image holds neither helm nor Rancher's chart: the real
		// program fails at its Rancher step with its own words, as on a cluster whose
		// images.rancherInstaller names a wrong image.
		emptyInstaller := GinkgoT().TempDir()
		jobs := startRancherWithJobs(wl, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}, func(j *sim.ClusterUpgradeJobs) {
			j.RancherInstallers = func(string) (string, bool) { return emptyInstaller, true }
		})
		addr, err := sim.NonLoopbackIPv4()
		Expect(err).NotTo(HaveOccurred())
		c := newClusterWith(wl, true, 1, "Harvester v1.7.1", nil, func(s *sim.SUC) {
			// The nodes' kubelets serve the logs of the pods the simulators left, behind
			// the API server's pods/log.
			s.Kubelet.ServeAddress = addr
			s.Kubelet.Logs = func(namespace, pod, container string) (string, bool) {
				if log, ok := jobs.PodLog(namespace, pod, container); ok {
					return log, true
				}
				return s.PodLog(namespace, pod, container)
			}
		})
		DeferCleanup(c.kubelet.Close)
		Expect(c.kubelet.StartServing(ctx, c.nodes[0])).To(Succeed())

		plan := &harvesterv1.UpgradePlan{}
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
			return plan.Status.Phase
		}).WithTimeout(2*time.Minute).WithPolling(100*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanFailed), func() string { return plan.Status.Message })

		job := clusterupgrade.JobName(plan.Name)
		ended, ok := jobs.Ended(repository.Namespace, job)
		Expect(ok).To(BeTrue(), "the cluster upgrade Job ran")
		Expect(ended).To(HavePrefix("capi-inplace node cluster-upgrade: failed: cluster upgrade step %s: no helm in ", clusterupgrade.StepUpgradeRancher), "the program's termination message")
		logs := name.SafeConcatName(plan.Name, "job-logs")
		Expect(plan.Status.Message).To(MatchRegexp(`^ClusterUpgradeFailed: %s \(container apply of pod %s-\w+ exited with code 1\); the cluster upgrade Job %s/%s failed: BackoffLimitExceeded: Job has reached the specified backoff limit; its pod's termination message and log are kept in ConfigMap %s/%s; delete the UpgradePlan to start again$`,
			regexp.QuoteMeta(ended), regexp.QuoteMeta(job), repository.Namespace, regexp.QuoteMeta(job), repository.Namespace, regexp.QuoteMeta(logs)),
			"the pod's own words first, then where they come from, the Job and the Job controller's reason, and where they are kept")
		Expect(meta.FindStatusCondition(plan.Status.Conditions, harvesterv1.UpgradePlanDegraded)).To(HaveField("Message", plan.Status.Message))

		// The failed plan's cleanup deleted the Job (and a real cluster's garbage collector
		// its pod with it); the plan deleted as its message says, its finalizer cleans up
		// again. The ConfigMap with the pod's words stays through both.
		Eventually(func() bool {
			return apierrors.IsNotFound(wl.Client.Get(ctx, client.ObjectKey{Namespace: repository.Namespace, Name: job}, &batchv1.Job{}))
		}).WithTimeout(30*time.Second).Should(BeTrue(), "the failed plan's cleanup deletes its Job")
		Expect(env.Client.Delete(ctx, plan)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}).WithTimeout(30*time.Second).Should(BeTrue(), "the plan's finalizer has cleaned up")
		cm := &corev1.ConfigMap{}
		Expect(wl.Client.Get(ctx, client.ObjectKey{Namespace: repository.Namespace, Name: logs}, cm)).To(Succeed())
		Expect(cm.Labels).NotTo(HaveKey(upgradeplan.LabelUpgradePlan), "not the plan's label: cleanup deletes what carries it")
		Expect(cm.Annotations).To(HaveKeyWithValue(upgradeplan.LabelUpgradePlan, plan.Name))
		Expect(cm.Data).To(HaveKeyWithValue(job+".apply.termination-message", ended))
		Expect(cm.Data).To(HaveKeyWithValue(job+".apply.failure", MatchRegexp(`^Job %s/%s failed: BackoffLimitExceeded: Job has reached the specified backoff limit; container apply of pod %s-\w+ exited with code 1$`,
			repository.Namespace, regexp.QuoteMeta(job), regexp.QuoteMeta(job))))
		// The log, read through pods/log from the node's kubelet: the program's progress,
		// then its error, which the termination message alone does not show.
		Expect(cm.Data).To(HaveKeyWithValue(job+".apply.log", And(
			ContainSubstring(clusterupgrade.StepUpgradeRancher+": started"),
			ContainSubstring(clusterupgrade.StepUpgradeRancher+": failed: no helm in "),
			HaveSuffix(ended))))
	})
})

// startRancherWithJobs is startRancherAt without Rancher's simulator changed, running the
// cluster upgrade Jobs with a simulator changed by mutate, which it returns.
func startRancherWithJobs(wl *testenv.Environment, release sim.HarvesterRelease, mutate func(*sim.ClusterUpgradeJobs)) *sim.ClusterUpgradeJobs {
	GinkgoHelper()
	Expect(sim.Seed(ctx, wl.Client, release)).To(Succeed())
	rctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	cache, err := wl.StartCache(rctx)
	Expect(err).NotTo(HaveOccurred())
	(&sim.Rancher{Client: wl.Client, Cache: cache, ChartDelay: 50 * time.Millisecond, DownloadDelay: 20 * time.Millisecond, RolloutDelay: 20 * time.Millisecond}).Start(rctx)
	jobs := &sim.ClusterUpgradeJobs{Client: wl.Client, Kubeconfig: wl.Kubeconfig, Cache: cache}
	mutate(jobs)
	jobs.Start(rctx)
	simCaches[wl] = cache
	DeferCleanup(func() { delete(simCaches, wl) })
	return jobs
}

var _ = Describe("An UpgradePlan on a cluster whose RKE2 certificates expire soon", func() {
	It("fails at its image preload, before anything of the cluster or a node is touched, with the node program's words: the node, the certificate and what to run", func() {
		var bad string
		c := newHarvesterCluster(2, "Harvester v1.7.1", nil, func(s *sim.SUC) {
			// kube-controller-manager's own serving certificate on the second node, which
			// RKE2 before v1.27 never renews (rancher/rancher#41125), expires in three days.
			bad = fmt.Sprintf("hv%d-node-2", clusterSeq)
			s.SetRKE2Certificates(bad, nodeprogram.ExpiringCertificate{
				Path:    "/var/lib/rancher/rke2/server/tls/kube-controller-manager/kube-controller-manager.crt",
				Subject: "CN=kube-controller-manager", NotAfter: time.Now().AddDate(0, 0, 3),
			})
		})
		Expect(c.nodes).To(ContainElement(bad))
		plan := &harvesterv1.UpgradePlan{}
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
			return plan.Status.Phase
		}).WithTimeout(2*time.Minute).WithPolling(100*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanFailed), func() string { return plan.Status.Message })
		Expect(plan.Status.Message).To(And(
			ContainSubstring("RKE2's certificates on this node expire within 7 days: /var/lib/rancher/rke2/server/tls/kube-controller-manager/kube-controller-manager.crt (CN=kube-controller-manager) expires at "),
			ContainSubstring("rke2 certificate rotate"), ContainSubstring("rancher/rancher#41125"),
			ContainSubstring(upgradeplan.ObjectName("preload", plan))), "the node program's words, and the preload Plan they come from")
		Expect(plan.Status.Message).To(ContainSubstring(bad), "the node named")
		Expect(meta.FindStatusCondition(plan.Status.Conditions, harvesterv1.UpgradePlanDegraded)).To(HaveField("Message", plan.Status.Message))
		for _, n := range c.nodes {
			Expect(unschedulable(n)).To(BeFalse(), "node %s cordoned", n)
		}
		Expect(c.rec.MaxDown()).To(BeZero(), "no node went down")
	})
})

var _ = Describe("An UpgradePlan deleted while its cluster upgrade Job's pod runs", func() {
	It("is gone only once the Job's pod has stopped, and the Job with it: nothing of the cluster upgrade runs after the plan gave back what it changed", func() {
		wl, err := testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(wl.Stop)
		// The pod's run lasts (as a real Rancher upgrade does), and its container goes on
		// for a while after its Job is deleted: the garbage collector's and the kubelet's
		// time to stop it.
		const terminationDelay = 4 * time.Second
		jobs := startRancherWithJobs(wl, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}, func(j *sim.ClusterUpgradeJobs) {
			j.MinDuration = 5 * time.Minute
			j.TerminationDelay = terminationDelay
		})
		c := newClusterWith(wl, true, 1, "Harvester v1.7.1", nil)
		job := client.ObjectKey{Namespace: repository.Namespace, Name: clusterupgrade.JobName(c.plan.Name)}
		Eventually(func(g Gomega) int32 {
			j := &batchv1.Job{}
			g.Expect(wl.Client.Get(ctx, job, j)).To(Succeed())
			return j.Status.Active
		}).WithTimeout(2*time.Minute).WithPolling(100*time.Millisecond).Should(BeEquivalentTo(1), "the cluster upgrade Job's pod runs")

		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
		Expect(plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanClusterUpgrading))
		patch := client.MergeFrom(plan.DeepCopy())
		if plan.Annotations == nil {
			plan.Annotations = map[string]string{}
		}
		plan.Annotations[upgradeplan.AnnotationAllowDeletion] = "true"
		Expect(env.Client.Patch(ctx, plan, patch)).To(Succeed())
		deleted := time.Now()
		Expect(env.Client.Delete(ctx, plan)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).Should(BeTrue(), "the plan's finalizer has cleaned up")
		ended, ok := jobs.Ended(job.Namespace, job.Name)
		Expect(ok).To(BeTrue(), "the plan went %s after its deletion while the cluster upgrade's pod still ran", time.Since(deleted).Round(time.Millisecond))
		Expect(ended).To(Equal(sim.StoppedMessage))
		Expect(apierrors.IsNotFound(wl.Client.Get(ctx, job, &batchv1.Job{}))).To(BeTrue(), "the Job went with its pod")
	})
})
