package clusterupgrade_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// Two runs of the cluster step can overlap on a real cluster: the pod of a plan deleted a
// moment before runs until its container is stopped, while the plan created again starts
// its own (the Rancher soak's seed 9: "create ManagedChart fleet-local/kubeovn-operator-crd
// at 1.15.2: ... already exists" failed the second plan). What the other run creates
// between this run's read and its create is brought as one that exists, as the release's
// kubectl apply would.
var _ = Describe("Run and objects another run creates between its read and its create", func() {
	It("brings kube-ovn's CRD chart and rke2-multus's HelmChartConfig as ones that exist", func() {
		seed(oldRelease)
		atReleaseFiles()
		crdChart := client.ObjectKey{Namespace: rancher.FleetLocal, Name: "kubeovn-operator-crd"}
		Expect(env.Client.Delete(ctx, &managementv3.ManagedChart{ObjectMeta: metav1.ObjectMeta{Namespace: crdChart.Namespace, Name: crdChart.Name}})).To(Succeed())
		Expect(multusConfig()).To(BeNil())
		want := releaseAddon("kubeovn-operator").Spec.Version

		// The other run creates each of them just before this run's create: the chart at
		// an older version, the HelmChartConfig with a value of its own and RKE2's default
		// failurePolicy.
		raced := map[string]bool{}
		direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		c := interceptor.NewClient(direct, interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				switch {
				case obj.GetName() == crdChart.Name && !raced[crdChart.Name]:
					raced[crdChart.Name] = true
					Expect(env.Client.Create(ctx, &managementv3.ManagedChart{
						ObjectMeta: metav1.ObjectMeta{Namespace: crdChart.Namespace, Name: crdChart.Name},
						Spec: managementv3.ManagedChartSpec{Chart: crdChart.Name, ReleaseName: crdChart.Name, Version: "1.13.0",
							DefaultNamespace: "kube-system", RepoName: rancher.HarvesterChartsRepo, TimeoutSeconds: 600},
					})).To(Succeed())
				case obj.GetName() == sim.MultusChart && !raced[sim.MultusChart]:
					raced[sim.MultusChart] = true
					createMultusConfig("valuesContent", "manifest:\n  enable: true\n")
				}
				return c.Create(ctx, obj, opts...)
			},
		})
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, c, input("up-raced-creates"), p)).To(Succeed())
		Expect(raced).To(HaveLen(2), "both were created between the run's read and its create")

		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).State).To(Equal(clusterupgrade.StateDone))
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).Message).To(ContainSubstring("ManagedChart kubeovn-operator-crd " + want + " (was 1.13.0)"))
		chart := &managementv3.ManagedChart{}
		Expect(env.Client.Get(ctx, crdChart, chart)).To(Succeed())
		Expect(chart.Spec.Version).To(Equal(want))

		Expect(stepNamed(steps, clusterupgrade.StepPatchMultusFailurePolicy).State).To(Equal(clusterupgrade.StateDone))
		cfg := multusConfig()
		policy, _, _ := unstructured.NestedString(cfg.Object, "spec", "failurePolicy")
		values, _, _ := unstructured.NestedString(cfg.Object, "spec", "valuesContent")
		Expect(policy).To(Equal("abort"))
		Expect(values).To(Equal("manifest:\n  enable: true\n"), "what the other run wrote kept")
	})
})
