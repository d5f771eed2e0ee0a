package sim_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// multusCluster is a namespace holding three VM networks and, when policy is set, a
// HelmChartConfig rke2-multus with that failurePolicy (Harvester's patch_rke2_multus_config
// writes abort, fact 9); the Multus simulator has installed the chart at v1.33.3+rke2r1.
type multusCluster struct {
	ns     string
	multus *sim.Multus
	nads   []string
}

func newMultusCluster(policy string, skipped func(string) bool) *multusCluster {
	GinkgoHelper()
	seq++
	c := &multusCluster{ns: fmt.Sprintf("multus-%d", seq)}
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})).To(Succeed())
	if policy != "" {
		cfg := &unstructured.Unstructured{}
		cfg.SetGroupVersionKind(sim.HelmChartConfigGVK)
		cfg.SetNamespace(c.ns)
		cfg.SetName(sim.MultusChart)
		Expect(unstructured.SetNestedField(cfg.Object, policy, "spec", "failurePolicy")).To(Succeed())
		Expect(env.Client.Create(ctx, cfg)).To(Succeed())
	}
	c.multus = &sim.Multus{Client: env.Client, Namespace: c.ns, Skipped: skipped}
	Expect(c.multus.RKE2Restarted(ctx, "node-1", "v1.33.3+rke2r1")).To(Succeed())
	Expect(c.multus.Installs()).To(HaveLen(1))
	Expect(c.multus.Installs()[0].Outcome).To(BeElementOf("installed", "skipped"))
	for _, name := range []string{"vlan10", "vlan20", "storage"} {
		nad := &unstructured.Unstructured{}
		nad.SetGroupVersionKind(sim.NADGVK)
		nad.SetNamespace(c.ns)
		nad.SetName(name)
		Expect(unstructured.SetNestedField(nad.Object, `{"cniVersion":"0.3.1","type":"bridge"}`, "spec", "config")).To(Succeed())
		Expect(env.Client.Create(ctx, nad)).To(Succeed())
		c.nads = append(c.nads, c.ns+"/"+name)
	}
	return c
}

func (c *multusCluster) networks() []string {
	GinkgoHelper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(sim.NADGVK.GroupVersion().WithKind("NetworkAttachmentDefinitionList"))
	Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
	var out []string
	for _, n := range list.Items {
		out = append(out, n.GetNamespace()+"/"+n.GetName())
	}
	return out
}

func (c *multusCluster) lost() []string {
	var out []string
	for _, n := range c.multus.NetworksLost() {
		if strings.HasPrefix(n, c.ns+"/") {
			out = append(out, n)
		}
	}
	return out
}

func (c *multusCluster) chartVersion() string {
	GinkgoHelper()
	hc := &unstructured.Unstructured{}
	hc.SetGroupVersionKind(sim.HelmChartGVK)
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: sim.MultusChart}, hc)).To(Succeed())
	v, _, _ := unstructured.NestedString(hc.Object, "spec", "version")
	return v
}

var _ = Describe("The Multus simulator (harvester-release-steps.md facts 9 and 34, issue harvester#10359)", func() {
	It("with the default failurePolicy reinstall, a failed upgrade uninstalls the chart, and the API server deletes every NetworkAttachmentDefinition with the CRD", func() {
		c := newMultusCluster("", nil)
		Expect(c.networks()).To(ConsistOf(c.nads))
		c.multus.FailInstall("timed out waiting for the condition")
		Expect(c.multus.RKE2Restarted(ctx, "node-1", "v1.34.1+rke2r1")).To(Succeed())

		last := c.multus.Installs()[len(c.multus.Installs())-1]
		Expect(last.Policy).To(Equal(sim.FailurePolicyReinstall), "helm-controller's default, absent a HelmChartConfig")
		Expect(last.Outcome).To(Equal("reinstalled"))
		Expect(c.lost()).To(ConsistOf(c.nads))
		Expect(c.networks()).To(BeEmpty(), "the VM networks are gone from the API server")
		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: sim.NADCRD}, crd)).To(Succeed(), "the install created the CRD again")
		Expect(c.chartVersion()).To(Equal("v1.34.1+rke2r1"))
	})

	It("with the HelmChartConfig's failurePolicy reinstall written explicitly, loses the networks too", func() {
		c := newMultusCluster(sim.FailurePolicyReinstall, nil)
		c.multus.FailInstall("pre-upgrade hook failed")
		Expect(c.multus.RKE2Restarted(ctx, "node-2", "v1.34.1+rke2r1")).To(Succeed())
		Expect(c.lost()).To(ConsistOf(c.nads))
		Expect(c.networks()).To(BeEmpty())
	})

	It("with the HelmChartConfig's failurePolicy abort (Harvester's patch), leaves the failed release and every NetworkAttachmentDefinition", func() {
		c := newMultusCluster(sim.FailurePolicyAbort, nil)
		c.multus.FailInstall("timed out waiting for the condition")
		Expect(c.multus.RKE2Restarted(ctx, "node-1", "v1.34.1+rke2r1")).To(Succeed())

		last := c.multus.Installs()[len(c.multus.Installs())-1]
		Expect(last.Policy).To(Equal(sim.FailurePolicyAbort))
		Expect(last.Outcome).To(Equal("aborted"))
		Expect(c.lost()).To(BeEmpty())
		Expect(c.networks()).To(ConsistOf(c.nads))
	})

	It("with rke2-multus.yaml.skip on the node, runs no install at all, failure injected or not", func() {
		skipped := map[string]bool{}
		c := newMultusCluster("", func(node string) bool { return skipped[node] })
		skipped["node-1"], skipped["node-2"] = true, true
		c.multus.FailInstall("timed out waiting for the condition")
		for _, node := range []string{"node-1", "node-2"} {
			Expect(c.multus.RKE2Restarted(ctx, node, "v1.34.1+rke2r1")).To(Succeed())
		}
		for _, in := range c.multus.Installs()[1:] {
			Expect(in.Outcome).To(Equal("skipped"), in.Node)
			Expect(in.Policy).To(BeEmpty(), "no helm-install Job ran")
		}
		Expect(c.chartVersion()).To(Equal("v1.33.3+rke2r1"), "the manifest was not applied")
		Expect(c.lost()).To(BeEmpty())
		Expect(c.networks()).To(ConsistOf(c.nads))
	})
})
