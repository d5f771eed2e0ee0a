package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
)

// preloadStep pulls the release's images onto the node before it is drained.
var preloadStep = step{
	name:    StepImagePreload,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanPreload, t) },
	skip:    (*Updater).skipPreload,
	run:     (*Updater).runPreload,
}

// skipPreload: the node was preloaded with every other node by its cluster's
// UpgradePlan (the cluster Plan's label on the node says so), or preloadImages is false.
func (u *Updater) skipPreload(ctx context.Context, r *nodeRun) (string, error) {
	if r.plan != nil {
		node, err := u.node(ctx, r)
		if err != nil {
			return "", err
		}
		name := upgradeplan.ObjectName("preload", r.plan)
		if _, ok := node.Labels["plan.upgrade.cattle.io/"+name]; ok {
			return fmt.Sprintf("preloaded with every node of the cluster by UpgradePlan %s (SUC plan %s)", r.plan.Name, name), nil
		}
	}
	if p := r.cfg.Spec.PreloadImages; p != nil && !*p {
		return "preloadImages is false in the HarvesterUpgrader", nil
	}
	return "", nil
}

func (u *Updater) runPreload(ctx context.Context, r *nodeRun) (bool, string, error) {
	return u.applyPlan(ctx, r, suc.PlanPreload)
}
