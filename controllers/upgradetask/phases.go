package upgradetask

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// reconcileOngoing carries an Ongoing task on: decide what to start from what was read,
// claim the picked machines and create their NodeUpdates, then write the other machines
// (claims, conditions, release annotations), and write the status.
func (r *Reconciler) reconcileOngoing(ctx context.Context, s *taskScope) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	task := s.task

	if err := r.abortRemoved(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	var policyProblem string
	s.drainPolicy, policyProblem = drainPolicy(task, s.cluster)
	gate := preflight.Gates(preflight.GateInput{Spec: &task.Spec, Now: s.now, LastNodeCompletion: lastNodeCompletion(s),
		HeldBy: s.heldBy, ControlPlaneBehind: s.controlPlaneBehind, FailureBudgetExhausted: s.failures.gateMessage(),
		Health: r.healthGates(ctx, s), DrainPolicyProblem: policyProblem})
	stopper := stoppedBy(s)
	s.goesOnAfterFailure = stopper == nil
	r.selectNextMachines(ctx, s, gate, stopper)
	phase := computePhase(s, false)

	// Hand-off comes first: a machine that may start is started before any other machine
	// is written, so the next node waits for no write about the last one. A machine is
	// claimed before its NodeUpdate exists: the claim, written with the resourceVersion
	// read, is what keeps two tasks from starting the same machine.
	if !task.Spec.DryRun {
		var picked []*member
		for _, mem := range s.members {
			if mem.picked {
				picked = append(picked, mem)
			}
		}
		if err := r.settleMembers(ctx, task, picked); err != nil {
			return ctrl.Result{}, err
		}
		// Each picked machine is claimed and then started, the machines of a round side
		// by side: a machine's NodeUpdate waits for its own claim only, not for the
		// claims of the others (one write each, through an API server that may be
		// busy), and the round takes about one claim and one creation.
		var claimedMu sync.Mutex
		var claimed []string
		err := forEachConcurrently(picked, HandOffConcurrency, func(mem *member) error {
			if !mem.isClaimed(task) || !hasSkipRemediationOf(mem.machine, upgraderequest.LabelValue(task.Name)) {
				wasClaimed := mem.isClaimed(task)
				// The claim alone: its InProgress condition is written in the background.
				// With skip-remediation: the node may go NotReady (drain, reboot) as soon
				// as its NodeUpdate exists, and a MachineHealthCheck must not replace it
				// for that.
				if err := r.writeMachine(ctx, mem.machine, machineWant{claim: true, skipRemediation: true}, task); err != nil {
					return err
				}
				if !wasClaimed {
					claimedMu.Lock()
					claimed = append(claimed, mem.name)
					claimedMu.Unlock()
				}
			}
			nu, err := r.startNodeUpdate(ctx, s, mem)
			if err != nil {
				return err
			}
			mem.nu, mem.state, mem.message = nu, inplacev1.MachineStateInProgress, ""
			return nil
		})
		r.recordClaims(task, claimed)
		for _, mem := range picked {
			if mem.nu == nil {
				continue
			}
			log.Info("started node", "machine", mem.name, "node", mem.nodeName, "nodeUpdate", mem.nu.Name)
			r.Recorder.Eventf(task, mem.machine, corev1.EventTypeNormal, inplacev1.NodeStartedReason, "Start",
				"started the in-place upgrade of machine %s (node %s) to %s: NodeUpdate %s", mem.name, mem.nodeName, task.Spec.Version, mem.nu.Name)
		}
		if err != nil {
			return ctrl.Result{}, err
		}
		phase = computePhase(s, false)
	}

	// A dry run touches no machine that has not started; machines started before
	// dryRun was turned on are still followed to their end. While the task runs the
	// machines are written in the background; a task that ended has written them (its
	// claims released) before its status says so.
	var members []*member
	for _, mem := range s.members {
		if mem.machine == nil || mem.claimedBy != "" || (task.Spec.DryRun && mem.nu == nil) {
			continue
		}
		members = append(members, mem)
	}
	want := func(mem *member) machineWant { return desiredMachine(s, mem, phase, true) }
	if phase.IsFinal() {
		if err := r.writeMachinesNow(ctx, task, members, want); err != nil {
			return ctrl.Result{}, err
		}
	} else {
		r.machines.submit(task, members, want)
	}

	if err := r.reconcilePendingTaints(ctx, s, phase); errors.Is(err, errTaintWritesInFlight) {
		// The task ends once they are written: the writer asks for it again then.
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.writeStatus(ctx, s, phase, gate); err != nil {
		return ctrl.Result{}, err
	}
	if phase.IsFinal() && phase != inplacev1.TaskPhasePlanned {
		return ctrl.Result{}, nil
	}
	requeue := r.PollInterval
	if !gate.Open && gate.RetryAfter > 0 && gate.RetryAfter < requeue {
		requeue = gate.RetryAfter
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// HandOffConcurrency bounds the machines of one round claimed and started at once: a
// round is at most maxUnavailable machines, each one claim and one creation, the writes
// every other write of the task waits behind (MachineWriteConcurrency bounds those).
const HandOffConcurrency = 16

// computePhase derives the task's phase from its members.
func computePhase(s *taskScope, aborting bool) inplacev1.TaskPhase {
	var waiting, inProgress, failed, started int
	for _, mem := range s.members {
		if mem.nu != nil || mem.picked {
			started++
		}
		switch {
		case mem.picked || mem.state == inplacev1.MachineStateInProgress:
			inProgress++
		case mem.state == inplacev1.MachineStateWaiting:
			waiting++
		case mem.skippedPending():
			// Tried once more when every other machine is done (retrySkipped).
			waiting++
		case mem.failedForTask():
			failed++
		}
	}
	switch {
	case aborting && inProgress > 0:
		return inplacev1.TaskPhaseAborting
	case aborting:
		return inplacev1.TaskPhaseAborted
	case failed > 0 && (inProgress > 0 || (waiting > 0 && s.goesOnAfterFailure)):
		return inplacev1.TaskPhaseInProgress
	case failed > 0:
		return inplacev1.TaskPhaseFailed
	case waiting == 0 && inProgress == 0 && s.pendingHandover == 0:
		return inplacev1.TaskPhaseCompleted
	case s.task.Spec.DryRun && started == 0:
		return inplacev1.TaskPhasePlanned
	case started > 0:
		return inplacev1.TaskPhaseInProgress
	}
	return inplacev1.TaskPhasePending
}

// lastNodeCompletion is when the last node of the task ended well, for the soak delay.
func lastNodeCompletion(s *taskScope) time.Time {
	var last time.Time
	for _, mem := range s.members {
		if mem.state != inplacev1.MachineStateUpgraded {
			continue
		}
		t := completionTime(s, mem)
		if t != nil && t.After(last) {
			last = t.Time
		}
	}
	return last
}
