package upgradetask

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	for _, ev := range notifyEvents(s, prev) {
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
