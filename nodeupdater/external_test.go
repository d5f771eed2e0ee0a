package nodeupdater_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

const externalGroup = "external.updater.example.com"

// installExternalUpdaterCRD installs the CRD of an updater kind served outside the
// manager, labelled as following the NodeUpdate contract, once per suite.
func installExternalUpdaterCRD() {
	GinkgoHelper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "externalupgraders." + externalGroup,
			Labels: map[string]string{inplacev1.NodeUpdaterCRDLabel: inplacev1.NodeUpdaterContractVersion},
		},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: externalGroup,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: "ExternalUpgrader", ListKind: "ExternalUpgraderList", Plural: "externalupgraders", Singular: "externalupgrader",
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", XPreserveUnknownFields: ptr.To(true)},
					},
				}},
			}},
		},
	}
	if err := k8s.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	Eventually(func(g Gomega) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(crd), got)).To(Succeed())
		established := false
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		g.Expect(established).To(BeTrue())
	}, wait).Should(Succeed())
}

func createExternalConfig(ns, name string, spec map[string]any) {
	GinkgoHelper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": externalGroup + "/v1",
		"kind":       "ExternalUpgrader",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	Eventually(func() error { return k8s.Create(ctx, obj) }, wait).Should(Succeed())
}

var _ = Describe("NodeUpdate reconciler with an external updater", func() {
	var (
		ns  string
		u   *scriptedUpdater
		ref = inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "ext"}
	)

	BeforeEach(func() {
		installExternalUpdaterCRD()
		ns = newNamespace()
		u = newScriptedUpdater("Prepare")
	})

	// actAsExternalUpdater writes status as the external controller does.
	actAsExternalUpdater := func(nu *inplacev1.NodeUpdate, mutate func(*inplacev1.NodeUpdateStatus)) {
		GinkgoHelper()
		Eventually(func() error {
			got := &inplacev1.NodeUpdate{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(nu), got); err != nil {
				return err
			}
			mutate(&got.Status)
			return k8s.Status().Update(ctx, got)
		}, wait).Should(Succeed())
	}

	It("leaves steps and result to the external controller and enforces its timeout", func() {
		createExternalConfig(ns, "ext", map[string]any{"nodeTimeout": "2s"})
		startManager(ns, fastReconciler(u))
		nu := newNodeUpdate(ns, ref)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.UpdaterAvailableCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(inplacev1.ExternalUpdaterReason))
			g.Expect(got.Status.StartTime).NotTo(BeNil())
		}, wait).Should(Succeed())
		Expect(get(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhasePending), "the external controller decides when the node starts")

		actAsExternalUpdater(nu, func(st *inplacev1.NodeUpdateStatus) {
			st.Phase = inplacev1.NodeUpdatePhaseInProgress
			st.Steps = []inplacev1.NodeUpdateStep{
				{Name: "Flash", State: inplacev1.StepStateSucceeded},
				{Name: "Reboot", State: inplacev1.StepStateRunning, Message: "waiting for the node"},
			}
		})
		Consistently(stepStates(nu), 500*time.Millisecond).Should(Equal([]string{"Flash=Succeeded", "Reboot=Running"}))
		Expect(get(nu).Status.CurrentStep).To(Equal("Reboot"))

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := get(nu)
		Expect(got.Status.FailureReason).To(Equal(inplacev1.TimedOutReason))
		Expect(got.Status.FailureMessage).To(HavePrefix("node update did not finish within 2s"))
		Expect(stepStates(nu)(Default)).To(Equal([]string{"Flash=Succeeded", "Reboot=Failed"}))
		Expect(u.snapshot()).To(BeEmpty(), "no updater of the manager is called for an external kind")
	})

	It("lets the external controller confirm an abort, and marks it Aborted itself when it does not", func() {
		createExternalConfig(ns, "ext", map[string]any{})
		r := fastReconciler(u)
		r.ExternalAbortTimeout = 1500 * time.Millisecond
		startManager(ns, r)

		startExternally := func(nu *inplacev1.NodeUpdate) {
			GinkgoHelper()
			Expect(k8s.Create(ctx, nu)).To(Succeed())
			Eventually(func(g Gomega) *metav1.Time { return get(nu).Status.StartTime }, wait).ShouldNot(BeNil())
			actAsExternalUpdater(nu, func(st *inplacev1.NodeUpdateStatus) {
				st.Phase = inplacev1.NodeUpdatePhaseInProgress
				st.Steps = []inplacev1.NodeUpdateStep{{Name: "Reboot", State: inplacev1.StepStateRunning}}
			})
		}

		confirmed := newNodeUpdate(ns, ref)
		startExternally(confirmed)
		requestAbort(confirmed)
		Eventually(func() *metav1.MicroTime { return get(confirmed).Status.AbortStartTime }, wait).ShouldNot(BeNil())
		Expect(get(confirmed).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress), "the external controller stops the node")
		actAsExternalUpdater(confirmed, func(st *inplacev1.NodeUpdateStatus) {
			st.Phase = inplacev1.NodeUpdatePhaseAborted
			st.Steps[0].State = inplacev1.StepStateAborted
			st.Steps[0].Message = "stopped by the external updater"
		})
		Consistently(func() string { return get(confirmed).Status.Steps[0].Message }, 300*time.Millisecond).
			Should(Equal("stopped by the external updater"))

		silent := newNodeUpdate(ns, ref)
		startExternally(silent)
		asked := time.Now()
		requestAbort(silent)
		Eventually(phaseOf(silent), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(time.Since(asked)).To(BeNumerically(">=", 1500*time.Millisecond),
			"the external controller has the abort timeout to stop at a safe point")
		Expect(get(silent).Status.Steps[0].Message).To(Equal("aborted: the external updater did not confirm the abort within 1.5s"))
	})

	It("is the missing-updater case when the kind's CRD is not labelled for the contract", func() {
		startManager(ns, fastReconciler(u))
		// ConfigMap-like kinds of the test API server that no updater serves: CAPI's Cluster
		// has a CRD, but not the label.
		nu := newNodeUpdate(ns, inplacev1.UpdaterReference{Kind: "Cluster", APIGroup: "cluster.x-k8s.io", Name: "workload"})
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(eventsOf(nu), wait).Should(ContainElement(HavePrefix("Warning UpdaterNotFound: no updater serves kind Cluster.cluster.x-k8s.io")))
		Expect(get(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhasePending))
	})
})
