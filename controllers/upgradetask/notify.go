package upgradetask

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/notify"
)

// notifyTransitions queues a notification for each change since the status last written
// that a webhook is told of: the first node started, a node failed, the task paused or
// resumed, the task ended. It is called where the status is computed, once per status
// change, never per reconcile, and never waits for the webhook.
func (r *Reconciler) notifyTransitions(s *taskScope, prev *inplacev1.UpgradeTaskStatus) {
	if r.Notifier == nil {
		return
	}
	secretName, format := notifyTarget(s)
	if secretName == "" {
		return
	}
	for _, ev := range r.notified.unsent(s.task, notifyEvents(s, prev)) {
		r.Notifier.Enqueue(notify.Notification{
			Event:           ev,
			SecretNamespace: s.task.Namespace,
			SecretName:      secretName,
			Format:          format,
			// Only what the event recorder needs to name the task: the status of a task
			// of thousands of machines is not copied for a notification.
			Regarding: &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: s.task.Namespace, Name: s.task.Name, UID: s.task.UID}},
		})
	}
}

// notifyTarget is the Secret that configures a task's webhook, and the format asked:
// the task's spec.notify, else its Cluster's notify-secret annotation.
func notifyTarget(s *taskScope) (secretName string, format inplacev1.NotifyFormat) {
	if n := s.task.Spec.Notify; n != nil {
		return n.SecretRef.Name, n.Format
	}
	if s.cluster != nil {
		return s.cluster.Annotations[inplacev1.NotifySecretAnnotation], ""
	}
	return "", ""
}

// notifyEvents lists, in the order they happened, the changes from prev to the task's
// status that a webhook is told of.
func notifyEvents(s *taskScope, prev *inplacev1.UpgradeTaskStatus) []notify.Event {
	task := s.task
	st := &task.Status
	base := notify.Event{
		Namespace: task.Namespace, Cluster: task.Spec.ClusterName, Task: task.Name, Version: task.Spec.Version,
		Phase: string(st.Phase), Progress: st.Progress, Time: s.now.UTC(),
	}
	var out []notify.Event
	add := func(typ, reason, message string, mutate ...func(*notify.Event)) {
		ev := base
		ev.Type, ev.Reason, ev.Message = typ, reason, message
		for _, m := range mutate {
			m(&ev)
		}
		out = append(out, ev)
	}

	// A dry run's plan turned into a run starts from Planned; every other task from
	// Pending (or no phase yet, when its first node starts at its first reconcile).
	if st.Phase == inplacev1.TaskPhaseInProgress && (prev.Phase == "" || prev.Phase == inplacev1.TaskPhasePending || prev.Phase == inplacev1.TaskPhasePlanned) {
		add(notify.TaskStarted, inplacev1.InProgressReason, conditionMessage(st, inplacev1.ProgressingCondition))
	}

	before := map[string]inplacev1.MachineState{}
	for _, ms := range prev.Machines {
		before[ms.Name] = ms.State
	}
	for _, ms := range st.Machines {
		if ms.State == inplacev1.MachineStateFailed && before[ms.Name] != inplacev1.MachineStateFailed {
			add(notify.NodeFailed, inplacev1.FailedReason, ms.Message, func(ev *notify.Event) { ev.Machine, ev.Node = ms.Name, ms.NodeName })
		}
	}

	ended := prev.Phase != st.Phase && st.Phase.IsFinal() && st.Phase != inplacev1.TaskPhasePlanned
	oldPaused := meta.FindStatusCondition(prev.Conditions, inplacev1.PausedCondition)
	newPaused := meta.FindStatusCondition(st.Conditions, inplacev1.PausedCondition)
	wasPaused := oldPaused != nil && oldPaused.Status == metav1.ConditionTrue
	switch {
	case newPaused != nil && newPaused.Status == metav1.ConditionTrue && (!wasPaused || oldPaused.Reason != newPaused.Reason):
		add(notify.TaskPaused, newPaused.Reason, newPaused.Message)
	case wasPaused && (newPaused == nil || newPaused.Status != metav1.ConditionTrue) && !ended:
		// A task that ends is no longer paused; its end says so.
		add(notify.TaskResumed, oldPaused.Reason, "no longer paused: "+oldPaused.Message)
	}

	if ended {
		switch st.Phase {
		case inplacev1.TaskPhaseCompleted:
			add(notify.TaskCompleted, inplacev1.CompletedReason, conditionMessage(st, inplacev1.ReadyCondition))
		case inplacev1.TaskPhaseFailed:
			add(notify.TaskFailed, inplacev1.FailedReason, conditionMessage(st, inplacev1.DegradedCondition))
		case inplacev1.TaskPhaseAborted:
			add(notify.TaskAborted, inplacev1.AbortedReason, conditionMessage(st, inplacev1.ProgressingCondition))
		}
	}
	return out
}

func conditionMessage(st *inplacev1.UpgradeTaskStatus, t string) string {
	if c := meta.FindStatusCondition(st.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}

// notifiedTasks remembers what each task's webhook was told. A change is found by
// comparing the status computed with the status before it, but the status before can be
// older than the last one computed: a status write that conflicts with an edit of the
// task (spec.paused, an abort) is dropped, and the next reconcile starts again from the
// API server's. What was told already is not told again. The memory is the manager's: after
// a restart the status read from the API server alone decides.
type notifiedTasks struct {
	mu    sync.Mutex
	tasks map[types.NamespacedName]*notifiedTask
}

type notifiedTask struct {
	uid     types.UID
	started bool
	ended   bool
	failed  map[string]bool
	// paused is the reason of the last TaskPaused told, "" after a TaskResumed; nil
	// until either was told.
	paused *string
}

// unsent keeps the events not told yet for the task, and remembers them as told.
func (n *notifiedTasks) unsent(task *inplacev1.UpgradeTask, evs []notify.Event) []notify.Event {
	if len(evs) == 0 {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.tasks == nil {
		n.tasks = map[types.NamespacedName]*notifiedTask{}
	}
	key := types.NamespacedName{Namespace: task.Namespace, Name: task.Name}
	t := n.tasks[key]
	if t == nil || t.uid != task.UID {
		t = &notifiedTask{uid: task.UID, failed: map[string]bool{}}
		n.tasks[key] = t
	}
	var out []notify.Event
	for _, ev := range evs {
		switch ev.Type {
		case notify.TaskStarted:
			if t.started {
				continue
			}
			t.started = true
		case notify.NodeFailed:
			if t.failed[ev.Machine] {
				continue
			}
			t.failed[ev.Machine] = true
		case notify.TaskPaused:
			if t.paused != nil && *t.paused == ev.Reason {
				continue
			}
			t.paused = &ev.Reason
		case notify.TaskResumed:
			if t.paused != nil && *t.paused == "" {
				continue
			}
			t.paused = new(string)
		default: // the task ended
			if t.ended {
				continue
			}
			t.ended = true
		}
		out = append(out, ev)
	}
	return out
}

// forget drops what is remembered of a task that is gone.
func (n *notifiedTasks) forget(key types.NamespacedName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.tasks, key)
}
