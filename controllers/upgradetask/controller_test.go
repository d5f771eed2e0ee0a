package upgradetask

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

const (
	timeout       = 40 * time.Second
	poll          = 100 * time.Millisecond
	targetVersion = "v1.34.1+rke2r1"
	fromVersion   = "v1.33.3+rke2r1"
)

// expectStartedInRounds asserts that machines started in the planned order, as rounds of
// at most maxUnavailable nodes that start together: each of the first k machines started
// is among the first k+maxUnavailable-1 planned, so no machine starts while one planned
// maxUnavailable places before it still waits. With maxUnavailable 1 that is the planned
// order itself.
func expectStartedInRounds(started, planned []string, maxUnavailable int) {
	GinkgoHelper()
	Expect(started).To(ConsistOf(planned), "every planned machine started once")
	for k := 1; k <= len(started); k++ {
		allowed := planned[:min(k+maxUnavailable-1, len(planned))]
		Expect(allowed).To(ContainElements(started[:k]), "the first %d machines started (%v) come from the first %d planned", k, started[:k], len(allowed))
	}
}

// expectUpgraded asserts that every machine of the world reached the version through
// exactly one NodeUpdate of the task, carries Done and the release annotation, and is no
// longer claimed.
func expectUpgraded(w *world, taskName string, rec *sim.NodeUpdateWitness, v string) {
	GinkgoHelper()
	creations := rec.Creations()
	for _, m := range w.machines {
		Expect(creations[m.Name]).To(Equal(1), "machine %s must be started exactly once", m.Name)
		got := w.machine(m.Name)
		Expect(got.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, v))
		Expect(got.Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel), "machine %s still claimed", m.Name)
		c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionTrue))
		Expect(c.Reason).To(Equal(inplacev1.DoneReason))
	}
	t := w.task(taskName)
	Expect(t.Status.Upgraded).To(Equal(int32(len(w.machines))))
	Expect(t.Status.Total).To(Equal(int32(len(w.machines))))
	Expect(t.Status.InProgress).To(BeZero())
	Expect(t.Status.Waiting).To(BeZero())
	Expect(condition(t.Status.Conditions, inplacev1.ReadyCondition).Status).To(Equal(metav1.ConditionTrue))
	Expect(t.Status.CompletionTime).NotTo(BeNil())
	for _, ms := range t.Status.Machines {
		Expect(ms.State).To(Equal(inplacev1.MachineStateUpgraded))
		Expect(ms.NodeUpdate).To(Equal(upgraderequest.NodeUpdateName(taskName, ms.Name)))
		Expect(ms.StartTime).NotTo(BeNil())
		Expect(ms.CompletionTime).NotTo(BeNil())
		Expect(ms.NodeName).To(Equal(fixtures.NodeName(w.ns, ms.Name)))
	}
}

var _ = Describe("UpgradeTask controller", func() {
	var stop func()
	var fakeClock *clocktesting.FakePassiveClock
	var clk clock.PassiveClock

	BeforeEach(func() {
		fakeClock = nil
		clk = nil
	})
	JustBeforeEach(func() {
		if fakeClock != nil {
			clk = fakeClock
		}
		stop = startManager(clk)
	})
	AfterEach(func() {
		if stop != nil {
			stop()
		}
	})

	DescribeTable("never has more machines in progress than maxUnavailable allows, and upgrades each once",
		func(maxUnavailable int) {
			w := newMDWorld(5)
			rec := watchNodeUpdates(w.ns)
			simulate(w.ns, 700*time.Millisecond)
			task := w.mdTask("md", func(t *inplacev1.UpgradeTask) {
				t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(int32(maxUnavailable)))
			})
			Expect(k8s.Create(ctx, task)).To(Succeed())

			Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
			Expect(rec.MaxRunning()).To(Equal(maxUnavailable), "most NodeUpdates running at once")
			expectUpgraded(w, "md", rec, targetVersion)
			expectStartedInRounds(rec.StartOrder(), []string{"workers-1", "workers-2", "workers-3", "workers-4", "workers-5"}, maxUnavailable)

			for _, nu := range w.nodeUpdates() {
				Expect(nu.Labels).To(HaveKeyWithValue(inplacev1.UpgradeTaskLabel, "md"))
				Expect(nu.Labels).To(HaveKeyWithValue(inplacev1.ClusterNameLabel, "harvester"))
				Expect(metav1.IsControlledBy(&nu, w.task("md"))).To(BeTrue())
				Expect(nu.Spec.Version).To(Equal(targetVersion))
			}
			Expect(w.events(inplacev1.NodeStartedReason)).To(HaveLen(5))
			// One NodeUpgraded event per node, each naming its Machine: not folded into
			// one series that would keep the first node's note.
			Eventually(func() []string { return w.eventsRelated(inplacev1.NodeUpgradedReason) }, timeout, poll).Should(ConsistOf(
				"workers-1", "workers-2", "workers-3", "workers-4", "workers-5"))
			Expect(gauge("capi_inplace_upgradetask_phase", map[string]string{"namespace": w.ns, "name": "md", "phase": "Completed"})).To(Equal(1.0))
			Expect(gauge("capi_inplace_upgradetask_phase", map[string]string{"namespace": w.ns, "name": "md", "phase": "InProgress"})).To(Equal(0.0))
			Expect(gauge("capi_inplace_upgradetask_machines", map[string]string{"namespace": w.ns, "name": "md", "state": "upgraded"})).To(Equal(5.0))
			Expect(histogramCount("capi_inplace_upgradetask_node_duration_seconds", map[string]string{"result": "succeeded"})).To(BeNumerically(">=", 5))
		},
		Entry("maxUnavailable 1", 1),
		Entry("maxUnavailable 2", 2),
	)

	It("upgrades a control plane one node at a time, nodes named in nodeOrder first", func() {
		w := newCPWorld(3)
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 300*time.Millisecond)
		task := &inplacev1.UpgradeTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "cp"},
			Spec: inplacev1.UpgradeTaskSpec{
				ClusterName:     "harvester",
				ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"},
				Version:         targetVersion,
				UpdaterRef:      inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"},
				NodeOrder:       []string{w.node(2)},
			},
		}
		Expect(k8s.Create(ctx, task)).To(Succeed())
		Eventually(w.phaseOf("cp"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(rec.MaxRunning()).To(Equal(1))
		Expect(rec.StartOrder()).To(Equal([]string{"cp-3", "cp-1", "cp-2"}))
		expectUpgraded(w, "cp", rec, targetVersion)
	})

	It("holds a NotReady node, counts it as unavailable, and picks it once it is Ready", func() {
		w := newMDWorld(3)
		Expect(fixtures.SetNodeReady(ctx, k8s, w.node(0), false)).To(Succeed())
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 400*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2)) }))).To(Succeed())

		// workers-1's node is NotReady: one of the two unavailable slots is taken, so the
		// others go one at a time, and workers-1 is never started while NotReady.
		Eventually(func() int32 { return w.task("md").Status.Upgraded }, timeout, poll).Should(Equal(int32(2)))
		Consistently(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-1") }, time.Second, poll).Should(BeNil())
		Expect(rec.MaxRunning()).To(Equal(1), "a NotReady node counts against maxUnavailable")

		ms := w.machineStatus("md", "workers-1")
		Expect(ms.State).To(Equal(inplacev1.MachineStateWaiting))
		Expect(ms.Message).To(Equal("held by NodeReady: node " + w.node(0) + " is not Ready"))
		Expect(ms.Preflight).To(Equal([]inplacev1.PreflightCheckStatus{{Name: "NodeReady", Passed: false, Message: "node " + w.node(0) + " is not Ready"}}))
		paused := condition(w.task("md").Status.Conditions, inplacev1.PausedCondition)
		Expect(paused.Status).To(Equal(metav1.ConditionTrue))
		Expect(paused.Reason).To(Equal(inplacev1.PreflightHoldReason))
		Expect(paused.Message).To(ContainSubstring("NodeReady"))
		Expect(w.events(inplacev1.NodeHeldReason)).To(ContainElement(ContainSubstring("held by NodeReady")))
		c := meta.FindStatusCondition(w.machine("workers-1").Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Reason).To(Equal(inplacev1.WaitingReason))
		Expect(w.machine("workers-1").Labels).To(HaveKeyWithValue(inplacev1.UpgradeTaskLabel, "md"))

		Expect(fixtures.SetNodeReady(ctx, k8s, w.node(0), true)).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		expectUpgraded(w, "md", rec, targetVersion)
	})

	It("counts a node that another NodeUpdate is upgrading as unavailable", func() {
		w := newMDWorld(2)
		rec := watchNodeUpdates(w.ns)
		foreign := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "by-hand", Labels: map[string]string{inplacev1.ClusterNameLabel: "harvester"}},
			Spec: inplacev1.NodeUpdateSpec{ClusterName: "harvester", MachineName: "workers-1", NodeName: w.node(0), Version: "v1.34.0",
				UpdaterRef: inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}},
		}
		Expect(k8s.Create(ctx, foreign)).To(Succeed())
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(func() string { return w.machineStatus("md", "workers-2").Message }, timeout, poll).
			Should(Equal("held by Availability: 1 node(s) of the target already unavailable (" + w.node(0) + "); maxUnavailable is 1"))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(Equal(1))

		foreign.Status.Phase = inplacev1.NodeUpdatePhaseSucceeded
		Expect(k8s.Status().Update(ctx, foreign)).To(Succeed())
		simulate(w.ns, 100*time.Millisecond)
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(rec.MaxRunning()).To(Equal(1))
	})

	It("releases its claims when it is deleted", func() {
		w := newMDWorld(2)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Paused = true }))).To(Succeed())
		Eventually(func() map[string]string { return w.machine("workers-2").Labels }, timeout, poll).Should(HaveKeyWithValue(inplacev1.UpgradeTaskLabel, "md"))
		Expect(w.task("md").Finalizers).To(ContainElement(inplacev1.UpgradeTaskFinalizer))
		Expect(k8s.Delete(ctx, w.task("md"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "md"}, &inplacev1.UpgradeTask{}))
		}, timeout, poll).Should(BeTrue())
		for _, m := range w.machines {
			got := w.machine(m.Name)
			Expect(got.Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel))
			Expect(meta.FindStatusCondition(got.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)).To(BeNil())
		}
	})

	It("stops on a failure, starts no other node, and fails the task with the node's message", func() {
		w := newMDWorld(4)
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, 300*time.Millisecond)
		sim.FailMachine("workers-2", "rke2 upgrade job failed: BackoffLimitExceeded")
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())

		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))
		Consistently(func() map[string]int { return rec.Creations() }, 1500*time.Millisecond, poll).Should(Equal(map[string]int{"workers-1": 1, "workers-2": 1}))

		t := w.task("md")
		Expect(t.Status.Failed).To(Equal(int32(1)))
		Expect(t.Status.Upgraded).To(Equal(int32(1)))
		Expect(t.Status.Waiting).To(Equal(int32(2)))
		degraded := condition(t.Status.Conditions, inplacev1.DegradedCondition)
		Expect(degraded.Status).To(Equal(metav1.ConditionTrue))
		Expect(degraded.Message).To(Equal("machine workers-2 (node " + w.node(1) + ") failed: rke2 upgrade job failed: BackoffLimitExceeded"))
		Expect(w.machineStatus("md", "workers-2").Message).To(Equal("rke2 upgrade job failed: BackoffLimitExceeded"))
		Expect(w.machineStatus("md", "workers-3").Message).To(Equal("not started: the task stopped after machine workers-2 failed"))

		failed := w.machine("workers-2")
		c := meta.FindStatusCondition(failed.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(inplacev1.FailedReason))
		Expect(c.Message).To(ContainSubstring("rke2 upgrade job failed: BackoffLimitExceeded"))
		for _, name := range []string{"workers-1", "workers-2", "workers-3", "workers-4"} {
			Expect(w.machine(name).Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel), "claim of %s released at the end", name)
		}
		Expect(meta.FindStatusCondition(w.machine("workers-3").Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)).To(BeNil())
		Expect(w.events(inplacev1.NodeFailedReason)).To(ContainElement(ContainSubstring("BackoffLimitExceeded")))
	})

	It("aborts mid-flight: aborts the running NodeUpdate, waits for it, releases the claims", func() {
		w := newMDWorld(3)
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, time.Hour)
		sim.SetAbortDelay(time.Second)
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(func() inplacev1.NodeUpdatePhase {
			if nu := w.nodeUpdateOf("workers-1"); nu != nil {
				return nu.Status.Phase
			}
			return ""
		}, timeout, poll).Should(Equal(inplacev1.NodeUpdatePhaseInProgress))

		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })

		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborting))
		Expect(w.nodeUpdateOf("workers-1").Spec.Phase).To(Equal(inplacev1.TaskActionAbort))
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Consistently(func() map[string]int { return rec.Creations() }, time.Second, poll).Should(Equal(map[string]int{"workers-1": 1}))

		for _, m := range w.machines {
			Expect(w.machine(m.Name).Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel))
		}
		c := meta.FindStatusCondition(w.machine("workers-1").Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Reason).To(Equal(inplacev1.AbortedReason))
		Expect(meta.FindStatusCondition(w.machine("workers-2").Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)).To(BeNil())
		Expect(w.machineStatus("md", "workers-2").State).To(Equal(inplacev1.MachineStateAborted))
		Expect(w.task("md").Status.Failed).To(BeZero(), "an aborted node is not a failed node")
	})

	It("lets a new request abort the old task and take over its machines", func() {
		w := newMDWorld(3)
		installExternalUpdater(w.ns)
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, 800*time.Millisecond)
		sim.SetAbortDelay(500 * time.Millisecond)
		requester := &upgraderequest.Requester{Client: k8s, DefaultUpdater: "ExternalUpgrader/default"}
		request := func(v string) upgraderequest.Decision {
			GinkgoHelper()
			d, err := requester.Request(ctx, upgraderequest.Request{
				Namespace: w.ns, ClusterName: "harvester", Version: v,
				Target: upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"}},
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(d.Accepted).To(BeTrue(), d.Message)
			return d
		}
		old := request("v1.34.1+rke2r1")
		Eventually(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-1") }, timeout, poll).ShouldNot(BeNil())

		takeover := request("v1.34.2+rke2r1")
		Expect(takeover.Aborted).To(Equal([]string{old.TaskName}))
		Expect(w.task(old.TaskName).Spec.Phase).To(Equal(inplacev1.TaskActionAbort))

		Eventually(w.phaseOf(old.TaskName), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Eventually(w.phaseOf(takeover.TaskName), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(rec.MaxRunning()).To(Equal(1), "the old and the new task together never ran two nodes at once")
		for _, m := range w.machines {
			Expect(w.machine(m.Name).Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, "v1.34.2+rke2r1"))
			Expect(w.machine(m.Name).Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel))
		}
		Expect(w.task(takeover.TaskName).Status.Upgraded).To(Equal(int32(3)))
		Expect(w.task(takeover.TaskName).Spec.UpdaterRef).To(Equal(inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}))
	})

	It("upgrades only the machines Cluster API hands to an externally paced task", func() {
		w := newMDWorld(3)
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 200*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("ext", func(t *inplacev1.UpgradeTask) {
			t.Spec.Pacing = inplacev1.PacingExternal
			t.Spec.Machines = []string{"workers-2"}
			t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(3))
		}))).To(Succeed())
		Eventually(func() int32 { return w.task("ext").Status.Upgraded }, timeout, poll).Should(Equal(int32(1)))
		Consistently(func() map[string]int { return rec.Creations() }, time.Second, poll).Should(Equal(map[string]int{"workers-2": 1}))
		t := w.task("ext")
		Expect(t.Status.Phase).To(Equal(inplacev1.TaskPhaseInProgress), "two machines still wait for Cluster API")
		Expect(t.Status.Total).To(Equal(int32(3)))
		Expect(t.Status.Waiting).To(Equal(int32(2)))

		w.editTask("ext", func(t *inplacev1.UpgradeTask) { t.Spec.Machines = []string{"workers-1", "workers-2", "workers-3"} })
		Eventually(w.phaseOf("ext"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		expectUpgraded(w, "ext", rec, targetVersion)
	})

	It("never starts a NodeUpdate on a handed-over machine whose node already runs the target", func() {
		w := newMDWorld(3)
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 200*time.Millisecond)
		// As the soak's seed 264 left it: the machine's node reached the target under a
		// NodeUpdate that was then marked Aborted, and Cluster API handed it to a new task.
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			m := w.machine("workers-2")
			if m.Status.NodeInfo == nil {
				m.Status.NodeInfo = &corev1.NodeSystemInfo{}
			}
			m.Status.NodeInfo.KubeletVersion = targetVersion
			return k8s.Status().Update(ctx, m)
		})).To(Succeed())
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			m := w.machine("workers-2")
			m.Labels[inplacev1.UpgradeTaskLabel] = "ext"
			return k8s.Update(ctx, m)
		})).To(Succeed())
		Expect(k8s.Create(ctx, w.mdTask("ext", func(t *inplacev1.UpgradeTask) {
			t.Spec.Pacing = inplacev1.PacingExternal
			t.Spec.Machines = []string{"workers-2"}
			t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(3))
		}))).To(Succeed())
		Eventually(func() int32 { return w.task("ext").Status.Upgraded }, timeout, poll).Should(Equal(int32(1)))
		Consistently(func() map[string]int { return rec.Creations() }, 2*time.Second, poll).Should(BeEmpty())
		Eventually(func() map[string]string { return w.machine("workers-2").Annotations }, timeout, poll).
			Should(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, targetVersion))
	})

	It("never upgrades again a machine that another task's NodeUpdate upgraded to the target, while its Machine does not show it yet", func() {
		w := newMDWorld(3)
		simulate(w.ns, 200*time.Millisecond)
		// Issue #34 (the soak's seed 9238): a NodeUpdate of an earlier task finished
		// workers-2, and the Machine does not show it yet: its nodeInfo is Cluster API's
		// copy of the Node, and the release annotation is written behind.
		earlier := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "earlier-workers-2", Labels: map[string]string{inplacev1.ClusterNameLabel: "harvester"}},
			Spec: inplacev1.NodeUpdateSpec{ClusterName: "harvester", MachineName: "workers-2", NodeName: w.node(1), Version: targetVersion,
				UpdaterRef: inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}},
		}
		Expect(k8s.Create(ctx, earlier)).To(Succeed())
		earlier.Status.Phase = inplacev1.NodeUpdatePhaseSucceeded
		Expect(k8s.Status().Update(ctx, earlier)).To(Succeed())
		lagging := w.machine("workers-2")
		Expect(lagging.Status.NodeInfo == nil || lagging.Status.NodeInfo.KubeletVersion != targetVersion).To(BeTrue(), "the Machine lags")
		Expect(lagging.Annotations).NotTo(HaveKey(inplacev1.UpgradeReleaseAnnotation))

		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(3)) }))).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		var onWorkers2 []string
		for _, nu := range w.nodeUpdates() {
			if nu.Spec.MachineName == "workers-2" {
				onWorkers2 = append(onWorkers2, nu.Name)
			}
		}
		Expect(onWorkers2).To(Equal([]string{earlier.Name}), "no second NodeUpdate on workers-2")
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(Equal(3))
	})

	It("asks the live node before it starts a machine: one whose node already runs the target after an aborted NodeUpdate is not upgraded again while its Machine lags", func() {
		w := newMDWorld(3)
		simulate(w.ns, 200*time.Millisecond)
		// Issue #34 point 1: a NodeUpdate of an earlier task upgraded workers-2's node and
		// was then marked Aborted (its task aborted in the same moment); the Machine does
		// not show the new kubelet yet (its nodeInfo is Cluster API's copy of the Node),
		// and no release annotation was written. Only the live Node says it is there.
		earlier := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "earlier-workers-2", Labels: map[string]string{inplacev1.ClusterNameLabel: "harvester"}},
			Spec: inplacev1.NodeUpdateSpec{ClusterName: "harvester", MachineName: "workers-2", NodeName: w.node(1), Version: targetVersion,
				UpdaterRef: inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}},
		}
		Expect(k8s.Create(ctx, earlier)).To(Succeed())
		earlier.Status.Phase = inplacev1.NodeUpdatePhaseAborted
		Expect(k8s.Status().Update(ctx, earlier)).To(Succeed())
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			node := &corev1.Node{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: w.node(1)}, node); err != nil {
				return err
			}
			node.Status.NodeInfo.KubeletVersion = targetVersion
			return k8s.Status().Update(ctx, node)
		})).To(Succeed())
		lagging := w.machine("workers-2")
		Expect(lagging.Status.NodeInfo == nil || lagging.Status.NodeInfo.KubeletVersion != targetVersion).To(BeTrue(), "the Machine lags")
		Expect(lagging.Annotations).NotTo(HaveKey(inplacev1.UpgradeReleaseAnnotation))

		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(3)) }))).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		var onWorkers2 []string
		for _, nu := range w.nodeUpdates() {
			if nu.Spec.MachineName == "workers-2" {
				onWorkers2 = append(onWorkers2, nu.Name)
			}
		}
		Expect(onWorkers2).To(Equal([]string{earlier.Name}), "no second NodeUpdate on workers-2")
		Expect(w.task("md").Status.Total).To(Equal(int32(2)), "workers-2 is already at the target: the task does not take it")
		Expect(w.machine("workers-2").Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel))
	})

	It("starts nothing while paused, skips pauseNodes, and completes when they are released", func() {
		w := newMDWorld(3)
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 200*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Paused = true }))).To(Succeed())
		Eventually(func() string { return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Reason }, timeout, poll).
			Should(Equal(inplacev1.PausedByUserReason))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())
		Expect(w.task("md").Status.Phase).To(Equal(inplacev1.TaskPhasePending))

		w.editTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Paused = false
			t.Spec.PauseNodes = []string{w.node(0)}
		})
		Eventually(func() int32 { return w.task("md").Status.Upgraded }, timeout, poll).Should(Equal(int32(2)))
		Consistently(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-1") }, time.Second, poll).Should(BeNil())
		Expect(w.machineStatus("md", "workers-1").Message).To(Equal("listed in spec.pauseNodes"))
		Expect(w.task("md").Status.Phase).To(Equal(inplacev1.TaskPhaseInProgress))

		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.PauseNodes = nil })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		expectUpgraded(w, "md", rec, targetVersion)
	})

	Context("with a clock the test controls", func() {
		BeforeEach(func() {
			// Saturday 2026-11-21 10:00 UTC.
			fakeClock = clocktesting.NewFakePassiveClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		})

		It("starts nodes only inside the maintenance window", func() {
			w := newMDWorld(2)
			rec := watchNodeUpdates(w.ns)
			simulate(w.ns, 200*time.Millisecond)
			Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
				t.Spec.Window = &inplacev1.MaintenanceWindow{TimeZone: "Europe/Berlin", Days: []inplacev1.Weekday{"Saturday"}, Start: "22:00", End: "04:00"}
			}))).To(Succeed())
			Eventually(func() metav1.Condition { return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition) }, timeout, poll).
				Should(And(
					HaveField("Reason", inplacev1.OutsideWindowReason),
					HaveField("Message", "Window: outside the maintenance window 22:00-04:00 Europe/Berlin (Saturday); it opens next at 2026-11-21T22:00:00+01:00"),
				))
			Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())

			// 22:30 in Berlin.
			fakeClock.SetTime(time.Date(2026, 11, 21, 21, 30, 0, 0, time.UTC))
			Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
			expectUpgraded(w, "md", rec, targetVersion)
		})

		It("waits postNodeDelay after each node before the next", func() {
			w := newMDWorld(2)
			rec := watchNodeUpdates(w.ns)
			simulate(w.ns, 100*time.Millisecond)
			Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
				t.Spec.PostNodeDelay = &metav1.Duration{Duration: time.Hour}
			}))).To(Succeed())
			Eventually(func() int32 { return w.task("md").Status.Upgraded }, timeout, poll).Should(Equal(int32(1)))
			Eventually(func() string { return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Reason }, timeout, poll).
				Should(Equal(inplacev1.SoakingReason))
			Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(Equal(1))

			fakeClock.SetTime(time.Now().Add(2 * time.Hour))
			Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
			expectUpgraded(w, "md", rec, targetVersion)
		})
	})

	It("computes the plan in a dry run and creates nothing; turning dryRun off carries it out", func() {
		w := newMDWorld(3)
		Expect(fixtures.SetNodeReady(ctx, k8s, w.node(1), false)).To(Succeed())
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 200*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.DryRun = true
			t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2))
			t.Spec.NodeOrder = []string{w.node(2)}
		}))).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhasePlanned))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())

		t := w.task("md")
		Expect(condition(t.Status.Conditions, inplacev1.PausedCondition).Reason).To(Equal(inplacev1.DryRunReason))
		Expect(t.Status.Machines).To(HaveLen(3))
		order := []string{}
		for _, ms := range t.Status.Machines {
			order = append(order, ms.Name)
			Expect(ms.Order).To(Equal(int32(len(order))))
			Expect(ms.Preflight).To(HaveLen(len(preflight.Default(nil))), "every check's result for %s", ms.Name)
		}
		Expect(order).To(Equal([]string{"workers-3", "workers-1", "workers-2"}))
		Expect(t.Status.Machines[0].Preflight).To(HaveEach(HaveField("Passed", true)))
		Expect(t.Status.Machines[2].Preflight[0]).To(Equal(inplacev1.PreflightCheckStatus{Name: "NodeReady", Passed: false, Message: "node " + w.node(1) + " is not Ready"}))
		Expect(t.Status.Machines[2].Message).To(Equal("dry run: would be held by NodeReady: node " + w.node(1) + " is not Ready"))
		for _, m := range w.machines {
			got := w.machine(m.Name)
			Expect(got.Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel), "a dry run claims nothing")
			Expect(meta.FindStatusCondition(got.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)).To(BeNil())
		}
		Expect(pendingTainted(w.node(0), w.node(1), w.node(2))).To(BeEmpty(), "a dry run taints no node")

		Expect(fixtures.SetNodeReady(ctx, k8s, w.node(1), true)).To(Succeed())
		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.DryRun = false })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		// The first round (maxUnavailable 2) starts the nodeOrder node and the next in the
		// plan together; without nodeOrder it would have been workers-1 and workers-2.
		Expect(rec.StartOrder()[:2]).To(ConsistOf("workers-3", "workers-1"))
		expectUpgraded(w, "md", rec, targetVersion)
		Expect(pendingTainted(w.node(0), w.node(1), w.node(2))).To(BeEmpty(), "no taint once the task completed")
	})

	It("neither starts a node twice nor skips one across a restart of the manager", func() {
		w := newMDWorld(5)
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 600*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2)) }))).To(Succeed())
		Eventually(func() int { return len(rec.Creations()) }, timeout, poll).Should(BeNumerically(">=", 2))

		stop()
		stop = nil
		// While the manager is down, the running nodes finish.
		time.Sleep(time.Second)
		stop = startManager(clk)

		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(rec.MaxRunning()).To(Equal(2))
		expectUpgraded(w, "md", rec, targetVersion)
	})
})
