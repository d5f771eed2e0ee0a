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
