package harvesteradapter_test

import (
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi/toolkit"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// A node is judged when it is picked, and may wait long after that (its cluster's
// UpgradePlan runs the cluster step first, which upgrades Longhorn). Harvester's pre-drain
// judges the volumes again right before each node is evacuated and drained
// (wait_longhorn_engines, harvester-release-steps.md fact 45).
var _ = Describe("A node's storage judged again right before it is taken down", func() {
	It("holds a node at its cordon while a Longhorn volume is degraded, touching nothing, and goes on once it is healthy", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		vol := "pvc-fresh-" + c.name
		createLonghornVolume(vol, "v1", c.nodes[0], c.nodes[1])
		DeferCleanup(func() { setRobustness(vol, "healthy") }) // the Longhorn of the shared workload cluster stays healthy for other specs
		setRobustness(vol, "degraded")
		startLifecycle(c)
		nu := c.nodeUpdate(c.nodes[0])

		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			g.Expect(nu.Status.CurrentStep).To(Equal(harvesteradapter.StepCordon))
			g.Expect(nodeupdater.Step(nu, harvesteradapter.StepCordon).Message).To(And(
				ContainSubstring("holding node "+c.nodes[0]+" before it is cordoned"),
				ContainSubstring(longhorn.CheckLonghornVolumesHealthy), ContainSubstring(vol)))
		}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
		Consistently(func(g Gomega) {
			node := &corev1.Node{}
			g.Expect(workload.Client.Get(ctx, client.ObjectKey{Name: c.nodes[0]}, node)).To(Succeed())
			g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned while the volume is degraded")
			g.Expect(c.rec.RunsOf(harvesteradapter.PlanName("rke2", nu))).To(BeEmpty())
		}, time.Second, 100*time.Millisecond).Should(Succeed())

		setRobustness(vol, "healthy")
		Eventually(func(g Gomega) inplacev1.NodeUpdatePhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			return nu.Status.Phase
		}, 60*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
	})
})

// setRobustness sets a Longhorn volume's status.robustness.
func setRobustness(name, robustness string) {
	GinkgoHelper()
	vol := &unstructured.Unstructured{}
	vol.SetAPIVersion("longhorn.io/v1beta2")
	vol.SetKind("Volume")
	Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: longhorn.Namespace, Name: name}, vol)).To(Succeed())
	Expect(unstructured.SetNestedField(vol.Object, robustness, "status", "robustness")).To(Succeed())
	Expect(workload.Client.Status().Update(ctx, vol)).To(Succeed())
}

// heldAtCordon waits until nu is held at its Cordon step with a message holding all of
// want, with status.lastCheckTime set, and checks for a second that its node stays
// uncordoned and no Plan of it ran.
func heldAtCordon(c *harvesterCluster, wl client.Client, nu *inplacev1.NodeUpdate, want ...string) {
	GinkgoHelper()
	matchers := make([]types.GomegaMatcher, 0, len(want))
	for _, w := range want {
		matchers = append(matchers, ContainSubstring(w))
	}
	Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		g.Expect(nu.Status.CurrentStep).To(Equal(harvesteradapter.StepCordon))
		g.Expect(nodeupdater.Step(nu, harvesteradapter.StepCordon).Message).To(And(matchers...))
		g.Expect(nu.Status.LastCheckTime).NotTo(BeNil(), "the NodeUpdate shows when it was judged")
	}, 60*time.Second, 50*time.Millisecond).Should(Succeed())
	Consistently(func(g Gomega) {
		node := &corev1.Node{}
		g.Expect(wl.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, node)).To(Succeed())
		g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned while held")
		g.Expect(c.rec.RunsOf(harvesteradapter.PlanName("rke2", nu))).To(BeEmpty())
	}, time.Second, 100*time.Millisecond).Should(Succeed())
}

func succeeded(nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Eventually(func(g Gomega) inplacev1.NodeUpdatePhase {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		return nu.Status.Phase
	}, 90*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
}

// The control plane's rules, judged when a node was picked (ControlPlaneQuorum and
// VersionSkew, docs/upgradetask.md), are judged again on the live nodes right before it
// is taken down (issue #34 point 2).
var _ = Describe("A node's control plane judged again right before it is taken down", func() {
	It("holds a control plane node while another control plane node is down, and a worker while a control plane node runs an older kubelet", func() {
		c := newHarvesterCluster(3, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		for _, n := range c.nodes[:2] {
			node := &corev1.Node{}
			Expect(workload.Client.Get(ctx, client.ObjectKey{Name: n}, node)).To(Succeed())
			patch := client.MergeFrom(node.DeepCopy())
			node.Labels["node-role.kubernetes.io/control-plane"], node.Labels["node-role.kubernetes.io/etcd"] = "true", "true"
			Expect(workload.Client.Patch(ctx, node, patch)).To(Succeed())
		}
		startLifecycle(c)

		By("the first control plane node waits while the second is cordoned by someone else")
		Expect(c.kubelet.SetUnschedulable(ctx, c.nodes[1], true)).To(Succeed())
		first := c.nodeUpdate(c.nodes[0])
		heldAtCordon(c, workload.Client, first, "holding control plane node "+c.nodes[0]+" before it is cordoned", "control plane node(s) "+c.nodes[1]+" are down", "quorum")
		Expect(c.kubelet.SetUnschedulable(ctx, c.nodes[1], false)).To(Succeed())
		succeeded(first)

		By("the worker waits while the second control plane node runs the older kubelet")
		worker := c.nodeUpdate(c.nodes[2])
		heldAtCordon(c, workload.Client, worker, "holding node "+c.nodes[2]+" before it is cordoned", "control plane node(s) "+c.nodes[1]+" (v1.34.3+rke2r3)", "version skew")
		Expect(c.kubelet.SetVersion(ctx, c.nodes[1], worker.Spec.Version, "")).To(Succeed())
		succeeded(worker)
	})
})

// Longhorn's own roll (its managers' DaemonSet, which the harvester chart renders) is
// waited for once in the cluster step; a chart deployed again since rolls the managers
// while nodes wait: the node waits for the roll before it is taken down (issue #34
// point 2).
var _ = Describe("Longhorn's roll settled right before a node is taken down", func() {
	It("holds a node while the longhorn-manager DaemonSet rolls out a new generation, and goes on once it has", func() {
		wl, err := testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(wl.Stop)
		const roll = 6 * time.Second
		startRancherAt(wl, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}, func(r *sim.Rancher) { r.LonghornRolloutDelay = roll })

		c := newHarvesterClusterOn(wl, 2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			plan := &harvesterv1.UpgradePlan{}
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
			return plan.Status.Phase
		}, 90*time.Second, 50*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanNodeUpgrading))

		By("the harvester chart deployed again: Longhorn's managers roll")
		ds := &appsv1.DaemonSet{}
		Expect(wl.Client.Get(ctx, clusterupgrade.LonghornManagerKey, ds)).To(Succeed())
		patch := client.MergeFrom(ds.DeepCopy())
		if ds.Spec.Template.Annotations == nil {
			ds.Spec.Template.Annotations = map[string]string{}
		}
		ds.Spec.Template.Annotations["test.capi-inplace.io/redeployed"] = "1"
		Expect(wl.Client.Patch(ctx, ds, patch)).To(Succeed())
		startLifecycle(c)
		nu := c.nodeUpdate(c.nodes[0])
		heldAtCordon(c, wl.Client, nu, "holding node "+c.nodes[0]+" before it is cordoned", "Longhorn's managers are rolling out", clusterupgrade.LonghornManagerKey.String())
		succeeded(nu)
	})
})

// The budget is asked again before each disruptive step, not only before the cordon
// (issue #54 point 8): a control plane node that was cordoned while the control plane was
// whole holds before RKE2 restarts (and before the reboot its OS upgrade arms) once
// another control plane node went down; and two control plane NodeUpdates that reach
// their cordon together never both pass (the Cluster's disruption ledger).
var _ = Describe("A node's budget asked again before each disruptive step", func() {
	controlPlane := func(wl client.Client, nodes ...string) {
		GinkgoHelper()
		for _, n := range nodes {
			node := &corev1.Node{}
			Expect(wl.Get(ctx, client.ObjectKey{Name: n}, node)).To(Succeed())
			patch := client.MergeFrom(node.DeepCopy())
			node.Labels["node-role.kubernetes.io/control-plane"], node.Labels["node-role.kubernetes.io/etcd"] = "true", "true"
			Expect(wl.Patch(ctx, node, patch)).To(Succeed())
		}
	}

	DescribeTable("holds a cordoned control plane node before its next disruptive step while another control plane node is down, and goes on once it is back",
		func(upgradeOS bool, before, step, plan string) {
			c := newHarvesterCluster(3, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(upgradeOS) })
			controlPlane(workload.Client, c.nodes[0], c.nodes[1])
			nu := c.nodeUpdate(c.nodes[0])
			var release func()
			if before == harvesteradapter.StepDrain {
				// A pod under a budget that allows no disruption holds the drain, after
				// the cordon and before RKE2's restart.
				release = blockingPod(c.name, c.nodes[0])
			}
			// The node is left in the step before: draining (held by the pod), or with
			// RKE2's Plan applying.
			Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
				return nodeupdater.StepState(nu, before) == inplacev1.StepStateRunning
			})).To(Succeed())
			Expect(unschedulable(c.nodes[0])).To(BeTrue(), "cordoned while the control plane was whole")

			By("the other control plane node goes NotReady after the cordon")
			Expect(c.kubelet.SetReady(ctx, c.nodes[1], false, "KubeletNotReady")).To(Succeed())
			if release != nil {
				release()
			}
			Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
				return strings.Contains(stepMessage(nu, step), "before it is allowed to "+plan)
			})).To(Succeed())
			Expect(stepMessage(nu, step)).To(And(
				ContainSubstring("holding control plane node "+c.nodes[0]),
				ContainSubstring("control plane node(s) "+c.nodes[1]+" are down"), ContainSubstring("quorum")))
			kind := "rke2"
			if step == harvesteradapter.StepOSUpgrade {
				kind = "os"
			}
			for range 5 {
				_, err := c.updater.Reconcile(ctx, nu)
				Expect(err).NotTo(HaveOccurred())
				Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
				time.Sleep(100 * time.Millisecond)
			}
			Expect(c.rec.RunsOf(harvesteradapter.PlanName(kind, nu))).To(BeEmpty(), "the step's Plan ran while another control plane node was down")
			err := workload.Client.Get(ctx, client.ObjectKey{Namespace: "cattle-system", Name: harvesteradapter.PlanName(kind, nu)}, &sucv1.Plan{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the step's Plan was made while another control plane node was down: %v", err)

			By("the other node back: the node goes on to the end")
			Expect(c.kubelet.SetReady(ctx, c.nodes[1], true, "")).To(Succeed())
			Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		},
		Entry("before RKE2's restart (SUC's rke2 Plan)", false, harvesteradapter.StepDrain, harvesteradapter.StepKubernetesUpgrade, "restart RKE2"),
		Entry("before the reboot the OS upgrade arms", true, harvesteradapter.StepKubernetesUpgrade, harvesteradapter.StepOSUpgrade, "reboot"),
	)

	It("lets one of two control plane NodeUpdates that reach their cordon together through, holding the other by the ledger until the first ends", func() {
		// Both are held before their cordon by another upgrader's plan (noOtherUpgrade),
		// which then fails: their next reconciles judge the live nodes at the same moment,
		// neither cordoned yet.
		wl := freshWorkload()
		theirs, err := toolkitPlan(wl, "hvst-upgrade-toolkit", "NodeUpgrading")
		Expect(err).NotTo(HaveOccurred())
		c := newClusterWith(wl, false, 3, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		c.createPlan(nil)
		patch := client.MergeFrom(c.plan.DeepCopy())
		c.plan.Annotations = map[string]string{clusterchecks.SkipCheckAnnotationPrefix + clusterchecks.CheckNoOtherUpgrade: "true"}
		Expect(env.Client.Patch(ctx, c.plan, patch)).To(Succeed())
		controlPlane(wl.Client, c.nodes[0], c.nodes[1])
		a, b := c.nodeUpdate(c.nodes[0]), c.nodeUpdate(c.nodes[1])
		for _, nu := range []*inplacev1.NodeUpdate{a, b} {
			Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
				return strings.Contains(stepMessage(nu, harvesteradapter.StepCordon), "another upgrader is upgrading this cluster")
			})).To(Succeed())
		}
		setToolkitPhase(wl, theirs, toolkit.PhaseFailed)

		By("both judged at once: the live nodes show neither cordoned, the ledger lets one through")
		var wg sync.WaitGroup
		for _, nu := range []*inplacev1.NodeUpdate{a, b} {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				_, err := c.updater.Reconcile(ctx, nu)
				Expect(err).NotTo(HaveOccurred())
			}()
		}
		wg.Wait()
		cordoned := 0
		var held *inplacev1.NodeUpdate
		for _, nu := range []*inplacev1.NodeUpdate{a, b} {
			Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
			node := &corev1.Node{}
			Expect(wl.Client.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, node)).To(Succeed())
			if node.Spec.Unschedulable {
				cordoned++
			} else {
				held = nu
			}
		}
		Expect(cordoned).To(Equal(1), "two control plane nodes cordoned at once")
		Expect(stepMessage(held, harvesteradapter.StepCordon)).To(Or(
			ContainSubstring("are past their first disruption; one control plane node at a time"),
			ContainSubstring("are down (not Ready or cordoned) now")))
		first := a
		if held == a {
			first = b
		}
		Expect(drive(c.updater, first, 90*time.Second)).To(Succeed())
		By("the first ended: the second goes through")
		succeededAsReconciled(first)
		Expect(drive(c.updater, held, 90*time.Second)).To(Succeed())
	})
})

// blockingPod puts a pod on node, in a namespace of its own on the workload cluster, under
// a PodDisruptionBudget that allows no disruption (no disruption controller runs on the
// test API server: its status says so), and returns how to take both away.
func blockingPod(name, node string) (release func()) {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "blocking-" + name}}
	Expect(workload.Client.Create(ctx, ns)).To(Succeed())
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-rs", UID: "web-rs-uid", Controller: ptr.To(true)}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns.Name, Labels: map[string]string{"app": "web"}, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
	Expect(workload.Client.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	Expect(workload.Client.Status().Update(ctx, pod)).To(Succeed())
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns.Name},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	Expect(workload.Client.Create(ctx, pdb)).To(Succeed())
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	Expect(workload.Client.Status().Update(ctx, pdb)).To(Succeed())
	return func() {
		GinkgoHelper()
		Expect(workload.Client.Delete(ctx, pdb)).To(Succeed())
		Expect(workload.Client.Delete(ctx, pod, client.GracePeriodSeconds(0))).To(Succeed())
	}
}
