package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// osStep installs the release's operating system and waits for the node to come back
// Ready on it after its reboot.
var osStep = step{
	name:    StepOSUpgrade,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanOS, t) },
	skip:    (*Updater).skipOS,
	run:     (*Updater).runOS,
}

func (u *Updater) skipOS(_ context.Context, r *nodeRun) (string, error) {
	if !releases.UpgradesOS(r.cfg) {
		return "upgradeOS is false in the HarvesterUpgrader", nil
	}
	return "", nil
}

func (u *Updater) runOS(ctx context.Context, r *nodeRun) (bool, string, error) {
	done, message, err := u.applyPlan(ctx, r, suc.PlanOS)
	if err != nil || !done {
		return done, message, err
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	want := "Harvester " + r.cfg.Spec.Release.Version
	if !kube.NodeReady(node) || !releases.OSAtRelease(node.Status.NodeInfo.OSImage, r.cfg.Spec.Release.Version) {
		return false, fmt.Sprintf("waiting for node %s to come back Ready on %s after its reboot (it reports %q)", node.Name, want, node.Status.NodeInfo.OSImage), nil
	}
	return true, fmt.Sprintf("node %s runs %s", node.Name, want), nil
}
