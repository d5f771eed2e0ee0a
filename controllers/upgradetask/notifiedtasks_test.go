package upgradetask

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/notify"
)

// A change found twice (a status write dropped on a conflict makes the next reconcile
// start from an older status) is told once; a new pause after a resume is told again.
func TestNotifiedTasksTellsEachChangeOnce(t *testing.T) {
	task := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "md", UID: "u1"}}
	var n notifiedTasks
	types := func(evs []notify.Event) []string {
		var out []string
		for _, ev := range evs {
			out = append(out, ev.Type)
		}
		return out
	}
	ev := func(typ, reason, machine string) notify.Event {
		return notify.Event{Type: typ, Reason: reason, Machine: machine}
	}
	steps := []struct {
		in   []notify.Event
		want []string
	}{
		{[]notify.Event{ev(notify.TaskStarted, "", "")}, []string{notify.TaskStarted}},
		{[]notify.Event{ev(notify.TaskPaused, "GateRed", "")}, []string{notify.TaskPaused}},
		{[]notify.Event{ev(notify.TaskStarted, "", ""), ev(notify.TaskPaused, "GateRed", "")}, nil},
		{[]notify.Event{ev(notify.TaskPaused, "PausedByUser", "")}, []string{notify.TaskPaused}},
		{[]notify.Event{ev(notify.TaskResumed, "PausedByUser", "")}, []string{notify.TaskResumed}},
		{[]notify.Event{ev(notify.TaskResumed, "PausedByUser", "")}, nil},
		{[]notify.Event{ev(notify.TaskPaused, "GateRed", "")}, []string{notify.TaskPaused}},
		{[]notify.Event{ev(notify.NodeFailed, "Failed", "workers-2"), ev(notify.NodeFailed, "Failed", "workers-2")}, []string{notify.NodeFailed}},
		{[]notify.Event{ev(notify.NodeFailed, "Failed", "workers-3"), ev(notify.TaskFailed, "Failed", "")}, []string{notify.NodeFailed, notify.TaskFailed}},
		{[]notify.Event{ev(notify.TaskFailed, "Failed", "")}, nil},
	}
	for i, s := range steps {
		if got := types(n.unsent(task, s.in)); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: told %v, want %v", i+1, got, s.want)
		}
	}
	// A task of the same name made anew is told from the start.
	again := task.DeepCopy()
	again.UID = "u2"
	if got := types(n.unsent(again, []notify.Event{ev(notify.TaskStarted, "", "")})); !slices.Equal(got, []string{notify.TaskStarted}) {
		t.Fatalf("a new task of the same name: told %v", got)
	}
}
