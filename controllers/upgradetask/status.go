package upgradetask

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
)

// writeStatus computes the whole status from the members, in one place, writes it, and
// records the events and metrics of what changed since the status last written.
func (r *Reconciler) writeStatus(ctx context.Context, s *taskScope, phase inplacev1.TaskPhase, gate preflight.GateResult) error {
	task := s.task
	prev := task.Status.DeepCopy()
	task.Status = computeStatus(s, phase, gate, prev)
	r.status.submit(task)
	r.recordTransitions(ctx, s, prev)
	r.recordFailureBudget(ctx, s)
	r.notifyTransitions(s, prev)
	r.Metrics.observeTask(task)
	if phase.IsFinal() && phase != inplacev1.TaskPhasePlanned {
		// A task that ended is not looked at again: its last status is written before
		// its last reconcile returns, and nothing more is kept about it.
		key := client.ObjectKeyFromObject(task)
		err := r.status.flush(ctx, key)
		r.status.forget(ctx, key)
		return err
	}
	return nil
}

// computeStatus derives the status from the members; prev only supplies times first
// observed by an earlier reconcile.
func computeStatus(s *taskScope, phase inplacev1.TaskPhase, gate preflight.GateResult, prev *inplacev1.UpgradeTaskStatus) inplacev1.UpgradeTaskStatus {
	task := s.task
	st := inplacev1.UpgradeTaskStatus{
		Phase:              phase,
		ObservedGeneration: task.Generation,
		// A copy: the conditions are set in place, and prev is what they are compared with.
		Conditions:             slices.Clone(prev.Conditions),
		StartTime:              prev.StartTime,
		CompletionTime:         prev.CompletionTime,
		LastNodeCompletionTime: prev.LastNodeCompletionTime,
		Gates:                  s.gates,
	}
	aborting := phase == inplacev1.TaskPhaseAborting || phase == inplacev1.TaskPhaseAborted
	var current, held []string
	var failedMember *member
	removedEnded := 0
	for i, mem := range s.members {
		ms := inplacev1.MachineUpgradeStatus{
			Name:     mem.name,
			NodeName: mem.nodeName,
			State:    mem.state,
			Order:    int32(i + 1),
			Message:  truncate(mem.message, 10240),
		}
		if aborting && ms.State == inplacev1.MachineStateWaiting {
			ms.State = inplacev1.MachineStateAborted
		}
		if mem.nu != nil {
			ms.NodeUpdate = mem.nu.Name
			start := mem.nu.CreationTimestamp
			if mem.nu.Status.StartTime != nil {
				start = *mem.nu.Status.StartTime
			}
			ms.StartTime = &start
			if st.StartTime == nil || start.Before(st.StartTime) {
				st.StartTime = ptrTime(start)
			}
			if mem.state != inplacev1.MachineStateInProgress {
				ms.CompletionTime = completionTime(s, mem)
			}
		}
		for _, r := range mem.preflight {
			ms.Preflight = append(ms.Preflight, inplacev1.PreflightCheckStatus{Name: r.Name, Passed: r.Passed, Message: truncate(r.Message, 4096)})
		}
		switch ms.State {
		case inplacev1.MachineStateUpgraded:
			st.Upgraded++
			if ms.CompletionTime != nil && (st.LastNodeCompletionTime == nil || st.LastNodeCompletionTime.Before(ms.CompletionTime)) {
				st.LastNodeCompletionTime = ms.CompletionTime
			}
		case inplacev1.MachineStateInProgress:
			st.InProgress++
			current = append(current, displayName(mem))
		case inplacev1.MachineStateFailed, inplacev1.MachineStateAborted:
			if mem.removed && mem.state == ms.State {
				// A machine deleted in the middle is not counted: it is not the task's to upgrade any more.
				removedEnded++
			}
			if mem.failedForTask() && (mem.state == inplacev1.MachineStateFailed || !aborting) {
				st.Failed++
				if failedMember == nil {
					failedMember = mem
				}
			}
		case inplacev1.MachineStateWaiting:
			st.Waiting++
			if isHeld(mem.message) {
				held = append(held, fmt.Sprintf("%s %s", displayName(mem), mem.message))
			}
		}
		st.Machines = append(st.Machines, ms)
	}
	// Waiting for room under maxUnavailable is the normal queue while nodes are being
	// upgraded; it is worth naming only when nothing runs (NotReady nodes take the room).
	if st.InProgress > 0 {
		held = slices.DeleteFunc(held, func(h string) bool { return strings.Contains(h, queueHoldPrefix) })
	}
	if len(held) > maxHeldListed {
		held = append(held[:maxHeldListed], fmt.Sprintf("and %d more", len(held)-maxHeldListed))
	}
	st.Total = int32(len(s.members) + s.pendingHandover - removedEnded)
	st.Waiting += int32(s.pendingHandover)
	st.Progress = fmt.Sprintf("%d/%d", st.Upgraded, st.Total)
	st.CurrentNodes = truncate(strings.Join(current, ","), 4096)
	if phase.IsFinal() && phase != inplacev1.TaskPhasePlanned {
		if st.CompletionTime == nil {
			st.CompletionTime = ptrTime(metav1.NewTime(s.now))
		}
	} else {
		st.CompletionTime = nil
	}

	setStatusConditions(&st, s, phase, gate, failedMember, current, held)
	return st
}

func setStatusConditions(st *inplacev1.UpgradeTaskStatus, s *taskScope, phase inplacev1.TaskPhase, gate preflight.GateResult, failedMember *member, current, held []string) {
	set := func(t string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: truncate(msg, 32768), ObservedGeneration: s.task.Generation})
	}

	setFailureBudgetCondition(st, s)
	setSkippedCondition(s, set)
	switch phase {
	case inplacev1.TaskPhaseCompleted:
		set(inplacev1.ReadyCondition, true, inplacev1.CompletedReason, fmt.Sprintf("every machine (%d) reached %s", st.Total, s.task.Spec.Version))
	case inplacev1.TaskPhaseFailed:
		set(inplacev1.ReadyCondition, false, inplacev1.FailedReason, "the task failed; see Degraded")
	case inplacev1.TaskPhaseAborted, inplacev1.TaskPhaseAborting:
		set(inplacev1.ReadyCondition, false, inplacev1.AbortedReason, "the task was aborted")
	default:
		set(inplacev1.ReadyCondition, false, inplacev1.InProgressReason, fmt.Sprintf("%s upgraded", st.Progress))
	}

	progressMsg := fmt.Sprintf("%d in progress (%s), %d waiting, %d upgraded of %d", st.InProgress, strings.Join(current, ", "), st.Waiting, st.Upgraded, st.Total)
	if len(held) > 0 {
		progressMsg += "; " + strings.Join(held, "; ")
	}
	if s.pendingHandover > 0 {
		progressMsg += fmt.Sprintf("; %d machine(s) wait for Cluster API to hand them over", s.pendingHandover)
	}
	switch {
	case phase == inplacev1.TaskPhaseAborting:
		set(inplacev1.ProgressingCondition, true, inplacev1.AbortingReason, fmt.Sprintf("aborting: waiting for %d node(s) to stop at a safe point (%s)", st.InProgress, strings.Join(current, ", ")))
	case phase.IsFinal():
		set(inplacev1.ProgressingCondition, false, string(phase), fmt.Sprintf("the task ended %s: %s", phase, progressMsg))
	case st.InProgress > 0:
		set(inplacev1.ProgressingCondition, true, inplacev1.InProgressReason, progressMsg)
	default:
		set(inplacev1.ProgressingCondition, true, inplacev1.WaitingReason, progressMsg)
	}

	if failedMember != nil {
		set(inplacev1.DegradedCondition, true, inplacev1.FailedReason, fmt.Sprintf("machine %s (node %s) failed: %s", failedMember.name, failedMember.nodeName, failedMember.message))
	} else {
		set(inplacev1.DegradedCondition, false, inplacev1.AsExpectedReason, "")
	}

	switch {
	case phase.IsFinal() && phase != inplacev1.TaskPhasePlanned:
		set(inplacev1.PausedCondition, false, inplacev1.AsExpectedReason, "")
	case s.task.Spec.DryRun:
		set(inplacev1.PausedCondition, true, inplacev1.DryRunReason, "spec.dryRun is true: the plan is in status.machines; no node is started")
	case !gate.Open:
		set(inplacev1.PausedCondition, true, gate.Reason, fmt.Sprintf("%s: %s", gate.Name, gate.Message))
	case st.InProgress == 0 && len(held) > 0 && failedMember == nil:
		set(inplacev1.PausedCondition, true, inplacev1.PreflightHoldReason, "every candidate node is held back: "+strings.Join(held, "; "))
	default:
		set(inplacev1.PausedCondition, false, inplacev1.AsExpectedReason, "")
	}
}

// completionTime is when a member's NodeUpdate ended: its own completionTime, else the
// time an earlier reconcile first saw it ended, else now.
func completionTime(s *taskScope, mem *member) *metav1.Time {
	if mem.nu != nil && mem.nu.Status.CompletionTime != nil {
		return mem.nu.Status.CompletionTime
	}
	for _, ms := range s.task.Status.Machines {
		if ms.Name == mem.name && ms.CompletionTime != nil {
			return ms.CompletionTime
		}
	}
	return ptrTime(metav1.NewTime(s.now))
}

// recordTransitions emits one event per decision that changed since the last status:
// a node ended, a node is newly held by a check, the task ended or is paused.
func (r *Reconciler) recordTransitions(ctx context.Context, s *taskScope, prev *inplacev1.UpgradeTaskStatus) {
	log := ctrl.LoggerFrom(ctx)
	task := s.task
	before := map[string]inplacev1.MachineUpgradeStatus{}
	for _, ms := range prev.Machines {
		before[ms.Name] = ms
	}
	// Each node's event names its Machine as related: the events API folds events with
	// the same reason, regarding and related object into one series that keeps the first
	// note, so without it the second node upgraded within minutes would show as the
	// first one's count.
	machines := map[string]runtime.Object{}
	for _, mem := range s.members {
		if mem.machine != nil {
			machines[mem.name] = mem.machine
		}
	}
	for _, ms := range task.Status.Machines {
		old, seen := before[ms.Name]
		if seen && old.State == ms.State && old.Message == ms.Message {
			continue
		}
		switch {
		case ms.State == inplacev1.MachineStateUpgraded && old.State != ms.State:
			log.Info("node upgraded", "machine", ms.Name, "node", ms.NodeName)
			r.Recorder.Eventf(task, machines[ms.Name], corev1.EventTypeNormal, inplacev1.NodeUpgradedReason, "Upgrade", "machine %s (node %s) reached %s", ms.Name, ms.NodeName, task.Spec.Version)
			r.Metrics.observeNode(task, ms, "succeeded")
		case ms.State == inplacev1.MachineStateFailed && old.State != ms.State:
			log.Info("node failed; no further node is started", "machine", ms.Name, "node", ms.NodeName, "message", ms.Message)
			r.Recorder.Eventf(task, machines[ms.Name], corev1.EventTypeWarning, inplacev1.NodeFailedReason, "Upgrade", "machine %s (node %s) failed: %s", ms.Name, ms.NodeName, ms.Message)
			// Cluster API shows a failed UpdateMachine only as "UpdateMachine hook failed:
			// please check controller logs for errors": the node's own error also goes where
			// an operator looks first, `kubectl describe` of the Machine and of the Cluster.
			if m := machines[ms.Name]; m != nil {
				r.Recorder.Eventf(m, task, corev1.EventTypeWarning, inplacev1.NodeFailedReason, "Upgrade",
					"in-place upgrade of node %s to %s failed: %s (UpgradeTask %s)", ms.NodeName, task.Spec.Version, ms.Message, task.Name)
			}
			if s.cluster != nil && s.cluster.UID != "" {
				r.Recorder.Eventf(s.cluster, machines[ms.Name], corev1.EventTypeWarning, inplacev1.NodeFailedReason, "Upgrade",
					"in-place upgrade of machine %s (node %s) to %s failed: %s (UpgradeTask %s)", ms.Name, ms.NodeName, task.Spec.Version, ms.Message, task.Name)
			}
			r.Metrics.observeNode(task, ms, "failed")
		case ms.State == inplacev1.MachineStateSkipped && old.State != ms.State:
			log.Info("node skipped; the task goes on with the others and tries it again at the end", "machine", ms.Name, "node", ms.NodeName, "message", ms.Message)
			r.Recorder.Eventf(task, machines[ms.Name], corev1.EventTypeWarning, inplacev1.NodeSkippedReason, "Upgrade",
				"machine %s (node %s) %s; the task goes on with the other machines and tries it once more when they are done", ms.Name, ms.NodeName, ms.Message)
			r.Metrics.observeNode(task, ms, "skipped")
		case ms.State == inplacev1.MachineStateWaiting && isHeld(ms.Message) && !strings.HasPrefix(ms.Message, queueHoldPrefix):
			log.Info("node held back by a preflight check", "machine", ms.Name, "node", ms.NodeName, "reason", ms.Message)
			r.Recorder.Eventf(task, machines[ms.Name], corev1.EventTypeNormal, inplacev1.NodeHeldReason, "Preflight", "machine %s (node %s) %s", ms.Name, ms.NodeName, ms.Message)
		}
	}
	if prev.Phase != task.Status.Phase {
		log.Info("task phase changed", "from", prev.Phase, "to", task.Status.Phase, "progress", task.Status.Progress)
		eventType := corev1.EventTypeNormal
		if task.Status.Phase == inplacev1.TaskPhaseFailed || task.Status.Phase == inplacev1.TaskPhaseAborted {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(task, nil, eventType, string(task.Status.Phase), "Phase", "UpgradeTask is %s (%s upgraded)", task.Status.Phase, task.Status.Progress)
	}
	oldPaused := meta.FindStatusCondition(prev.Conditions, inplacev1.PausedCondition)
	newPaused := meta.FindStatusCondition(task.Status.Conditions, inplacev1.PausedCondition)
	if newPaused != nil && newPaused.Status == metav1.ConditionTrue && (oldPaused == nil || oldPaused.Status != newPaused.Status || oldPaused.Reason != newPaused.Reason) {
		log.Info("task starts no new node", "reason", newPaused.Reason, "message", newPaused.Message)
		r.Recorder.Eventf(task, nil, corev1.EventTypeNormal, newPaused.Reason, "Pause", "%s", truncate(newPaused.Message, maxEventNote))
	}
}

const (
	heldPrefix      = "held by "
	queueHoldPrefix = heldPrefix + "Availability:"
	maxHeldListed   = 10
)

// isHeld reports whether a member's message says a preflight check holds it back.
func isHeld(message string) bool { return strings.HasPrefix(message, heldPrefix) }

func setCondition(task *inplacev1.UpgradeTask, t string, ok bool, reason, msg string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&task.Status.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: truncate(msg, 32768), ObservedGeneration: task.Generation})
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
