package upgradetask

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// annotateCluster sets an annotation of the world's Cluster, as kubectl annotate --overwrite does.
func (w *world) annotateCluster(key, value string) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &clusterv1.Cluster{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "harvester"}, c); err != nil {
			return err
		}
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[key] = value
		return k8s.Update(ctx, c)
	})).To(Succeed())
}

// conditionOf returns a condition of a task as the API server has it.
func (w *world) conditionOf(task, t string) func() metav1.Condition {
	return func() metav1.Condition {
		got := &inplacev1.UpgradeTask{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: task}, got); err != nil {
			return metav1.Condition{}
		}
		return condition(got.Status.Conditions, t)
	}
}

// nodeUpdatesOfTask counts the NodeUpdates a task controls.
func (w *world) nodeUpdatesOfTask(task string) func() int {
	return func() int {
		n := 0
		for _, nu := range w.nodeUpdates() {
			if controllingTask(&nu) == task {
				n++
			}
		}
		return n
	}
}

var _ = Describe("The failure budget of a Cluster", func() {
	var stop func()
	JustBeforeEach(func() { stop = startManager(nil) })
	AfterEach(func() {
		if stop != nil {
			stop()
		}
	})

	// othersTask is an UpgradeTask of a second MachineDeployment "others" of the same Cluster.
	othersTask := func(w *world, name string, mutate ...func(*inplacev1.UpgradeTask)) *inplacev1.UpgradeTask {
		return w.mdTask(name, append([]func(*inplacev1.UpgradeTask){func(t *inplacev1.UpgradeTask) {
			t.Spec.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "others"}
		}}, mutate...)...)
	}

	It("by default pauses every other task of the Cluster after one failed node, across a restart, until the reset annotation lifts it", func() {
		w := newMDWorld(2)
		_, _, err := fixtures.MachineDeployment(ctx, k8s, w.ns, "harvester", "others", fromVersion, 2)
		Expect(err).NotTo(HaveOccurred())
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, 300*time.Millisecond)
		sim.FailMachine("workers-1", "rke2 upgrade job failed: BackoffLimitExceeded")
		// Task b waits (spec.paused) until task a's node has failed, so that it has started
		// nothing before.
		Expect(k8s.Create(ctx, othersTask(w, "b", func(t *inplacev1.UpgradeTask) { t.Spec.Paused = true }))).To(Succeed())
		Expect(k8s.Create(ctx, w.mdTask("a"))).To(Succeed())
		Eventually(w.phaseOf("a"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))
		Expect(rec.Creations()).To(Equal(map[string]int{"workers-1": 1}), "the task with the failure stops as before")

		w.editTask("b", func(t *inplacev1.UpgradeTask) { t.Spec.Paused = false })
		Eventually(func() string { return w.conditionOf("b", inplacev1.PausedCondition)().Reason }, timeout, poll).Should(Equal(inplacev1.FailureBudgetExhaustedReason))
		paused := w.conditionOf("b", inplacev1.PausedCondition)()
		Expect(paused.Status).To(Equal(metav1.ConditionTrue))
		Expect(paused.Message).To(ContainSubstring("machine workers-1 (node " + w.node(0) + ") of UpgradeTask a failed at "))
		Expect(paused.Message).To(ContainSubstring("rke2 upgrade job failed: BackoffLimitExceeded"))
		Expect(paused.Message).To(ContainSubstring("1 failed node(s), budget 1"))
		Expect(paused.Message).To(ContainSubstring("kubectl annotate cluster -n " + w.ns + " harvester " + inplacev1.FailureBudgetResetAnnotation + "="))
		exhausted := w.conditionOf("b", inplacev1.FailureBudgetExhaustedCondition)()
		Expect(exhausted.Status).To(Equal(metav1.ConditionTrue))
		Expect(exhausted.Reason).To(Equal(inplacev1.FailureBudgetExhaustedReason))
		Consistently(w.nodeUpdatesOfTask("b"), 1500*time.Millisecond, poll).Should(BeZero())
		Expect(w.phaseOf("b")()).To(Equal(inplacev1.TaskPhasePending))
		Eventually(func() []string { return w.events(inplacev1.FailureBudgetExhaustedReason) }, timeout, poll).
			Should(ContainElement(HavePrefix("the failure budget of Cluster harvester is exhausted")), "the Cluster's event (the task's Paused event starts with the gate's name)")

		By("a restarted manager keeps task b paused: the failures are read from the API server")
		stop()
		stop = startManager(nil)
		Consistently(w.nodeUpdatesOfTask("b"), 1500*time.Millisecond, poll).Should(BeZero())
		Expect(w.conditionOf("b", inplacev1.PausedCondition)().Reason).To(Equal(inplacev1.FailureBudgetExhaustedReason))

		By("the reset annotation lifts the budget: task b resumes by itself, task a stays Failed, the failed node is not retried")
		w.annotateCluster(inplacev1.FailureBudgetResetAnnotation, time.Now().UTC().Format(time.RFC3339))
		Eventually(w.phaseOf("b"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(rec.Creations()).To(Equal(map[string]int{"workers-1": 1, "others-1": 1, "others-2": 1}))
		Expect(w.phaseOf("a")()).To(Equal(inplacev1.TaskPhaseFailed))
		exhausted = w.conditionOf("b", inplacev1.FailureBudgetExhaustedCondition)()
		Expect(exhausted.Status).To(Equal(metav1.ConditionFalse))
		Expect(exhausted.Message).To(ContainSubstring("0 failed node(s) since the reset at"))
	})

	It("with a budget of 2 goes on after the first failed node and stops every node at the second", func() {
		w := newMDWorld(4)
		w.annotateCluster(inplacev1.FailureBudgetAnnotation, "2")
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, time.Second)
		sim.KeepNodesReady()
		sim.FailMachine("workers-1", "step OS failed")
		sim.FailMachine("workers-3", "step RKE2 failed")
		Expect(k8s.Create(ctx, w.mdTask("a"))).To(Succeed())

		Eventually(func() string { return w.conditionOf("a", inplacev1.FailureBudgetExhaustedCondition)().Message }, timeout, poll).
			Should(ContainSubstring("1 failed node(s) of a budget of 2"))
		Expect(w.phaseOf("a")()).To(Equal(inplacev1.TaskPhaseInProgress), "a failed node within the budget does not end the task")

		Eventually(w.phaseOf("a"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))
		Consistently(rec.Creations, 1500*time.Millisecond, poll).Should(Equal(map[string]int{"workers-1": 1, "workers-2": 1, "workers-3": 1}))
		t := w.task("a")
		Expect(t.Status.Failed).To(Equal(int32(2)))
		Expect(t.Status.Upgraded).To(Equal(int32(1)))
		Expect(w.machineStatus("a", "workers-4").Message).To(Equal("not started: the task stopped after machine workers-1 failed"))
		exhausted := condition(t.Status.Conditions, inplacev1.FailureBudgetExhaustedCondition)
		Expect(exhausted.Status).To(Equal(metav1.ConditionTrue))
		Expect(exhausted.Message).To(ContainSubstring("2 failed node(s), budget 2"))
		Expect(exhausted.Message).To(ContainSubstring("machine workers-1 (node " + w.node(0) + ") of UpgradeTask a failed at "))
		Expect(exhausted.Message).To(ContainSubstring("machine workers-3 (node " + w.node(2) + ") of UpgradeTask a failed at "))
		Expect(condition(t.Status.Conditions, inplacev1.DegradedCondition).Status).To(Equal(metav1.ConditionTrue))
	})

	It("with a budget of 3 stops a control plane's task at its first failed node, and names etcd and the reset in the condition", func() {
		w := newCPWorld(3)
		w.annotateCluster(inplacev1.FailureBudgetAnnotation, "3")
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, 300*time.Millisecond)
		sim.KeepNodesReady()
		sim.FailMachine("cp-1", "step RKE2 failed: etcd did not rejoin")
		Expect(k8s.Create(ctx, w.mdTask("cp", func(t *inplacev1.UpgradeTask) {
			t.Spec.MachineDeploymentRef = nil
			t.Spec.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
			t.Spec.NodeOrder = []string{w.node(0)}
		}))).To(Succeed())

		Eventually(w.phaseOf("cp"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))
		Consistently(rec.Creations, 1500*time.Millisecond, poll).Should(Equal(map[string]int{"cp-1": 1}), "no other control plane node starts after a failed one, whatever the budget")
		t := w.task("cp")
		Expect(t.Status.Failed).To(Equal(int32(1)))
		Expect(w.machineStatus("cp", "cp-2").Message).To(Equal("not started: the task stopped after machine cp-1 failed"))
		exhausted := condition(t.Status.Conditions, inplacev1.FailureBudgetExhaustedCondition)
		Expect(exhausted.Status).To(Equal(metav1.ConditionTrue))
		Expect(exhausted.Reason).To(Equal(inplacev1.FailureBudgetExhaustedReason))
		Expect(exhausted.Message).To(ContainSubstring("a failed control plane node exhausts it whatever its size: control plane machine cp-1 failed"))
		Expect(exhausted.Message).To(ContainSubstring("1 failed node(s), budget 3"))
		Expect(exhausted.Message).To(ContainSubstring("control plane machine cp-1 (node " + w.node(0) + ") of UpgradeTask cp failed at "))
		Expect(exhausted.Message).To(ContainSubstring("step RKE2 failed: etcd did not rejoin"))
		Expect(exhausted.Message).To(ContainSubstring("once etcd is healthy again"))
		Expect(exhausted.Message).To(ContainSubstring("kubectl annotate cluster -n " + w.ns + " harvester " + inplacev1.FailureBudgetResetAnnotation + "="))
	})

	It("takes an unusable budget as 1, says so with the value, and stops at the first failed node", func() {
		w := newMDWorld(3)
		w.annotateCluster(inplacev1.FailureBudgetAnnotation, "two")
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, time.Second)
		sim.KeepNodesReady()
		sim.FailMachine("workers-1", "step OS failed")
		Expect(k8s.Create(ctx, w.mdTask("a"))).To(Succeed())

		Eventually(func() string { return w.conditionOf("a", inplacev1.FailureBudgetExhaustedCondition)().Reason }, timeout, poll).
			Should(Equal(inplacev1.InvalidFailureBudgetReason))
		Expect(w.conditionOf("a", inplacev1.FailureBudgetExhaustedCondition)().Message).To(Equal(
			`annotation inplace.cluster.x-k8s.io/failure-budget is "two", not a whole number of at least 1; the budget is 1 until it is fixed`))
		Eventually(func() []string { return w.events(inplacev1.InvalidFailureBudgetReason) }, timeout, poll).Should(ContainElement(ContainSubstring(`"two"`)))

		Eventually(w.phaseOf("a"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))
		Consistently(rec.Creations, time.Second, poll).Should(Equal(map[string]int{"workers-1": 1}))
		exhausted := w.conditionOf("a", inplacev1.FailureBudgetExhaustedCondition)()
		Expect(exhausted.Status).To(Equal(metav1.ConditionTrue))
		Expect(exhausted.Message).To(ContainSubstring("1 failed node(s), budget 1"))
		Expect(exhausted.Message).To(ContainSubstring(`"two"`))
	})
})

var _ = Describe("readFailureBudget", func() {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	nu := func(name, machine string, phase inplacev1.NodeUpdatePhase, created, ended time.Time, task string) inplacev1.NodeUpdate {
		n := inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
			Spec:   inplacev1.NodeUpdateSpec{MachineName: machine, NodeName: machine},
			Status: inplacev1.NodeUpdateStatus{Phase: phase, CompletionTime: ptr.To(metav1.NewTime(ended)), FailureMessage: "boom"}}
		if task != "" {
			n.OwnerReferences = []metav1.OwnerReference{{Kind: "UpgradeTask", Name: task, Controller: ptr.To(true)}}
		}
		return n
	}
	at := func(minutesAgo int) time.Time { return now.Add(-time.Duration(minutesAgo) * time.Minute) }
	DescribeTable("counts the failures that ended after the reset and were not upgraded since",
		func(annotations map[string]string, nus []inplacev1.NodeUpdate, wantLimit int, wantFailed []string, wantProblem string) {
			b := readFailureBudget(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: annotations}}, nus, now, nil)
			Expect(b.limit).To(Equal(wantLimit))
			var failed []string
			for _, f := range b.failed {
				failed = append(failed, f.nodeUpdate)
			}
			Expect(failed).To(Equal(wantFailed))
			if wantProblem == "" {
				Expect(b.problems).To(BeEmpty())
			} else {
				Expect(b.problems).To(ContainElement(ContainSubstring(wantProblem)))
			}
		},
		Entry("no annotation: budget 1, every failure of a task counts, oldest first", nil,
			[]inplacev1.NodeUpdate{nu("n2", "m2", inplacev1.NodeUpdatePhaseFailed, at(20), at(5), "t"), nu("n1", "m1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t")},
			1, []string{"n1", "n2"}, ""),
		Entry("an aborted NodeUpdate and a hand-made one are not failures of a task", nil,
			[]inplacev1.NodeUpdate{nu("n1", "m1", inplacev1.NodeUpdatePhaseAborted, at(30), at(10), "t"), nu("n2", "m2", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "")},
			1, nil, ""),
		Entry("a machine upgraded by a later NodeUpdate is no longer a failed node", map[string]string{inplacev1.FailureBudgetAnnotation: "3"},
			[]inplacev1.NodeUpdate{nu("n1", "m1", inplacev1.NodeUpdatePhaseFailed, at(30), at(20), "t"), nu("n2", "m1", inplacev1.NodeUpdatePhaseSucceeded, at(10), at(5), "u")},
			3, nil, ""),
		Entry("the reset lifts the failures that ended at or before it", map[string]string{inplacev1.FailureBudgetResetAnnotation: at(10).Format(time.RFC3339)},
			[]inplacev1.NodeUpdate{nu("n1", "m1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t"), nu("n2", "m2", inplacev1.NodeUpdatePhaseFailed, at(30), at(9), "t")},
			1, []string{"n2"}, ""),
		Entry("a budget of 0 is unusable and counts as 1", map[string]string{inplacev1.FailureBudgetAnnotation: "0"},
			nil, 1, nil, `is "0", not a whole number of at least 1`),
		Entry("a reset that is not a time lifts nothing", map[string]string{inplacev1.FailureBudgetResetAnnotation: "yes"},
			[]inplacev1.NodeUpdate{nu("n1", "m1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t")},
			1, []string{"n1"}, `is "yes", not an RFC3339 time`),
		Entry("a reset in the future lifts nothing", map[string]string{inplacev1.FailureBudgetResetAnnotation: now.Add(time.Hour).Format(time.RFC3339)},
			[]inplacev1.NodeUpdate{nu("n1", "m1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t")},
			1, []string{"n1"}, "in the future"),
	)

	It("lets a failed worker node spend a budget of 3 but not a failed control plane node", func() {
		cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{inplacev1.FailureBudgetAnnotation: "3"}}}
		isControlPlane := func(nu *inplacev1.NodeUpdate) bool { return nu.Spec.MachineName == "cp-1" }
		worker := readFailureBudget(cluster, []inplacev1.NodeUpdate{nu("n1", "w-1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t")}, now, isControlPlane)
		Expect(worker.exhausted()).To(BeFalse())
		Expect(worker.gateMessage()).To(BeEmpty())
		cp := readFailureBudget(cluster, []inplacev1.NodeUpdate{nu("n2", "cp-1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t")}, now, isControlPlane)
		Expect(cp.exhausted()).To(BeTrue())
		Expect(cp.gateMessage()).To(ContainSubstring("control plane machine cp-1 failed"))
		lifted := readFailureBudget(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{
			inplacev1.FailureBudgetAnnotation: "3", inplacev1.FailureBudgetResetAnnotation: at(5).Format(time.RFC3339)}}},
			[]inplacev1.NodeUpdate{nu("n2", "cp-1", inplacev1.NodeUpdatePhaseFailed, at(30), at(10), "t")}, now, isControlPlane)
		Expect(lifted.exhausted()).To(BeFalse(), "the reset annotation lifts a control plane failure as any other")
	})
})
