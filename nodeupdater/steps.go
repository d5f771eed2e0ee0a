package nodeupdater

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// These helpers are how an Updater records its steps in NodeUpdate.status.steps. The
// reconciler persists the status after every Updater.Reconcile call and turns each change
// of a step's state into an event, so an updater only says where its steps stand. All of
// them are idempotent: calling one again with the same state changes only the message.

// DeclareSteps lists the updater's steps in order as Pending, so that the whole plan of
// the node shows from the start. Steps already recorded keep their state; steps not
// named yet are appended.
func DeclareSteps(nu *inplacev1.NodeUpdate, names ...string) {
	for _, name := range names {
		ensureStep(nu, name)
	}
}

// Step returns the recorded step of that name, or nil when it is not recorded.
func Step(nu *inplacev1.NodeUpdate, name string) *inplacev1.NodeUpdateStep {
	for i := range nu.Status.Steps {
		if nu.Status.Steps[i].Name == name {
			return &nu.Status.Steps[i]
		}
	}
	return nil
}

// StepState returns the state of the named step, Pending when it is not recorded.
func StepState(nu *inplacev1.NodeUpdate, name string) inplacev1.StepState {
	if s := Step(nu, name); s != nil {
		return s.State
	}
	return inplacev1.StepStatePending
}

// StepDone reports whether the named step succeeded or was skipped.
func StepDone(nu *inplacev1.NodeUpdate, name string) bool {
	st := StepState(nu, name)
	return st == inplacev1.StepStateSucceeded || st == inplacev1.StepStateSkipped
}

// StartStep marks the named step Running with a message; its start time is set once.
func StartStep(nu *inplacev1.NodeUpdate, name, message string) {
	s := ensureStep(nu, name)
	if s.State != inplacev1.StepStateRunning {
		s.State = inplacev1.StepStateRunning
		s.CompletionTime = nil
	}
	if s.StartTime == nil {
		now := metav1.Now()
		s.StartTime = &now
	}
	s.Message = message
}

// SetStepMessage updates what a step says without changing its state, for progress.
func SetStepMessage(nu *inplacev1.NodeUpdate, name, message string) {
	ensureStep(nu, name).Message = message
}

// CompleteStep marks the named step Succeeded.
func CompleteStep(nu *inplacev1.NodeUpdate, name, message string) {
	endStep(nu, name, inplacev1.StepStateSucceeded, message)
}

// SkipStep marks the named step Skipped; the message says why it was not needed.
func SkipStep(nu *inplacev1.NodeUpdate, name, message string) {
	endStep(nu, name, inplacev1.StepStateSkipped, message)
}

// FailStep marks the named step Failed with the error a person should read. The
// NodeUpdate fails with it when the updater returns a permanent error; a retryable error
// leaves the step to be tried again.
func FailStep(nu *inplacev1.NodeUpdate, name, message string) {
	endStep(nu, name, inplacev1.StepStateFailed, message)
}

func endStep(nu *inplacev1.NodeUpdate, name string, state inplacev1.StepState, message string) {
	s := ensureStep(nu, name)
	now := metav1.Now()
	if s.State != state {
		s.State = state
		s.CompletionTime = &now
	}
	if s.StartTime == nil && state != inplacev1.StepStateSkipped {
		s.StartTime = &now
	}
	if s.CompletionTime == nil {
		s.CompletionTime = &now
	}
	s.Message = message
}

func ensureStep(nu *inplacev1.NodeUpdate, name string) *inplacev1.NodeUpdateStep {
	if s := Step(nu, name); s != nil {
		return s
	}
	nu.Status.Steps = append(nu.Status.Steps, inplacev1.NodeUpdateStep{Name: name, State: inplacev1.StepStatePending})
	return &nu.Status.Steps[len(nu.Status.Steps)-1]
}

// currentStep is the step a person should look at: the one running, else the one that
// failed, else the next one pending while the update is not over.
func currentStep(nu *inplacev1.NodeUpdate) string {
	var failed, aborted, pending string
	for _, s := range nu.Status.Steps {
		switch s.State {
		case inplacev1.StepStateRunning:
			return s.Name
		case inplacev1.StepStateFailed:
			if failed == "" {
				failed = s.Name
			}
		case inplacev1.StepStateAborted:
			if aborted == "" {
				aborted = s.Name
			}
		case inplacev1.StepStatePending:
			if pending == "" {
				pending = s.Name
			}
		}
	}
	switch {
	case failed != "":
		return failed
	case aborted != "":
		return aborted
	case nu.Status.Phase.IsFinal():
		return ""
	default:
		return pending
	}
}

// endRunningSteps ends every running step in the given state, when the NodeUpdate ends
// for a reason outside the updater (timeout, abort, exhausted retries) or the updater
// reported done without closing its steps. An empty message keeps the step's own.
func endRunningSteps(nu *inplacev1.NodeUpdate, state inplacev1.StepState, message string) {
	for i := range nu.Status.Steps {
		step := &nu.Status.Steps[i]
		if step.State != inplacev1.StepStateRunning {
			continue
		}
		msg := message
		if msg == "" {
			msg = step.Message
		}
		endStep(nu, step.Name, state, msg)
	}
}
