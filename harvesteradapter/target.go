package harvesteradapter

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

var _ nodeupdater.TargetJudge = &Updater{}

// AtTarget reports whether the node of target already runs target.Version as the
// Harvester updater upgrades it: its kubelet reports the target version, build metadata
// included, and, unless the HarvesterUpgrader skips the OS upgrade, its OS image is the
// release's. A node whose RKE2 step finished and whose OS step failed is therefore not at
// the target, and is upgraded again rather than counted as done.
func (u *Updater) AtTarget(ctx context.Context, target nodeupdater.PreflightTarget) (bool, string, error) {
	cfg, err := u.configs().Get(ctx, target.Namespace, target.UpdaterRef.Name)
	if err != nil {
		return false, "", err
	}
	wc, err := u.workloadClient(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.ClusterName})
	if err != nil {
		return false, "", fmt.Errorf("reach the workload cluster %s: %w", target.ClusterName, err)
	}
	node := &corev1.Node{}
	if err := wc.Get(ctx, client.ObjectKey{Name: target.NodeName}, node); err != nil {
		return false, "", fmt.Errorf("get node %s of the workload cluster %s: %w", target.NodeName, target.ClusterName, err)
	}
	at, why := releases.NodeAtTarget(node.Status.NodeInfo, target.Version, cfg.Spec.Release.Version, releases.UpgradesOS(cfg))
	return at, why, nil
}
