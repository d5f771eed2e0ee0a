package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// Where Rancher provisions RKE2, a node's RemoveRestartGuard takes the restart guard off
// right before its pre-drain hook is answered (fact 44). Aborted in between, the node
// must get its guard back: once the plan ends its hooks go, Rancher gives the node the
// release's plan without asking, and only the guard keeps rancher-system-agent from
// restarting RKE2 there (fact 12), outside any NodeUpdate.
var _ = Describe("Aborting a Rancher-provisioned node while its restart guard is being taken off", func() {
	It("puts the guard back before the abort ends, so that Rancher restarts nothing there once the plan's hooks are gone", func() {
		wl, c, planner := rancherRoute(500*time.Millisecond, nil)

		By("the etcd node, Rancher's first, runs up to RemoveRestartGuard")
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepRemoveRestartGuard) == inplacev1.StepStateRunning
		})).To(Succeed())

		By("aborted there, it ends only once the guard is back")
		abortUntilDone(c, nu)
		Expect(c.suc.Guarded(node)).To(BeTrue(), "node %s left without its restart guard", node)

		By("the plan deleted (allowed by its annotation), its hooks go and Rancher rolls on under the strategy it had: it restarts no RKE2")
		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		deleteRunningPlan(plan)
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}, 30*time.Second, 100*time.Millisecond).Should(BeTrue(), "the plan's finalizer gave back what it changed")
		Eventually(func(g Gomega) {
			g.Expect(localStrategy(wl)).NotTo(ContainSubstring("pre-drain"), "the plan's hooks are gone")
		}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
		Consistently(func() []sim.PlanApply {
			var restarts []sim.PlanApply
			for _, a := range planner.Restarts() {
				if a.To == rancherNewRKE2 {
					restarts = append(restarts, a)
				}
			}
			return restarts
		}, 3*time.Second, 100*time.Millisecond).Should(BeEmpty(), "an RKE2 restart after the NodeUpdate ended")
		expectRancherSettled(wl, c)
	})
})

// expectRancherSettled asserts that Rancher's roll of c's nodes is handed back settled:
// no node cordoned, no plan Secret in a drain that names our hooks (Rancher's
// machine-drain controller would wait at it for good, machinedrain.go OnChange), no tier
// waiting on a drain or an uncordon, the planner not paused by us, and every node either
// running the RKE2 that fleet-local/local declares or not yet given it.
func expectRancherSettled(wl *testenv.Environment, c *harvesterCluster) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		for _, name := range c.nodes {
			node := &corev1.Node{}
			g.Expect(wl.Client.Get(ctx, client.ObjectKey{Name: name}, node)).To(Succeed())
			g.Expect(node.Spec.Unschedulable).To(BeFalse(), "node %s left cordoned", name)
			secret, err := rancher.MachinePlan(ctx, wl.Client, node)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(secret).NotTo(BeNil())
			for _, key := range []string{sim.DrainOptionsAnnotation, sim.PreDrainAnnotation, sim.PostDrainAnnotation, sim.UnCordonAnnotation} {
				g.Expect(secret.Annotations).NotTo(HaveKey(key), "node %s's plan Secret left in a drain", name)
			}
		}
		pause, err := rancher.ReadPlannerPause(ctx, wl.Client)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pause.By).To(BeEmpty(), "Rancher's planner left paused by an UpgradePlan")
		cl := &provisioningv1.Cluster{}
		g.Expect(wl.Client.Get(ctx, rancher.LocalClusterKey, cl)).To(Succeed())
		for _, cond := range cl.Status.Conditions {
			if cond.Type == "Updated" {
				g.Expect(cond.Message).NotTo(Or(ContainSubstring("draining"), ContainSubstring("uncordoning")), "a tier waits on a drain nobody finishes")
			}
		}
	}).WithPolling(100 * time.Millisecond).Should(Succeed())
}
