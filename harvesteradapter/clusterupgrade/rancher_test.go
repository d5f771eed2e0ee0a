package clusterupgrade_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// upgrade_rancher (harvester-release-steps.md facts 16 and 42).
var _ = Describe("Run and Rancher", func() {
	rancherFeatures := func() string {
		GinkgoHelper()
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}, dep)).To(Succeed())
		for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "CATTLE_FEATURES" {
				return e.Value
			}
		}
		return ""
	}

	It("runs the new Rancher with the target release's features, replacing the whole list as Helm does (fact 42)", func() {
		seed(oldRelease)
		settle()
		// Rancher as a v1.7 release leaves it: turtles off, the embedded Cluster API on.
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}, dep)).To(Succeed())
		v17, err := releases.RancherFeatures("v1.7.1")
		Expect(err).NotTo(HaveOccurred())
		dep.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CATTLE_FEATURES", Value: v17}}
		Expect(env.Client.Update(ctx, dep)).To(Succeed())
		settle()

		steps := runStates(input("up-features"), newProgress())
		want, err := releases.RancherFeatures(newRelease.Version)
		Expect(err).NotTo(HaveOccurred())
		Expect(want).NotTo(ContainSubstring("turtles"))
		Expect(rancherFeatures()).To(Equal(want))
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).Message).To(ContainSubstring("features " + want))
	})

	It("waits for the fleet, fleet-crd and rancher-webhook releases Rancher deploys before Harvester's charts change (fact 16.11 to 16.13)", func() {
		r := seed(oldRelease, func(r *sim.Rancher) { r.SystemChartDelay = 1500 * time.Millisecond })
		settle()
		in := input("up-deps")
		steps := runStates(in, newProgress())

		crdChanged := r.ChartVersionSeenAt(rancher.HarvesterCRDChart, in.HarvesterChartVersion)
		Expect(crdChanged).NotTo(BeZero())
		for _, c := range []struct{ name, chart string }{
			{rancher.FleetChart, in.RancherDependencies.Fleet.Chart},
			{rancher.FleetCRDChart, in.RancherDependencies.FleetCRD.Chart},
			{rancher.RancherWebhookChart, in.RancherDependencies.RancherWebhook.Chart},
		} {
			deployed := r.SystemChartDeployedAt(c.name, c.chart)
			Expect(deployed).NotTo(BeZero(), "Rancher deployed %s %s", c.name, c.chart)
			Expect(crdChanged).To(BeTemporally(">", deployed), "harvester-crd changed only after %s was deployed", c.name)
		}
		for _, key := range []client.ObjectKey{
			{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerDeploy},
			{Namespace: rancher.CattleSystem, Name: rancher.RancherWebhookChart},
		} {
			dep := &appsv1.Deployment{}
			Expect(env.Client.Get(ctx, key, dep)).To(Succeed())
			Expect(dep.Status.ObservedGeneration).To(Equal(dep.Generation), "%s rolled out", key)
		}
		secret := &corev1.Secret{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.STVAggregationSecret}, secret)).To(Succeed())
		Expect(stepNamed(steps, clusterupgrade.StepWaitRancherDependencies).Message).To(ContainSubstring("fleet fleet-" + in.RancherDependencies.Fleet.Chart))
	})

	It("deletes Rancher's chart repositories before changing it, so that the new Rancher indexes its own charts and upgrades Fleet (fact 16.4)", func() {
		r := seed(oldRelease)
		settle()
		in := input("up-repos")
		in.Timeout = 60 * time.Second // a liveness bound: the run succeeds; 15 s ran out under a load of 20
		steps := runStates(in, newProgress())
		for _, name := range []string{rancher.RancherChartsRepo, rancher.RancherRKE2ChartsRepo, rancher.RancherPartnerChartsRepo} {
			repo := &catalogv1.ClusterRepo{}
			Expect(env.Client.Get(ctx, client.ObjectKey{Name: name}, repo)).To(Succeed())
			Expect(repo.Status.Commit).To(Equal(sim.BundledChartsCommit(newRelease.Rancher)), "%s created again by the new Rancher", name)
		}
		branch := &managementv3.Setting{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: rancher.ChartDefaultBranchSetting}, branch)).To(Succeed())
		Expect(branch.Value).To(Equal("release-v2.12"))
		Expect(r.SystemChartDeployedAt(rancher.FleetChart, in.RancherDependencies.Fleet.Chart)).NotTo(BeZero(), "the new Rancher found its fleet chart")
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).Message).To(ContainSubstring(
			"ClusterRepos rancher-charts, rancher-rke2-charts, rancher-partner-charts and Setting chart-default-branch deleted before"))
	})

	It("does not wait for Rancher's charts when Rancher was already at the release", func() {
		seed(sim.HarvesterRelease{Version: oldRelease.Version, Rancher: newRelease.Rancher})
		settle()
		steps := runStates(input("up-deps-skip"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeRancher).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepWaitRancherDependencies).State).To(Equal(clusterupgrade.StateSkipped))
	})

	It("rolls a system chart stuck pending at another chart back once, with helm, so that Rancher installs the release's (fact 16.11)", func() {
		seed(oldRelease)
		settle()
		stuck := releases.ChartApp{Chart: "111.9.9+up0.11.9", App: "0.11.9"}
		Expect(sim.StoreStuckSystemChart(ctx, env.Client, rancher.FleetChart, stuck, time.Now().Add(-10*time.Minute))).To(Succeed())
		in := input("up-stuck")
		steps := runStates(in, newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepWaitRancherDependencies).State).To(Equal(clusterupgrade.StateDone))
		rel, err := rancher.NewestHelmRelease(ctx, env.Client, rancher.FleetNamespace, rancher.FleetChart)
		Expect(err).NotTo(HaveOccurred())
		Expect(rel.ChartRef()).To(Equal(rancher.FleetChart + "-" + in.RancherDependencies.Fleet.Chart))
		Expect(rel.Info.Status).To(Equal("deployed"))
		Expect(rel.Version).To(Equal(4), "1 deployed, 2 stuck, 3 the rollback to 1, 4 Rancher's upgrade")
		secrets := &corev1.SecretList{}
		Expect(env.Client.List(ctx, secrets, client.InNamespace(rancher.FleetNamespace), client.MatchingLabels{"owner": "helm", "name": rancher.FleetChart, "version": "3"})).To(Succeed())
		Expect(secrets.Items).To(HaveLen(1))
		rollback, err := rancher.DecodeHelmRelease(secrets.Items[0].Data["release"])
		Expect(err).NotTo(HaveOccurred())
		Expect(rollback.Info.Description).To(Equal("Rollback to 1"), "helm's own rollback")
	})

	It("leaves a revision pending for less than the bound alone, and its wait names it", func() {
		seed(oldRelease)
		settle()
		stuck := releases.ChartApp{Chart: "111.9.9+up0.11.9", App: "0.11.9"}
		Expect(sim.StoreStuckSystemChart(ctx, env.Client, rancher.FleetChart, stuck, time.Now())).To(Succeed())
		in := input("up-stuck-young")
		in.Timeout = 30 * time.Second // the revision stays pending: the run ends at this bound, past the sub-steps before on a loaded machine
		Expect(clusterupgrade.Run(ctx, env.Client, in, newProgress())).To(MatchError(And(
			ContainSubstring("fleet-111.9.9+up0.11.9 (app 0.11.9) pending-upgrade since"),
			ContainSubstring("rolled back once"))))
		rel, err := rancher.NewestHelmRelease(ctx, env.Client, rancher.FleetNamespace, rancher.FleetChart)
		Expect(err).NotTo(HaveOccurred())
		Expect(rel.Version).To(Equal(2), "nothing rolled back, nothing upgraded over it")
	})

	repoOf := func() *catalogv1.ClusterRepo {
		GinkgoHelper()
		repo := &catalogv1.ClusterRepo{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: rancher.RancherChartsRepo}, repo)).To(Succeed())
		return repo
	}

	It("leaves the rancher-charts index alone for a target before v1.7.2 (fact 40)", func() {
		seed(oldRelease)
		settle()
		steps := runStates(input("up-rc-v160"), newProgress())
		Expect(repoOf().Spec.ForceUpdate).To(BeNil(), "a v1.6.0 target does not refresh it")
		Expect(stepNamed(steps, clusterupgrade.StepWaitRancherDependencies).Message).To(HavePrefix("Helm releases deployed"))
	})

	It("refreshes the rancher-charts index after Rancher's upgrade for a target from v1.7.2 on (facts 16.10, 40)", func() {
		seed(oldRelease)
		settle()
		before := repoOf().Status.DownloadTime
		in := input("up-rc-v172")
		in.HarvesterVersion = "v1.7.2"
		steps := runStates(in, newProgress())
		repo := repoOf()
		Expect(repo.Spec.ForceUpdate).NotTo(BeNil())
		Expect(repo.Spec.ForceUpdate.Time).To(BeTemporally(">", before.Time))
		Expect(repo.Status.DownloadTime.Before(repo.Spec.ForceUpdate)).To(BeFalse(), "the index was downloaded after the forced update")
		Expect(stepNamed(steps, clusterupgrade.StepWaitRancherDependencies).Message).To(HavePrefix("ClusterRepo rancher-charts refreshed; Helm releases deployed"))
	})
})
