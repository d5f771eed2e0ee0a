package extension

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	ctrl "sigs.k8s.io/controller-runtime"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	"github.com/capi-inplace/capi-inplace/internal/faults"
)

// Reasons of hook failures in capi_inplace_hook_failures_total, besides the decline
// reasons of request admission (upgraderequest.Reason*), which a declined request keeps.
const (
	// HookReasonWrongKind: the body is another hook's request type.
	HookReasonWrongKind = "WrongKind"
	// HookReasonInvalidRequest: the request lacks what the hook needs, or cannot be read.
	HookReasonInvalidRequest = "InvalidRequest"
	// HookReasonMachineNotFound: UpdateMachine's machine does not exist.
	HookReasonMachineNotFound = "MachineNotFound"
	// HookReasonUnknownOwner: the machine belongs to neither a MachineDeployment nor a control plane.
	HookReasonUnknownOwner = "UnknownOwner"
	// HookReasonAPIError: the management API server could not be asked.
	HookReasonAPIError = "APIError"
	// HookReasonHandOverFailed: the machine could not be added to its UpgradeTask.
	HookReasonHandOverFailed = "HandOverFailed"
	// HookReasonNodeUpdateFailed: the machine's NodeUpdate failed; the answer carries its error.
	HookReasonNodeUpdateFailed = "NodeUpdateFailed"
	// HookReasonNotMarked: UpdateMachine's machine lacks Cluster API's in-place update marks.
	HookReasonNotMarked = "NotMarked"
	// HookReasonTaskCompleted: the machine's task completed without upgrading it.
	HookReasonTaskCompleted = "TaskCompleted"
	// HookReasonPanic: the handler panicked (a bug); the manager's log has the stack.
	HookReasonPanic = "Panic"
)

// hookCall is one call of a hook handler. Every handler starts one and defers its end,
// so that a panic becomes a Failure answer and every Failure answer (and decline) is
// counted in capi_inplace_hook_failures_total, with the reason the path that answered gave.
type hookCall struct {
	ctx    context.Context
	hook   string
	resp   runtimehooksv1.ResponseObject
	reason string
	// decline is the reason of a Decline answer (ExternalUpgradeRequest).
	decline string
}

func startHook(ctx context.Context, hook string, resp runtimehooksv1.ResponseObject) *hookCall {
	return &hookCall{ctx: ctx, hook: hook, resp: resp}
}

// end answers Failure for a panic of the handler and counts the answer when it is a
// Failure or a decline. It must be deferred directly, for recover to see the panic.
func (c *hookCall) end() {
	if r := recover(); r != nil {
		ctrl.LoggerFrom(c.ctx).Error(fmt.Errorf("panic: %v", r), "hook handler panicked", "hook", c.hook, "stack", string(debug.Stack()))
		c.resp.SetStatus(runtimehooksv1.ResponseStatusFailure)
		c.resp.SetMessage(fmt.Sprintf("capi-inplace could not process the %s request (internal error: %v); see the manager's log", c.hook, r))
		c.reason = HookReasonPanic
	}
	switch {
	case c.resp.GetStatus() == runtimehooksv1.ResponseStatusFailure:
		faults.HookFailed(c.hook, c.reason)
	case c.decline != "":
		faults.HookFailed(c.hook, c.decline)
	}
}

// fail answers Failure with the error's text, for the reason given.
func (c *hookCall) fail(reason string, err error) {
	c.reason = reason
	c.resp.SetStatus(runtimehooksv1.ResponseStatusFailure)
	c.resp.SetMessage(err.Error())
}

// declined records that the answer is a Decline for reason.
func (c *hookCall) declined(reason string) { c.decline = reason }

// failIfWrongKind answers Failure when the body names another hook's request type. An
// empty kind is accepted: the body was posted to this hook's path.
func (c *hookCall) failIfWrongKind(apiVersion, kind, want string) bool {
	return c.failIfWrongKindOf(apiVersion, kind, runtimehooksv1.GroupVersion.String(), want)
}

func (c *hookCall) failIfWrongKindOf(apiVersion, kind, wantAPIVersion, want string) bool {
	if (kind == "" || kind == want) && (apiVersion == "" || apiVersion == wantAPIVersion) {
		return false
	}
	c.fail(HookReasonWrongKind, fmt.Errorf("the request body is a %s %s, but this hook takes a %s %s", apiVersion, kind, wantAPIVersion, want))
	return true
}

// reasonError carries the reason a hook answers Failure for.
type reasonError struct {
	reason string
	err    error
}

func (e *reasonError) Error() string { return e.err.Error() }

func (e *reasonError) Unwrap() error { return e.err }

func withReason(reason string, err error) error { return &reasonError{reason: reason, err: err} }

// ReasonOf is the failure reason an error carries: the one withReason gave it, else
// InvalidRequest for a problem of the request named by failuref, else APIError.
func ReasonOf(err error) string {
	var re *reasonError
	if errors.As(err, &re) {
		return re.reason
	}
	var f failure
	if errors.As(err, &f) {
		return HookReasonInvalidRequest
	}
	return HookReasonAPIError
}
