package harvesteradapter_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

var _ = Describe("Whether a node already runs the target, as the Harvester updater judges it", func() {
	// atTarget asks through the registry, as selection, retries and UpdateMachine do.
	atTarget := func(c *harvesterCluster) (bool, string) {
		GinkgoHelper()
		registry := nodeupdater.NewRegistry()
		Expect(registry.Register(c.updater.Registration())).To(Succeed())
		at, why, err := registry.AtTarget(ctx, nodeupdater.PreflightTarget{
			Namespace: c.ns, ClusterName: c.name, MachineName: "m-" + c.nodes[0], NodeName: c.nodes[0], Version: "v1.35.6+rke2r1",
			UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
		})
		Expect(err).NotTo(HaveOccurred())
		return at, why
	}

	It("needs the kubelet at the target version and the OS at the release", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", nil)
		at, why := atTarget(c)
		Expect(at).To(BeFalse())
		Expect(why).To(Equal("kubelet v1.34.3+rke2r3 is not at the target v1.35.6+rke2r1"))

		// The RKE2 step finished and the OS step failed: the kubelet alone says nothing.
		Expect(c.kubelet.SetVersion(ctx, c.nodes[0], "v1.35.6+rke2r1", "")).To(Succeed())
		at, why = atTarget(c)
		Expect(at).To(BeFalse())
		Expect(why).To(Equal("kubelet v1.35.6+rke2r1 is at the target but the OS is Harvester v1.7.1; release v1.8.1 wants Harvester v1.8.1"))

		Expect(c.kubelet.SetVersion(ctx, c.nodes[0], "", "Harvester v1.8.1")).To(Succeed())
		at, why = atTarget(c)
		Expect(at).To(BeTrue(), why)
	})

	It("takes the kubelet alone when the HarvesterUpgrader skips the OS upgrade", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		Expect(c.kubelet.SetVersion(ctx, c.nodes[0], "v1.35.6+rke2r1", "")).To(Succeed())
		at, why := atTarget(c)
		Expect(at).To(BeTrue(), why)
	})
})
