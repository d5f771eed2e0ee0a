package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// A node is judged when it is picked, and may wait long after that (its cluster's
// UpgradePlan runs the cluster step first, which upgrades Longhorn). Harvester's pre-drain
// judges the volumes again right before each node is evacuated and drained
// (wait_longhorn_engines, harvester-release-steps.md fact 45).
var _ = Describe("A node's storage judged again right before it is taken down", func() {
	It("holds a node at its cordon while a Longhorn volume is degraded, touching nothing, and goes on once it is healthy", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		vol := "pvc-fresh-" + c.name
		createLonghornVolume(vol, "v1", c.nodes[0], c.nodes[1])
		DeferCleanup(func() { setRobustness(vol, "healthy") }) // the Longhorn of the shared workload cluster stays healthy for other specs
		setRobustness(vol, "degraded")
		startLifecycle(c)
		nu := c.nodeUpdate(c.nodes[0])

		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			g.Expect(nu.Status.CurrentStep).To(Equal(harvesteradapter.StepCordon))
			g.Expect(nodeupdater.Step(nu, harvesteradapter.StepCordon).Message).To(And(
				ContainSubstring("holding node "+c.nodes[0]+" before it is cordoned"),
				ContainSubstring(longhorn.CheckLonghornVolumesHealthy), ContainSubstring(vol)))
		}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
		Consistently(func(g Gomega) {
			node := &corev1.Node{}
			g.Expect(workload.Client.Get(ctx, client.ObjectKey{Name: c.nodes[0]}, node)).To(Succeed())
			g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned while the volume is degraded")
			g.Expect(c.rec.RunsOf(harvesteradapter.PlanName("rke2", nu))).To(BeEmpty())
		}, time.Second, 100*time.Millisecond).Should(Succeed())

		setRobustness(vol, "healthy")
		Eventually(func(g Gomega) inplacev1.NodeUpdatePhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			return nu.Status.Phase
		}, 60*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
	})
})

// setRobustness sets a Longhorn volume's status.robustness.
func setRobustness(name, robustness string) {
	GinkgoHelper()
	vol := &unstructured.Unstructured{}
	vol.SetAPIVersion("longhorn.io/v1beta2")
	vol.SetKind("Volume")
	Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: longhorn.Namespace, Name: name}, vol)).To(Succeed())
	Expect(unstructured.SetNestedField(vol.Object, robustness, "status", "robustness")).To(Succeed())
	Expect(workload.Client.Status().Update(ctx, vol)).To(Succeed())
}

// heldAtCordon waits until nu is held at its Cordon step with a message holding all of
// want, with status.lastCheckTime set, and checks for a second that its node stays
// uncordoned and no Plan of it ran.
func heldAtCordon(c *harvesterCluster, wl client.Client, nu *inplacev1.NodeUpdate, want ...string) {
	GinkgoHelper()
	matchers := make([]types.GomegaMatcher, 0, len(want))
	for _, w := range want {
		matchers = append(matchers, ContainSubstring(w))
	}
	Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		g.Expect(nu.Status.CurrentStep).To(Equal(harvesteradapter.StepCordon))
		g.Expect(nodeupdater.Step(nu, harvesteradapter.StepCordon).Message).To(And(matchers...))
		g.Expect(nu.Status.LastCheckTime).NotTo(BeNil(), "the NodeUpdate shows when it was judged")
	}, 60*time.Second, 50*time.Millisecond).Should(Succeed())
	Consistently(func(g Gomega) {
		node := &corev1.Node{}
		g.Expect(wl.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, node)).To(Succeed())
		g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned while held")
		g.Expect(c.rec.RunsOf(harvesteradapter.PlanName("rke2", nu))).To(BeEmpty())
	}, time.Second, 100*time.Millisecond).Should(Succeed())
}

func succeeded(nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Eventually(func(g Gomega) inplacev1.NodeUpdatePhase {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		return nu.Status.Phase
	}, 90*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
}

// The control plane's rules, judged when a node was picked (ControlPlaneQuorum and
// VersionSkew, docs/upgradetask.md), are judged again on the live nodes right before it
// is taken down (issue #34 point 2).
var _ = Describe("A node's control plane judged again right before it is taken down", func() {
	It("holds a control plane node while another control plane node is down, and a worker while a control plane node runs an older kubelet", func() {
		c := newHarvesterCluster(3, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		for _, n := range c.nodes[:2] {
			node := &corev1.Node{}
			Expect(workload.Client.Get(ctx, client.ObjectKey{Name: n}, node)).To(Succeed())
			patch := client.MergeFrom(node.DeepCopy())
			node.Labels["node-role.kubernetes.io/control-plane"], node.Labels["node-role.kubernetes.io/etcd"] = "true", "true"
			Expect(workload.Client.Patch(ctx, node, patch)).To(Succeed())
		}
		startLifecycle(c)

		By("the first control plane node waits while the second is cordoned by someone else")
		Expect(c.kubelet.SetUnschedulable(ctx, c.nodes[1], true)).To(Succeed())
		first := c.nodeUpdate(c.nodes[0])
		heldAtCordon(c, workload.Client, first, "holding control plane node "+c.nodes[0]+" before it is cordoned", "control plane node(s) "+c.nodes[1]+" are down", "quorum")
		Expect(c.kubelet.SetUnschedulable(ctx, c.nodes[1], false)).To(Succeed())
		succeeded(first)

		By("the worker waits while the second control plane node runs the older kubelet")
		worker := c.nodeUpdate(c.nodes[2])
		heldAtCordon(c, workload.Client, worker, "holding node "+c.nodes[2]+" before it is cordoned", "control plane node(s) "+c.nodes[1]+" (v1.34.3+rke2r3)", "version skew")
		Expect(c.kubelet.SetVersion(ctx, c.nodes[1], worker.Spec.Version, "")).To(Succeed())
		succeeded(worker)
	})
})

// Longhorn's own roll (its managers' DaemonSet, which the harvester chart renders) is
// waited for once in the cluster step; a chart deployed again since rolls the managers
// while nodes wait: the node waits for the roll before it is taken down (issue #34
// point 2).
var _ = Describe("Longhorn's roll settled right before a node is taken down", func() {
	It("holds a node while the longhorn-manager DaemonSet rolls out a new generation, and goes on once it has", func() {
		wl, err := testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(wl.Stop)
		const roll = 6 * time.Second
		startRancherAt(wl, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}, func(r *sim.Rancher) { r.LonghornRolloutDelay = roll })

		c := newHarvesterClusterOn(wl, 2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			plan := &harvesterv1.UpgradePlan{}
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
			return plan.Status.Phase
		}, 90*time.Second, 50*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanNodeUpgrading))

		By("the harvester chart deployed again: Longhorn's managers roll")
		ds := &appsv1.DaemonSet{}
		Expect(wl.Client.Get(ctx, clusterupgrade.LonghornManagerKey, ds)).To(Succeed())
		patch := client.MergeFrom(ds.DeepCopy())
		if ds.Spec.Template.Annotations == nil {
			ds.Spec.Template.Annotations = map[string]string{}
		}
		ds.Spec.Template.Annotations["test.capi-inplace.io/redeployed"] = "1"
		Expect(wl.Client.Patch(ctx, ds, patch)).To(Succeed())
		startLifecycle(c)
		nu := c.nodeUpdate(c.nodes[0])
		heldAtCordon(c, wl.Client, nu, "holding node "+c.nodes[0]+" before it is cordoned", "Longhorn's managers are rolling out", clusterupgrade.LonghornManagerKey.String())
		succeeded(nu)
	})
})
