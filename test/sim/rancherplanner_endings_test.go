package sim_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// What Rancher does when a roll behind drain hooks ends early: the unhappy paths the
// product must settle (issue #52), each after Rancher v2.14.4's code.
var _ = Describe("The Rancher planner simulator when a roll behind hooks ends early", func() {
	It("keeps a node in the drain its options name after the strategy lost the hooks: cordoned, its tier waiting, until both hooks are answered", func() {
		c := newPlannerCluster(2, 0, nil)
		first, second := c.node("m", 1), c.node("m", 2)
		c.guard(first)
		c.guard(second)
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.UpgradeStrategy = harvesterStrategy()
		})
		Eventually(func() string { return c.secret(first).Annotations[sim.PreDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())

		By("the strategy loses its hooks: the planner's drain short-circuits and delivers the plan (drain.go), the guarded agent installs it without a restart")
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.RKEConfig.UpgradeStrategy = provisioningv1.ClusterUpgradeStrategy{}
		})
		Eventually(func() rancher.DeliveredPlan { return rancher.ReadDeliveredPlan(c.secret(first)) }).WithPolling(20 * time.Millisecond).
			Should(Equal(rancher.DeliveredPlan{Version: newRKE2, Applied: true}))
		Expect(c.kubelet.InstalledRKE2(first)).To(Equal(newRKE2), "run.sh installs the binaries before it exits on INSTALL_RKE2_SKIP_ENABLE")
		Expect(c.kubeletVersion(first)).To(Equal(oldRKE2))
		Expect(c.planner.Restarts()).To(BeEmpty())

		By("the machine-drain controller stays in drain() while drain-done differs from drain-options (machinedrain.go OnChange): the node stays cordoned, the etcd tier waits for its uncordon")
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(ContainSubstring("uncordoning etcd node(s)"))
		Consistently(func() bool { return c.getNode(first).Spec.Unschedulable }, 500*time.Millisecond, 50*time.Millisecond).Should(BeTrue())
		Expect(c.secret(second).Annotations).NotTo(HaveKey(sim.DrainOptionsAnnotation))
		Expect(rancher.ReadDeliveredPlan(c.secret(second)).Version).To(Equal(oldRKE2), "the tier holds the next node")

		By("both hooks answered, it finishes: drain-done, then the post-drain request and the uncordon")
		c.answer(first, sim.PreDrainAnnotation, preHook)
		Eventually(func() string { return c.secret(first).Annotations[sim.PostDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		c.answer(first, sim.PostDrainAnnotation, postHok)
		Eventually(func() bool { return c.getNode(first).Spec.Unschedulable }).WithPolling(20 * time.Millisecond).Should(BeFalse())

		By("the next node's plan is installed under its guard, and the cluster waits for the kubelets (fact 61)")
		Eventually(func() string { return c.kubelet.InstalledRKE2(second) }).WithPolling(20 * time.Millisecond).Should(Equal(newRKE2))
		// Two machines wait, so Rancher names them without a detail (messages.go
		// detailedMessage): both wait for their kubelet.
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal(
			"Unknown: configuring etcd node(s) " + sim.MachineName(first) + "," + sim.MachineName(second)))

		By("a reboot starts the installed RKE2")
		Expect(c.kubelet.Rebooted(ctx, first, "")).To(Succeed())
		Expect(c.kubeletVersion(first)).To(Equal(newRKE2))
		Expect(c.kubelet.InstalledRKE2(first)).To(BeEmpty())
		Expect(c.planner.Restarts()).To(BeEmpty())
	})

	It("starts no drain and delivers no plan while its control plane is paused; the machine-drain controller still finishes an answered hook", func() {
		c := newPlannerCluster(1, 1, nil)
		node := c.node("m", 1)
		_, err := rancher.PausePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = rancher.ResumePlanner(ctx, env.Client, "spec") })
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.UpgradeStrategy = harvesterStrategy()
		})
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("Unknown: " + sim.PausedMessage))
		Consistently(func() map[string]string { return c.secret(node).Annotations }, 500*time.Millisecond, 50*time.Millisecond).ShouldNot(HaveKey(sim.DrainOptionsAnnotation))
		Expect(c.getNode(node).Spec.Unschedulable).To(BeFalse())

		By("resumed, the planner takes the node; paused again once it asks for the pre-drain hook")
		_, err = rancher.ResumePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() string { return c.secret(node).Annotations[sim.PreDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		_, err = rancher.PausePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("Unknown: " + sim.PausedMessage))
		c.answer(node, sim.PreDrainAnnotation, preHook)
		Eventually(func() map[string]string { return c.secret(node).Annotations }).WithPolling(20 * time.Millisecond).Should(HaveKey(sim.DrainOptionsAnnotation))
		Eventually(func() bool {
			a := c.secret(node).Annotations
			return a[sim.DrainDoneAnnotation] == a[sim.DrainOptionsAnnotation]
		}).WithPolling(20*time.Millisecond).Should(BeTrue(), "the machine-drain controller is not the planner: it finishes the drain")
		Consistently(func() string { return rancher.ReadDeliveredPlan(c.secret(node)).Version }, 500*time.Millisecond, 50*time.Millisecond).Should(Equal(oldRKE2), "the paused planner delivers nothing")

		By("resumed, the plan is delivered and RKE2 restarts inside the hooks")
		_, err = rancher.ResumePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() string { return c.kubeletVersion(node) }).WithPolling(20 * time.Millisecond).Should(Equal(newRKE2))
		Expect(c.planner.UnguardedRestartsOutsideDrain()).To(BeEmpty())
	})

	It("is let go by no resume while its RKEControlPlane lags fleet-local/local's strategy, which it would roll with: the pause stays, saying so, until Rancher copied it", func() {
		c := newPlannerCluster(2, 0, func(p *sim.RancherPlanner) { p.CopyDelay = 1500 * time.Millisecond })
		updateLocalCluster(func(cl *provisioningv1.Cluster) { cl.Spec.RKEConfig.UpgradeStrategy = harvesterStrategy() })
		Eventually(func() string {
			p, err := rancher.ReadPlannerPause(ctx, env.Client)
			Expect(err).NotTo(HaveOccurred())
			return p.Unsynced
		}).WithPolling(20*time.Millisecond).Should(BeEmpty(), "Rancher copies the hooks into the RKEControlPlane")
		_, err := rancher.PausePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = rancher.ResumePlanner(ctx, env.Client, "spec") })

		By("the strategy given back while paused: neither resume lifts the pause before the copy")
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.UpgradeStrategy = provisioningv1.ClusterUpgradeStrategy{}
		})
		seen, err := rancher.ReadPlannerPause(ctx, env.Client)
		Expect(err).NotTo(HaveOccurred())
		Expect(seen.Unsynced).To(And(ContainSubstring("kubernetesVersion "+oldRKE2), ContainSubstring("upgradeStrategy"), ContainSubstring("has not copied")))
		lifted, err := rancher.ResumeSeenPlanner(ctx, env.Client, "spec", seen)
		Expect(err).NotTo(HaveOccurred())
		Expect(lifted).To(BeFalse(), "a pause seen with the RKEControlPlane behind was lifted")
		after, err := rancher.ResumePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		Expect(after.Paused).To(BeTrue(), "ResumePlanner lifted the pause before the copy")
		Expect(after.Unsynced).NotTo(BeEmpty())

		By("copied: the resume lifts it, and the planner rolls with the strategy given back, no hook asked")
		Eventually(func() bool {
			p, err := rancher.ResumePlanner(ctx, env.Client, "spec")
			Expect(err).NotTo(HaveOccurred())
			return p.Paused
		}).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(BeFalse())
		Eventually(c.updated).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		for _, e := range c.planner.HookEvents() {
			Expect(e.Kind).NotTo(Equal(sim.PreDrainAnnotation), "the planner asked node %s for a hook of the strategy given back", e.Node)
		}
	})

	It("uncordons a node whose post-drain hook is answered while it is paused (the uncordon was asked before the hook), and takes the next node only once resumed; a resume decided from a pause read before a hold lifts nothing", func() {
		c := newPlannerCluster(2, 0, nil)
		first, second := c.node("m", 1), c.node("m", 2)
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.UpgradeStrategy = harvesterStrategy()
		})
		Eventually(func() string { return c.secret(first).Annotations[sim.PreDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		c.answer(first, sim.PreDrainAnnotation, preHook)
		Eventually(func() string { return c.secret(first).Annotations[sim.PostDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		Expect(c.secret(first).Annotations).To(HaveKey(sim.UnCordonAnnotation), "the planner asks for the uncordon before the machine-drain controller asks for the post-drain hook (machinedrain.go unDrain)")

		By("held, as a NodeUpdate holds it before answering: a resume from the pause read before the hold is refused")
		_, err := rancher.PausePlanner(ctx, env.Client, "spec")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = rancher.ResumePlanner(ctx, env.Client, "spec") })
		seen, err := rancher.ReadPlannerPause(ctx, env.Client)
		Expect(err).NotTo(HaveOccurred())
		Expect(seen.By).To(Equal("spec"))
		_, err = rancher.HoldPlanner(ctx, env.Client, "spec", "post-drain hook of node "+first+" answered")
		Expect(err).NotTo(HaveOccurred())
		lifted, err := rancher.ResumeSeenPlanner(ctx, env.Client, "spec", seen)
		Expect(err).NotTo(HaveOccurred())
		Expect(lifted).To(BeFalse(), "a pause written since it was read was lifted")
		pause, err := rancher.ReadPlannerPause(ctx, env.Client)
		Expect(err).NotTo(HaveOccurred())
		Expect(pause.Paused).To(BeTrue())

		By("the post-drain hook answered while paused: the machine-drain controller uncordons the node; the planner takes no next node")
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("Unknown: " + sim.PausedMessage))
		c.answer(first, sim.PostDrainAnnotation, postHok)
		Eventually(func() bool { return c.getNode(first).Spec.Unschedulable }).WithPolling(20 * time.Millisecond).Should(BeFalse())
		Eventually(func() map[string]string { return c.secret(first).Annotations }).WithPolling(20 * time.Millisecond).ShouldNot(HaveKey(sim.DrainOptionsAnnotation))
		Consistently(func() map[string]string { return c.secret(second).Annotations }, 500*time.Millisecond, 50*time.Millisecond).ShouldNot(HaveKey(sim.DrainOptionsAnnotation))
		Expect(c.getNode(second).Spec.Unschedulable).To(BeFalse())

		By("a resume from the pause read now lifts it, and the planner takes the next node")
		pause, err = rancher.ReadPlannerPause(ctx, env.Client)
		Expect(err).NotTo(HaveOccurred())
		lifted, err = rancher.ResumeSeenPlanner(ctx, env.Client, "spec", pause)
		Expect(err).NotTo(HaveOccurred())
		Expect(lifted).To(BeTrue())
		Eventually(func() string { return c.secret(second).Annotations[sim.PreDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		Expect(c.getNode(second).Spec.Unschedulable).To(BeTrue(), "the machine-drain controller cordons before it asks for the pre-drain hook")
	})
})
