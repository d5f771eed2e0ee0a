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

	It("from v1.8.0 on turns the legacy image values into image.*, and gives Rancher replicas -2 on a three-node cluster with a witness (facts 16.2, 16.7)", func() {
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

	// A witness cluster as Harvester leaves it: rancherd installed Rancher with replicas
	// -3 and a required anti-affinity (rancher/rancherd pkg/rancher/run.go), Harvester's
	// witness promotion annotated the rancher Deployment scale-available "2" (harvester
	// chart templates/configmap.yaml, promote.sh) and tainted the witness
	// node-role.kubernetes.io/etcd=true:NoExecute, so Rancher runs two pods, one on each
	// management node. The chart's own -3 would render "3" again (harvester commit
	// f8a7092: "it will be overwritten to 3 after chart upgrade"), and Rancher would then
	// ask for a third pod no node can run: the rollout would never complete.
	It("keeps Rancher at two pods on two management nodes and a witness: replicas -2, so the upgraded Rancher rolls out (fact 16.2)", func() {
		kubelet := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord(), Labels: sim.HarvesterNodeLabels(nil)}
		for _, name := range []string{"rw-1", "rw-2", "rw-witness"} {
			var labels map[string]string
			if name == "rw-witness" {
				labels = map[string]string{clusterupgrade.LabelWitnessNode: "true"}
			}
			n, err := kubelet.CreateNode(ctx, name, "v1.34.3+rke2r3", labels)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, n))).To(Succeed()) })
			if name == "rw-witness" {
				Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(n), n)).To(Succeed())
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "node-role.kubernetes.io/etcd", Value: "true", Effect: corev1.TaintEffectNoExecute})
				Expect(env.Client.Update(ctx, n)).To(Succeed())
			}
		}
		rel := oldRelease
		rel.RancherdDefaults = true
		seed(rel)
		settle()
		key := client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, key, dep)).To(Succeed())
		before := dep.DeepCopy()
		dep.Annotations[sim.ScaleAvailableAnnotation] = "2" // the witness promotion
		Expect(env.Client.Patch(ctx, dep, client.MergeFrom(before))).To(Succeed())
		rancherDeployment := func() *appsv1.Deployment {
			cur := &appsv1.Deployment{}
			Expect(env.Client.Get(ctx, key, cur)).To(Succeed())
			return cur
		}
		Eventually(func(g Gomega) {
			cur := rancherDeployment()
			g.Expect(cur.Spec.Replicas).To(HaveValue(BeNumerically("==", 2)))
			g.Expect(cur.Status.ObservedGeneration).To(Equal(cur.Generation))
			g.Expect(cur.Status.AvailableReplicas).To(BeNumerically("==", 2))
		}).Should(Succeed(), "Rancher runs its two pods before the upgrade")

		steps := runStates(input("up-helm-witness"), newProgress())

		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).State).To(Equal(clusterupgrade.StateDone))
		rel2 := rancherRelease()
		Expect(rel2.Config).To(HaveKeyWithValue("replicas", BeNumerically("==", -2)))
		Expect(rel2.Config).To(HaveKeyWithValue("antiAffinity", "required"), "rancherd's value stays")
		dep = rancherDeployment()
		Expect(dep.Annotations).To(HaveKeyWithValue(sim.ScaleAvailableAnnotation, "2"))
		Expect(dep.Spec.Replicas).To(HaveValue(BeNumerically("==", 2)))
		Expect(dep.Status.AvailableReplicas).To(BeNumerically("==", 2))
		Expect(rancherImage()).To(Equal("rancher/rancher:" + newRelease.Rancher))
	})

	It("fails, naming what is missing, without the installer image's files, and changes nothing", func() {
		seed(oldRelease)
		settle()
		in := input("up-helm-missing")
		in.RancherInstaller = ""
		in.Timeout = 30 * time.Second // it fails as soon as it reaches UpgradeRancher; the bound is for a loaded machine
		Expect(clusterupgrade.Run(ctx, env.Client, in, newProgress())).To(MatchError(ContainSubstring("--rancher-installer")))
		Expect(rancherRelease().Version).To(Equal(1))
		Expect(rancherImage()).To(Equal("rancher/rancher:" + oldRelease.Rancher))
	})
})
