package harvesteradapter

import (
	"context"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// preloadStep pulls the release's images onto the node before it is drained.
var preloadStep = step{
	name:    StepImagePreload,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return planTimeout(planPreload, t) },
	skip:    (*Updater).skipPreload,
	run:     (*Updater).runPreload,
}

func (u *Updater) skipPreload(_ context.Context, r *nodeRun) (string, error) {
	if p := r.cfg.Spec.PreloadImages; p != nil && !*p {
		return "preloadImages is false in the HarvesterUpgrader", nil
	}
	return "", nil
}

func (u *Updater) runPreload(ctx context.Context, r *nodeRun) (bool, string, error) {
	return u.applyPlan(ctx, r, planPreload)
}
