package sim_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

var _ = Describe("The SUC simulator keeps rke2-multus.yaml.skip of each server node and tells Multus (harvester-release-steps.md fact 34)", func() {
	It("skips on the server node only, an RKE2 restart there applies no chart, and removing the skip applies it once", func() {
		var s *sim.SUC
		m := newMultusCluster(sim.FailurePolicyAbort, func(node string) bool { return s != nil && s.ManifestSkipped(node) })
		c := newCluster(0, func(x *sim.SUC) { x.Multus, s = m.multus, x })
		server, agent := c.pool+"-cp-1", c.pool+"-worker-1"
		_, err := c.kubelet.CreateNode(ctx, server, "v1.33.3+rke2r1", map[string]string{"pool": c.pool, "node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"})
		Expect(err).NotTo(HaveOccurred())
		_, err = c.kubelet.CreateNode(ctx, agent, "v1.33.3+rke2r1", map[string]string{"pool": c.pool})
		Expect(err).NotTo(HaveOccurred())
		every := func(p *sucv1.Plan) {
			p.Spec.Concurrency = 2
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"pool": c.pool}}
		}

		skip := c.onePlan("skip", "", func(p *sucv1.Plan) { nodeProgramPlan("rke2-manifest-skip")(p); every(p) })
		Eventually(planComplete(skip)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(s.ManifestSkipped(server)).To(BeTrue())
		Expect(s.ManifestSkipped(agent)).To(BeFalse(), "an agent node has no server manifests directory: the script does nothing there")

		installs := len(m.multus.Installs())
		for _, node := range []string{server, agent} {
			rke2 := c.onePlan("rke2-"+node, node, func(p *sucv1.Plan) { p.Spec.Version = "v1.34.1+rke2r1" })
			Eventually(planComplete(rke2)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		}
		got := m.multus.Installs()[installs:]
		Expect(got).To(HaveLen(1), "the server's RKE2 restart only: an agent runs no deploy controller")
		Expect(got[0].Node).To(Equal(server))
		Expect(got[0].Cause).To(Equal(sim.MultusOnRestart))
		Expect(got[0].Outcome).To(Equal("skipped"))
		Expect(m.chartVersion()).To(Equal("v1.33.3+rke2r1"))

		unskip := c.onePlan("unskip", "", func(p *sucv1.Plan) { nodeProgramPlan("rke2-manifest-skip", "--remove")(p); every(p) })
		Eventually(planComplete(unskip)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(s.ManifestSkipped(server)).To(BeFalse())
		got = m.multus.Installs()[installs+1:]
		Expect(got).To(HaveLen(1), "the server's deploy controller applies the manifest once, the agent has none")
		Expect(got[0].Node).To(Equal(server))
		Expect(got[0].Cause).To(Equal(sim.MultusOnSkipRemoved))
		Expect(got[0].Version).To(Equal("v1.34.1+rke2r1"), "the manifest of the RKE2 the node runs")
		Expect(got[0].Outcome).To(Equal("upgraded"))
		Expect(m.chartVersion()).To(Equal("v1.34.1+rke2r1"))
		Expect(m.lost()).To(BeEmpty())

		By("removed again: nothing was skipped, nothing applied")
		again := c.onePlan("unskip-again", "", func(p *sucv1.Plan) { nodeProgramPlan("rke2-manifest-skip", "--remove")(p); every(p) })
		Eventually(planComplete(again)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(m.multus.Installs()).To(HaveLen(installs + 2))
	})
})
