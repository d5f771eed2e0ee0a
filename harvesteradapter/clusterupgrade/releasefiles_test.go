package clusterupgrade_test

import (
	"io/fs"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// releaseAddon is the add-on file name of the simulated release upgrade image.
func releaseAddon(name string) *harvesterapi.Addon {
	GinkgoHelper()
	a, err := sim.ReleaseAddon(name)
	Expect(err).NotTo(HaveOccurred())
	return a
}

// atReleaseFiles leaves the cluster as an earlier upgrade to the simulated release left
// it: its extra manifests applied, its add-ons at their files.
func atReleaseFiles() {
	GinkgoHelper()
	raw, err := fs.ReadFile(sim.HarvesterUpgradeFiles(), "extra_manifests/cdi/cdi.yaml")
	Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{}
	Expect(yaml.Unmarshal(raw, &u.Object)).To(Succeed())
	Expect(env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(clusterupgrade.ExtraManifestsFieldOwner), client.ForceOwnership)).To(Succeed())
	entries, err := fs.ReadDir(sim.HarvesterUpgradeFiles(), "addons")
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		Expect(env.Client.Create(ctx, releaseAddon(strings.TrimSuffix(e.Name(), ".yaml")))).To(Succeed())
	}
	// kube-ovn's CRD chart at the release's kubeovn-operator version (manage_kubeovn).
	Expect(env.Client.Create(ctx, &managementv3.ManagedChart{
		ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: "kubeovn-operator-crd"},
		Spec: managementv3.ManagedChartSpec{Chart: "kubeovn-operator-crd", ReleaseName: "kubeovn-operator-crd", Version: releaseAddon("kubeovn-operator").Spec.Version,
			DefaultNamespace: "kube-system", RepoName: rancher.HarvesterChartsRepo, TimeoutSeconds: 600},
	})).To(Succeed())
}

func addon(key client.ObjectKey) *harvesterapi.Addon {
	GinkgoHelper()
	a := &harvesterapi.Addon{}
	Expect(env.Client.Get(ctx, key, a)).To(Succeed())
	return a
}

// The release's own files (harvester-release-steps.md facts 22 and 29): the extra
// manifests and the add-ons of its upgrade image.
var _ = Describe("Run and the release's files", Ordered, func() {
	var (
		vmImport    = client.ObjectKey{Namespace: "harvester-system", Name: "vm-import-controller"}
		pcidevices  = client.ObjectKey{Namespace: "harvester-system", Name: "pcidevices-controller"}
		seeder      = client.ObjectKey{Namespace: "harvester-system", Name: "harvester-seeder"}
		descheduler = client.ObjectKey{Namespace: "kube-system", Name: "descheduler"}
	)
	BeforeAll(func() {
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}})).To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))
	})
	It("without the release's files says so and changes no add-on", func() {
		seed(oldRelease)
		settle()
		in := input("up-files-none")
		in.ReleaseFiles = ""
		steps := runStates(in, newProgress())
		for _, n := range []string{clusterupgrade.StepApplyExtraManifests, clusterupgrade.StepUpgradeAddons} {
			Expect(stepNamed(steps, n).State).To(Equal(clusterupgrade.StateSkipped), n)
			Expect(stepNamed(steps, n).Message).To(ContainSubstring("no release files were given"), n)
		}
		list := &harvesterapi.AddonList{}
		Expect(env.Client.List(ctx, list)).To(Succeed())
		Expect(list.Items).To(BeEmpty())
	})

	It("applies the release's extra manifests, brings each add-on to the release's file keeping whether it is enabled, installs a missing one as the file says, and leaves one already there", func() {
		seed(oldRelease)
		settle()
		// The descheduler, enabled, at the old release's chart.
		Expect(env.Client.Create(ctx, &harvesterapi.Addon{ObjectMeta: metav1.ObjectMeta{Namespace: descheduler.Namespace, Name: descheduler.Name},
			Spec: harvesterapi.AddonSpec{Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "descheduler", Version: "0.33.0", Enabled: true, ValuesContent: "old: values\n"}})).To(Succeed())
		// vm-import-controller already at the release's file, enabled by its user.
		atRelease := releaseAddon(vmImport.Name)
		atRelease.Spec.Enabled = true
		Expect(env.Client.Create(ctx, atRelease)).To(Succeed())
		rv := addon(vmImport).ResourceVersion

		p := newProgress()
		steps := runStates(input("up-files"), p)

		By("the extra manifests are applied (fact 22)")
		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: "cdis.cdi.kubevirt.io"}, crd)).To(Succeed())
		Expect(stepNamed(steps, clusterupgrade.StepApplyExtraManifests)).To(HaveField("State", clusterupgrade.StateDone))
		Expect(stepNamed(steps, clusterupgrade.StepApplyExtraManifests).Message).To(ContainSubstring("CustomResourceDefinition cdis.cdi.kubevirt.io"))

		By("the add-ons are at the release's files (fact 29)")
		d := addon(descheduler)
		want := releaseAddon(descheduler.Name)
		Expect(d.Spec.Version).To(Equal(want.Spec.Version))
		Expect(d.Spec.Version).NotTo(Equal("0.33.0"), "the fixture's version differs from the seeded one")
		Expect(d.Spec.ValuesContent).To(Equal(want.Spec.ValuesContent))
		Expect(d.Spec.Enabled).To(BeTrue(), "the descheduler stays enabled: whether it is enabled is its user's")
		for _, k := range []client.ObjectKey{pcidevices, seeder} {
			a, want := addon(k), releaseAddon(k.Name)
			Expect(a.Spec).To(Equal(want.Spec), "%s installed as the release's file says", k)
			Expect(a.Spec.Enabled).To(BeFalse(), k.String())
		}
		Expect(addon(vmImport).ResourceVersion).To(Equal(rv), "an add-on already at the release is not written")
		Expect(addon(vmImport).Spec.Enabled).To(BeTrue())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).Message).To(And(
			ContainSubstring("descheduler "+want.Spec.Version+" (was 0.33.0)"),
			ContainSubstring("pcidevices-controller installed at "),
			ContainSubstring("already at the release: vm-import-controller at ")))

		By("a second run finds them there")
		steps = runStates(input("up-files"), p)
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons)).To(HaveField("State", clusterupgrade.StateDone))
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).Message).To(ContainSubstring("(done by an earlier run)"))
	})

	It("edits the values of rancher-monitoring, rancher-logging and nvidia-driver-toolkit as the release does, keeping what their users set", func() {
		seed(oldRelease)
		settle()
		monitoring := client.ObjectKey{Namespace: "cattle-monitoring-system", Name: "rancher-monitoring"}
		logging := client.ObjectKey{Namespace: "cattle-logging-system", Name: "rancher-logging"}
		nvidia := client.ObjectKey{Namespace: "harvester-system", Name: "nvidia-driver-toolkit"}
		kubeOVN := client.ObjectKey{Namespace: "kube-system", Name: "kubeovn-operator"}
		for _, ns := range []string{monitoring.Namespace, logging.Namespace} {
			Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))
		}
		// As a user left them on a v1.6 cluster: monitoring with their own retention and
		// without the keys v1.7 added, logging with its eventrouter and their own limits,
		// the NVIDIA toolkit pointing at their driver.
		seeded := []*harvesterapi.Addon{
			{ObjectMeta: metav1.ObjectMeta{Namespace: monitoring.Namespace, Name: monitoring.Name}, Spec: harvesterapi.AddonSpec{
				Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "rancher-monitoring", Version: "105.1.0+up61.3.2", Enabled: true,
				ValuesContent: "prometheus:\n  prometheusSpec:\n    retention: 30d\n"}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: logging.Namespace, Name: logging.Name}, Spec: harvesterapi.AddonSpec{
				Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "rancher-logging", Version: "105.1.0+up4.10.0", Enabled: false,
				ValuesContent: "fluentd:\n  resources:\n    limits:\n      memory: 1600Mi\neventTailer:\n  workloadOverrides:\n    containers:\n    - image: rancher/harvester-eventrouter:v0.1.2\n      name: event-tailer\n"}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: nvidia.Namespace, Name: nvidia.Name}, Spec: harvesterapi.AddonSpec{
				Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "nvidia-driver-runtime", Version: "0.1.1", Enabled: true,
				ValuesContent: "driverLocation: http://files.example.com/NVIDIA-Linux-x86_64-570.run\nfullnameOverride: nvidia-driver-runtime\n"}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: kubeOVN.Namespace, Name: kubeOVN.Name}, Spec: harvesterapi.AddonSpec{
				Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "kubeovn-operator", Version: "1.13.0", Enabled: true,
				ValuesContent: "their: own\n"}},
		}
		for _, a := range seeded {
			Expect(env.Client.Create(ctx, a)).To(Succeed())
			DeferCleanup(func() { _ = env.Client.Delete(ctx, a) })
		}
		in := input("up-valued-addons")
		in.LoggingEventRouterImage = "rancher/harvester-eventrouter:v0.3.3"
		p := newProgress()
		steps := runStates(in, p)

		values := func(key client.ObjectKey) map[string]any {
			GinkgoHelper()
			v := map[string]any{}
			Expect(yaml.Unmarshal([]byte(addon(key).Spec.ValuesContent), &v)).To(Succeed())
			return v
		}
		By("rancher-monitoring: the monitoring chart, the two keys v1.7 added, the user's retention kept")
		Expect(addon(monitoring).Spec.Version).To(Equal(in.MonitoringChartVersion))
		Expect(addon(monitoring).Spec.Enabled).To(BeTrue())
		m := values(monitoring)
		Expect(m).To(HaveKeyWithValue("rancherMonitoring", map[string]any{"enabled": false}))
		Expect(m).To(HaveKeyWithValue("kube-state-metrics", map[string]any{"metricLabelsAllowlist": []any{"nodes=[*]"}}))
		Expect(m).To(HaveKeyWithValue("prometheus", map[string]any{"prometheusSpec": map[string]any{"retention": "30d"}}))

		By("rancher-logging: the logging chart, the release's eventrouter, the user's limits kept")
		Expect(addon(logging).Spec.Version).To(Equal(in.LoggingChartVersion))
		l := values(logging)
		Expect(l["eventTailer"]).To(HaveKeyWithValue("workloadOverrides", HaveKeyWithValue("containers", ConsistOf(
			map[string]any{"image": "rancher/harvester-eventrouter:v0.3.3", "name": "event-tailer"}))))
		Expect(l["fluentd"]).To(HaveKeyWithValue("resources", HaveKeyWithValue("limits", HaveKeyWithValue("memory", "1600Mi"))))

		By("nvidia-driver-toolkit: the release's file with the user's driver location in place of its placeholder")
		want := releaseAddon(nvidia.Name)
		Expect(want.Spec.ValuesContent).To(ContainSubstring("HTTPENDPOINT/NVIDIA-Linux-x86_64-vgpu-kvm.run"), "the fixture has the release's placeholder")
		Expect(addon(nvidia).Spec.Version).To(Equal(want.Spec.Version))
		Expect(addon(nvidia).Spec.Enabled).To(BeTrue())
		Expect(values(nvidia)).To(HaveKeyWithValue("driverLocation", "http://files.example.com/NVIDIA-Linux-x86_64-570.run"))
		Expect(values(nvidia)).To(HaveKeyWithValue("image", HaveKeyWithValue("tag", "v1.8.1")))
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).Message).To(And(
			ContainSubstring("rancher-monitoring "+in.MonitoringChartVersion+" (was 105.1.0+up61.3.2) with its values edited as the release does"),
			ContainSubstring("rancher-logging "+in.LoggingChartVersion+" (was 105.1.0+up4.10.0) with its values edited as the release does"),
			ContainSubstring("nvidia-driver-toolkit "+want.Spec.Version+" (was 0.1.1)")))

		By("kube-ovn: its CRD chart at the release's kubeovn-operator version, deployed, then the add-on's version, its values kept")
		ovn := releaseAddon(kubeOVN.Name)
		chart := &managementv3.ManagedChart{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: "kubeovn-operator-crd"}, chart)).To(Succeed())
		Expect(chart.Spec.Version).To(Equal(ovn.Spec.Version))
		Expect(chart.Spec.RepoName).To(Equal(rancher.HarvesterChartsRepo))
		Expect(chart.Status.Summary.Ready).To(Equal(1), "Fleet deployed it")
		Expect(addon(kubeOVN).Spec.Version).To(Equal(ovn.Spec.Version))
		Expect(addon(kubeOVN).Spec.ValuesContent).To(Equal("their: own\n"))
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).Message).To(ContainSubstring(
			"ManagedChart kubeovn-operator-crd created at " + ovn.Spec.Version + ", kubeovn-operator " + ovn.Spec.Version + " (was 1.13.0) (kubeovn-operator-crd ready)"))

		By("a run for another plan finds them at the release and writes none of them")
		rvs := map[client.ObjectKey]string{}
		for _, k := range []client.ObjectKey{monitoring, logging, nvidia, kubeOVN} {
			rvs[k] = addon(k).ResourceVersion
		}
		steps = runStates(in, newProgress())
		for k, rv := range rvs {
			Expect(addon(k).ResourceVersion).To(Equal(rv), "%s not written again", k)
		}
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).Message).To(ContainSubstring("rancher-monitoring at " + in.MonitoringChartVersion))
	})
})

// sync_containerd_registry_to_rancher (harvester-release-steps.md fact 24).
var _ = Describe("Run and the containerd registries", func() {
	setting := func() *harvesterapi.Setting {
		GinkgoHelper()
		s := &harvesterapi.Setting{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: clusterupgrade.ContainerdRegistrySetting}, s)).To(Succeed())
		return s
	}

	It("annotates Harvester's containerd-registry Setting when Rancher has no registries, so that Harvester's controller syncs them", func() {
		seed(oldRelease)
		settle()
		Expect(setting().Annotations).NotTo(HaveKey(clusterupgrade.UpgradePatchedAnnotation))
		steps := runStates(input("up-registry"), newProgress())
		Expect(setting().Annotations).To(HaveKeyWithValue(clusterupgrade.UpgradePatchedAnnotation, newRelease.Version))
		Expect(stepNamed(steps, clusterupgrade.StepSyncContainerdRegistry)).To(HaveField("State", clusterupgrade.StateDone))
	})

	It("leaves the Setting when Rancher already has the registries", func() {
		seed(oldRelease)
		settle()
		cl := &provisioningv1.Cluster{}
		Expect(env.Client.Get(ctx, rancher.LocalClusterKey, cl)).To(Succeed())
		before := cl.DeepCopy()
		cl.Spec.RKEConfig.Registries = &apiextensionsv1.JSON{Raw: []byte(`{"mirrors":{"docker.io":{"endpoints":["https://mirror.example.com"]}}}`)}
		Expect(env.Client.Patch(ctx, cl, client.MergeFrom(before))).To(Succeed())
		steps := runStates(input("up-registry-set"), newProgress())
		Expect(setting().Annotations).NotTo(HaveKey(clusterupgrade.UpgradePatchedAnnotation))
		Expect(stepNamed(steps, clusterupgrade.StepSyncContainerdRegistry)).To(HaveField("State", clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepSyncContainerdRegistry).Message).To(ContainSubstring("already has spec.rkeConfig.registries (1 keys)"))
	})
})

// wait_for_fleet_bundles (harvester-release-steps.md fact 31).
var _ = Describe("Run and Fleet's bundles", func() {
	bundle := func(name, ready, message string) {
		GinkgoHelper()
		b := &fleetv1alpha1.Bundle{ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: name}}
		Expect(env.Client.Create(ctx, b)).To(Succeed())
		DeferCleanup(func() { Expect(env.Client.Delete(ctx, b)).To(Succeed()) })
		b.Status.Conditions = []genericcondition.GenericCondition{{Type: "Ready", Status: corev1.ConditionStatus(ready), Message: message}}
		Expect(env.Client.Status().Update(ctx, b)).To(Succeed())
	}

	It("waits a bounded time for a bundle that is not ready, then ends without failing and names it", func() {
		seed(oldRelease)
		settle()
		bundle("mcc-harvester", "True", "")
		bundle("mcc-rancher-logging-crd", "False", "NotReady(1) [Cluster fleet-local/local]")
		in := input("up-bundles")
		in.FleetBundlesWait = 500 * time.Millisecond
		start := time.Now()
		steps := runStates(in, newProgress())
		s := stepNamed(steps, clusterupgrade.StepWaitFleetBundles)
		Expect(s.State).To(Equal(clusterupgrade.StateDone))
		Expect(s.Message).To(And(ContainSubstring("gave up waiting for Fleet's bundles after 500ms"),
			ContainSubstring("fleet-local/mcc-rancher-logging-crd (NotReady(1) [Cluster fleet-local/local])"), Not(ContainSubstring("mcc-harvester"))))
		Expect(time.Since(start)).To(BeNumerically(">=", 500*time.Millisecond), "it waited")
	})

	It("ends as soon as every bundle is ready", func() {
		seed(oldRelease)
		settle()
		bundle("mcc-harvester", "True", "")
		in := input("up-bundles-ready")
		in.FleetBundlesWait = time.Hour
		steps := runStates(in, newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepWaitFleetBundles).Message).To(Equal("all 1 of Fleet's bundles are ready"))
	})
})
