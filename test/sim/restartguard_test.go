package sim_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// nodeProgramPlan makes p run `capi-inplace node <subcommand...>` from the node image
// with the flags every Harvester updater Plan gives it, at release v1.6.0.
func nodeProgramPlan(subcommand ...string) func(*sucv1.Plan) {
	return func(p *sucv1.Plan) {
		p.Spec.Version = "v1.6.0"
		args := append(append([]string{"node"}, subcommand...), "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.6.0")
		p.Spec.Upgrade = &sucv1.ContainerSpec{
			Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Command: []string{"/capi-inplace"}, Args: args,
			SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)},
		}
	}
}

var _ = Describe("The SUC simulator keeps the restart guard of each node (harvester-release-steps.md facts 12 and 44)", func() {
	It("guards the nodes a guard Plan ran on, unguards a node whose unguard Plan ran, and a node that reboots loses the guard", func() {
		c := newCluster(2)
		node1, node2 := c.pool+"-node-1", c.pool+"-node-2"
		Expect(c.suc.Guarded(node1) || c.suc.Guarded(node2)).To(BeFalse(), "no node is guarded before a guard Plan ran")

		// Harvester's skip_restart_rancher_system_agent: every node, ten at a time.
		guard := c.onePlan("restart-guard", "", func(p *sucv1.Plan) {
			nodeProgramPlan("rke2-restart-guard")(p)
			p.Spec.Concurrency = 10
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"pool": c.pool}}
		})
		Eventually(planComplete(guard)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(c.suc.Guarded(node1)).To(BeTrue())
		Expect(c.suc.Guarded(node2)).To(BeTrue())
		// Harvester deletes the Plan once every node is done: the guard stays on the hosts.
		Expect(env.Client.Delete(ctx, guard)).To(Succeed())
		Consistently(func() bool { return c.suc.Guarded(node1) && c.suc.Guarded(node2) }, 300*time.Millisecond, 50*time.Millisecond).Should(BeTrue())

		// recover_rancher_system_agent on node 1 only.
		unguard := c.onePlan("unguard-1", node1, nodeProgramPlan("rke2-restart-guard", "--remove"))
		Eventually(planComplete(unguard)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(c.suc.Guarded(node1)).To(BeFalse())
		Expect(c.suc.Guarded(node2)).To(BeTrue(), "the unguard Plan selects node 1 only")

		// An RKE2 upgrade restarts RKE2, not the host: /run keeps the drop-in.
		rke2 := c.onePlan("rke2-2", node2, nil)
		Eventually(planComplete(rke2)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(c.suc.Guarded(node2)).To(BeTrue(), "restarting RKE2 leaves /run as it is")

		// The OS upgrade reboots node 2: /run is a tmpfs, the drop-in is gone. The Job
		// completes first, the host reboots after it (harvester-node-upgrade.md fact 28).
		osPlan := c.onePlan("os-2", node2, nodeProgramPlan("os-upgrade"))
		Eventually(planComplete(osPlan)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Eventually(func() []sim.Reboot { return c.rec.Reboots(node2) }).WithPolling(50 * time.Millisecond).Should(
			ContainElement(HaveField("End", Not(BeZero()))))
		Expect(c.rec.Reboots(node2)).To(HaveLen(1))
		var osRun sim.PlanRun
		for _, run := range c.rec.Runs() {
			if run.Plan == "os-2" {
				osRun = run
			}
		}
		Expect(osRun.End).NotTo(BeZero())
		Expect(c.rec.Reboots(node2)[0].Start).To(BeTemporally(">", osRun.End), "the host went down only after the Job's pod ended")
		Expect(c.rec.Reboots(node1)).To(BeEmpty())
		n := &corev1.Node{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: node2}, n)).To(Succeed())
		Expect(n.Status.NodeInfo.OSImage).To(Equal("Harvester v1.6.0"), "the node rebooted into the release's OS")
		Expect(c.suc.Guarded(node2)).To(BeFalse(), "the reboot emptied /run")
	})

	It("does not guard a node whose guard Job failed, and keeps the guard of a node whose unguard Job failed", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		c.suc.FailNode("guard-failing", node, "systemctl: Failed to connect to bus")
		failing := c.onePlan("guard-failing", node, nodeProgramPlan("rke2-restart-guard"))
		Eventually(planComplete(failing)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.suc.Guarded(node)).To(BeFalse())

		guard := c.onePlan("guard", node, nodeProgramPlan("rke2-restart-guard"))
		Eventually(planComplete(guard)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(c.suc.Guarded(node)).To(BeTrue())

		c.suc.FailNode("unguard", node, "systemctl: Failed to connect to bus")
		unguard := c.onePlan("unguard", node, nodeProgramPlan("rke2-restart-guard", "--remove"))
		Eventually(planComplete(unguard)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.suc.Guarded(node)).To(BeTrue())
	})
})
