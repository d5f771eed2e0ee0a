package sim_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

var _ = Describe("The Rancher planner simulator with rancher-system-agent stopped on a node", func() {
	It("delivers the plan, which nothing applies, fails or restarts while the agent is stopped; Rancher waits for it to be applied; started again, the agent applies it", func() {
		c := newPlannerCluster(1, 0, nil)
		node := c.node("m", 1)
		c.planner.StopAgent(node)
		updateLocalCluster(func(cl *provisioningv1.Cluster) { cl.Spec.KubernetesVersion = newRKE2 })
		Eventually(func() rancher.DeliveredPlan { return rancher.ReadDeliveredPlan(c.secret(node)) }).WithPolling(20*time.Millisecond).
			Should(Equal(rancher.DeliveredPlan{Version: newRKE2}), "the planner delivers the plan (no drain: no strategy)")
		Consistently(func(g Gomega) {
			s := c.secret(node)
			g.Expect(rancher.ReadDeliveredPlan(s).Applied).To(BeFalse(), "a stopped agent applied the plan")
			g.Expect(s.Data).NotTo(HaveKey(sim.FailureCountKey), "a stopped agent counts no failure")
		}, time.Second, 50*time.Millisecond).Should(Succeed())
		Expect(c.planner.Applies()).To(BeEmpty(), "nothing ran the install")
		Expect(c.kubeletVersion(node)).To(Equal(oldRKE2))
		Expect(c.updated()).To(ContainSubstring(sim.WaitingPlanMessage), "Rancher waits for the plan to be applied (store.go getPlanStatusReasonMessage)")

		By("started again, the agent applies the plan and RKE2 restarts at the declared version")
		c.planner.StartAgent(node)
		Eventually(func() rancher.DeliveredPlan { return rancher.ReadDeliveredPlan(c.secret(node)) }).WithPolling(20 * time.Millisecond).
			Should(Equal(rancher.DeliveredPlan{Version: newRKE2, Applied: true}))
		Eventually(func() string { return c.kubeletVersion(node) }).WithPolling(20 * time.Millisecond).Should(Equal(newRKE2))
		Expect(c.planner.Restarts()).To(HaveLen(1))
	})
})
