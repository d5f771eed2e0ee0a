package sim_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

var _ = Describe("The Harvester add-on controller simulator (harvester pkg/controller/master/addon at v1.8.2)", func() {
	var (
		addons *sim.HarvesterAddons
		key    client.ObjectKey
	)
	BeforeEach(func() {
		seq++
		key = client.ObjectKey{Namespace: fmt.Sprintf("addons-%d", seq), Name: "rancher-monitoring"}
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: key.Namespace}})).To(Succeed())
		addons = &sim.HarvesterAddons{Client: env.Client, JobDelay: 50 * time.Millisecond}
		runCtx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		addons.Start(runCtx)
	})
	addon := func() *harvesterapi.Addon {
		GinkgoHelper()
		a := &harvesterapi.Addon{}
		Expect(env.Client.Get(ctx, key, a)).To(Succeed())
		return a
	}
	// chartVersion is the version of the add-on's HelmChart, "" when it has none.
	chartVersion := func() string {
		GinkgoHelper()
		hc := &unstructured.Unstructured{}
		hc.SetGroupVersionKind(sim.HelmChartGVK)
		err := env.Client.Get(ctx, key, hc)
		if apierrors.IsNotFound(err) {
			return ""
		}
		Expect(err).NotTo(HaveOccurred())
		v, _, _ := unstructured.NestedString(hc.Object, "spec", "version")
		return v
	}
	state := func() harvesterapi.AddonState { return addon().Status.Status }
	create := func(enabled bool) {
		GinkgoHelper()
		Expect(env.Client.Create(ctx, &harvesterapi.Addon{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec: harvesterapi.AddonSpec{Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "rancher-monitoring", Version: "1.0.0", Enabled: enabled, ValuesContent: "a: 1\n"}})).To(Succeed())
	}
	setVersion := func(version string) {
		GinkgoHelper()
		a := addon()
		before := a.DeepCopy()
		a.Spec.Version = version
		Expect(env.Client.Patch(ctx, a, client.MergeFrom(before))).To(Succeed())
	}

	It("deploys an enabled add-on, and takes a new version through the InProgress condition and AddonUpdating back to AddonDeploySuccessful", func() {
		addons.HoldAddon(key)
		create(true)
		Eventually(state).Should(Equal(harvesterapi.AddonEnabling))
		Expect(chartVersion()).To(Equal("1.0.0"))
		addons.UnholdAddon(key)
		Eventually(state).Should(Equal(harvesterapi.AddonDeployed))
		Expect(addon().Status.IsTrue(harvesterapi.AddonOperationCompleted)).To(BeTrue())

		addons.HoldAddon(key)
		setVersion("2.0.0")
		Eventually(state).Should(Equal(harvesterapi.AddonUpdating))
		Expect(chartVersion()).To(Equal("2.0.0"), "the HelmChart is updated before the status says AddonUpdating")
		Expect(addon().Status.IsTrue(harvesterapi.AddonOperationInProgress)).To(BeTrue())
		addons.UnholdAddon(key)
		Eventually(state).Should(Equal(harvesterapi.AddonDeployed))
		Expect(addon().Status.IsTrue(harvesterapi.AddonOperationInProgress)).To(BeFalse())
		Expect(addon().Status.IsTrue(harvesterapi.AddonOperationCompleted)).To(BeTrue())
	})

	It("leaves an add-on whose new version fails AddonUpdating with OperationFailed, and disables one turned off", func() {
		create(true)
		Eventually(state).Should(Equal(harvesterapi.AddonDeployed))
		addons.FailAddon(key, "2.0.0")
		setVersion("2.0.0")
		Eventually(func() bool { return addon().Status.IsTrue(harvesterapi.AddonOperationFailed) }).Should(BeTrue())
		a := addon()
		Expect(a.Status.Status).To(Equal(harvesterapi.AddonUpdating))
		Expect(a.Status.Condition(harvesterapi.AddonOperationFailed).Message).To(Equal("addon deployment job helm-install-rancher-monitoring failed"))

		before := a.DeepCopy()
		a.Spec.Enabled = false
		Expect(env.Client.Patch(ctx, a, client.MergeFrom(before))).To(Succeed())
		Eventually(state).Should(Equal(harvesterapi.AddonDisabled))
		Expect(chartVersion()).To(BeEmpty(), "the HelmChart is uninstalled")
	})

	It("leaves a disabled add-on without a HelmChart", func() {
		create(false)
		Eventually(state).Should(Equal(harvesterapi.AddonDisabled))
		Expect(chartVersion()).To(BeEmpty())
	})
})
