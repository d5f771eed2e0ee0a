package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// finishStep puts the node back in service and removes what the updater created for it.
var finishStep = step{
	name:    StepFinish,
	timeout: func(harvesterv1.Timeouts) time.Duration { return 10 * time.Minute },
	run:     (*Updater).runFinish,
}

// runFinish lifts the updater's own cordon, removes this node's Plans and gives back its
// pause of Longhorn's live upgrade.
func (u *Updater) runFinish(ctx context.Context, r *nodeRun) (bool, string, error) {
	if err := u.cleanup(ctx, r); err != nil {
		return false, "", err
	}
	return true, fmt.Sprintf("node %s is in service; its Plans are removed", r.nu.Spec.NodeName), nil
}

// cleanup removes what the updater created for the node (its Plans), gives back its
// pause of Longhorn's live upgrade of v2 instance managers (runDataEngine), and lifts the
// cordon the updater set, if it set one (runDrain). The Plans go whether or not the node
// still exists. It runs at Finish and when the node's update is aborted or fails, so no
// node that has ended leaves Longhorn paused.
func (u *Updater) cleanup(ctx context.Context, r *nodeRun) error {
	if err := u.uncordonIfOurs(ctx, r); err != nil {
		return err
	}
	if err := r.wc.DeleteAllOf(ctx, &sucv1.Plan{}, client.InNamespace(r.cfg.Spec.SystemUpgradeController.Namespace),
		client.MatchingLabels{LabelNodeUpdate: string(r.nu.UID)}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the Plans of node %s: %w", r.nu.Spec.NodeName, err)
	}
	return releaseV2AutomaticUpgrade(ctx, r.wc, r.nu.UID)
}
