package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
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
