package releases

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// NodeAtTarget is the rule AtTarget applies to what a node's kubelet reports; when the
// node is not at the target, why says which part is missing.
func NodeAtTarget(info corev1.NodeSystemInfo, version, release string, upgradeOS bool) (bool, string) {
	if !SameVersion(info.KubeletVersion, version) {
		return false, fmt.Sprintf("kubelet %s is not at the target %s", info.KubeletVersion, version)
	}
	if !upgradeOS || OSAtRelease(info.OSImage, release) {
		return true, ""
	}
	return false, fmt.Sprintf("kubelet %s is at the target but the OS is %s; release %s wants Harvester %s", info.KubeletVersion, info.OSImage, release, release)
}

// OSAtRelease reports whether a node's OS image, as its kubelet reports it, is the
// Harvester OS of release. The OS step waits for this after its reboot, and AtTarget
// asks it, so both judge the OS alike.
func OSAtRelease(osImage, release string) bool {
	current, err := HarvesterVersionFromOSImage(osImage)
	return err == nil && SameVersion(current, release)
}

// UpgradesOS reports whether the HarvesterUpgrader upgrades the OS (upgradeOS, default
// true).
func UpgradesOS(cfg *harvesterv1.HarvesterUpgrader) bool {
	return cfg.Spec.UpgradeOS == nil || *cfg.Spec.UpgradeOS
}
