package upgradetask

import (
	"context"
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
	log := ctrl.LoggerFrom(ctx)
	task := s.task
	for _, mem := range s.members {
		mem.message = abortMessage(mem)
		if mem.nu == nil || mem.nu.Status.Phase.IsFinal() || mem.nu.Spec.Phase == inplacev1.TaskActionAbort {
			continue
		}
		orig := mem.nu.DeepCopy()
		mem.nu.Spec.Phase = inplacev1.TaskActionAbort
		if err := r.Client.Patch(ctx, mem.nu, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("abort NodeUpdate %s: %w", klog.KObj(mem.nu), err)
		}
		log.Info("aborting node", "machine", mem.name, "node", mem.nodeName, "nodeUpdate", mem.nu.Name)
		r.Recorder.Eventf(task, mem.nu, corev1.EventTypeWarning, inplacev1.AbortingReason, "Abort",
			"aborting the in-place upgrade of machine %s (node %s): NodeUpdate %s stops at its next safe point", mem.name, mem.nodeName, mem.nu.Name)
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
	if err := r.writeStatus(ctx, s, phase, preflight.GateResult{Open: true}); err != nil {
		return ctrl.Result{}, err
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
