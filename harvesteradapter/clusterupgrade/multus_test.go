package clusterupgrade_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// multusConfig is kube-system's HelmChartConfig rke2-multus, nil when there is none.
func multusConfig() *unstructured.Unstructured {
	GinkgoHelper()
	cfg := &unstructured.Unstructured{}
	cfg.SetGroupVersionKind(sim.HelmChartConfigGVK)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: sim.MultusChart}, cfg); err != nil {
		Expect(client.IgnoreNotFound(err)).To(Succeed())
		return nil
	}
	return cfg
}

// createMultusConfig creates kube-system's HelmChartConfig rke2-multus with the spec field
// set to value.
func createMultusConfig(field, value string) {
	GinkgoHelper()
	cfg := &unstructured.Unstructured{}
	cfg.SetGroupVersionKind(sim.HelmChartConfigGVK)
	cfg.SetNamespace("kube-system")
	cfg.SetName(sim.MultusChart)
	Expect(unstructured.SetNestedField(cfg.Object, value, "spec", field)).To(Succeed())
	Expect(env.Client.Create(ctx, cfg)).To(Succeed())
}

var _ = Describe("Run and rke2-multus", func() {
	It("sets rke2-multus's failurePolicy to abort, so that a failed multus install during a node's RKE2 restart deletes no VM network (fact 9)", func() {
		seed(oldRelease)
		multus := &sim.Multus{Client: env.Client}
		Expect(multus.RKE2Restarted(ctx, "node-1", "v1.32.4+rke2r1")).To(Succeed())
		for _, name := range []string{"vlan10", "storage"} {
			nad := &unstructured.Unstructured{}
			nad.SetGroupVersionKind(sim.NADGVK)
			nad.SetNamespace("default")
			nad.SetName(name)
			Expect(unstructured.SetNestedField(nad.Object, `{"cniVersion":"0.3.1","type":"bridge"}`, "spec", "config")).To(Succeed())
			Expect(env.Client.Create(ctx, nad)).To(Succeed())
		}
		Expect(clusterupgrade.Run(ctx, env.Client, input("multus-plan"), newProgress())).To(Succeed())

		By("a node's RKE2 restarts with the new version and the multus upgrade fails")
		multus.FailInstall("helm upgrade: timed out waiting for the condition")
		Expect(multus.RKE2Restarted(ctx, "node-1", "v1.33.3+rke2r1")).To(Succeed())
		Expect(multus.NetworksLost()).To(BeEmpty())
		cfg := multusConfig()
		Expect(cfg).NotTo(BeNil())
		policy, _, _ := unstructured.NestedString(cfg.Object, "spec", "failurePolicy")
		Expect(policy).To(Equal("abort"))
	})

	It("keeps what else the HelmChartConfig says", func() {
		seed(oldRelease)
		createMultusConfig("valuesContent", "manifest:\n  enable: true\n")
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, env.Client, input("multus-keep"), p)).To(Succeed())
		got := multusConfig()
		policy, _, _ := unstructured.NestedString(got.Object, "spec", "failurePolicy")
		values, _, _ := unstructured.NestedString(got.Object, "spec", "valuesContent")
		Expect(policy).To(Equal("abort"))
		Expect(values).To(Equal("manifest:\n  enable: true\n"))
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(stepNamed(steps, clusterupgrade.StepPatchMultusFailurePolicy).State).To(Equal(clusterupgrade.StateDone))
	})
})
