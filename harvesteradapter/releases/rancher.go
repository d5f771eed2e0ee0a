package releases

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// ChartApp is a chart of the release metadata's rancherDependencies: its chart version and
// the app version Helm records for it (lib.sh detect_repo reads .chart and .app).
type ChartApp struct {
	Chart string `json:"chart,omitempty"`
	App   string `json:"app,omitempty"`
}

// RancherDependencies are the versions of the charts Rancher installs itself, which the
// release waits for after upgrading Rancher (harvester-release-steps.md fact 16.11).
type RancherDependencies struct {
	Fleet          ChartApp `json:"fleet,omitempty"`
	FleetCRD       ChartApp `json:"fleet-crd,omitempty"`
	RancherWebhook ChartApp `json:"rancher-webhook,omitempty"`
}

// Complete says whether every chart and app version is named (the release's script fails
// when one is missing, lib.sh detect_repo).
func (d *RancherDependencies) Complete() bool {
	if d == nil {
		return false
	}
	for _, v := range []string{d.Fleet.Chart, d.Fleet.App, d.FleetCRD.Chart, d.FleetCRD.App, d.RancherWebhook.Chart, d.RancherWebhook.App} {
		if v == "" {
			return false
		}
	}
	return true
}

// rancherBaseFeatures are the Rancher feature flags every Harvester release turns off
// in its embedded Rancher (fact 42).
var rancherBaseFeatures = []string{
	"multi-cluster-management=false", "multi-cluster-management-agent=false", "managed-system-upgrade-controller=false",
}

// rancherFeaturesByMinor is the Rancher `features` value each Harvester minor passes to
// its `helm upgrade rancher` (fact 42, upgrade_manifests.sh upgrade_rancher at each tag).
// Helm replaces the whole value, so an upgrade must pass the target release's list.
var rancherFeaturesByMinor = map[string][]string{
	"v1.4": rancherBaseFeatures,
	"v1.5": rancherBaseFeatures,
	"v1.6": rancherBaseFeatures,
	"v1.7": append(append([]string{}, rancherBaseFeatures...), "turtles=false", "embedded-cluster-api=true"),
	"v1.8": rancherBaseFeatures,
	"v1.9": append(append([]string{}, rancherBaseFeatures...), "crt-token-ttl-rotation=false"),
}

// RancherFeatures is the value of Rancher's `features` (its container's CATTLE_FEATURES)
// that the Harvester release target runs Rancher with (fact 42), or an error naming the
// minors known.
func RancherFeatures(target string) (string, error) {
	v, err := version.ParseGeneric(target)
	if err != nil {
		return "", fmt.Errorf("%q is not a Harvester release: %w", target, err)
	}
	minor := fmt.Sprintf("v%d.%d", v.Major(), v.Minor())
	flags, ok := rancherFeaturesByMinor[minor]
	if !ok {
		return "", fmt.Errorf("the Rancher features of Harvester %s are not known (known: v1.4 to v1.9)", minor)
	}
	return strings.Join(flags, ","), nil
}

// Info is d as the UpgradePlan's status.releaseMetadata keeps it; nil for nil.
func (d *RancherDependencies) Info() *harvesterv1.RancherDependencies {
	if d == nil {
		return nil
	}
	return &harvesterv1.RancherDependencies{
		Fleet:          harvesterv1.ChartVersions{Chart: d.Fleet.Chart, App: d.Fleet.App},
		FleetCRD:       harvesterv1.ChartVersions{Chart: d.FleetCRD.Chart, App: d.FleetCRD.App},
		RancherWebhook: harvesterv1.ChartVersions{Chart: d.RancherWebhook.Chart, App: d.RancherWebhook.App},
	}
}

// DependenciesOf is the inverse of Info; the zero value for nil.
func DependenciesOf(info *harvesterv1.RancherDependencies) RancherDependencies {
	if info == nil {
		return RancherDependencies{}
	}
	return RancherDependencies{
		Fleet:          ChartApp{Chart: info.Fleet.Chart, App: info.Fleet.App},
		FleetCRD:       ChartApp{Chart: info.FleetCRD.Chart, App: info.FleetCRD.App},
		RancherWebhook: ChartApp{Chart: info.RancherWebhook.Chart, App: info.RancherWebhook.App},
	}
}
