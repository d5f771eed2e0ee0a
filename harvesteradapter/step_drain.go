package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// drainStep evicts the node's pods, once, after its virtual machines left it.
var drainStep = step{
	name:    StepDrain,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return planTimeout(planDrain, t) },
	skip:    (*Updater).skipDrain,
	run:     (*Updater).runDrain,
}

// skipDrain: with drain.enabled false there is nothing to run; the node stays cordoned
// and its virtual machines were evacuated by EvacuateVMs all the same.
func (u *Updater) skipDrain(_ context.Context, r *nodeRun) (string, error) {
	if drainArgs(r.cfg.Spec.Drain, r.nu.Spec.NodeName) == nil {
		return "drain.enabled is false in the HarvesterUpgrader: the node is only cordoned", nil
	}
	return "", nil
}

// runDrain runs the drain Plan: kubectl drain of the node, which the updater cordoned
// and emptied of running virtual machines before.
func (u *Updater) runDrain(ctx context.Context, r *nodeRun) (bool, string, error) {
	done, message, err := u.applyPlan(ctx, r, planDrain)
	if err != nil || !done {
		return done, message, err
	}
	return true, fmt.Sprintf("node %s is drained", r.nu.Spec.NodeName), nil
}
