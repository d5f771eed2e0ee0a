package harvesteradapter

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

var _ nodeupdater.TargetJudge = &Updater{}

// AtTarget reports whether the node of target already runs target.Version as the
// Harvester updater upgrades it: its kubelet reports the target version, build metadata
// included, and, unless the HarvesterUpgrader skips the OS upgrade, its OS image is the
// release's. A node whose RKE2 step finished and whose OS step failed is therefore not at
// the target, and is upgraded again rather than counted as done.
func (u *Updater) AtTarget(ctx context.Context, target nodeupdater.PreflightTarget) (bool, string, error) {
	cfg, err := u.config(ctx, target.Namespace, target.UpdaterRef.Name)
	if err != nil {
		return false, "", err
	}
	wc, err := u.Workloads.Client(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.ClusterName})
	if err != nil {
		return false, "", fmt.Errorf("reach the workload cluster %s: %w", target.ClusterName, err)
	}
	node := &corev1.Node{}
	if err := wc.Get(ctx, client.ObjectKey{Name: target.NodeName}, node); err != nil {
		return false, "", fmt.Errorf("get node %s of the workload cluster %s: %w", target.NodeName, target.ClusterName, err)
	}
	at, why := nodeAtTarget(node.Status.NodeInfo, target.Version, cfg.Spec.Release.Version, upgradesOS(cfg))
	return at, why, nil
}

// nodeAtTarget is the rule AtTarget applies to what a node's kubelet reports; when the
// node is not at the target, why says which part is missing.
func nodeAtTarget(info corev1.NodeSystemInfo, version, release string, upgradeOS bool) (bool, string) {
	if !sameVersion(info.KubeletVersion, version) {
		return false, fmt.Sprintf("kubelet %s is not at the target %s", info.KubeletVersion, version)
	}
	if !upgradeOS || osAtRelease(info.OSImage, release) {
		return true, ""
	}
	return false, fmt.Sprintf("kubelet %s is at the target but the OS is %s; release %s wants Harvester %s", info.KubeletVersion, info.OSImage, release, release)
}

// osAtRelease reports whether a node's OS image, as its kubelet reports it, is the
// Harvester OS of release. The OS step waits for this after its reboot, and AtTarget
// asks it, so both judge the OS alike.
func osAtRelease(osImage, release string) bool {
	current, err := HarvesterVersionFromOSImage(osImage)
	return err == nil && sameVersion(current, release)
}

// upgradesOS reports whether the HarvesterUpgrader upgrades the OS (upgradeOS, default
// true).
func upgradesOS(cfg *harvesterv1.HarvesterUpgrader) bool {
	return cfg.Spec.UpgradeOS == nil || *cfg.Spec.UpgradeOS
}
