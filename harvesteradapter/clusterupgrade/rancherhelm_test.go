package clusterupgrade_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// upgrade_rancher's helm upgrade (harvester-release-steps.md facts 16.1, 16.2, 16.7, 16.9
// and 41), with the real helm against the test API server and the simulated chart of
// Rancher's installer image.
var _ = Describe("Run upgrades Rancher through Helm", func() {
	rancherRelease := func() *rancher.HelmRelease {
		GinkgoHelper()
		rel, err := rancher.NewestHelmRelease(ctx, env.Client, rancher.CattleSystem, "rancher")
		Expect(err).NotTo(HaveOccurred())
		Expect(rel).NotTo(BeNil())
		return rel
	}
	rancherImage := func() string {
		GinkgoHelper()
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}, dep)).To(Succeed())
		return dep.Spec.Template.Spec.Containers[0].Image
	}

	It("runs helm upgrade with the installer image's chart, keeps the values the user set, and applies the chart's other objects", func() {
		seed(oldRelease)
		settle()
		Expect(rancherRelease().Version).To(Equal(1))

		steps := runStates(input("up-helm"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).State).To(Equal(clusterupgrade.StateDone))

		rel := rancherRelease()
		Expect(rel.Version).To(Equal(2), "one helm upgrade")
		Expect(rel.Info.Status).To(Equal("deployed"))
		Expect(rel.ChartRef()).To(Equal("rancher-" + strings.TrimPrefix(newRelease.Rancher, "v")))
		Expect(rel.Info.Description).To(Equal("capi-inplace upgrade plan up-helm"))
		// A v1.6 release keeps the legacy image values and sets rancherImageTag (fact 41).
		Expect(rel.Config).To(HaveKeyWithValue("rancherImageTag", newRelease.Rancher))
		Expect(rel.Config).To(HaveKeyWithValue("features", mustFeatures(newRelease.Version)))
		Expect(rel.Config).To(HaveKeyWithValue("useBundledSystemChart", true), "a value rancherd set stays")
		Expect(rel.Config).To(HaveKeyWithValue("noDefaultAdmin", false), "a value rancherd set stays")
		Expect(rel.Config).NotTo(HaveKey("image"))
		Expect(rancherImage()).To(Equal("rancher/rancher:" + newRelease.Rancher))

		cm := &corev1.ConfigMap{}
		Expect(env.Client.Get(ctx, sim.RancherChartConfig, cm)).To(Succeed())
		Expect(cm.Data).To(HaveKeyWithValue("chart", "rancher-"+strings.TrimPrefix(newRelease.Rancher, "v")), "the new chart's objects are applied, not only the Deployment's image")
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).Message).To(ContainSubstring("helm upgrade with rancher-" + strings.TrimPrefix(newRelease.Rancher, "v") + ".tgz"))

		By("a run again finds the values at the release and upgrades nothing twice")
		steps = runStates(input("up-helm"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).State).To(Equal(clusterupgrade.StateDone))
		Expect(rancherRelease().Version).To(Equal(2))
	})

	It("from v1.8.0 on turns the legacy image values into image.*, and runs Rancher on all nodes but two of a three-node cluster with a witness (facts 16.2, 16.7)", func() {
		seed(oldRelease)
		settle()
		for i, name := range []string{"rh-1", "rh-2", "rh-witness"} {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
			if i == 2 {
				n.Labels[clusterupgrade.LabelWitnessNode] = "true"
			}
			Expect(env.Client.Create(ctx, n)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, n))).To(Succeed()) })
		}
		in := input("up-helm-v18")
		in.HarvesterVersion = "v1.8.1"
		_ = runStates(in, newProgress())

		rel := rancherRelease()
		Expect(rel.Version).To(Equal(2))
		Expect(rel.Config).NotTo(HaveKey("rancherImageTag"))
		Expect(rel.Config).NotTo(HaveKey("rancherImage"))
		Expect(rel.Config).To(HaveKeyWithValue("image", map[string]any{"repository": "rancher/rancher", "tag": newRelease.Rancher, "pullPolicy": "IfNotPresent"}))
		Expect(rel.Config).To(HaveKeyWithValue("replicas", BeNumerically("==", -2)))
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}, dep)).To(Succeed())
		Expect(dep.Annotations).To(HaveKeyWithValue("management.cattle.io/scale-available", "2"), "the chart rendered replicas -2")
		Expect(rancherImage()).To(Equal("rancher/rancher:" + newRelease.Rancher))
	})

	It("fails, naming what is missing, without the installer image's files, and changes nothing", func() {
		seed(oldRelease)
		settle()
		in := input("up-helm-missing")
		in.RancherInstaller = ""
		in.Timeout = 10 * time.Second
		Expect(clusterupgrade.Run(ctx, env.Client, in, newProgress())).To(MatchError(ContainSubstring("--rancher-installer")))
		Expect(rancherRelease().Version).To(Equal(1))
		Expect(rancherImage()).To(Equal("rancher/rancher:" + oldRelease.Rancher))
	})
})
