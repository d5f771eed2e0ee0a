package upgradetask

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// TestMachineWriterWritesEndsFirst: with one worker and every write handed over before it
// takes any, the writer writes the ends of nodes first, then the starts, then the claims
// and Waiting conditions in the order they were handed over; a Waiting write that a start
// replaced before its turn is written once, as the start. When the API server falls behind
// (make bench), a task's end then finds the ends written, and the Waiting conditions that
// fell behind are replaced rather than sent.
func TestMachineWriterWritesEndsFirst(t *testing.T) {
	var mu sync.Mutex
	var written []string
	all := make(chan struct{})
	const writes = 6
	write := func(_ context.Context, m *clusterv1.Machine, want machineWant, _ *inplacev1.UpgradeTask) error {
		mu.Lock()
		defer mu.Unlock()
		reason := "released"
		if want.condition != nil {
			reason = want.condition.Reason
		}
		written = append(written, m.Name+":"+reason)
		if len(written) == writes {
			close(all)
		}
		return nil
	}
	w := newMachineWriter(write,
		func(m *clusterv1.Machine, _ *inplacev1.UpgradeTask) *clusterv1.Machine { return m },
		func(*inplacev1.UpgradeTask, []string) {}, func(types.NamespacedName) {})

	task := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "task", UID: "uid"},
		Spec: inplacev1.UpgradeTaskSpec{Version: "v1.36.0"}}
	mem := func(name string) *member {
		return &member{name: name, machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}}
	}
	wantOf := func(reason string) func(*member) machineWant {
		return func(*member) machineWant {
			switch reason {
			case inplacev1.WaitingReason:
				return machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, reason, "queued")}
			case inplacev1.InProgressReason:
				return machineWant{claim: true, skipRemediation: true, condition: machineCondition(metav1.ConditionFalse, reason, "started")}
			case inplacev1.FailedReason:
				// A failed machine keeps its claim while the task runs.
				return machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, reason, "failed")}
			}
			return machineWant{condition: machineCondition(metav1.ConditionTrue, inplacev1.DoneReason, "done"), release: "v1.36.0"}
		}
	}

	w.submit(task, []*member{mem("m1"), mem("m2"), mem("m3")}, wantOf(inplacev1.WaitingReason))
	w.submit(task, []*member{mem("m4")}, wantOf(inplacev1.DoneReason))
	w.submit(task, []*member{mem("m5")}, wantOf(inplacev1.InProgressReason))
	// m2 starts before its Waiting write had its turn.
	w.submit(task, []*member{mem("m2")}, wantOf(inplacev1.InProgressReason))
	w.submit(task, []*member{mem("m6")}, wantOf(inplacev1.FailedReason))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.ctx = ctx
	w.workers.Add(1)
	go w.work()
	defer func() {
		w.mu.Lock()
		w.stopped = true
		w.wake.Broadcast()
		w.mu.Unlock()
		w.workers.Wait()
	}()

	select {
	case <-all:
	case <-time.After(10 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the writer made %d of %d writes: %v", len(written), writes, written)
	}
	// One more write would show within this: m2's replaced Waiting write, sent after all.
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	want := []string{"m4:Done", "m6:Failed", "m5:InProgress", "m2:InProgress", "m1:Waiting", "m3:Waiting"}
	if !slices.Equal(written, want) {
		t.Errorf("written in this order: %v; want %v", written, want)
	}
}
