package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// cordonStep takes the node out of scheduling, once, before its virtual machines are
// evacuated and it is drained.
var cordonStep = step{
	name: StepCordon,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.Drain, harvesterv1.DefaultDrainTimeout)
	},
	skip: func(_ *Updater, _ context.Context, r *nodeRun) (string, error) {
		if singleNode(r) {
			return singleNodeSkip, nil
		}
		return "", nil
	},
	run: (*Updater).runCordon,
}

// runCordon cordons the node itself and records that the cordon is its own (cordon.go).
// The Plans neither cordon nor drain, so SUC never uncordons the node between them
// (shared/facts/suc.md, fact 46): the node stays cordoned until Finish. A node cordoned
// by someone else, or in Harvester maintenance mode, is held: the operator is doing
// something with it (the same rule as the NodeSchedulable preflight check, which keeps
// such a node from being picked).
func (u *Updater) runCordon(ctx context.Context, r *nodeRun) (bool, string, error) {
	held, err := u.cordonAsOurs(ctx, r)
	if err != nil || held != "" {
		return false, held, err
	}
	return true, fmt.Sprintf("node %s is cordoned", r.nu.Spec.NodeName), nil
}
