package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// drainStep evicts the node's pods, once, after its virtual machines left it.
var drainStep = step{
	name:    StepDrain,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanDrain, t) },
	skip:    (*Updater).skipDrain,
	run:     (*Updater).runDrain,
}

// singleNodeSkip is why the only node of a cluster is neither cordoned nor drained, as
// Harvester's single-node upgrade does not (harvester-node-upgrade.md, facts 12, 29-30):
// nothing could move to another node, and a cordon would keep any pod recreated during
// the upgrade (the repository, SUC, the Plans' Jobs are tolerated but a Deployment's new
// pod is not) from running. Its virtual machines are shut down and started again
// (EvacuateVMs, RestoreVMs: every VM of a one-node cluster is non-migratable, fact 31).
const singleNodeSkip = "the only node of the cluster: Harvester's single-node upgrade neither cordons nor drains it (its virtual machines are shut down instead)"

// skipDrain: with drain.enabled false there is nothing to run; the node stays cordoned
// and its virtual machines were evacuated by EvacuateVMs all the same.
func (u *Updater) skipDrain(_ context.Context, r *nodeRun) (string, error) {
	if singleNode(r) {
		return singleNodeSkip, nil
	}
	if suc.DrainArgs(r.cfg.Spec.Drain, r.nu.Spec.NodeName) == nil {
		return "drain.enabled is false in the HarvesterUpgrader: the node is only cordoned", nil
	}
	return "", nil
}

// runDrain runs the drain Plan: kubectl drain of the node, which the updater cordoned
// and emptied of running virtual machines before.
func (u *Updater) runDrain(ctx context.Context, r *nodeRun) (bool, string, error) {
	done, message, err := u.applyPlan(ctx, r, suc.PlanDrain)
	if err != nil || !done {
		if err == nil {
			// The node's pods that the drain cannot evict now: the drain policy's part.
			blocked, perr := u.applyDrainPolicy(ctx, r)
			if perr != nil {
				return false, "", perr
			}
			if blocked != "" {
				message += "; " + blocked
			}
		}
		return done, message, err
	}
	return true, fmt.Sprintf("node %s is drained", r.nu.Spec.NodeName), nil
}
