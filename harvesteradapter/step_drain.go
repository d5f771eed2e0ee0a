package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// drainStep takes the node out of service, once, before its first disruptive step.
var drainStep = step{
	name:    StepDrain,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return planTimeout(planDrain, t) },
	run:     (*Updater).runDrain,
}

// runDrain takes the node out of service once, before its first disruptive step: the
// updater cordons it itself and records that the cordon is its own, then the drain Plan
// evacuates the virtual machines and drains it. The later Plans neither cordon nor
// drain, so SUC never uncordons the node between them (shared/facts/suc.md, fact 46);
// the node stays cordoned until Finish. A node cordoned by someone else, or in Harvester
// maintenance mode, is held: the operator is doing something with it (the same rule as
// the NodeSchedulable preflight check, which keeps such a node from being picked).
func (u *Updater) runDrain(ctx context.Context, r *nodeRun) (bool, string, error) {
	held, err := u.cordonAsOurs(ctx, r)
	if err != nil || held != "" {
		return false, held, err
	}
	done, message, err := u.applyPlan(ctx, r, planDrain)
	if err != nil || !done {
		return done, message, err
	}
	node := r.nu.Spec.NodeName
	if drainArgs(r.cfg.Spec.Drain, node) == nil {
		return true, fmt.Sprintf("node %s is cordoned and its virtual machines evacuated (drain is off)", node), nil
	}
	return true, fmt.Sprintf("node %s is cordoned, its virtual machines evacuated and its pods drained", node), nil
}
