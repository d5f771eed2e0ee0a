package clusterupgrade_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

var (
	oldRelease = sim.HarvesterRelease{Version: "v1.5.1", Rancher: "v2.11.3"}
	newRelease = sim.HarvesterRelease{Version: "v1.6.0", Rancher: "v2.12.0", MonitoringChart: "106.1.0+up66.0.0", LoggingChart: "106.0.1+up4.10.1"}
)

// input is the upgrade to newRelease with test-speed waits.
func input(plan string) clusterupgrade.Input {
	return clusterupgrade.Input{
		Plan:                   plan,
		HarvesterVersion:       newRelease.Version,
		PreviousVersion:        oldRelease.Version,
		KubeVirtVersion:        sim.KubeVirtVersionOfChart("1.6.0"),
		HarvesterChartVersion:  "1.6.0",
		MonitoringChartVersion: newRelease.MonitoringChart,
		LoggingChartVersion:    newRelease.LoggingChart,
		RancherVersion:         newRelease.Rancher,
		RancherFeatures:        mustFeatures(newRelease.Version),
		RancherDependencies:    sim.DefaultRancherDependencies(newRelease.Rancher),
		ReleaseFiles:           releaseFiles,
		RancherInstaller:       rancherInstaller,
		Kubeconfig:             kubeconfig,
		PollInterval:           10 * time.Millisecond,
		CAPIStableFor:          60 * time.Millisecond,
		ChartFailAfter:         300 * time.Millisecond,
		Timeout:                60 * time.Second, // a bound on liveness: a loaded 2-core CI machine took over 30 s to reach Rancher's waits
	}
}

func mustFeatures(harvester string) string {
	f, err := releases.RancherFeatures(harvester)
	if err != nil {
		panic(err)
	}
	return f
}

var progressSeq int

// newProgress is a progress ConfigMap of its own for one spec.
func newProgress() clusterupgrade.Progress {
	progressSeq++
	return clusterupgrade.Progress{
		ConfigMap: client.ObjectKey{Namespace: "harvester-system", Name: fmt.Sprintf("progress-%d", progressSeq)},
		Log:       GinkgoWriter,
	}
}

// seed re-creates the Rancher objects at rel and starts a Rancher simulator for the spec.
func seed(rel sim.HarvesterRelease, options ...func(*sim.Rancher)) *sim.Rancher {
	GinkgoHelper()
	Expect(sim.Seed(ctx, env.Client, rel)).To(Succeed())
	// Neither a Harvester add-on nor the extra manifests' CRD yet: each spec's upgrade
	// installs them from the release's files.
	for _, ns := range []string{"harvester-system", "kube-system"} {
		Expect(env.Client.DeleteAllOf(ctx, &harvesterapi.Addon{}, client.InNamespace(ns))).To(Succeed())
	}
	cdi := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "cdis.cdi.kubevirt.io"}}
	Expect(client.IgnoreNotFound(env.Client.Delete(ctx, cdi))).To(Succeed())
	// A CRD is gone once kube-apiserver's CRD finalizer saw none of its objects left: it
	// lists them again every 5 s for up to a minute before it retries (apiextensions-apiserver
	// pkg/controller/finalizer/crd_finalizer.go, deleteInstances), so under load the
	// fixture may wait past the suite's 30 s default (CI saw it, 2026-11-30).
	Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(cdi), cdi)) }).
		WithTimeout(90 * time.Second).Should(BeTrue())
	// RKE2's rke2-multus HelmChartConfig as a fresh cluster has it: none.
	if cfg := multusConfig(); cfg != nil {
		Expect(env.Client.Delete(ctx, cfg)).To(Succeed())
	}
	r := &sim.Rancher{Client: env.Client}
	for _, o := range options {
		o(r)
	}
	simCtx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	r.Start(simCtx)
	return r
}

// stepNamed is the sub-step called name.
func stepNamed(steps []clusterupgrade.StepProgress, name string) clusterupgrade.StepProgress {
	GinkgoHelper()
	for _, s := range steps {
		if s.Name == name {
			return s
		}
	}
	Fail("no sub-step " + name)
	return clusterupgrade.StepProgress{}
}

func states(steps []clusterupgrade.StepProgress) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name+"="+string(s.State))
	}
	return out
}

// keyedOutFromV151 are the sub-steps a hop from v1.5.1 (input's) skips: each is keyed on
// another previous version (facts 1 and 2).
var keyedOutFromV151 = []string{clusterupgrade.StepPreserveOvercommitConfig, clusterupgrade.StepCleanCAPILegacyWebhooks, clusterupgrade.StepMigrateLonghornV1beta1CRDs}

// skippedOnSeeded are the sub-steps with nothing to do on the seeded cluster: the
// hop-keyed ones input's v1.5.1 does not match, and the local-rke-state conversion (Seed
// creates the Secret with Rancher's type, fact 18).
var skippedOnSeeded = append(append([]string{}, keyedOutFromV151...), clusterupgrade.StepUpdateLocalRKEStateSecret)

// want is every sub-step in state, but those in except, and those skippedOnSeeded,
// Skipped.
func want(state clusterupgrade.StepState, except map[string]clusterupgrade.StepState) []string {
	var out []string
	for _, n := range clusterupgrade.StepNames() {
		s := state
		if slices.Contains(skippedOnSeeded, n) {
			s = clusterupgrade.StateSkipped
		}
		if e, ok := except[n]; ok {
			s = e
		}
		out = append(out, n+"="+string(s))
	}
	return out
}

func chart(name string) *managementv3.ManagedChart {
	GinkgoHelper()
	mc := &managementv3.ManagedChart{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: name}, mc)).To(Succeed())
	return mc
}

func deployment(name string) *appsv1.Deployment {
	GinkgoHelper()
	d := &appsv1.Deployment{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.CattleSystem, Name: name}, d)).To(Succeed())
	return d
}

func clusterRepo() *catalogv1.ClusterRepo {
	GinkgoHelper()
	r := &catalogv1.ClusterRepo{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: rancher.HarvesterChartsRepo}, r)).To(Succeed())
	return r
}

func localCluster() *provisioningv1.Cluster {
	GinkgoHelper()
	c := &provisioningv1.Cluster{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}, c)).To(Succeed())
	return c
}

func serverVersion() string {
	GinkgoHelper()
	s := &managementv3.Setting{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: rancher.ServerVersionSetting}, s)).To(Succeed())
	return s.Value
}

// resourceVersions are the resourceVersions of every Rancher object Seed creates: equal
// before and after means nothing was written.
func resourceVersions() map[string]string {
	GinkgoHelper()
	out := map[string]string{}
	for _, n := range []string{rancher.HarvesterCRDChart, rancher.HarvesterChart, rancher.MonitoringCRDChart, rancher.LoggingCRDChart} {
		out["chart/"+n] = chart(n).ResourceVersion
	}
	for _, n := range []string{rancher.RancherDeployment, rancher.ClusterRepoDeployment} {
		out["deployment/"+n] = deployment(n).ResourceVersion
	}
	out["clusterrepo"] = clusterRepo().ResourceVersion
	out["cluster"] = localCluster().ResourceVersion
	s := &managementv3.Setting{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: rancher.ServerVersionSetting}, s)).To(Succeed())
	out["setting"] = s.ResourceVersion
	out["overcommit"] = overcommitConfig().ResourceVersion
	out["kubevirt"] = kubevirtCR().ResourceVersion
	return out
}

// settle lets the Rancher simulator finish what it does after Seed.
func settle() {
	GinkgoHelper()
	Eventually(func() error {
		ok, msg, err := clusterupgrade.ManagedChartsReady(ctx, env.Client)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New(msg)
		}
		return nil
	}).Should(Succeed())
	time.Sleep(200 * time.Millisecond)
}

// runJob starts jobs for the spec, runs the cluster upgrade as the Job the builder makes
// for plan, waits for it to succeed, and returns its steps' states.
func runJob(jobs *sim.ClusterUpgradeJobs, plan string) []string {
	GinkgoHelper()
	jobCtx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	jobs.Start(jobCtx)
	in := input("")
	in.Timeout = 0
	// The files come from the release's upgrade image, through the Job's init container.
	in.ReleaseFiles = ""
	job := clusterupgrade.Job(clusterupgrade.JobInput{Plan: plan, Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", UpgradeImage: "rancher/harvester-upgrade:" + newRelease.Version, Input: in})
	Expect(env.Client.Create(ctx, job)).To(Succeed())
	Eventually(func() bool {
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(job), job)).To(Succeed())
		done, failed, msg := clusterupgrade.JobState(job)
		ended, _ := jobs.Ended(job.Namespace, job.Name)
		Expect(failed).To(BeFalse(), "%s; the program ended: %s", msg, ended)
		return done
	}).WithTimeout(30 * time.Second).Should(BeTrue())
	steps, err := clusterupgrade.ReadProgress(ctx, env.Client, clusterupgrade.ProgressKey("", plan))
	Expect(err).NotTo(HaveOccurred())
	return states(steps)
}

var _ = Describe("Run", Ordered, func() {
	It("upgrades every part, in order, to the new release", func() {
		seed(oldRelease)
		settle()
		monitoring := chart(rancher.MonitoringCRDChart)
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, env.Client, input("up-full"), p)).To(Succeed())

		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(states(steps)).To(Equal(want(clusterupgrade.StateDone, nil)))
		for i := 1; i < len(steps); i++ {
			Expect(steps[i].Time.Before(&steps[i-1].Time)).To(BeFalse(), "%s finished before %s", steps[i].Name, steps[i-1].Name)
		}

		Expect(serverVersion()).To(Equal("v2.12.0"))
		Expect(deployment(rancher.RancherDeployment).Spec.Template.Spec.Containers[0].Image).To(Equal("rancher/rancher:v2.12.0"))
		Expect(deployment(rancher.ClusterRepoDeployment).Spec.Template.Spec.Containers[0].Image).To(Equal("rancher/harvester-cluster-repo:v1.6.0"))
		cl := localCluster()
		Expect(cl.Labels).To(HaveKeyWithValue(rancher.ManagementClusterNameLabel, "local"))
		Expect(cl.Status.FleetWorkspaceName).To(Equal("fleet-local"))
		Expect(cl.Spec.KubernetesVersion).To(Equal("v1.34.3+rke2r3"), "the label patch kept the spec (Seed's default RKE2)")
		repo := clusterRepo()
		Expect(repo.Spec.ForceUpdate).NotTo(BeNil())
		Expect(repo.Status.DownloadTime.Before(repo.Spec.ForceUpdate)).To(BeFalse())
		// harvester-crd: paused (2), upgraded (3); harvester: paused (2), KubeVirt's
		// workload update methods emptied and deployed (3), paused again (4), upgraded (5).
		for n, generation := range map[string]int64{rancher.HarvesterCRDChart: 3, rancher.HarvesterChart: 5} {
			mc := chart(n)
			Expect(mc.Spec.Version).To(Equal("1.6.0"), n)
			Expect(mc.Spec.Paused).To(BeFalse(), n)
			Expect(mc.Generation).To(Equal(generation), n)
			Expect(mc.Status.ObservedGeneration).To(Equal(generation), n)
			Expect(mc.Spec.TimeoutSeconds).To(Equal(601), n)
			Expect(mc.Annotations).To(HaveKeyWithValue("upgrade.harvesterhci.io/last-upgrade-name", "up-full"))
			Expect(mc.Annotations).To(HaveKeyWithValue("upgrade.harvesterhci.io/last-upgrade-target-version", "1.6.0"), "the chart's version, as the script writes it")
		}
		Expect(string(chart(rancher.HarvesterChart).Spec.Values.Raw)).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":[]}}}}`),
			"KubeVirt's workload updates stay off until the roll ends (fact 13)")
		// rancher-monitoring-crd and rancher-logging-crd: paused (2), upgraded and un-paused
		// (3), as upgrade_monitoring and upgrade_logging_event_audit do (fact 27).
		for n, v := range map[string]string{rancher.MonitoringCRDChart: newRelease.MonitoringChart, rancher.LoggingCRDChart: newRelease.LoggingChart} {
			mc := chart(n)
			Expect(mc.Spec.Version).To(Equal(v), n)
			Expect(mc.Spec.Paused).To(BeFalse(), n)
			Expect(mc.Generation).To(BeEquivalentTo(3), n)
			Expect(mc.Annotations).To(HaveKeyWithValue("upgrade.harvesterhci.io/last-upgrade-target-version", v), n)
		}
		Expect(monitoring.Spec.Version).To(Equal("105.1.2+up61.3.2"), "seeded at the old release's")
		Expect(chart(rancher.HarvesterCRDChart).Annotations[clusterupgrade.FromGenerationAnnotation]).To(Equal("2"), "paused at 2 before its upgrade")
	})

	It("fails naming the chart whose deployment fails, and a second run resumes without redoing finished work", func() {
		r := seed(oldRelease)
		settle()
		r.FailChartVersion(rancher.HarvesterChart, "1.6.0", "helm upgrade: rendered manifests contain a resource that already exists")
		p := newProgress()
		err := clusterupgrade.Run(ctx, env.Client, input("up-resume"), p)
		Expect(err).To(MatchError(And(
			ContainSubstring("UpgradeHarvesterChart"),
			ContainSubstring("ManagedChart fleet-local/harvester"),
			ContainSubstring("failed to deploy version 1.6.0"),
			ContainSubstring("rendered manifests contain a resource that already exists"),
			Not(ContainSubstring("gave up waiting")))))
		steps, rerr := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(rerr).NotTo(HaveOccurred())
		Expect(states(steps)).To(Equal(want(clusterupgrade.StateDone, map[string]clusterupgrade.StepState{
			clusterupgrade.StepUpgradeHarvesterChart: clusterupgrade.StateFailed, clusterupgrade.StepWaitKubeVirt: clusterupgrade.StatePending,
			clusterupgrade.StepSyncContainerdRegistry: clusterupgrade.StatePending,
			clusterupgrade.StepWaitLonghorn:           clusterupgrade.StatePending, clusterupgrade.StepUpgradeMonitoringCRDChart: clusterupgrade.StatePending,
			clusterupgrade.StepUpgradeLoggingCRDChart: clusterupgrade.StatePending, clusterupgrade.StepUpgradeAddons: clusterupgrade.StatePending,
			clusterupgrade.StepWaitFleetBundles: clusterupgrade.StatePending})))
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeHarvesterChart).Message).To(ContainSubstring("already exists"))

		crd, harvester, rancherDep, repo := chart(rancher.HarvesterCRDChart), chart(rancher.HarvesterChart), deployment(rancher.RancherDeployment), clusterRepo()
		clusterRV := localCluster().ResourceVersion
		Expect(harvester.Generation).To(Equal(int64(5)), "paused, its KubeVirt methods emptied and deployed, paused again, upgraded")

		r.ClearChartFailure(rancher.HarvesterChart)
		Expect(clusterupgrade.Run(ctx, env.Client, input("up-resume"), p)).To(Succeed())
		steps, rerr = clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(rerr).NotTo(HaveOccurred())
		Expect(states(steps)).To(Equal(want(clusterupgrade.StateDone, nil)))
		for _, s := range steps {
			if s.Name == clusterupgrade.StepUpgradeHarvesterChart {
				break
			}
			if slices.Contains(keyedOutFromV151, s.Name) {
				Expect(s.Message).To(ContainSubstring("v1.5.1 before this upgrade to v1.6.0, not a hop"), s.Name)
				continue
			}
			if s.Name == clusterupgrade.StepUpdateLocalRKEStateSecret {
				Expect(s.Message).To(ContainSubstring("is of type " + rancher.RKEClusterStateType))
				continue
			}
			Expect(s.Message).To(ContainSubstring("done by an earlier run"), s.Name)
		}
		Expect(chart(rancher.HarvesterCRDChart).ResourceVersion).To(Equal(crd.ResourceVersion), "harvester-crd was not patched again")
		Expect(chart(rancher.HarvesterChart).Generation).To(Equal(harvester.Generation), "harvester was awaited, not patched again")
		Expect(deployment(rancher.RancherDeployment).ResourceVersion).To(Equal(rancherDep.ResourceVersion))
		Expect(clusterRepo().Spec.ForceUpdate.Equal(repo.Spec.ForceUpdate)).To(BeTrue(), "the index was not refreshed again")
		Expect(localCluster().ResourceVersion).To(Equal(clusterRV))
		Expect(chart(rancher.HarvesterChart).Status.Summary.Ready).To(Equal(1))
	})

	It("resumes a run cut off while it waited for a chart by waiting again, not patching again", func() {
		r := seed(oldRelease)
		settle()
		r.FailChartVersion(rancher.HarvesterCRDChart, "1.6.0", "not yet")
		p := newProgress()
		in := input("up-cut")
		in.ChartFailAfter = time.Hour
		in.Timeout = 15 * time.Second // the chart never settles: the run always ends waiting for it
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(MatchError(ContainSubstring("gave up waiting for ManagedChart fleet-local/harvester-crd")))
		gen := chart(rancher.HarvesterCRDChart).Generation
		Expect(gen).To(Equal(int64(3)), "paused, then upgraded")
		r.ClearChartFailure(rancher.HarvesterCRDChart)
		in.Timeout = 30 * time.Second
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(Succeed())
		Expect(chart(rancher.HarvesterCRDChart).Generation).To(Equal(gen))
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeHarvesterCRDChart).State).To(Equal(clusterupgrade.StateDone))
		Expect(chart(rancher.HarvesterCRDChart).Annotations[clusterupgrade.FromGenerationAnnotation]).To(Equal("2"), "the second run kept the generation the first started from")
	})

	It("waits for the chart index download before it upgrades the charts, and a second run waits for the same refresh", func() {
		// The download does not end until the spec lets it: the first run ends while it
		// runs however long the run takes to reach it on a loaded machine.
		r := seed(oldRelease, func(r *sim.Rancher) { r.DownloadDelay = time.Hour })
		settle()
		p := newProgress()
		in := input("up-download")
		in.Timeout = 30 * time.Second
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(MatchError(And(
			ContainSubstring("RefreshHarvesterCharts"), ContainSubstring("gave up waiting for ClusterRepo harvester-charts"))))
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		from := slices.Index(clusterupgrade.StepNames(), clusterupgrade.StepRefreshHarvesterCharts)
		Expect(states(steps)[from]).To(Equal("RefreshHarvesterCharts=Failed"))
		Expect(states(steps)[from+1:]).To(HaveEach(HaveSuffix("=Pending")), "nothing after it ran")
		Expect(chart(rancher.HarvesterCRDChart).Spec.Version).To(Equal("1.5.1"), "no chart was upgraded before the index was downloaded")
		forced := clusterRepo().Spec.ForceUpdate
		Expect(forced).NotTo(BeNil())

		r.SetDownloadDelay(time.Second) // asked for more than a second ago: it ends now
		in.Timeout = 60 * time.Second
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(Succeed())
		Expect(clusterRepo().Spec.ForceUpdate.Equal(forced)).To(BeTrue(), "the refresh the first run asked for was awaited, not asked again")
	})

	It("skips every upgrade on a cluster already at the release, and still turns off for the roll what the roll needs off (facts 11, 13)", func() {
		seed(newRelease)
		settle()
		// The local cluster as an earlier upgrade left it.
		cl := localCluster()
		before := cl.DeepCopy()
		cl.Labels = map[string]string{rancher.ManagementClusterNameLabel: "local"}
		Expect(env.Client.Patch(ctx, cl, client.MergeFrom(before))).To(Succeed())
		before = cl.DeepCopy()
		cl.Status.FleetWorkspaceName = "fleet-local"
		Expect(env.Client.Status().Patch(ctx, cl, client.MergeFrom(before))).To(Succeed())
		createMultusConfig("failurePolicy", "abort") // as the earlier upgrade left it (fact 9)
		ing := &networkingv1.Ingress{}
		Expect(env.Client.Get(ctx, clusterupgrade.RancherExposeKey, ing)).To(Succeed())
		ing.Spec.IngressClassName = ptr.To("nginx") // as the earlier upgrade left it (fact 21)
		Expect(env.Client.Update(ctx, ing)).To(Succeed())
		atReleaseFiles() // facts 22, 29
		registry := &harvesterapi.Setting{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: clusterupgrade.ContainerdRegistrySetting}, registry)).To(Succeed())
		registry.Annotations = map[string]string{clusterupgrade.UpgradePatchedAnnotation: newRelease.Version} // fact 24
		Expect(env.Client.Update(ctx, registry)).To(Succeed())
		settle()

		rvs := resourceVersions()
		p := newProgress()
		var log bytes.Buffer
		p.Log = &log
		Expect(clusterupgrade.Run(ctx, env.Client, input("up-noop"), p)).To(Succeed())
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(states(steps)).To(Equal(want(clusterupgrade.StateSkipped, map[string]clusterupgrade.StepState{
			clusterupgrade.StepPauseCharts: clusterupgrade.StateDone, clusterupgrade.StepDisableKubeVirtWorkloadUpdates: clusterupgrade.StateDone,
			clusterupgrade.StepWaitFleetBundles: clusterupgrade.StateDone})))
		after := resourceVersions()
		for _, k := range []string{"deployment/" + rancher.RancherDeployment, "deployment/" + rancher.ClusterRepoDeployment, "clusterrepo", "cluster", "setting"} {
			Expect(after[k]).To(Equal(rvs[k]), k)
		}
		for _, n := range []string{rancher.HarvesterCRDChart, rancher.HarvesterChart} {
			mc := chart(n)
			Expect(mc.Spec.Paused).To(BeFalse(), n)
			Expect(mc.Annotations).NotTo(HaveKey(clusterupgrade.FromGenerationAnnotation), "%s was not upgraded again", n)
		}
	})

	It("refuses bad input before it changes anything", func() {
		seed(oldRelease)
		settle()
		rvs := resourceVersions()
		p := newProgress()
		in := input("up-bad")
		in.HarvesterVersion = "1.6"
		in.HarvesterChartVersion = ""
		err := clusterupgrade.Run(ctx, env.Client, in, p)
		Expect(err).To(MatchError(And(ContainSubstring("bad input"), ContainSubstring("--harvester-version \"1.6\""), ContainSubstring("--harvester-chart-version"))))
		Expect(resourceVersions()).To(Equal(rvs))
		Expect(apierrors.IsNotFound(env.Client.Get(ctx, p.ConfigMap, &corev1.ConfigMap{}))).To(BeTrue(), "no progress ConfigMap")

		in = input("up-bad")
		in.PreviousVersion = ""
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(MatchError(And(ContainSubstring("bad input"), ContainSubstring("--previous-version is required"))))
		in.PreviousVersion = "1.7"
		in.KubeVirtVersion = "v1.6 0"
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(MatchError(And(ContainSubstring(`--previous-version "1.7" must be a release`), ContainSubstring(`--kubevirt-version "v1.6 0"`))))
		Expect(resourceVersions()).To(Equal(rvs))
		Expect(overcommitConfig().ResourceVersion).To(Equal(rvs["overcommit"]))
		Expect(apierrors.IsNotFound(env.Client.Get(ctx, p.ConfigMap, &corev1.ConfigMap{}))).To(BeTrue(), "no progress ConfigMap")

		bad := newProgress()
		bad.ConfigMap.Name = ""
		Expect(clusterupgrade.Run(ctx, env.Client, input("up-bad"), bad)).To(MatchError(ContainSubstring("--progress-name")))
		Expect(resourceVersions()).To(Equal(rvs))
	})

	It("reports every ManagedChart ready, or which one is not", func() {
		r := seed(oldRelease)
		settle()
		ok, msg, err := clusterupgrade.ManagedChartsReady(ctx, env.Client)
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue(), msg)
		r.FailChart(rancher.LoggingCRDChart, "boom")
		mc := chart(rancher.LoggingCRDChart)
		before := mc.DeepCopy()
		mc.Spec.TimeoutSeconds++
		Expect(env.Client.Patch(ctx, mc, client.MergeFrom(before))).To(Succeed())
		Eventually(func() string {
			_, msg, _ := clusterupgrade.ManagedChartsReady(ctx, env.Client)
			return msg
		}).Should(ContainSubstring("rancher-logging-crd: 0 of 1 ready, 1 unavailable: ErrApplied(1) [Cluster fleet-local/local: boom]"))
		ok, _, _ = clusterupgrade.ManagedChartsReady(ctx, env.Client)
		Expect(ok).To(BeFalse())
	})

	It("runs as a Job through simulators driven by the events of their informers, not by their Interval", func() {
		informers, err := env.StartCache(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(informers.Stop)
		// One pass each at the start; the next one without an event an hour later.
		seed(oldRelease, func(r *sim.Rancher) { r.Cache, r.Interval = informers, time.Hour })
		settle()
		jobs := &sim.ClusterUpgradeJobs{Kubeconfig: env.Kubeconfig, Client: env.Client, Cache: informers, Interval: time.Hour}
		Expect(runJob(jobs, "up-job-events")).To(Equal(want(clusterupgrade.StateDone, nil)))
		Expect(serverVersion()).To(Equal("v2.12.0"), "Rancher rolled out and wrote its version")
		Expect(jobs.Runs()).To(Equal(1))
	})

	It("runs as the Job the builder makes, through the simulator's Job runner", func() {
		seed(oldRelease)
		settle()
		jobs := &sim.ClusterUpgradeJobs{Kubeconfig: env.Kubeconfig, Client: env.Client}
		Expect(runJob(jobs, "up-job")).To(Equal(want(clusterupgrade.StateDone, nil)))
		Expect(chart(rancher.HarvesterChart).Annotations).To(HaveKeyWithValue("upgrade.harvesterhci.io/last-upgrade-name", "up-job"))

		// A Job with arguments the program refuses fails with its usage message: the Job
		// says only what the Job controller says, the failed pod the program's own words.
		bad := clusterupgrade.Job(clusterupgrade.JobInput{Plan: "up-job-bad", Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Input: clusterupgrade.Input{HarvesterVersion: "v1.6.0"}})
		Expect(env.Client.Create(ctx, bad)).To(Succeed())
		Eventually(func() string {
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(bad), bad)).To(Succeed())
			_, failed, msg := clusterupgrade.JobState(bad)
			if !failed {
				return ""
			}
			return msg
		}).Should(Equal("Job harvester-system/up-job-bad-cluster-upgrade failed (BackoffLimitExceeded): Job has reached the specified backoff limit"))
		failures, err := suc.FailedContainers(ctx, env.Client, bad, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(failures).To(HaveLen(1))
		Expect(failures[0].Container).To(Equal("apply"))
		Expect(failures[0].ExitCode).To(BeEquivalentTo(nodeprogram.ExitUsage))
		Expect(failures[0].Words()).To(And(HavePrefix("capi-inplace node cluster-upgrade: "), ContainSubstring("--rancher-version")))
		Expect(jobs.Runs()).To(Equal(2))
	})

	It("runs nothing while the release's upgrade image cannot be pulled, and the Job fails at its deadline naming the image", func() {
		seed(oldRelease)
		settle()
		jobCtx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		jobs := &sim.ClusterUpgradeJobs{Kubeconfig: env.Kubeconfig, Client: env.Client}
		jobs.Start(jobCtx)
		in := input("")
		in.Timeout, in.ReleaseFiles = 0, ""
		job := clusterupgrade.Job(clusterupgrade.JobInput{Plan: "up-job-pull", Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0",
			UpgradeImage: "registry.example.com/unknown:v1.6.0", ActiveDeadline: 2 * time.Second, Input: in})
		Expect(job.Spec.Template.Spec.InitContainers).To(HaveLen(3), "the release's files, then the program and Rancher's installer image")
		Expect(job.Spec.Template.Spec.InitContainers[0].Image).To(Equal("registry.example.com/unknown:v1.6.0"))
		Expect(env.Client.Create(ctx, job)).To(Succeed())
		Eventually(func() string {
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(job), job)).To(Succeed())
			_, failed, msg := clusterupgrade.JobState(job)
			if !failed {
				return ""
			}
			return msg
		}).Should(Equal("Job harvester-system/up-job-pull-cluster-upgrade failed (DeadlineExceeded): Job was active longer than specified deadline"))
		// The Job controller deleted the pod that waited for the image (a real cluster shows
		// why on that pod while it waits, and in its events); the simulator saw why.
		ended, ok := jobs.Ended(job.Namespace, job.Name)
		Expect(ok).To(BeTrue())
		Expect(ended).To(And(ContainSubstring("ErrImagePull"), ContainSubstring("registry.example.com/unknown:v1.6.0")))
		failures, err := suc.FailedContainers(ctx, env.Client, job, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(failures).To(BeEmpty(), "no pod is left of a Job past its deadline")
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, clusterupgrade.ProgressKey("", "up-job-pull"))
		Expect(err).NotTo(HaveOccurred())
		Expect(states(steps)).To(HaveEach(HaveSuffix("=" + string(clusterupgrade.StatePending))))
	})
})
