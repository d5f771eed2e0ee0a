package nodeupdater

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

const (
	eventNormal  = "Normal"
	eventWarning = "Warning"
	// maxEventNote is the size the events API accepts for a note.
	maxEventNote = 1024
)

// Event reasons of a NodeUpdate, besides the condition reasons of the API.
const (
	// EventStarted: the updater started on the node.
	EventStarted = "Started"
	// EventSucceeded: the node reached the target version.
	EventSucceeded = "Succeeded"
	// EventStepStarted: a step started.
	EventStepStarted = "StepStarted"
	// EventStepSucceeded: a step finished well.
	EventStepSucceeded = "StepSucceeded"
	// EventStepSkipped: a step was not needed.
	EventStepSkipped = "StepSkipped"
	// EventStepAborted: a step was stopped by an abort.
	EventStepAborted = "StepAborted"
	// EventRetryScheduled: a step failed with a retryable error and is tried again later.
	EventRetryScheduled = "RetryScheduled"
	// EventAbortFailed: the updater's Abort (or its cleanup before deletion) failed and is
	// tried again.
	EventAbortFailed = "AbortFailed"
)

// computeStatus derives, in one place, what follows from the phase and steps the
// reconcile decided: the current step, the Ready and Progressing conditions and the
// observed generation.
func computeStatus(nu *inplacev1.NodeUpdate) {
	st := &nu.Status
	st.ObservedGeneration = nu.Generation
	st.CurrentStep = currentStep(nu)

	ready := metav1.Condition{Type: inplacev1.ReadyCondition, Status: metav1.ConditionFalse, ObservedGeneration: nu.Generation}
	progressing := metav1.Condition{Type: inplacev1.ProgressingCondition, Status: metav1.ConditionFalse, ObservedGeneration: nu.Generation}
	switch st.Phase {
	case inplacev1.NodeUpdatePhaseSucceeded:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, inplacev1.DoneReason,
			fmt.Sprintf("node %s is at %s", nu.Spec.NodeName, nu.Spec.Version)
		progressing.Reason = inplacev1.DoneReason
	case inplacev1.NodeUpdatePhaseFailed:
		ready.Reason, ready.Message = inplacev1.FailedReason, failureSummary(nu)
		progressing.Reason, progressing.Message = st.FailureReason, failureSummary(nu)
	case inplacev1.NodeUpdatePhaseSkipped:
		ready.Reason, ready.Message = inplacev1.NodeSkippedReason, skipSummary(nu)
		progressing.Reason, progressing.Message = inplacev1.NodeSkippedReason, ready.Message
	case inplacev1.NodeUpdatePhaseAborted:
		ready.Reason, ready.Message = inplacev1.AbortedReason, "the node update was aborted"
		if why := abortCause(nu); why != "" {
			ready.Message += ": " + why
		}
		progressing.Reason, progressing.Message = inplacev1.AbortedReason, ready.Message
	case inplacev1.NodeUpdatePhaseInProgress:
		ready.Reason, ready.Message = inplacev1.InProgressReason, progressMessage(nu)
		progressing.Status = metav1.ConditionTrue
		switch {
		case st.AbortStartTime != nil && st.FailureReason == inplacev1.NodeSkippedReason:
			progressing.Reason, progressing.Message = inplacev1.AbortingReason,
				fmt.Sprintf("skipping node %s: %s; putting the node back (stopping the drain, uncordoning, restoring what was stopped)", nu.Spec.NodeName, st.FailureMessage)+abortError(st)
		case st.AbortStartTime != nil && st.FailureReason != "":
			progressing.Reason, progressing.Message = inplacev1.AbortingReason,
				fmt.Sprintf("%s: %s; waiting for the updater to clean up", st.FailureReason, st.FailureMessage)+abortError(st)
		case st.AbortStartTime != nil:
			msg := "waiting for the updater to stop at a safe point and clean up"
			if why := abortCause(nu); why != "" {
				msg = "aborting: " + why + "; " + msg
			}
			progressing.Reason, progressing.Message = inplacev1.AbortingReason, msg+abortError(st)
		case st.NextRetryTime != nil:
			progressing.Reason, progressing.Message = inplacev1.RetryingReason,
				fmt.Sprintf("attempt %d of %s at %s after: %s", st.Attempts, stepLabel(st.CurrentStep),
					st.NextRetryTime.UTC().Format(time.RFC3339), st.LastError)
		default:
			progressing.Reason, progressing.Message = inplacev1.InProgressReason, progressMessage(nu)
		}
		if st.AbortStartTime != nil {
			// The step's own progress no longer matters: what the node waits for is the
			// updater's cleanup, after a failure or on request.
			ready.Message = progressing.Message
		}
	default:
		ready.Reason, ready.Message = inplacev1.WaitingReason, "the updater has not started on the node"
		progressing.Reason, progressing.Message = inplacev1.WaitingReason, "the updater has not started on the node"
		if c := meta.FindStatusCondition(st.Conditions, inplacev1.UpdaterAvailableCondition); c != nil && c.Status == metav1.ConditionFalse {
			ready.Message, progressing.Message = c.Message, c.Message
			progressing.Reason = c.Reason
		}
		if st.AbortStartTime != nil {
			progressing.Status, progressing.Reason = metav1.ConditionTrue, inplacev1.AbortingReason
		}
	}
	ready.Message = truncate(ready.Message, 32768)
	progressing.Message = truncate(progressing.Message, 32768)
	meta.SetStatusCondition(&st.Conditions, ready)
	meta.SetStatusCondition(&st.Conditions, progressing)
}

// abortError is what to add to the message of an abort whose last attempt failed: the
// error, when it came after the abort started.
func abortError(st *inplacev1.NodeUpdateStatus) string {
	if st.LastError == "" || st.LastAttemptTime == nil || st.AbortStartTime == nil || st.LastAttemptTime.Before(st.AbortStartTime) {
		return ""
	}
	return "; the last attempt failed, trying again: " + st.LastError
}

func failureSummary(nu *inplacev1.NodeUpdate) string {
	if nu.Status.CurrentStep != "" {
		return fmt.Sprintf("step %s failed (%s): %s", nu.Status.CurrentStep, nu.Status.FailureReason, nu.Status.FailureMessage)
	}
	return fmt.Sprintf("%s: %s", nu.Status.FailureReason, nu.Status.FailureMessage)
}

// skipSummary says what a Skipped NodeUpdate did: it put the node back, and why.
func skipSummary(nu *inplacev1.NodeUpdate) string {
	return fmt.Sprintf("node %s was skipped and put back (drain stopped, uncordoned, what was stopped restored, its Plans removed); it is not at %s: %s",
		nu.Spec.NodeName, nu.Spec.Version, nu.Status.FailureMessage)
}

func progressMessage(nu *inplacev1.NodeUpdate) string {
	if s := Step(nu, nu.Status.CurrentStep); s != nil {
		if s.Message != "" {
			return fmt.Sprintf("step %s: %s", s.Name, s.Message)
		}
		return fmt.Sprintf("step %s is %s", s.Name, s.State)
	}
	return "the updater is working on the node"
}

// writeStatus computes the status, patches it when it changed, and turns what changed
// into events and metrics. Events are derived from the persisted change, so that a
// restart or a failed patch never tells the same transition twice.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope) error {
	computeStatus(s.nu)
	if equality.Semantic.DeepEqual(s.before.Status, s.nu.Status) {
		return nil
	}
	// An external updater writes the status too: patch only over what was read. The
	// manager's own updaters have no other writer, and a conflict would lose what the
	// updater just did on the node.
	patch := client.MergeFrom(s.before)
	if s.external {
		patch = client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})
	}
	if err := r.Client.Status().Patch(ctx, s.nu, patch); err != nil {
		return fmt.Errorf("patch status of NodeUpdate %s: %w", klog.KObj(s.nu), err)
	}
	r.recordTransitions(ctx, s.before, s.nu)
	return nil
}

// recordTransitions emits an event for each change between two persisted statuses and
// records the metrics of the ones that end something.
func (r *Reconciler) recordTransitions(ctx context.Context, before, after *inplacev1.NodeUpdate) {
	kind := after.Spec.UpdaterRef.Kind
	bs, as := &before.Status, &after.Status

	if c := meta.FindStatusCondition(as.Conditions, inplacev1.UpdaterAvailableCondition); c != nil {
		old := meta.FindStatusCondition(bs.Conditions, inplacev1.UpdaterAvailableCondition)
		switch {
		case c.Status == metav1.ConditionFalse && (old == nil || old.Status != c.Status || old.Message != c.Message):
			r.event(after, eventWarning, c.Reason, "ResolveUpdater", c.Message)
		case c.Status == metav1.ConditionTrue && old != nil && old.Status == metav1.ConditionFalse:
			r.event(after, eventNormal, c.Reason, "ResolveUpdater", c.Message)
		}
	}

	if bs.StartTime == nil && as.StartTime != nil && as.Phase == inplacev1.NodeUpdatePhaseInProgress {
		r.event(after, eventNormal, EventStarted, "Update",
			fmt.Sprintf("updating node %s to %s with %s", after.Spec.NodeName, after.Spec.Version, after.Spec.UpdaterRef))
	}

	for _, step := range as.Steps {
		prev := inplacev1.StepStatePending
		if old := Step(before, step.Name); old != nil {
			prev = old.State
		}
		if prev == step.State {
			continue
		}
		reason, eventType := "", eventNormal
		switch step.State {
		case inplacev1.StepStateRunning:
			reason = EventStepStarted
		case inplacev1.StepStateSucceeded:
			reason = EventStepSucceeded
		case inplacev1.StepStateSkipped:
			reason = EventStepSkipped
		case inplacev1.StepStateAborted:
			reason = EventStepAborted
		case inplacev1.StepStateFailed:
			reason, eventType = inplacev1.StepFailedReason, eventWarning
			stepFailures.WithLabelValues(kind, step.Name).Inc()
		default:
			continue
		}
		note := fmt.Sprintf("step %s %s", step.Name, step.State)
		if step.Message != "" {
			note += ": " + step.Message
		}
		r.event(after, eventType, reason, "Step", note)
	}

	if as.NextRetryTime != nil && (bs.NextRetryTime == nil || !bs.NextRetryTime.Equal(as.NextRetryTime)) {
		stepRetries.WithLabelValues(kind, as.CurrentStep).Inc()
		// An unreachable cluster is retried without using up an attempt.
		if as.Attempts <= 1 || as.Attempts == bs.Attempts {
			r.event(after, eventWarning, EventRetryScheduled, "Retry",
				fmt.Sprintf("%s cannot reach its cluster, trying again at %s until the node's timeout: %s", stepLabel(as.CurrentStep),
					as.NextRetryTime.UTC().Format(time.RFC3339Nano), as.LastError))
		} else {
			r.event(after, eventWarning, EventRetryScheduled, "Retry",
				fmt.Sprintf("%s failed (attempt %d of %d), trying again at %s: %s", stepLabel(as.CurrentStep), as.Attempts-1,
					r.MaxAttempts, as.NextRetryTime.UTC().Format(time.RFC3339Nano), as.LastError))
		}
	}

	if bs.AbortStartTime == nil && as.AbortStartTime != nil && !as.Phase.IsFinal() {
		if as.FailureReason == inplacev1.NodeSkippedReason {
			r.event(after, eventWarning, as.FailureReason, "Skip",
				fmt.Sprintf("%s; putting node %s back", as.FailureMessage, after.Spec.NodeName))
		} else if as.FailureReason != "" {
			r.event(after, eventWarning, as.FailureReason, "Abort",
				fmt.Sprintf("%s; stopping the updater and cleaning up", as.FailureMessage))
		} else {
			note := "abort requested"
			if why := abortCause(after); why != "" {
				note += ": " + why
			}
			r.event(after, eventNormal, inplacev1.AbortingReason, "Abort", note+"; stopping at a safe point and cleaning up")
		}
	}

	if as.Phase != bs.Phase && as.Phase.IsFinal() {
		switch as.Phase {
		case inplacev1.NodeUpdatePhaseSucceeded:
			r.event(after, eventNormal, EventSucceeded, "Update",
				fmt.Sprintf("node %s reached %s in %s", after.Spec.NodeName, after.Spec.Version, duration(after).Round(time.Second)))
		case inplacev1.NodeUpdatePhaseFailed:
			r.event(after, eventWarning, as.FailureReason, "Update", failureSummary(after))
		case inplacev1.NodeUpdatePhaseSkipped:
			r.event(after, eventWarning, inplacev1.NodeSkippedReason, "Skip", skipSummary(after))
		case inplacev1.NodeUpdatePhaseAborted:
			note := fmt.Sprintf("node update of %s aborted", after.Spec.NodeName)
			if why := abortCause(after); why != "" {
				note += ": " + why
			}
			r.event(after, eventNormal, inplacev1.AbortedReason, "Abort", note)
		}
		if as.StartTime != nil {
			nodeUpdateDuration.WithLabelValues(kind, string(as.Phase)).Observe(duration(after).Seconds())
		}
		ctrl.LoggerFrom(ctx).Info("Node update ended", "phase", as.Phase, "reason", as.FailureReason, "step", as.CurrentStep)
	}
}

func duration(nu *inplacev1.NodeUpdate) time.Duration {
	if nu.Status.StartTime == nil || nu.Status.CompletionTime == nil {
		return 0
	}
	return nu.Status.CompletionTime.Sub(nu.Status.StartTime.Time)
}

// event records an event on the NodeUpdate; the note is cut to what the events API takes.
func (r *Reconciler) event(nu *inplacev1.NodeUpdate, eventType, reason, action, note string) {
	r.Recorder.Eventf(nu, nil, eventType, reason, action, "%s", truncate(note, maxEventNote))
}

// gaugeBook keeps the updater kind and phase of every NodeUpdate the reconciler has seen,
// and sets the in-progress and failed gauges from its counts as each NodeUpdate changes:
// one reconcile costs the same whatever the number of NodeUpdates. (Counting them all
// again from the cache at each of the two reconciles of a node was a twelfth of the
// manager's CPU time with 20 Clusters of 50 machines upgraded at once, issue #55.) Every
// NodeUpdate in the cache is reconciled once the manager starts, so the gauges are right
// after a restart without any state of their own.
type gaugeBook struct {
	mu                 sync.Mutex
	seen               map[types.NamespacedName]gaugeEntry
	inProgress, failed map[string]int
}

type gaugeEntry struct {
	kind  string
	phase inplacev1.NodeUpdatePhase
}

// observe records nu as it is now and sets the gauges.
func (b *gaugeBook) observe(nu *inplacev1.NodeUpdate) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	key := types.NamespacedName{Namespace: nu.Namespace, Name: nu.Name}
	entry := gaugeEntry{kind: nu.Spec.UpdaterRef.Kind, phase: nu.Status.Phase}
	if old, ok := b.seen[key]; ok {
		if old == entry {
			return
		}
		b.count(old, -1)
	}
	b.seen[key] = entry
	b.count(entry, 1)
	b.publish()
}

// forget drops a NodeUpdate that is gone and sets the gauges.
func (b *gaugeBook) forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.seen[key]
	if !ok {
		return
	}
	delete(b.seen, key)
	b.count(old, -1)
	b.publish()
}

func (b *gaugeBook) init() {
	if b.seen == nil {
		b.seen, b.inProgress, b.failed = map[types.NamespacedName]gaugeEntry{}, map[string]int{}, map[string]int{}
	}
}

func (b *gaugeBook) count(e gaugeEntry, n int) {
	b.inProgress[e.kind] += 0
	b.failed[e.kind] += 0
	switch e.phase {
	case inplacev1.NodeUpdatePhaseInProgress:
		b.inProgress[e.kind] += n
	case inplacev1.NodeUpdatePhaseFailed:
		b.failed[e.kind] += n
	}
}

// publish sets the gauges from the counts: a kind whose NodeUpdates are all gone stays
// at zero.
func (b *gaugeBook) publish() {
	nodeUpdatesInProgress.Reset()
	nodeUpdatesFailed.Reset()
	for kind, n := range b.inProgress {
		nodeUpdatesInProgress.WithLabelValues(kind).Set(float64(n))
	}
	for kind, n := range b.failed {
		nodeUpdatesFailed.WithLabelValues(kind).Set(float64(n))
	}
}
