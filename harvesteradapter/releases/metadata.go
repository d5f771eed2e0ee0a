// Package releases knows the Harvester releases the updater installs: the release
// metadata a repository serves (harvester-release.yaml), how versions compare, and
// whether a node already runs a release.
package releases

import (
	"bytes"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// maxReleaseMetadataBytes bounds what is read of harvester-release.yaml; the real file is
// a few hundred bytes.
const MaxMetadataBytes = 64 << 10

// ReleaseMetadata is harvester-release.yaml, as an upgrade repository serves it at its root.
type Metadata struct {
	// Harvester is the release's Harvester version, for example v1.6.0.
	Harvester string `json:"harvester"`
	// HarvesterChart is the version of the Harvester chart.
	HarvesterChart string `json:"harvesterChart,omitempty"`
	// OS is the operating system's name and version, for example "Harvester v1.6.0".
	OS string `json:"os,omitempty"`
	// Kubernetes is the RKE2 version the release ships, for example v1.33.3+rke2r1.
	Kubernetes string `json:"kubernetes"`
	// Rancher is the embedded Rancher's version.
	Rancher string `json:"rancher,omitempty"`
	// KubeVirt is the KubeVirt version the release ships, which the cluster upgrade
	// waits for virt-operator to deploy (harvester-release-steps.md fact 23.5; Harvester's
	// lib.sh detect_repo reads it as REPO_KUBEVIRT_VERSION). Optional here: older
	// metadata without it skips that wait.
	KubeVirt string `json:"kubevirt,omitempty"`
	// MonitoringChart is the version of the rancher-monitoring charts, to which the
	// cluster upgrade brings the rancher-monitoring-crd ManagedChart (fact 27).
	MonitoringChart string `json:"monitoringChart,omitempty"`
	// LoggingChart is the version of the rancher-logging charts, to which the cluster
	// upgrade brings the rancher-logging-crd ManagedChart (fact 27).
	LoggingChart string `json:"loggingChart,omitempty"`
	// LoggingChartHarvesterEventRouter is the eventrouter image the rancher-logging
	// add-on's event tailer runs with the release, which the cluster upgrade writes into
	// the add-on's values when they name one (fact 29; lib.sh
	// upgrade_addon_rancher_logging_with_patch_eventrouter_image).
	LoggingChartHarvesterEventRouter string `json:"loggingChartHarvesterEventRouter,omitempty"`
	// RancherDependencies are the versions of the Fleet and rancher-webhook charts
	// Rancher installs, which the cluster upgrade waits for (fact 16.11).
	RancherDependencies *RancherDependencies `json:"rancherDependencies,omitempty"`
	// MinUpgradableVersion is the oldest Harvester version the release installs over.
	MinUpgradableVersion string `json:"minUpgradableVersion"`
}

// ParseReleaseMetadata reads harvester-release.yaml. Unknown fields are allowed (newer
// releases add some); the three fields eligibility depends on are required and must be
// versions.
func ParseMetadata(data []byte) (*Metadata, error) {
	if len(data) > MaxMetadataBytes {
		return nil, fmt.Errorf("harvester-release.yaml is %d bytes, more than the %d a release metadata file can be", len(data), MaxMetadataBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("harvester-release.yaml is empty")
	}
	m := &Metadata{}
	if err := yaml.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("harvester-release.yaml is not valid YAML: %w", err)
	}
	for _, f := range []struct{ name, value string }{
		{"harvester", m.Harvester}, {"kubernetes", m.Kubernetes}, {"minUpgradableVersion", m.MinUpgradableVersion},
	} {
		if f.value == "" {
			return nil, fmt.Errorf("harvester-release.yaml has no %s field", f.name)
		}
		if _, err := version.ParseSemantic(f.value); err != nil {
			return nil, fmt.Errorf("harvester-release.yaml: %s %q is not a version: %w", f.name, f.value, err)
		}
	}
	return m, nil
}

// CheckEligible says whether the release may be installed: it is the release the
// HarvesterUpgrader asks for, it ships the Kubernetes version the upgrade targets, and
// the node's current Harvester version is at least the release's minUpgradableVersion
// and not newer than the release. The error says which versions disagree and what to do.
func (m *Metadata) CheckEligible(wantRelease, targetKubernetes, currentHarvester string) error {
	if !SameVersion(m.Harvester, wantRelease) {
		return fmt.Errorf("the repository serves Harvester %s, but the HarvesterUpgrader asks for %s: point release.isoURL or release.repositoryURL at the %s release", m.Harvester, wantRelease, wantRelease)
	}
	if !SameVersion(m.Kubernetes, targetKubernetes) {
		return fmt.Errorf("release Harvester %s ships Kubernetes %s, but the upgrade targets %s: upgrade to %s, or use the Harvester release that ships %s", m.Harvester, m.Kubernetes, targetKubernetes, m.Kubernetes, targetKubernetes)
	}
	current, err := version.ParseSemantic(currentHarvester)
	if err != nil {
		return fmt.Errorf("the node's current Harvester version %q is not a version: %w", currentHarvester, err)
	}
	minimum := version.MustParseSemantic(m.MinUpgradableVersion)
	release := version.MustParseSemantic(m.Harvester)
	if current.LessThan(minimum) {
		return fmt.Errorf("the node runs Harvester %s, but Harvester %s installs only over %s or newer: upgrade to %s first", currentHarvester, m.Harvester, m.MinUpgradableVersion, m.MinUpgradableVersion)
	}
	if release.LessThan(current) {
		return fmt.Errorf("the node runs Harvester %s, newer than the release %s: a downgrade is not possible", currentHarvester, m.Harvester)
	}
	return nil
}

// HarvesterVersionFromOSImage reads the Harvester version from a node's OS image as the
// kubelet reports it, for example "Harvester v1.5.1" gives v1.5.1.
func HarvesterVersionFromOSImage(osImage string) (string, error) {
	fields := strings.Fields(osImage)
	if len(fields) != 2 || fields[0] != "Harvester" {
		return "", fmt.Errorf("the node's OS image %q is not a Harvester OS image (\"Harvester vX.Y.Z\")", osImage)
	}
	if _, err := version.ParseSemantic(fields[1]); err != nil {
		return "", fmt.Errorf("the node's OS image %q carries no Harvester version: %w", osImage, err)
	}
	return fields[1], nil
}

// sameVersion compares two versions semantically, build metadata included (v1.33.3+rke2r1
// and 1.33.3+rke2r1 are the same; v1.33.3+rke2r1 and v1.33.3+rke2r2 are not).
func SameVersion(a, b string) bool {
	va, errA := version.ParseSemantic(a)
	vb, errB := version.ParseSemantic(b)
	if errA != nil || errB != nil {
		return false
	}
	return va.String() == vb.String()
}

// versionLess reports whether version a is older than b; versions that do not parse
// are never older.
func Less(a, b string) bool {
	va, errA := version.ParseSemantic(a)
	vb, errB := version.ParseSemantic(b)
	return errA == nil && errB == nil && va.LessThan(vb)
}

// forcedFloor is the version eligibility is judged from: the running one, or, when the
// cluster's UpgradePlan is forced (spec.force, as the toolkit's force skips its version
// guard) and the running one is older than the release's minUpgradableVersion, that
// minimum. A downgrade is refused even when forced.
func ForcedFloor(plan *harvesterv1.UpgradePlan, current string, meta *Metadata) string {
	if plan != nil && plan.Spec.Force && Less(current, meta.MinUpgradableVersion) {
		return meta.MinUpgradableVersion
	}
	return current
}
