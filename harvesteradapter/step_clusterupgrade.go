package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// clusterUpgradeStep holds the node until its cluster's UpgradePlan for the release has
// done the cluster-level work: the repository, the release metadata, the preload of every
// node and the cluster upgrade (Rancher, Harvester's charts). No node is disrupted
// before, whichever path (CAPI's hooks, an UpgradeTask, the annotations) asked for it:
// every path ends in a NodeUpdate, and this is its first step.
var clusterUpgradeStep = step{
	name: StepClusterUpgrade,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.ClusterUpgrade, harvesterv1.DefaultClusterUpgradeTimeout)
	},
	run: (*Updater).runClusterUpgrade,
}

// runClusterUpgrade creates the cluster's UpgradePlan if it has none (the first node of a
// cluster and release does) and waits until the plan lets the nodes go. A failed plan
// fails the node: nothing of the node has been touched.
func (u *Updater) runClusterUpgrade(ctx context.Context, r *nodeRun) (bool, string, error) {
	if r.plan == nil {
		plan, created, err := upgradeplan.EnsureFor(ctx, u.Client, r.nu, r.cfg)
		if err != nil {
			return false, "", err
		}
		r.plan = plan
		if created {
			return false, fmt.Sprintf("created UpgradePlan %s for cluster %s and Harvester %s", plan.Name, plan.Spec.ClusterName, plan.Spec.Version), nil
		}
	}
	plan := r.plan
	switch {
	case plan.Status.Phase == harvesterv1.UpgradePlanFailed:
		return false, "", nodeupdater.Permanentf("UpgradePlanFailed", "UpgradePlan %s failed: %s", plan.Name, plan.Status.Message)
	case upgradeplan.PhaseReached(plan, harvesterv1.UpgradePlanNodeUpgrading):
		return true, fmt.Sprintf("UpgradePlan %s upgraded the cluster to Harvester %s", plan.Name, plan.Spec.Version), nil
	}
	phase := plan.Status.Phase
	if phase == "" {
		phase = "(not started)"
	}
	return false, fmt.Sprintf("waiting for UpgradePlan %s to upgrade the cluster: %s: %s", plan.Name, phase, plan.Status.Message), nil
}

// singleNode reports whether the node's cluster has one non-witness node, as its
// UpgradePlan recorded it.
func singleNode(r *nodeRun) bool {
	return r.plan != nil && r.plan.Status.SingleNode
}
