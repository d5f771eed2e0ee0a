package upgradetask

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
)

// reconcileAbort stops a task at its next safe point: it asks every unfinished NodeUpdate
// to abort and waits for them; once none runs it releases the claims, removes the
// condition of machines never started, and the task is Aborted. Nodes already upgraded
// stay upgraded.
func (r *Reconciler) reconcileAbort(ctx context.Context, s *taskScope) (ctrl.Result, error) {
	task := s.task
	for _, mem := range s.members {
		mem.message = abortMessage(mem)
		reason := inplacev1.TaskAbortedReason
		if mem.removed {
			reason = inplacev1.MachineDeletedReason
		}
		if err := r.abortNodeUpdate(ctx, task, mem, reason); err != nil {
			return ctrl.Result{}, err
		}
	}

	phase := computePhase(s, true)
	var members []*member
	for _, mem := range s.members {
		if mem.machine != nil && mem.claimedBy == "" {
			members = append(members, mem)
		}
	}
	if err := r.writeMachinesNow(ctx, task, members, func(mem *member) machineWant { return desiredMachine(s, mem, phase, false) }); err != nil {
		return ctrl.Result{}, err
	}
	taintErr := r.reconcilePendingTaints(ctx, s, phase)
	if taintErr != nil {
		// Aborted once the taints are written (the writer asks for the task again when its
		// writes are done; a write the workload cluster refused or left unanswered is
		// tried again); until then the task says it is being aborted.
		phase = inplacev1.TaskPhaseAborting
	}
	if err := r.writeStatus(ctx, s, phase, preflight.GateResult{Open: true}); err != nil {
		return ctrl.Result{}, err
	}
	if taintErr != nil && !errors.Is(taintErr, errTaintWritesInFlight) {
		return ctrl.Result{}, taintErr
	}
	if phase.IsFinal() {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: r.PollInterval}, nil
}

func abortMessage(mem *member) string {
	switch mem.state {
	case inplacev1.MachineStateWaiting:
		return "not started: the task was aborted"
	case inplacev1.MachineStateInProgress:
		return "aborting: waiting for the NodeUpdate to stop at a safe point"
	}
	return mem.message
}

// abortNodeUpdate asks a member's NodeUpdate that has not ended to stop at its next safe
// point, saying why; a NodeUpdate already asked is left as it is.
func (r *Reconciler) abortNodeUpdate(ctx context.Context, task *inplacev1.UpgradeTask, mem *member, reason string) error {
	nu := mem.nu
	if nu == nil || nu.Status.Phase.IsFinal() || nu.Spec.Phase == inplacev1.TaskActionAbort {
		return nil
	}
	orig := nu.DeepCopy()
	nu.Spec.Phase = inplacev1.TaskActionAbort
	nu.Spec.AbortReason = reason
	if err := r.Client.Patch(ctx, nu, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("abort NodeUpdate %s: %w", klog.KObj(nu), err)
	}
	ctrl.LoggerFrom(ctx).Info("aborting node", "machine", mem.name, "node", mem.nodeName, "nodeUpdate", nu.Name, "reason", reason)
	r.Recorder.Eventf(task, nu, corev1.EventTypeWarning, inplacev1.AbortingReason, "Abort",
		"aborting the in-place upgrade of machine %s (node %s) (%s): NodeUpdate %s stops at its next safe point", mem.name, mem.nodeName, reason, nu.Name)
	return nil
}

// abortRemoved aborts the NodeUpdates of machines that are being deleted or gone (a scale
// down, a remediation): nothing is gained by upgrading a node that goes away, and its
// updater must stop at a safe point and remove what it created.
func (r *Reconciler) abortRemoved(ctx context.Context, s *taskScope) error {
	for _, mem := range s.members {
		if mem.removed {
			if err := r.abortNodeUpdate(ctx, s.task, mem, inplacev1.MachineDeletedReason); err != nil {
				return err
			}
		}
	}
	return nil
}
