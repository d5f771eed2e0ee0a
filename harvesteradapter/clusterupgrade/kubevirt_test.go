package clusterupgrade_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// kubevirtSeq keeps the KubeVirt specs' nodes and VMs apart.
var kubevirtSeq int

// runningVMs starts KubeVirt's simulator on harvester-system's KubeVirt CR, deployed at
// the KubeVirt of the old release's chart with the methods the seeded harvester chart
// renders ([LiveMigrate], as Harvester's chart since v1.6.0: fact 13), on two Ready nodes
// of their own, and n running virtual machines there. Fleet's deploys of the harvester
// chart reach the CR through r.OnDeployed (KubeVirt.ApplyHarvesterChart), as Fleet
// applies the chart's rendered KubeVirt CR.
func runningVMs(r *sim.Rancher, n int) *sim.KubeVirt {
	GinkgoHelper()
	kubevirtSeq++
	pool, ns := fmt.Sprintf("kv-%d", kubevirtSeq), fmt.Sprintf("vms-%d", kubevirtSeq)
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	kubelet := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord(), Labels: sim.HarvesterNodeLabels(map[string]string{"pool": pool})}
	// The nodes leave with the spec: they would count in a later spec's wait for Longhorn.
	DeferCleanup(func() {
		Expect(env.Client.DeleteAllOf(ctx, &corev1.Node{}, client.MatchingLabels{"pool": pool})).To(Succeed())
	})
	for i := 1; i <= 2; i++ {
		_, err := kubelet.CreateNode(ctx, fmt.Sprintf("%s-node-%d", pool, i), "v1.32.4+rke2r1", map[string]string{"pool": pool})
		Expect(err).NotTo(HaveOccurred())
	}
	cr := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: "harvester-system"}}
	_ = env.Client.Delete(ctx, cr)
	Eventually(func() bool { return env.Client.Get(ctx, client.ObjectKeyFromObject(cr), &kubevirtv1.KubeVirt{}) != nil }).Should(BeTrue())
	cr.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods = []kubevirtv1.WorkloadUpdateMethod{kubevirtv1.WorkloadUpdateMethodLiveMigrate}
	Expect(env.Client.Create(ctx, cr)).To(Succeed())
	kv := &sim.KubeVirt{
		Client: env.Client, Namespace: ns, NodeSelector: map[string]string{"pool": pool},
		KubeVirtCR: client.ObjectKeyFromObject(cr), MigrationDelay: 50 * time.Millisecond, Interval: 20 * time.Millisecond,
	}
	Expect(kv.UpgradeKubeVirt(ctx, sim.KubeVirtVersionOfChart(chart(rancher.HarvesterChart).Spec.Version))).To(Succeed())
	r.OnDeployed = kv.ApplyHarvesterChart
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); kv.Run(runCtx) }()
	DeferCleanup(func() { cancel(); <-done })
	always := kubevirtv1.RunStrategyAlways
	for i := 1; i <= n; i++ {
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vm-%d", i), Namespace: ns},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		Expect(env.Client.Create(ctx, vm)).To(Succeed())
	}
	Eventually(func(g Gomega) {
		list := &kubevirtv1.VirtualMachineInstanceList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(n))
		for _, vmi := range list.Items {
			g.Expect(vmi.Status.Phase).To(Equal(kubevirtv1.Running), vmi.Name)
		}
	}).Should(Succeed())
	return kv
}

func kubevirtCR() *kubevirtv1.KubeVirt {
	GinkgoHelper()
	kv := &kubevirtv1.KubeVirt{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: "harvester-system", Name: "kubevirt"}, kv)).To(Succeed())
	return kv
}

var _ = Describe("Run and KubeVirt's workload updates", Ordered, func() {
	It("upgrades KubeVirt with Harvester's chart without KubeVirt live-migrating any VM (fact 13)", func() {
		r := seed(oldRelease)
		kv := runningVMs(r, 4)
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, env.Client, input("kv-plan"), p)).To(Succeed())

		By("KubeVirt was upgraded with the chart: every running VMI is outdated")
		Eventually(func() string { return kubevirtCR().Status.ObservedKubeVirtVersion }).Should(Equal(sim.KubeVirtVersionOfChart("1.6.0")))
		By("and no workload update migration was made while the chart's methods stayed emptied")
		Consistently(kv.WorkloadUpdateMigrations).WithTimeout(time.Second).Should(BeEmpty())
		Expect(kubevirtCR().Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods).To(BeEmpty())
		Expect(chartValues()).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":[]}}}}`))
		for name, v := range map[string]string{rancher.MonitoringCRDChart: newRelease.MonitoringChart, rancher.LoggingCRDChart: newRelease.LoggingChart} {
			// Paused first, then un-paused by its own upgrade (fact 11's note, fact 27).
			Expect(chart(name).Spec.Version).To(Equal(v), name)
			Expect(chart(name).Spec.Paused).To(BeFalse(), "%s is un-paused by its upgrade", name)
		}
		changes, err := clusterupgrade.ReadChanges(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(changes).To(ContainElement(clusterupgrade.Change{Object: "fleet-local/harvester", Field: clusterupgrade.FieldWorkloadUpdateMethods, Before: []byte(`["LiveMigrate"]`)}))

		By("a second run changes nothing and records nothing new")
		generation := chart(rancher.HarvesterChart).Generation
		Expect(clusterupgrade.Run(ctx, env.Client, input("kv-plan"), p)).To(Succeed())
		Expect(chart(rancher.HarvesterChart).Generation).To(Equal(generation))
		again, err := clusterupgrade.ReadChanges(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(Equal(changes))

		By("Restore gives the chart its methods back and un-pauses every chart, once")
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		Expect(chartValues()).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":["LiveMigrate"]}}}}`))
		for _, name := range []string{rancher.HarvesterChart, rancher.HarvesterCRDChart, rancher.MonitoringCRDChart, rancher.LoggingCRDChart} {
			Expect(chart(name).Spec.Paused).To(BeFalse(), name)
		}
		Eventually(func() []kubevirtv1.WorkloadUpdateMethod {
			return kubevirtCR().Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods
		}).Should(ConsistOf(kubevirtv1.WorkloadUpdateMethodLiveMigrate))
		generation = chart(rancher.HarvesterChart).Generation
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		Expect(chart(rancher.HarvesterChart).Generation).To(Equal(generation))

		By("a run that resumes from the same progress after the restore turns the roll settings off again")
		Expect(clusterupgrade.ReadChanges(ctx, env.Client, p.ConfigMap)).To(BeEmpty())
		Expect(clusterupgrade.Run(ctx, env.Client, input("kv-plan"), p)).To(Succeed())
		Expect(chartValues()).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":[]}}}}`))
		Expect(clusterupgrade.ReadChanges(ctx, env.Client, p.ConfigMap)).To(ContainElement(
			clusterupgrade.Change{Object: "fleet-local/harvester", Field: clusterupgrade.FieldWorkloadUpdateMethods, Before: []byte(`["LiveMigrate"]`)}), "recorded again")
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		Expect(chartValues()).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":["LiveMigrate"]}}}}`))
	})

	It("gives back a chart without workloadUpdateMethods without them (fact 37: a backup of null deletes the key)", func() {
		seed(oldRelease)
		mc := chart(rancher.HarvesterChart)
		before := mc.DeepCopy()
		mc.Spec.Values = &apiextensionsv1.JSON{Raw: []byte(`{"kubevirt":{"spec":{}},"other":1}`)}
		Expect(env.Client.Patch(ctx, mc, client.MergeFrom(before))).To(Succeed())
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, env.Client, input("kv-null"), p)).To(Succeed())
		Expect(chartValues()).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":[]}}},"other":1}`))
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		Expect(chartValues()).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{}}},"other":1}`))
	})
})

// chartValues is the harvester chart's values, as JSON.
func chartValues() string {
	GinkgoHelper()
	mc := chart(rancher.HarvesterChart)
	if mc.Spec.Values == nil {
		return ""
	}
	return string(mc.Spec.Values.Raw)
}
