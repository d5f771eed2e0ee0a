package nodeupdater

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func TestRetryDelay(t *testing.T) {
	base, maxDelay := 10*time.Second, 5*time.Minute
	for _, tc := range []struct {
		failedAttempt int32
		want          time.Duration
	}{
		{0, 10 * time.Second},
		{1, 10 * time.Second},
		{2, 20 * time.Second},
		{3, 40 * time.Second},
		{5, 160 * time.Second},
		{6, 5 * time.Minute},
		{7, 5 * time.Minute},
		{1000, 5 * time.Minute},
	} {
		if got := RetryDelay(tc.failedAttempt, base, maxDelay); got != tc.want {
			t.Errorf("RetryDelay(%d) = %s, want %s", tc.failedAttempt, got, tc.want)
		}
	}
}

func steps(states ...string) []inplacev1.NodeUpdateStep {
	out := make([]inplacev1.NodeUpdateStep, 0, len(states))
	for i, st := range states {
		out = append(out, inplacev1.NodeUpdateStep{Name: string(rune('A' + i)), State: inplacev1.StepState(st)})
	}
	return out
}

func TestCurrentStep(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase inplacev1.NodeUpdatePhase
		steps []inplacev1.NodeUpdateStep
		want  string
	}{
		{"no steps", inplacev1.NodeUpdatePhaseInProgress, nil, ""},
		{"the running step", inplacev1.NodeUpdatePhaseInProgress, steps("Succeeded", "Running", "Pending"), "B"},
		{"the next pending step between two", inplacev1.NodeUpdatePhaseInProgress, steps("Succeeded", "Pending"), "B"},
		{"the failed step of a failed update", inplacev1.NodeUpdatePhaseFailed, steps("Succeeded", "Skipped", "Failed", "Pending"), "C"},
		{"the failed step even while another runs", inplacev1.NodeUpdatePhaseInProgress, steps("Failed", "Running"), "B"},
		{"the aborted step", inplacev1.NodeUpdatePhaseAborted, steps("Succeeded", "Aborted", "Pending"), "B"},
		{"nothing once succeeded", inplacev1.NodeUpdatePhaseSucceeded, steps("Succeeded", "Skipped"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nu := &inplacev1.NodeUpdate{Status: inplacev1.NodeUpdateStatus{Phase: tc.phase, Steps: tc.steps}}
			if got := currentStep(nu); got != tc.want {
				t.Errorf("currentStep = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestComputeStatus(t *testing.T) {
	retry := metav1.NewMicroTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	abort := metav1.NowMicro()
	for _, tc := range []struct {
		name            string
		status          inplacev1.NodeUpdateStatus
		wantReady       metav1.ConditionStatus
		wantReadyReason string
		wantProgReason  string
		wantProgMessage string
	}{
		{
			name:            "pending",
			status:          inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhasePending},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.WaitingReason,
			wantProgReason:  inplacev1.WaitingReason,
			wantProgMessage: "the updater has not started on the node",
		},
		{
			name: "pending on a missing updater says why",
			status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhasePending, Conditions: []metav1.Condition{{
				Type: inplacev1.UpdaterAvailableCondition, Status: metav1.ConditionFalse,
				Reason: inplacev1.UpdaterNotFoundReason, Message: "no updater serves kind X",
			}}},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.WaitingReason,
			wantProgReason:  inplacev1.UpdaterNotFoundReason,
			wantProgMessage: "no updater serves kind X",
		},
		{
			name: "in progress shows the running step",
			status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress, Steps: []inplacev1.NodeUpdateStep{
				{Name: "Drain", State: inplacev1.StepStateRunning, Message: "evicting 3 pods"},
			}},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.InProgressReason,
			wantProgReason:  inplacev1.InProgressReason,
			wantProgMessage: "step Drain: evicting 3 pods",
		},
		{
			name: "retrying shows the error and the next try",
			status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress, Attempts: 2, NextRetryTime: &retry, LastError: "boom",
				Steps: []inplacev1.NodeUpdateStep{{Name: "Drain", State: inplacev1.StepStateRunning}}},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.InProgressReason,
			wantProgReason:  inplacev1.RetryingReason,
			wantProgMessage: "attempt 2 of step Drain at 2026-01-02T03:04:05Z after: boom",
		},
		{
			name: "skipping: putting the node back",
			status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress, AbortStartTime: &abort,
				FailureReason: inplacev1.NodeSkippedReason, FailureMessage: "blocked by pod a/web"},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.InProgressReason,
			wantProgReason:  inplacev1.AbortingReason,
			wantProgMessage: "skipping node : blocked by pod a/web; putting the node back (stopping the drain, uncordoning, restoring what was stopped)",
		},
		{
			name:            "skipped: put back, not at the version",
			status:          inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseSkipped, FailureReason: inplacev1.NodeSkippedReason, FailureMessage: "blocked by pod a/web"},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.NodeSkippedReason,
			wantProgReason:  inplacev1.NodeSkippedReason,
			wantProgMessage: "node  was skipped and put back (drain stopped, uncordoned, what was stopped restored, its Plans removed); it is not at : blocked by pod a/web",
		},
		{
			name:            "aborting",
			status:          inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress, AbortStartTime: &abort},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.InProgressReason,
			wantProgReason:  inplacev1.AbortingReason,
			wantProgMessage: "waiting for the updater to stop at a safe point and clean up",
		},
		{
			name: "failed names the step and the reason",
			status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseFailed, FailureReason: "BackoffLimitExceeded", FailureMessage: "job failed",
				Steps: []inplacev1.NodeUpdateStep{{Name: "Job", State: inplacev1.StepStateFailed}}},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.FailedReason,
			wantProgReason:  "BackoffLimitExceeded",
			wantProgMessage: "step Job failed (BackoffLimitExceeded): job failed",
		},
		{
			name:            "succeeded",
			status:          inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseSucceeded},
			wantReady:       metav1.ConditionTrue,
			wantReadyReason: inplacev1.DoneReason,
			wantProgReason:  inplacev1.DoneReason,
		},
		{
			name:            "aborted",
			status:          inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseAborted},
			wantReady:       metav1.ConditionFalse,
			wantReadyReason: inplacev1.AbortedReason,
			wantProgReason:  inplacev1.AbortedReason,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nu := &inplacev1.NodeUpdate{Status: tc.status}
			nu.Generation = 3
			computeStatus(nu)
			ready := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.ReadyCondition)
			prog := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.ProgressingCondition)
			if ready == nil || prog == nil {
				t.Fatalf("conditions missing: %+v", nu.Status.Conditions)
			}
			if ready.Status != tc.wantReady || ready.Reason != tc.wantReadyReason {
				t.Errorf("Ready = %s/%s, want %s/%s", ready.Status, ready.Reason, tc.wantReady, tc.wantReadyReason)
			}
			if prog.Reason != tc.wantProgReason {
				t.Errorf("Progressing reason = %s, want %s", prog.Reason, tc.wantProgReason)
			}
			if tc.wantProgMessage != "" && prog.Message != tc.wantProgMessage {
				t.Errorf("Progressing message = %q, want %q", prog.Message, tc.wantProgMessage)
			}
			if nu.Status.ObservedGeneration != 3 || ready.ObservedGeneration != 3 {
				t.Errorf("observed generation not recorded")
			}
		})
	}
}

func TestStepHelpers(t *testing.T) {
	nu := &inplacev1.NodeUpdate{}
	DeclareSteps(nu, "A", "B")
	DeclareSteps(nu, "A", "B", "C")
	if len(nu.Status.Steps) != 3 || StepState(nu, "C") != inplacev1.StepStatePending {
		t.Fatalf("DeclareSteps: %+v", nu.Status.Steps)
	}
	StartStep(nu, "A", "one")
	started := Step(nu, "A").StartTime
	StartStep(nu, "A", "two")
	if Step(nu, "A").StartTime != started || Step(nu, "A").Message != "two" || StepState(nu, "A") != inplacev1.StepStateRunning {
		t.Errorf("StartStep again must keep the start time and update the message: %+v", Step(nu, "A"))
	}
	CompleteStep(nu, "A", "done")
	SkipStep(nu, "B", "not needed")
	FailStep(nu, "C", "bad")
	if !StepDone(nu, "A") || !StepDone(nu, "B") || StepDone(nu, "C") {
		t.Errorf("StepDone wrong: %+v", nu.Status.Steps)
	}
	if Step(nu, "B").StartTime != nil || Step(nu, "B").CompletionTime == nil {
		t.Errorf("a skipped step has no start time but an end: %+v", Step(nu, "B"))
	}
	if Step(nu, "C").StartTime == nil || Step(nu, "C").CompletionTime == nil || Step(nu, "C").Message != "bad" {
		t.Errorf("FailStep: %+v", Step(nu, "C"))
	}
	if StepState(nu, "missing") != inplacev1.StepStatePending || Step(nu, "missing") != nil {
		t.Errorf("an unknown step is Pending and not recorded")
	}
}

func TestEndRunningSteps(t *testing.T) {
	nu := &inplacev1.NodeUpdate{}
	StartStep(nu, "A", "rebooting")
	StartStep(nu, "B", "waiting")
	CompleteStep(nu, "B", "done")
	DeclareSteps(nu, "C")
	endRunningSteps(nu, inplacev1.StepStateSucceeded, "")
	if a := Step(nu, "A"); a.State != inplacev1.StepStateSucceeded || a.Message != "rebooting" || a.CompletionTime == nil {
		t.Errorf("a running step ended without a message keeps its own: %+v", a)
	}
	StartStep(nu, "C", "draining")
	endRunningSteps(nu, inplacev1.StepStateAborted, "aborted")
	if c := Step(nu, "C"); c.State != inplacev1.StepStateAborted || c.Message != "aborted" {
		t.Errorf("abort: %+v", c)
	}
	if b := Step(nu, "B"); b.State != inplacev1.StepStateSucceeded || b.Message != "done" {
		t.Errorf("a finished step is left alone: %+v", b)
	}
}

func TestAbortCause(t *testing.T) {
	for _, tc := range []struct {
		phase  inplacev1.TaskAction
		reason string
		want   string
	}{
		{inplacev1.TaskActionAbort, "", ""},
		{inplacev1.TaskActionAbort, inplacev1.MachineDeletedReason, "the machine is being deleted (MachineDeleted)"},
		{inplacev1.TaskActionAbort, inplacev1.TaskAbortedReason, "its UpgradeTask was aborted (TaskAborted)"},
		{inplacev1.TaskActionAbort, inplacev1.TaskDeletedReason, "its UpgradeTask was deleted (TaskDeleted)"},
		{inplacev1.TaskActionAbort, inplacev1.SupersededReason, "a newer request for the same target superseded it (Superseded)"},
		{inplacev1.TaskActionAbort, "ByHand", "ByHand"},
		{"", inplacev1.MachineDeletedReason, ""},
	} {
		nu := &inplacev1.NodeUpdate{Spec: inplacev1.NodeUpdateSpec{Phase: tc.phase, AbortReason: tc.reason}}
		if got := abortCause(nu); got != tc.want {
			t.Errorf("abortCause(phase %q, reason %q) = %q, want %q", tc.phase, tc.reason, got, tc.want)
		}
	}
}
