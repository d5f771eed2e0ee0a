package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// finishStep puts the node back in service and removes what the updater created for it.
var finishStep = step{
	name:    StepFinish,
	timeout: func(harvesterv1.Timeouts) time.Duration { return 10 * time.Minute },
	run:     (*Updater).runFinish,
}

// runFinish lifts the updater's own cordon, removes this node's Plans, starts again the
// VMs it stopped and gives back its pause of Longhorn's live upgrade (cleanup).
func (u *Updater) runFinish(ctx context.Context, r *nodeRun) (bool, string, error) {
	if err := u.cleanup(ctx, r); err != nil {
		return false, "", err
	}
	return true, fmt.Sprintf("node %s is in service; its Plans are removed", r.nu.Spec.NodeName), nil
}

// cleanup removes what the updater created for the node (its Plans, the migrations
// still under way, the landing label of its evacuation on other nodes), starts again the VMs it stopped (unless restoreVM is false or the
// node is a witness: the node goes back into service, at the end or on an abort), gives
// back its pause of Longhorn's live upgrade of v2 instance managers (runDataEngine), and
// lifts the cordon the updater set, if it set one (runCordon). The Plans go whether or
// not the node still exists. It runs at Finish and when the node's update is aborted or
// fails, so no node that has ended leaves Longhorn paused.
func (u *Updater) cleanup(ctx context.Context, r *nodeRun) error {
	if err := u.deleteUnfinishedMigrations(ctx, r); err != nil {
		return err
	}
	if err := kubevirt.RemoveLanding(ctx, r.wc, kubevirt.LandingLabel(r.nu.UID)); err != nil {
		return err
	}
	node := &corev1.Node{}
	if err := r.wc.Get(ctx, client.ObjectKey{Name: r.nu.Spec.NodeName}, node); err != nil {
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get node %s: %w", r.nu.Spec.NodeName, err)
		}
		node = nil
	}
	if ok, _ := restoresVMs(r, node); ok {
		if _, err := u.restoreStoppedVMs(ctx, r); err != nil {
			return err
		}
	}
	if r.hold != "" {
		if err := u.holdIfOurs(ctx, r, r.hold); err != nil {
			return err
		}
	} else if err := u.uncordonIfOurs(ctx, r); err != nil {
		return err
	}
	if err := r.wc.DeleteAllOf(ctx, &sucv1.Plan{}, client.InNamespace(r.cfg.Spec.SystemUpgradeController.Namespace),
		client.MatchingLabels{suc.LabelNodeUpdate: string(r.nu.UID)}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the Plans of node %s: %w", r.nu.Spec.NodeName, err)
	}
	return longhorn.ReleaseV2AutomaticUpgrade(ctx, r.wc, r.nu.UID)
}

// deleteUnfinishedMigrations deletes this NodeUpdate's migrations that have not ended
// (KubeVirt aborts a migration whose object is deleted). Ended ones stay, as KubeVirt's
// history of the VMI; KubeVirt garbage-collects them.
func (u *Updater) deleteUnfinishedMigrations(ctx context.Context, r *nodeRun) error {
	ours, err := u.migrations(ctx, r)
	if err != nil {
		return err
	}
	for _, m := range ours {
		if kubevirt.MigrationFinished(m) {
			continue
		}
		if err := r.wc.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete migration %s/%s: %w", m.Namespace, m.Name, err)
		}
	}
	return nil
}
