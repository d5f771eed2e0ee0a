package upgradetask

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

func skippedNU(name, machine string) *inplacev1.NodeUpdate {
	return &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: inplacev1.NodeUpdateSpec{MachineName: machine},
		Status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseSkipped, FailureReason: inplacev1.NodeSkippedReason,
			FailureMessage: "drainPolicy Skip: the drain of node n2 was blocked for more than 2s by pod default/web (PodDisruptionBudget web)"}}
}

func skipMember(name string, nu *inplacev1.NodeUpdate, state inplacev1.MachineState) *member {
	return &member{name: name, nodeName: "node-" + name, machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}, nu: nu, state: state}
}

// TestSkippedMachineIsRetriedOnceAtTheEnd follows a skipped machine through the task's
// decisions: kept Skipped while another machine runs (the task not Completed), made
// Waiting with the retry's name once none does, and Failed when the retry is skipped too.
func TestSkippedMachineIsRetriedOnceAtTheEnd(t *testing.T) {
	task := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Name: "t"}}
	first := skippedNU(upgraderequest.NodeUpdateName("t", "m2"), "m2")

	m2 := skipMember("m2", first, inplacev1.MachineStateWaiting)
	m2.state, m2.message = stateFromNodeUpdate(first)
	judgeSkipped(task, m2)
	if m2.state != inplacev1.MachineStateSkipped || !strings.Contains(m2.message, "pod default/web") {
		t.Fatalf("first skip: got %s %q", m2.state, m2.message)
	}
	running := skipMember("m3", &inplacev1.NodeUpdate{}, inplacev1.MachineStateInProgress)
	s := &taskScope{task: task, members: []*member{skipMember("m1", &inplacev1.NodeUpdate{}, inplacev1.MachineStateUpgraded), m2, running}}
	retrySkipped(s)
	if m2.state != inplacev1.MachineStateSkipped || m2.retry {
		t.Fatalf("retried while another machine runs: %s retry=%v", m2.state, m2.retry)
	}
	running.state = inplacev1.MachineStateUpgraded
	if p := computePhase(s, false); p != inplacev1.TaskPhaseInProgress {
		t.Fatalf("with a skipped machine not tried again the task is %s, want InProgress", p)
	}
	retrySkipped(s)
	if m2.state != inplacev1.MachineStateWaiting || !m2.retry {
		t.Fatalf("not retried once every other machine is done: %s retry=%v", m2.state, m2.retry)
	}
	if got, want := nodeUpdateName(task, m2), upgraderequest.RetryNodeUpdateName("t", "m2"); got != want || got == first.Name {
		t.Fatalf("retry NodeUpdate name %q, want %q (not the first's %q)", got, want, first.Name)
	}

	// The next reconcile reads both NodeUpdates: the retry is the machine's, the first kept.
	retry := skippedNU(upgraderequest.RetryNodeUpdateName("t", "m2"), "m2")
	for _, order := range [][]*inplacev1.NodeUpdate{{first, retry}, {retry, first}} {
		sc := &taskScope{task: task, nodeUpdates: map[string]*inplacev1.NodeUpdate{}, skippedFirst: map[string]*inplacev1.NodeUpdate{}}
		for _, nu := range order {
			sc.addNodeUpdate(nu)
		}
		if sc.nodeUpdates["m2"] != retry || sc.skippedFirst["m2"] != first {
			t.Fatalf("order %s, %s: machine's %v, first %v", order[0].Name, order[1].Name, sc.nodeUpdates["m2"].Name, sc.skippedFirst["m2"])
		}
	}
	again := skipMember("m2", retry, inplacev1.MachineStateWaiting)
	again.state, again.message = stateFromNodeUpdate(retry)
	again.skippedFirst = first
	judgeSkipped(task, again)
	if again.state != inplacev1.MachineStateFailed || !strings.Contains(again.message, inplacev1.SkippedAgainReason) || !again.failedForTask() {
		t.Fatalf("skipped again: got %s %q", again.state, again.message)
	}
	s = &taskScope{task: task, members: []*member{skipMember("m1", &inplacev1.NodeUpdate{}, inplacev1.MachineStateUpgraded), again}}
	if p := computePhase(s, false); p != inplacev1.TaskPhaseFailed {
		t.Fatalf("skipped twice: task %s, want Failed", p)
	}
	var cond metav1.Condition
	setSkippedCondition(s, func(typ string, ok bool, reason, msg string) {
		cond = metav1.Condition{Type: typ, Reason: reason, Message: msg, Status: metav1.ConditionFalse}
		if ok {
			cond.Status = metav1.ConditionTrue
		}
	})
	if cond.Status != metav1.ConditionTrue || cond.Reason != inplacev1.SkippedAgainReason || !strings.Contains(cond.Message, "node node-m2") || !strings.Contains(cond.Message, "pod default/web") {
		t.Fatalf("NodesSkipped: %+v", cond)
	}
}

// TestSkipUnderClusterAPIPacing: Cluster API picks the machines of an externally paced
// task, so a skip fails the machine there, with no retry.
func TestSkipUnderClusterAPIPacing(t *testing.T) {
	task := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: inplacev1.UpgradeTaskSpec{Pacing: inplacev1.PacingExternal}}
	nu := skippedNU(upgraderequest.NodeUpdateName("t", "m2"), "m2")
	m := skipMember("m2", nu, inplacev1.MachineStateWaiting)
	m.state, m.message = stateFromNodeUpdate(nu)
	judgeSkipped(task, m)
	if m.state != inplacev1.MachineStateFailed || !strings.Contains(m.message, "Cluster API picks") || !strings.Contains(m.message, "pod default/web") {
		t.Fatalf("got %s %q", m.state, m.message)
	}
}
