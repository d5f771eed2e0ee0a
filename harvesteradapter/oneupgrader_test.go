package harvesteradapter_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesteradapter "github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi/toolkit"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// AnnotationAllowDeletion is the annotation config/policy's upgradeplan-deletion policy
// reads.
const annotationAllowDeletion = "harvester.inplace.cluster.x-k8s.io/allow-deletion"

// deleteRunningPlan deletes an UpgradePlan that is in its cluster or nodes phase the only
// way the shipped admission policy lets it go: refused first, with a message that names
// the phase (either: the plan may move on meanwhile) and the annotation, then annotated
// allow-deletion and deleted.
func deleteRunningPlan(plan *harvesterv1.UpgradePlan) {
	GinkgoHelper()
	err := env.Client.Delete(ctx, plan)
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "deleting a running plan is refused: %v", err)
	Expect(err.Error()).To(And(MatchRegexp("is in phase (ClusterUpgrading|NodeUpgrading)"), ContainSubstring(annotationAllowDeletion+"=true")))
	Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), plan)).To(Succeed())
	Expect(plan.DeletionTimestamp).To(BeNil(), "a refused deletion leaves the plan as it was")
	patch := client.MergeFrom(plan.DeepCopy())
	if plan.Annotations == nil {
		plan.Annotations = map[string]string{}
	}
	plan.Annotations[annotationAllowDeletion] = "true"
	Expect(env.Client.Patch(ctx, plan, patch)).To(Succeed())
	Expect(env.Client.Delete(ctx, plan)).To(Succeed())
}

// stepMessage is the message of the NodeUpdate's step name.
func stepMessage(nu *inplacev1.NodeUpdate, name string) string {
	for _, s := range nu.Status.Steps {
		if s.Name == name {
			return s.Message
		}
	}
	return ""
}

// toolkitPlan creates upgrade-toolkit's UpgradePlan on wl at phase (none when "").
func toolkitPlan(wl *testenv.Environment, name, phase string) (*toolkit.UpgradePlan, error) {
	p := &toolkit.UpgradePlan{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: toolkit.UpgradePlanSpec{Version: ptr.To("v1.8.1")}}
	if err := wl.Client.Create(ctx, p); err != nil {
		return nil, err
	}
	if phase != "" {
		p.Status.CurrentPhase = phase
		if err := wl.Client.Status().Update(ctx, p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func setToolkitPhase(wl *testenv.Environment, p *toolkit.UpgradePlan, phase string) {
	GinkgoHelper()
	Expect(wl.Client.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	p.Status.CurrentPhase = phase
	Expect(wl.Client.Status().Update(ctx, p)).To(Succeed())
}

// guards lists the admission policies plans keep on wl.
func guards(wl *testenv.Environment) []string {
	GinkgoHelper()
	list := &admissionv1.ValidatingAdmissionPolicyList{}
	Expect(wl.Client.List(ctx, list, client.HasLabels{upgradeplan.LabelUpgradePlan})).To(Succeed())
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	return names
}

// freshWorkload is a workload API server of its own, seeded at Harvester v1.7.1: the
// specs below create the cluster-wide objects of other upgraders, which would hold every
// other spec's nodes on the shared one.
func freshWorkload() *testenv.Environment {
	GinkgoHelper()
	wl, err := testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(wl.Stop)
	startRancher(wl)
	return wl
}

// One upgrader at a time (issue #34 point 4): Harvester's own upgrade (an Upgrade in
// harvester-system) and upgrade-toolkit's (an UpgradePlan of management.harvesterhci.io)
// in progress hold capi-inplace, by the rules Harvester itself uses to tell one is in
// progress (harvester-release-steps.md fact 38); capi-inplace's plan keeps both out while
// it runs, through the workload API server's admission; and it cannot be deleted during
// its cluster or nodes phase without allow-deletion (the toolkit's rule, fact 47).
var _ = Describe("One upgrader at a time", func() {
	It("holds its plan and every node while another upgrade runs, keeps new ones out while it runs, refuses its own deletion mid-run without allow-deletion, and lets others in once it is gone", func() {
		wl := freshWorkload()
		theirs, err := toolkitPlan(wl, "hvst-upgrade-toolkit", "ClusterUpgrading")
		Expect(err).NotTo(HaveOccurred())
		harvesters := &harvesterapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: "hvst-upgrade-core", Namespace: harvesterapi.UpgradeNamespace}, Spec: harvesterapi.UpgradeSpec{Version: "v1.8.1"}}
		Expect(wl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: harvesterapi.UpgradeNamespace}})).To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))
		Expect(wl.Client.Create(ctx, harvesters)).To(Succeed(), "an Upgrade Harvester's controller has not labelled yet counts as in progress")

		c := newHarvesterClusterOn(wl, 2, "Harvester v1.7.1", nil)
		plan := &harvesterv1.UpgradePlan{}
		key := client.ObjectKeyFromObject(c.plan)

		By("the plan is held in Initializing by NoOtherUpgrade, naming both")
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			g.Expect(plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanInitializing))
			var check *harvesterv1.PreflightCheck
			for i := range plan.Status.Preflight {
				if plan.Status.Preflight[i].Name == clusterchecks.CheckNoOtherUpgrade {
					check = &plan.Status.Preflight[i]
				}
			}
			g.Expect(check).NotTo(BeNil())
			g.Expect(check.Result).To(Equal(harvesterv1.CheckFailed))
			g.Expect(check.Message).To(And(ContainSubstring("upgrade-toolkit's UpgradePlan hvst-upgrade-toolkit to v1.8.1 (ClusterUpgrading)"),
				ContainSubstring("Harvester's Upgrade harvester-system/hvst-upgrade-core to v1.8.1 (not started)")))
		}).WithPolling(50 * time.Millisecond).Should(Succeed())

		By("no node passes the preflight either")
		checks := c.updater.Preflight(ctx, nodeupdater.PreflightTarget{Namespace: c.ns, ClusterName: c.name, MachineName: "m-" + c.nodes[0], NodeName: c.nodes[0],
			Version: "v1.35.6+rke2r1", UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name}})
		Expect(checks).To(ContainElement(And(
			HaveField("Name", clusterchecks.CheckNoOtherUpgrade), HaveField("Passed", false),
			HaveField("Message", ContainSubstring("hvst-upgrade-toolkit")))))

		By("while the plan holds the cluster, neither Harvester nor the toolkit can start another upgrade: the API server refuses it, naming the plan")
		for _, create := range []func() error{
			func() error {
				_, err := toolkitPlan(wl, "hvst-upgrade-second", "")
				return err
			},
			func() error {
				return wl.Client.Create(ctx, &harvesterapi.Upgrade{ObjectMeta: metav1.ObjectMeta{GenerateName: "hvst-upgrade-", Namespace: harvesterapi.UpgradeNamespace}, Spec: harvesterapi.UpgradeSpec{Version: "v1.8.1"}})
			},
		} {
			Eventually(create).WithPolling(100 * time.Millisecond).Should(MatchError(And(
				ContainSubstring(fmt.Sprintf("UpgradePlan %s/%s is upgrading this cluster", c.ns, c.plan.Name)), ContainSubstring("one upgrader at a time"))))
		}

		By("once both others are final, the plan goes on to its nodes")
		setToolkitPhase(wl, theirs, toolkit.PhaseSucceeded)
		Expect(wl.Client.Get(ctx, client.ObjectKeyFromObject(harvesters), harvesters)).To(Succeed())
		harvesters.Labels = map[string]string{harvesterapi.LabelUpgradeState: harvesterapi.UpgradeStateFailed}
		Expect(wl.Client.Update(ctx, harvesters)).To(Succeed())
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			return plan.Status.Phase
		}, 60*time.Second, 50*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanNodeUpgrading), "plan message: %s", plan.Status.Message)

		By("deleting it in NodeUpgrading is refused without allow-deletion, and then cleans up")
		deleteRunningPlan(plan)
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, key, &harvesterv1.UpgradePlan{}))
		}, 30*time.Second, 50*time.Millisecond).Should(BeTrue())
		Expect(guards(wl)).To(BeEmpty(), "the plan's end removed its admission policy")

		By("with the plan gone, another upgrader may start")
		Eventually(func() error {
			_, err := toolkitPlan(wl, "hvst-upgrade-after", "")
			return err
		}).WithPolling(100 * time.Millisecond).Should(Succeed())
	})

	It("does not cordon a node while another upgrade runs, even when the plan's own check was skipped", func() {
		wl := freshWorkload()
		theirs, err := toolkitPlan(wl, "hvst-upgrade-toolkit", "NodeUpgrading")
		Expect(err).NotTo(HaveOccurred())
		c := newClusterWith(wl, false, 2, "Harvester v1.7.1", nil)
		c.createPlan(nil)
		patch := client.MergeFrom(c.plan.DeepCopy())
		c.plan.Annotations = map[string]string{clusterchecks.SkipCheckAnnotationPrefix + clusterchecks.CheckNoOtherUpgrade: "true"}
		Expect(env.Client.Patch(ctx, c.plan, patch)).To(Succeed())

		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepCordon) == inplacev1.StepStateRunning
		})).To(Succeed())
		By("held before its cordon, naming the toolkit's plan, the node untouched")
		Expect(driveUntil(c.updater, nu, 2*time.Second, nil)).To(MatchError(ContainSubstring("not done")))
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepCordon)).To(Equal(inplacev1.StepStateRunning))
		Expect(stepMessage(nu, harvesteradapter.StepCordon)).To(ContainSubstring("holding node " + node + " before it is cordoned: another upgrader is upgrading this cluster: upgrade-toolkit's UpgradePlan hvst-upgrade-toolkit"))
		n := &corev1.Node{}
		Expect(wl.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Spec.Unschedulable).To(BeFalse())

		By("once it has Failed, the node goes on")
		setToolkitPhase(wl, theirs, toolkit.PhaseFailed)
		Expect(drive(c.updater, nu, 120*time.Second)).To(Succeed())
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepCordon)).To(Equal(inplacev1.StepStateSucceeded))
		Expect(wl.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Status.NodeInfo.KubeletVersion).To(Equal(nu.Spec.Version), "the node was upgraded")
		Expect(n.Spec.Unschedulable).To(BeFalse())
	})
})
