package harvesteradapter_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// withDrainPolicy gives a NodeUpdate that has not started its drain policy, as the
// UpgradeTask copies it into the NodeUpdates it creates.
func withDrainPolicy(nu *inplacev1.NodeUpdate, mode inplacev1.DrainMode, grace time.Duration) {
	GinkgoHelper()
	nu.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: mode, GracePeriod: &metav1.Duration{Duration: grace}}
	Expect(env.Client.Update(ctx, nu)).To(Succeed())
}

func drainBlocked(nu *inplacev1.NodeUpdate) *metav1.Condition {
	return meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition)
}

// blockedUnderEvict starts node's NodeUpdate under drainPolicy Evict with grace, its
// events recorded, and drives it until DrainBlocked is True, pending eviction.
func blockedUnderEvict(c *vmCluster, node string, grace time.Duration) (*inplacev1.NodeUpdate, *events.FakeRecorder, *metav1.Condition) {
	GinkgoHelper()
	rec := events.NewFakeRecorder(100)
	c.updater.Recorder = rec
	nu := c.nodeUpdate(node)
	withDrainPolicy(nu, inplacev1.DrainModeEvict, grace)
	Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
		cond := drainBlocked(nu)
		return cond != nil && cond.Status == metav1.ConditionTrue
	})).To(Succeed())
	cond := drainBlocked(nu)
	Expect(cond.Reason).To(Equal(inplacev1.EvictionPendingReason))
	return nu, rec, cond
}

// blockedUnderSkip starts the NodeUpdate lifecycle on c, gives node's NodeUpdate
// drainPolicy Skip with grace, and waits until its DrainBlocked condition says the skip
// is pending.
func blockedUnderSkip(c *vmCluster, node string, grace time.Duration) *inplacev1.NodeUpdate {
	GinkgoHelper()
	startLifecycle(c.harvesterCluster)
	nu := c.nodeUpdate(node)
	withDrainPolicy(nu, inplacev1.DrainModeSkip, grace)
	Eventually(func(g Gomega) string {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		if cond := drainBlocked(nu); cond != nil {
			return cond.Reason
		}
		return ""
	}, 60*time.Second, 50*time.Millisecond).Should(Equal(inplacev1.SkipPendingReason))
	return nu
}

// drainEvents are the events the updater recorded so far.
func drainEvents(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

var _ = Describe("A node whose drain a PodDisruptionBudget blocks", func() {
	It("Hold: waits on the pod, names it on the NodeUpdate, and fails at the drain's timeout with the pod still running", func() {
		c := newVMCluster(3, func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Drain.Timeout = ptr.To(intstr.FromString("3s"))
		})
		n2 := c.nodes[1]
		c.pdbPod("web", n2, "100Mi")
		rec := events.NewFakeRecorder(100)
		c.updater.Recorder = rec
		nu := c.nodeUpdate(n2)
		withDrainPolicy(nu, inplacev1.DrainModeHold, time.Second)

		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			cond := drainBlocked(nu)
			return cond != nil && cond.Status == metav1.ConditionTrue
		})).To(Succeed())
		cond := drainBlocked(nu)
		Expect(cond.Reason).To(Equal(inplacev1.DrainHeldReason))
		Expect(cond.Message).To(And(ContainSubstring("pod "+c.ns+"/web (PodDisruptionBudget web)"), ContainSubstring("drainPolicy Hold")))
		Expect(nodeupdater.Step(nu, harvesteradapter.StepDrain).Message).To(ContainSubstring("drainPolicy Hold"), "the drain step says why it waits")

		err := drive(c.updater, nu, 60*time.Second)
		Expect(err).To(HaveOccurred())
		_, permanent := nodeupdater.AsPermanent(err)
		Expect(permanent).To(BeTrue(), "the drain's timeout fails the node: %v", err)
		// kubectl's own words ("global timeout reached" naming the pod) are in its log,
		// which envtest's API server cannot serve (no kubelet): the Job's end says it.
		Expect(err.Error()).To(And(ContainSubstring("step Drain"), ContainSubstring("BackoffLimitExceeded"), ContainSubstring("exited with code 1")))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})).To(Succeed(), "held: the budget keeps the pod")
		Expect(drainBlocked(nu).Reason).To(Equal(inplacev1.DrainHeldReason), "well past the grace period, Hold never deletes")
		evs := drainEvents(rec)
		Expect(evs).To(ContainElement(And(HavePrefix("Warning DrainBlocked"), ContainSubstring(c.ns+"/web"))))
		Expect(evs).NotTo(ContainElement(ContainSubstring(inplacev1.BlockingPodsDeletedReason)))
	})

	It("Evict: deletes the blocking pod despite its budget once the grace period has passed, with an event naming it, and the node goes on", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		c.pdbPod("web", n2, "100Mi")
		const grace = 2 * time.Second
		nu, rec, cond := blockedUnderEvict(c, n2, grace)
		blockedAt := time.Now()
		Expect(cond.Message).To(And(ContainSubstring("pod "+c.ns+"/web (PodDisruptionBudget web)"), ContainSubstring("drainPolicy Evict")))

		By("within the grace period the pod stays")
		Expect(driveUntil(c.updater, nu, grace/2, nil)).To(MatchError(ContainSubstring("not done within")))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})).To(Succeed())

		By("after it, the pod is deleted and the node's upgrade ends")
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateSucceeded))
		err := workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the pod is gone: %v", err)
		cond = drainBlocked(nu)
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Reason).To(Equal(inplacev1.BlockingPodsDeletedReason))
		Expect(cond.Message).To(ContainSubstring(c.ns + "/web"))
		var deleted []string
		for _, e := range drainEvents(rec) {
			if strings.HasPrefix(e, "Warning "+inplacev1.BlockingPodsDeletedReason) {
				deleted = append(deleted, e)
			}
		}
		Expect(deleted).To(ConsistOf(And(ContainSubstring("deleted pod "+c.ns+"/web"), ContainSubstring("ignoring PodDisruptionBudget web"))), "one event per deleted pod")
		Expect(c.rec.Drains(n2)).NotTo(BeEmpty())
		Expect(time.Since(blockedAt)).To(BeNumerically(">=", grace/2))
	})

	It("Evict: never deletes Longhorn's pods: the instance manager whose budget Longhorn keeps holds the node with Longhorn's reason, the other blocking pod is deleted, and the drain ends once Longhorn lifts its budget", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		im := "instance-manager-" + c.name
		c.pdbPod("web", n2, "100Mi")
		c.pdbPod(im, n2, "100Mi", "instance-manager")
		vol := "pvc-attached-" + c.name
		createLonghornVolume(vol, "v1", n2, c.nodes[2])
		DeferCleanup(deleteLonghornVolume, vol, n2, c.nodes[2])
		engine := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "longhorn.io/v1beta2", "kind": "Engine",
			"metadata": map[string]any{"name": vol + "-e", "namespace": longhorn.Namespace},
			"spec":     map[string]any{"volumeName": vol, "nodeID": n2, "dataEngine": "v1"},
		}}
		Expect(workload.Client.Create(ctx, engine)).To(Succeed(), "the volume attached with its engine on the node (a VM's disk whose VM leaves only later)")
		DeferCleanup(func() { Expect(client.IgnoreNotFound(workload.Client.Delete(ctx, engine))).To(Succeed()) })
		const grace = 2 * time.Second
		nu, rec, cond := blockedUnderEvict(c, n2, grace)
		pending := cond.Message

		By("past the grace period: the other pod deleted, Longhorn's kept, the node held with Longhorn's reason")
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			cond := drainBlocked(nu)
			return cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == inplacev1.DrainHeldReason
		})).To(Succeed())
		cond = drainBlocked(nu)
		Expect(cond.Reason).To(Equal(inplacev1.DrainHeldReason), "the node finished its drain: Evict deleted Longhorn's instance manager")
		Expect(cond.Message).To(And(
			ContainSubstring("drainPolicy Evict never deletes Longhorn's pods ("+c.ns+"/"+im+")"),
			ContainSubstring("Longhorn keeps them now because volume "+vol+" is attached with its engine on node "+n2)))
		// Deleted with its grace period: the simulated kubelet ends it a moment later.
		Eventually(func() bool {
			return apierrors.IsNotFound(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{}))
		}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).Should(BeTrue(), "the pod of another owner is deleted")
		Expect(driveUntil(c.updater, nu, 3*time.Second, nil)).To(MatchError(ContainSubstring("not done within")), "the node holds")
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: im}, &corev1.Pod{})).To(Succeed(), "Evict deleted Longhorn's instance manager")
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateRunning))
		Expect(pending).To(ContainSubstring("the pods other than Longhorn's are deleted, their budgets ignored (Longhorn's never are)"), "what Evict would do, said before the grace period ended")

		By("Longhorn lifts the budget (the volume detached): the drain ends")
		Expect(workload.Client.Delete(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: im}})).To(Succeed())
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		var deleted []string
		for _, e := range drainEvents(rec) {
			if strings.HasPrefix(e, "Warning "+inplacev1.BlockingPodsDeletedReason) {
				deleted = append(deleted, e)
			}
		}
		Expect(deleted).To(ConsistOf(ContainSubstring("deleted pod "+c.ns+"/web")), "one deletion, of the other owner's pod")
	})
})

// watchNodeUpdates starts a witness of the namespace's NodeUpdates for the spec.
func watchNodeUpdates(ns string) *sim.NodeUpdateWitness {
	GinkgoHelper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	witness, err := sim.WatchNodeUpdates(ctx, wc, ns)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(witness.Stop)
	return witness
}

// nodeUpdatePhase reads a NodeUpdate's phase, for Eventually.
func nodeUpdatePhase(nu *inplacev1.NodeUpdate) func(Gomega) inplacev1.NodeUpdatePhase {
	return func(g Gomega) inplacev1.NodeUpdatePhase {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		return nu.Status.Phase
	}
}

// seenFinal waits for the witness's watch to show the NodeUpdate final and returns when
// it first did. A Get can see the final status a moment before the watch delivers it (a
// loaded CI machine saw the Get first), so the spec waits for the delivery; a NodeUpdate
// the watch never shows final within 10 s fails here.
func seenFinal(w *sim.NodeUpdateWitness, name string) time.Time {
	GinkgoHelper()
	Eventually(w.FinalAt).WithArguments(name).WithTimeout(10*time.Second).WithPolling(20*time.Millisecond).
		ShouldNot(BeZero(), "the watch saw NodeUpdate %s final", name)
	return w.FinalAt(name)
}

// expectPutBack asserts what a skipped node is left with: its NodeUpdate Skipped naming
// the blocking pod and its budget, the node uncordoned, no Plan of the NodeUpdate, no Job
// of it still running, and every SUC run of its Plans ended before a watch showed the
// NodeUpdate final (finalAt), none started afterwards.
func expectPutBack(c *harvesterCluster, nu *inplacev1.NodeUpdate, pod string, finalAt time.Time) {
	GinkgoHelper()
	Expect(nu.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSkipped))
	blocker := "pod " + c.ns + "/" + pod + " (PodDisruptionBudget " + pod + ")"
	Expect(nu.Status.FailureReason).To(Equal(inplacev1.NodeSkippedReason))
	Expect(nu.Status.FailureMessage).To(And(ContainSubstring(blocker), ContainSubstring("drainPolicy Skip"), ContainSubstring("put back")))
	cond := drainBlocked(nu)
	Expect(cond).NotTo(BeNil())
	Expect(cond.Reason).To(Equal(inplacev1.NodeSkippedReason))
	Expect(cond.Message).To(ContainSubstring(blocker))
	ready := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.ReadyCondition)
	Expect(ready.Reason).To(Equal(inplacev1.NodeSkippedReason))
	Expect(ready.Message).To(And(ContainSubstring("put back"), ContainSubstring(blocker)))
	Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateAborted))
	Expect(nodeupdater.StepState(nu, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStatePending), "the node was not upgraded")

	node := nu.Spec.NodeName
	Expect(unschedulable(node)).To(BeFalse(), "the skipped node is uncordoned")
	expectNoPlanOf(nu)
	jobs := &batchv1.JobList{}
	Expect(workload.Client.List(ctx, jobs, client.InNamespace("cattle-system"), client.MatchingLabels{suc.LabelNodeUpdate: string(nu.UID)})).To(Succeed())
	for _, j := range jobs.Items {
		Expect(j.Status.CompletionTime != nil || j.Status.Failed > 0).To(BeTrue(), "Job %s of the skipped NodeUpdate still runs", j.Name)
	}
	Expect(finalAt).NotTo(BeZero(), "the watch saw NodeUpdate %s final", nu.Name)
	ours := func() []sim.PlanRun {
		var out []sim.PlanRun
		for _, run := range c.rec.Runs() {
			for _, kind := range []string{"preload", "drain", "rke2", "os", "unguard", "reguard"} {
				if run.Plan == harvesteradapter.PlanName(kind, nu) {
					out = append(out, run)
				}
			}
		}
		return out
	}
	Expect(ours()).NotTo(BeEmpty(), "the drain ran")
	for _, run := range ours() {
		Expect(run.End).NotTo(BeZero(), "run of %s on %s still running after the NodeUpdate ended", run.Plan, run.Node)
		Expect(run.End).To(BeTemporally("<=", finalAt), "run of %s on %s ended after the NodeUpdate", run.Plan, run.Node)
	}
	n := len(ours())
	Consistently(func() int { return len(ours()) }, time.Second, 100*time.Millisecond).Should(Equal(n), "no run of the skipped NodeUpdate starts afterwards")
}

var _ = Describe("drainPolicy Skip under the NodeUpdate lifecycle", func() {
	It("puts back a node whose drain a PodDisruptionBudget blocks past the grace period: drain stopped, uncordoned, Plans gone, Skipped with the pod named", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		c.pdbPod("web", n2, "100Mi")
		pinnedVM := c.vm("vm-pinned", n2, pinned(n2))
		witness := watchNodeUpdates(c.ns)
		const grace = 2 * time.Second
		nu := blockedUnderSkip(c, n2, grace)
		blockedAt := time.Now()
		Expect(drainBlocked(nu).Message).To(And(ContainSubstring("pod "+c.ns+"/web (PodDisruptionBudget web)"), ContainSubstring("drainPolicy Skip")))
		Expect(unschedulable(n2)).To(BeTrue(), "cordoned while it drains")
		Expect(runStrategy(c.getVM("vm-pinned"))).To(Equal(kubevirtv1.RunStrategyHalted), "the VM that cannot migrate was stopped before the drain")

		Eventually(nodeUpdatePhase(nu), 60*time.Second, 50*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSkipped),
			func() string { return fmt.Sprintf("%+v\nruns %+v", nu.Status, c.rec.Runs()) })
		Expect(time.Since(blockedAt)).To(BeNumerically(">=", grace/2), "not before the grace period")
		expectPutBack(c.harvesterCluster, nu, "web", seenFinal(witness, nu.Name))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})).To(Succeed(), "Skip never deletes the pod")
		Expect(runStrategy(c.getVM("vm-pinned"))).To(Equal(kubevirtv1.RunStrategyAlways), "the VM the node's evacuation stopped is started again")
		Eventually(c.kubevirt.NodeOf).WithArguments(pinnedVM).WithTimeout(10*time.Second).Should(Equal(n2), "and runs on its node again")
		Expect(c.rec.MaxDown()).To(Equal(0), "no node went down")
	})
})

// skipWorld is a 3-machine MachineDeployment on a Harvester cluster whose second node
// runs a pod under a PodDisruptionBudget that refuses its eviction, with the NodeUpdate
// reconciler and the UpgradeTask controller running and a witness of every NodeUpdate.
type skipWorld struct {
	*vmCluster
	machines []*clusterv1.Machine
	nodes    []string
	witness  *sim.NodeUpdateWitness
	task     *inplacev1.UpgradeTask
}

// newSkipWorld starts the world's task with drainPolicy Skip after grace; the task's
// pauseNodes holds the nodes of the machines whose indexes are held (0 to 2) until the spec
// takes them out.
func newSkipWorld(grace time.Duration, held ...int) *skipWorld {
	GinkgoHelper()
	// The UpgradePlan is created once the nodes exist: it judges single-node from them.
	c := newVMClusterWith(false, 0, nil)
	_, err := fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
	Expect(err).NotTo(HaveOccurred())
	_, machines, err := fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", "v1.34.3+rke2r3", 3)
	Expect(err).NotTo(HaveOccurred())
	w := &skipWorld{vmCluster: c, machines: machines}
	for _, m := range machines {
		_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, "v1.34.3+rke2r3", nil)
		Expect(err).NotTo(HaveOccurred())
		w.nodes = append(w.nodes, m.Status.NodeRef.Name)
	}
	c.nodes = w.nodes
	c.createPlan(nil)
	c.pdbPod("web", w.nodes[1], "100Mi")
	w.witness = watchNodeUpdates(c.ns)
	startLifecycle(c.harvesterCluster, true)
	w.task = &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "workers-v1-35-6", Namespace: c.ns},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName: c.name, MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
			Version: "v1.35.6+rke2r1", UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
			DrainPolicy: &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeSkip, GracePeriod: &metav1.Duration{Duration: grace}},
		},
	}
	for _, i := range held {
		w.task.Spec.PauseNodes = append(w.task.Spec.PauseNodes, w.nodes[i])
	}
	Expect(env.Client.Create(ctx, w.task)).To(Succeed())
	return w
}

func (w *skipWorld) nodeUpdate(name string) *inplacev1.NodeUpdate {
	return &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}
}

func (w *skipWorld) taskPhase(g Gomega) inplacev1.TaskPhase {
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(w.task), w.task)).To(Succeed())
	return w.task.Status.Phase
}

func (w *skipWorld) machineStatus(name string) inplacev1.MachineUpgradeStatus {
	GinkgoHelper()
	for _, ms := range w.task.Status.Machines {
		if ms.Name == name {
			return ms
		}
	}
	Fail("no status of machine " + name)
	return inplacev1.MachineUpgradeStatus{}
}

// expectSafeRun asserts the run's safety over its whole length: never more than one
// NodeUpdate (the task's maxUnavailable) unfinished at once, never two for one machine,
// never more than one node down, and every SUC run of a NodeUpdate ended before the watch
// showed the NodeUpdate final.
func (w *skipWorld) expectSafeRun() {
	GinkgoHelper()
	Expect(w.witness.Gaps()).To(BeZero(), "the witness lost part of the run")
	Expect(w.witness.MaxRunning()).To(Equal(1))
	Expect(w.witness.RunTwice()).To(BeEmpty())
	Expect(w.rec.MaxDown()).To(BeNumerically("<=", 1))
	nus := &inplacev1.NodeUpdateList{}
	Expect(env.Client.List(ctx, nus, client.InNamespace(w.ns))).To(Succeed())
	for i := range nus.Items {
		nu := &nus.Items[i]
		Expect(nu.Status.Phase.IsFinal()).To(BeTrue(), "NodeUpdate %s has not ended", nu.Name)
		ended := seenFinal(w.witness, nu.Name)
		for _, run := range w.rec.Runs() {
			for _, kind := range []string{"preload", "drain", "rke2", "os", "unguard", "reguard"} {
				if run.Plan != harvesteradapter.PlanName(kind, nu) {
					continue
				}
				Expect(run.End).NotTo(BeZero(), "run of %s still running after NodeUpdate %s ended", run.Plan, nu.Name)
				Expect(run.End).To(BeTemporally("<=", ended), "run of %s ended after NodeUpdate %s", run.Plan, nu.Name)
			}
		}
	}
}

var _ = Describe("An UpgradeTask with drainPolicy Skip, carried out by the Harvester updater", func() {
	It("puts back the node a PodDisruptionBudget blocks, upgrades the others, comes back to it at the end and upgrades it once the budget is lifted", func() {
		// The third node is held (pauseNodes) until the skip's record is checked: were it
		// upgraded meanwhile, the task would try the skipped machine again under the
		// budget still in force, and skip it again, before the spec lifts the budget (a
		// loaded CI machine saw the second machine Failed, skipped twice, at line 363).
		w := newSkipWorld(2*time.Second, 2)
		m1, m2, m3 := w.machines[0].Name, w.machines[1].Name, w.machines[2].Name
		first := w.nodeUpdate(upgraderequest.NodeUpdateName(w.task.Name, m2))
		Eventually(nodeUpdatePhase(first), 90*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSkipped))
		expectPutBack(w.harvesterCluster, first, "web", seenFinal(w.witness, first.Name))

		By("the task records the skip, and goes on with the third machine once it is no longer held")
		Eventually(func(g Gomega) inplacev1.MachineState {
			w.taskPhase(g)
			for _, ms := range w.task.Status.Machines {
				if ms.Name == m2 {
					return ms.State
				}
			}
			return ""
		}, 30*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.MachineStateSkipped))
		Expect(w.machineStatus(m2).Message).To(ContainSubstring("pod " + w.ns + "/web (PodDisruptionBudget web)"))
		cond := meta.FindStatusCondition(w.task.Status.Conditions, inplacev1.NodesSkippedCondition)
		Expect(cond).NotTo(BeNil())
		Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		Expect(cond.Reason).To(Equal(inplacev1.NodeSkippedReason))
		Expect(cond.Message).To(And(ContainSubstring("node "+w.nodes[1]), ContainSubstring(w.ns+"/web"), ContainSubstring("tried once more")))
		Expect(w.task.Status.Phase).To(Equal(inplacev1.TaskPhaseInProgress), "a skip is not a failure")
		Expect(w.task.Status.Failed).To(BeZero())
		evs := &corev1.EventList{}
		Expect(env.Client.List(ctx, evs, client.InNamespace(w.ns))).To(Succeed())
		Expect(evs.Items).To(ContainElement(And(HaveField("Reason", inplacev1.NodeSkippedReason), HaveField("InvolvedObject.Kind", "UpgradeTask"))))
		Expect(w.machineStatus(m3).State).To(Equal(inplacev1.MachineStateWaiting), "the third machine is held")
		release := w.task.DeepCopy()
		release.Spec.PauseNodes = nil
		Expect(env.Client.Patch(ctx, release, client.MergeFrom(w.task))).To(Succeed())

		By("the budget is lifted while the third machine is upgraded")
		Eventually(func(g Gomega) inplacev1.MachineState {
			w.taskPhase(g)
			return w.machineStatus(m3).State
		}, 30*time.Second, 50*time.Millisecond).Should(BeElementOf(inplacev1.MachineStateInProgress, inplacev1.MachineStateUpgraded))
		Expect(workload.Client.Delete(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "web"}})).To(Succeed())

		Eventually(w.taskPhase, 120*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted))
		for _, m := range []string{m1, m2, m3} {
			Expect(w.machineStatus(m).State).To(Equal(inplacev1.MachineStateUpgraded), m)
		}
		retry := upgraderequest.RetryNodeUpdateName(w.task.Name, m2)
		Expect(w.machineStatus(m2).NodeUpdate).To(Equal(retry))
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(first), first)).To(Succeed())
		Expect(first.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSkipped), "the first NodeUpdate stays, the record of the skip")
		Expect(nodeUpdatePhase(w.nodeUpdate(retry))(Default)).To(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		Expect(w.witness.StartOrder()).To(Equal([]string{m1, m2, m3, m2}), "the skipped machine is tried again once, at the end")
		cond = meta.FindStatusCondition(w.task.Status.Conditions, inplacev1.NodesSkippedCondition)
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Message).To(ContainSubstring("node " + w.nodes[1] + " was skipped, then upgraded when tried again"))
		Expect(w.rec.Drains(w.nodes[1])).NotTo(BeEmpty())
		w.expectSafeRun()
	})

	It("fails the task, naming the node and its blocker, when the node is skipped again at the end", func() {
		w := newSkipWorld(time.Second)
		m1, m2, m3 := w.machines[0].Name, w.machines[1].Name, w.machines[2].Name
		Eventually(w.taskPhase, 120*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseFailed))
		Expect(w.machineStatus(m1).State).To(Equal(inplacev1.MachineStateUpgraded))
		Expect(w.machineStatus(m3).State).To(Equal(inplacev1.MachineStateUpgraded), "the others were upgraded before the retry")
		ms := w.machineStatus(m2)
		Expect(ms.State).To(Equal(inplacev1.MachineStateFailed))
		Expect(ms.Message).To(And(ContainSubstring(inplacev1.SkippedAgainReason), ContainSubstring("pod "+w.ns+"/web (PodDisruptionBudget web)")))
		cond := meta.FindStatusCondition(w.task.Status.Conditions, inplacev1.NodesSkippedCondition)
		Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		Expect(cond.Reason).To(Equal(inplacev1.SkippedAgainReason))
		Expect(cond.Message).To(And(ContainSubstring("node "+w.nodes[1]), ContainSubstring(w.ns+"/web"), ContainSubstring("skipped again")))
		degraded := meta.FindStatusCondition(w.task.Status.Conditions, inplacev1.DegradedCondition)
		Expect(degraded.Message).To(ContainSubstring(m2))

		first := w.nodeUpdate(upgraderequest.NodeUpdateName(w.task.Name, m2))
		retry := w.nodeUpdate(upgraderequest.RetryNodeUpdateName(w.task.Name, m2))
		for _, nu := range []*inplacev1.NodeUpdate{first, retry} {
			Expect(nodeUpdatePhase(nu)(Default)).To(Equal(inplacev1.NodeUpdatePhaseSkipped))
			expectPutBack(w.harvesterCluster, nu, "web", seenFinal(w.witness, nu.Name))
		}
		Expect(w.witness.StartOrder()).To(Equal([]string{m1, m2, m3, m2}), "tried again once, not more")
		Consistently(func() int { return w.witness.Creations()[m2] }, 2*time.Second, 200*time.Millisecond).Should(Equal(2))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "web"}, &corev1.Pod{})).To(Succeed(), "Skip never deletes the pod")
		w.expectSafeRun()
	})
})

// A VM that cannot leave the node blocks it as a pod under a budget does: the drain
// policy acts on the evacuation's holds too.
var _ = Describe("A node whose evacuation a VM blocks", func() {
	const reason = "target virt-launcher pod: insufficient memory"

	It("Skip: puts the node back once a VM's failed live migration has held it for the grace period, the VM named and never stopped", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		a := c.vm("vm-a", n2, nil)
		c.kubevirt.FailMigrations(c.ns, "vm-a", reason)
		witness := watchNodeUpdates(c.ns)
		const grace = 2 * time.Second
		nu := blockedUnderSkip(c, n2, grace)
		blockedAt := time.Now()
		Expect(drainBlocked(nu).Message).To(And(ContainSubstring("the evacuation of node "+n2), ContainSubstring("VM "+a), ContainSubstring(reason), ContainSubstring("drainPolicy Skip")))
		Expect(nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message).To(HavePrefix("holding: "))

		Eventually(nodeUpdatePhase(nu), 60*time.Second, 50*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSkipped),
			func() string { return fmt.Sprintf("%+v", nu.Status) })
		Expect(time.Since(blockedAt)).To(BeNumerically(">=", grace/2), "not before the grace period")
		Expect(nu.Status.FailureReason).To(Equal(inplacev1.NodeSkippedReason))
		Expect(nu.Status.FailureMessage).To(And(ContainSubstring("drainPolicy Skip: the evacuation of node "+n2), ContainSubstring("VM "+a), ContainSubstring("put back")))
		Expect(drainBlocked(nu).Reason).To(Equal(inplacev1.NodeSkippedReason))
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepEvacuateVMs)).To(Equal(inplacev1.StepStateAborted))
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStatePending), "no drain started")
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStatePending), "the node was not upgraded")
		Expect(unschedulable(n2)).To(BeFalse(), "the skipped node is uncordoned")
		expectNoPlanOf(nu)
		seenFinal(witness, nu.Name)
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "Skip never stops the VM")
		Expect(c.kubevirt.NodeOf(a)).To(Equal(n2), "it runs where it ran")
		Expect(c.kubevirt.Starts(a)).To(Equal(1))
		Expect(c.rec.MaxDown()).To(Equal(0), "no node went down")
	})

	It("Evict: stops the VM whose live migration failed once the grace period has passed, as Harvester's upgrade does, and starts it again after the node", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		a := c.vm("vm-a", n2, nil)
		c.kubevirt.FailMigrations(c.ns, "vm-a", reason)
		// Long enough that a loaded machine's reconciles do not pass it before the check
		// within it (CI saw the VM stopped at 2s).
		const grace = 6 * time.Second
		nu, rec, cond := blockedUnderEvict(c, n2, grace)
		blockedAt := time.Now()
		Expect(cond.Message).To(And(ContainSubstring("the evacuation of node "+n2), ContainSubstring("VM "+a), ContainSubstring("drainPolicy Evict: the VMs whose live migration failed are stopped")))

		By("within the grace period the VM runs on")
		Expect(driveUntil(c.updater, nu, grace/3, nil)).To(MatchError(ContainSubstring("not done within")))
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways))
		Expect(c.kubevirt.NodeOf(a)).To(Equal(n2))

		By("after it, the VM is stopped, the node is upgraded, and the VM is started again")
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(time.Since(blockedAt)).To(BeNumerically(">=", grace/2))
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepEvacuateVMs)).To(Equal(inplacev1.StepStateSucceeded))
		cond = drainBlocked(nu)
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Reason).To(Equal(inplacev1.BlockingVMsStoppedReason))
		Expect(cond.Message).To(ContainSubstring("drainPolicy Evict stopped VM " + a))
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "started again after the node")
		Expect(c.getVM("vm-a").Labels).NotTo(HaveKey(kubevirt.LabelStoppedBy), "the record goes with the restore")
		Eventually(c.kubevirt.NodeOf).WithArguments(a).WithTimeout(10 * time.Second).ShouldNot(BeEmpty())
		Expect(c.kubevirt.Starts(a)).To(Equal(2), "stopped once, started once again")
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty())
		var stopped []string
		for _, e := range drainEvents(rec) {
			if strings.HasPrefix(e, "Normal "+harvesteradapter.EventVMStopped) {
				stopped = append(stopped, e)
			}
		}
		Expect(stopped).To(ConsistOf(And(ContainSubstring("stopping VM "+a), ContainSubstring(reason), ContainSubstring("drainPolicy Evict"))), "one stop, naming the failed migration")
	})

	It("Evict, then an abort: the VM Evict stopped is started again and the node is uncordoned", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		a := c.vm("vm-a", n2, nil)
		c.kubevirt.FailMigrations(c.ns, "vm-a", reason)
		nu, _, _ := blockedUnderEvict(c, n2, time.Second)
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			cond := drainBlocked(nu)
			return cond != nil && cond.Reason == inplacev1.BlockingVMsStoppedReason
		})).To(Succeed())
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyHalted), "Evict stopped it")
		Expect(c.getVM("vm-a").Labels).To(HaveKey(kubevirt.LabelStoppedBy), "and recorded the stop")
		Eventually(c.kubevirt.NodeOf).WithArguments(a).WithTimeout(10*time.Second).Should(BeEmpty(), "KubeVirt stops it")
		Expect(unschedulable(n2)).To(BeTrue())

		abortUntilDone(c.harvesterCluster, nu)
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "the abort starts it again")
		Expect(c.getVM("vm-a").Labels).NotTo(HaveKey(kubevirt.LabelStoppedBy), "the record goes with the restore")
		Eventually(c.kubevirt.NodeOf).WithArguments(a).WithTimeout(10*time.Second).ShouldNot(BeEmpty(), "it runs again")
		Expect(c.kubevirt.Starts(a)).To(Equal(2), "stopped once, started once again")
		Expect(unschedulable(n2)).To(BeFalse(), "the aborted node is uncordoned")
		expectNoPlanOf(nu)
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty())
	})

	It("Evict: holds as Hold where it cannot act (no room on the nodes that stay up), saying so", func() {
		c := newVMCluster(2, nil)
		n1 := c.nodes[0]
		// 64Gi allocatable per simulated node: 40Gi taken on the other leaves no room for
		// a 40Gi VM (as the vmonce spec).
		c.vm("vm-a", n1, askingMemory("40Gi"))
		c.vm("vm-load", c.nodes[1], askingMemory("40Gi"))
		nu := c.nodeUpdate(n1)
		const grace = time.Second
		withDrainPolicy(nu, inplacev1.DrainModeEvict, grace)
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			cond := drainBlocked(nu)
			return cond != nil && cond.Reason == inplacev1.DrainHeldReason
		})).To(Succeed())
		Expect(drainBlocked(nu).Message).To(And(ContainSubstring("drainPolicy Evict cannot act on it"), ContainSubstring("have no room")))
		By("past the grace period too: nothing is stopped, migrated or drained")
		Expect(driveUntil(c.updater, nu, 2*grace, nil)).To(MatchError(ContainSubstring("not done within")))
		Expect(drainBlocked(nu).Reason).To(Equal(inplacev1.DrainHeldReason))
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "nothing stopped")
		Expect(c.kubevirt.Migrations(c.ns + "/vm-a")).To(BeZero())
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStatePending))
	})
})
