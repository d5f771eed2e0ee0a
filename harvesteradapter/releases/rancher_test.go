package releases

import (
	"strings"
	"testing"
)

// The example of harvester-release.yaml in Harvester's enhancement
// 20220413-zero-downtime-upgrade.md, which lib.sh detect_repo reads the same way.
const releaseWithDependencies = `harvester: v1.0.1
harvesterChart: 1.0.1
os: Harvester v1.0.1
kubernetes: v1.21.11+rke2r1
rancher: v2.6.4-harvester3
monitoringChart: 100.1.0+up19.0.3
kubevirt: 0.49.0-2
rancherDependencies:
  fleet:
    chart: 100.0.3+up0.3.9
    app: 0.3.9
  fleet-crd:
    chart: 100.0.3+up0.3.9
    app: 0.3.9
  rancher-webhook:
    chart: 1.0.4+up0.2.5
    app: 0.2.5
minUpgradableVersion: v1.0.0
`

func TestParseRancherDependencies(t *testing.T) {
	m, err := ParseMetadata([]byte(releaseWithDependencies))
	if err != nil {
		t.Fatal(err)
	}
	d := m.RancherDependencies
	if !d.Complete() || d.Fleet.Chart != "100.0.3+up0.3.9" || d.FleetCRD.App != "0.3.9" || d.RancherWebhook.Chart != "1.0.4+up0.2.5" || d.RancherWebhook.App != "0.2.5" {
		t.Errorf("rancherDependencies parsed as %+v", d)
	}
	if back := DependenciesOf(d.Info()); back != *d {
		t.Errorf("through the status and back: %+v, want %+v", back, *d)
	}
	m, err = ParseMetadata([]byte(sampleRelease))
	if err != nil || m.RancherDependencies.Complete() {
		t.Errorf("metadata without rancherDependencies: %+v, %v", m.RancherDependencies, err)
	}
}

func TestRancherFeatures(t *testing.T) {
	for target, want := range map[string]string{
		"v1.6.1": "multi-cluster-management=false,multi-cluster-management-agent=false,managed-system-upgrade-controller=false",
		"v1.7.1": "multi-cluster-management=false,multi-cluster-management-agent=false,managed-system-upgrade-controller=false,turtles=false,embedded-cluster-api=true",
		"v1.8.2": "multi-cluster-management=false,multi-cluster-management-agent=false,managed-system-upgrade-controller=false",
		"v1.9.0": "multi-cluster-management=false,multi-cluster-management-agent=false,managed-system-upgrade-controller=false,crt-token-ttl-rotation=false",
	} {
		got, err := RancherFeatures(target)
		if err != nil || got != want {
			t.Errorf("RancherFeatures(%s) = %q, %v; want %q", target, got, err, want)
		}
	}
	if _, err := RancherFeatures("v1.3.0"); err == nil || !strings.Contains(err.Error(), "not known") {
		t.Errorf("RancherFeatures(v1.3.0): %v, want not known", err)
	}
	if _, err := RancherFeatures("latest"); err == nil {
		t.Error("RancherFeatures(latest) gave no error")
	}
}
