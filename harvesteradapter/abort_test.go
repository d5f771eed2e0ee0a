package harvesteradapter_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// abortUntilDone calls Abort the way the NodeUpdate reconciler does, until it is done.
func abortUntilDone(c *harvesterCluster, nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Eventually(func() bool {
		done, err := c.updater.Abort(ctx, nu)
		Expect(err).NotTo(HaveOccurred())
		return done
	}).WithPolling(50 * time.Millisecond).Should(BeTrue())
}

// expectNoPlanOf asserts that no Plan of the NodeUpdate is left, by its label or by the
// names the updater gives its Plans.
func expectNoPlanOf(nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Expect(plansOf(nu)).To(BeEmpty())
	for _, kind := range []string{"preload", "drain", "rke2", "os"} {
		err := workload.Client.Get(ctx, client.ObjectKey{Namespace: "cattle-system", Name: harvesteradapter.PlanName(kind, nu)}, &sucv1.Plan{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Plan %s: %v", kind, err)
	}
}

func unschedulable(node string) bool {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	return n.Spec.Unschedulable
}

var _ = Describe("Aborting a node that failed", func() {
	It("after a failed SUC Job removes every Plan of the NodeUpdate and uncordons the node SUC left cordoned", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		c.suc.FailNode(harvesteradapter.PlanName("rke2", nu), node, "rke2 failed to start: etcd member not healthy")
		err := drive(c.updater, nu, 90*time.Second)
		perm, ok := nodeupdater.AsPermanent(err)
		Expect(ok).To(BeTrue(), "%v", err)
		Expect(perm.Reason).To(Equal("PlanJobFailed"))
		Expect(plansOf(nu)).To(HaveLen(2), "the drain Plan that succeeded and the RKE2 Plan whose Job failed (the UpgradePlan preloaded the node)")
		Expect(unschedulable(node)).To(BeTrue(), "the updater's cordon stays until the abort")

		abortUntilDone(c, nu)
		expectNoPlanOf(nu)
		Expect(unschedulable(node)).To(BeFalse())
		n := &corev1.Node{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Annotations).NotTo(HaveKey(harvesteradapter.AnnotationCordonedBy), "the record of the cordon goes with it")
	})

	It("whose node is gone still removes every Plan of the NodeUpdate", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		reconcileUntilPlan(c, nu)
		Expect(workload.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})).To(Succeed())

		abortUntilDone(c, nu)
		expectNoPlanOf(nu)
	})

	It("before any step that cordons keeps a cordon someone else set meanwhile", func() {
		// v1.6.1 -> v1.8.1 skips a minor: the UpgradePlan fails before any step of the node.
		c := newHarvesterCluster(1, "Harvester v1.6.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.PreloadImages = ptr.To(false) })
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		Expect(c.kubelet.SetUnschedulable(ctx, node, true)).To(Succeed(), "an operator cordons the node for work of their own")
		Expect(drive(c.updater, nu, 10*time.Second)).To(MatchError(ContainSubstring("UnsupportedHop: Harvester v1.6.1 -> v1.8.1")))
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStatePending))

		abortUntilDone(c, nu)
		Expect(unschedulable(node)).To(BeTrue(), "the updater never cordoned the node, so it does not uncordon it")
	})
})

// The OS step's reboot is armed on the host by the os-upgrade Job, which completes
// before the host goes down (harvester-node-upgrade.md fact 28; test/sim hostreboot.go).
// An abort at any point of the step must not end the NodeUpdate while that reboot is
// still to come or under way: once the NodeUpdate is final, its node is counted up, is
// uncordoned and its VMs may come back.
var _ = Describe("Aborting a node during its OS step", func() {
	rebootArmed := func(c *harvesterCluster, _ *inplacev1.NodeUpdate, node string) bool {
		return c.suc.RebootArmed(node) && len(c.rec.Reboots(node)) == 0
	}
	const window = 2 * time.Second
	osWork := func(plan *sucv1.Plan) time.Duration {
		if sim.DefaultOSImage(plan) != "" {
			return window
		}
		return 100 * time.Millisecond
	}
	DescribeTable("ends only after the reboot the OS Job armed is over",
		func(point func(c *harvesterCluster, nu *inplacev1.NodeUpdate, node string) bool, deleteConfig bool) {
			c := newHarvesterCluster(1, "Harvester v1.7.1", nil, func(s *sim.SUC) {
				s.Work, s.RebootDelay, s.RebootDuration = osWork, window, window
			})
			node := c.nodes[0]
			nu := c.nodeUpdate(node)
			Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
				return nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade) == inplacev1.StepStateRunning
			})).To(Succeed())
			Eventually(func() bool { return point(c, nu, node) }, 30*time.Second, 10*time.Millisecond).Should(BeTrue())
			if deleteConfig {
				// The abort works from the configuration the node recorded when it started.
				Expect(env.Client.Delete(ctx, c.config)).To(Succeed())
			}

			abortUntilDone(c, nu)
			Expect(c.suc.RebootArmed(node)).To(BeFalse(), "the abort ended while a reboot was still armed on the node's host")
			reboots := c.rec.Reboots(node)
			Expect(reboots).To(HaveLen(1))
			Expect(reboots[0].End).NotTo(BeZero(), "the abort ended while the node was still down in its reboot")
			Consistently(func() []sim.Reboot { return c.rec.Reboots(node) }, window+time.Second, 100*time.Millisecond).Should(HaveLen(1))
			Expect(unschedulable(node)).To(BeFalse())
			expectNoPlanOf(nu)
		},
		Entry("while the OS Job runs", func(c *harvesterCluster, nu *inplacev1.NodeUpdate, node string) bool {
			for _, run := range c.rec.Runs() {
				if run.Plan == harvesteradapter.PlanName("os", nu) && run.End.IsZero() {
					return true
				}
			}
			return false
		}, false),
		Entry("after the OS Job completed, before the reboot", rebootArmed, false),
		Entry("after the OS Job completed, before the reboot, with the HarvesterUpgrader deleted meanwhile", rebootArmed, true),
		Entry("while the node is down in its reboot", func(c *harvesterCluster, _ *inplacev1.NodeUpdate, node string) bool {
			reboots := c.rec.Reboots(node)
			return len(reboots) == 1 && reboots[0].End.IsZero()
		}, false),
	)

	It("ends, once it waited RebootWait for an armed reboot that never comes, with the node held cordoned and why on it; uncordoned by the operator, a next NodeUpdate schedules the reboot again and finishes the node", func() {
		// Two nodes: a single-node cluster's update cordons nothing (its VMs are stopped).
		c := newHarvesterCluster(2, "Harvester v1.7.1", nil)
		c.updater.RebootWait = 2 * time.Second
		node := c.nodes[0]
		c.suc.LoseReboot(node) // its timer lost: harvester#6022, #7457
		nu := c.nodeUpdate(node)
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade) == inplacev1.StepStateRunning && rebootArmed(c, nu, node)
		})).To(Succeed())

		By("ended: held while it waits for the reboot, then ended with the node held")
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		nu.Status.AbortStartTime = &metav1.MicroTime{Time: time.Now()}
		Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
		Consistently(func() bool {
			done, err := c.updater.Abort(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			return done
		}, time.Second, 100*time.Millisecond).Should(BeFalse(), "the ending did not wait for the armed reboot")
		abortUntilDone(c, nu)
		Expect(c.rec.Reboots(node)).To(BeEmpty())
		n := &corev1.Node{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Spec.Unschedulable).To(BeTrue(), "a node whose armed reboot may still come was uncordoned")
		Expect(n.Annotations).NotTo(HaveKey(harvesteradapter.AnnotationCordonedBy), "the cordon is left as the ended update's")
		Expect(n.Annotations[harvesteradapter.AnnotationHeld]).To(And(
			ContainSubstring("the reboot that NodeUpdate "+nu.Name+"'s OS upgrade armed on node "+node+" has not come within 2s"),
			ContainSubstring("kubectl uncordon "+node)))
		expectNoPlanOf(nu)
		nu.Status.Phase = inplacev1.NodeUpdatePhaseFailed
		Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())

		By("a next NodeUpdate holds at the cordon, naming why, until the operator uncordons the node; then it finishes, the reboot scheduled again")
		next := renewNodeUpdate(c, nu)
		Expect(driveUntil(c.updater, next, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return strings.Contains(stepMessage(nu, harvesteradapter.StepCordon), "is held cordoned by an earlier update: the reboot that NodeUpdate")
		})).To(Succeed())
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		patch := client.MergeFrom(n.DeepCopy())
		n.Spec.Unschedulable = false
		Expect(workload.Client.Patch(ctx, n, patch)).To(Succeed())
		Expect(drive(c.updater, next, 60*time.Second)).To(Succeed())
		reboots := c.rec.Reboots(node)
		Expect(reboots).To(HaveLen(1), "the next update's OS Job scheduled the lost reboot again")
		Expect(reboots[0].End).NotTo(BeZero())
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Status.NodeInfo.OSImage).To(Equal("Harvester v1.8.1"))
		Expect(n.Annotations).NotTo(HaveKey(harvesteradapter.AnnotationHeld), "the hold the operator lifted is still named")
		Expect(n.Spec.Unschedulable).To(BeFalse())
	})
})
