package releases

import (
	"strings"
	"testing"
)

const sampleRelease = `harvester: v1.6.0
harvesterChart: 1.6.0
os: Harvester v1.6.0
kubernetes: v1.33.3+rke2r1
rancher: v2.12.0
monitoringChart: 105.1.2+up61.3.2
kubevirt: v1.5.2-150700.3.5.1
minUpgradableVersion: v1.5.0
`

func TestParseReleaseMetadata(t *testing.T) {
	m, err := ParseMetadata([]byte(sampleRelease))
	if err != nil {
		t.Fatalf("ParseReleaseMetadata: %v", err)
	}
	if m.Harvester != "v1.6.0" || m.Kubernetes != "v1.33.3+rke2r1" || m.MinUpgradableVersion != "v1.5.0" || m.OS != "Harvester v1.6.0" {
		t.Errorf("parsed %+v", m)
	}
	if m.KubeVirt != "v1.5.2-150700.3.5.1" {
		t.Errorf("kubevirt parsed as %q, want v1.5.2-150700.3.5.1", m.KubeVirt)
	}
	if old, err := ParseMetadata([]byte("harvester: v1.6.0\nkubernetes: v1.33.3+rke2r1\nminUpgradableVersion: v1.5.0\n")); err != nil || old.KubeVirt != "" {
		t.Errorf("metadata without kubevirt: %+v, %v; want it read, with no KubeVirt version", old, err)
	}

	bad := []struct{ name, data, want string }{
		{"empty", "  \n", "harvester-release.yaml is empty"},
		{"not yaml", "harvester: [v1", "not valid YAML"},
		{"no kubernetes", "harvester: v1.6.0\nminUpgradableVersion: v1.5.0\n", "has no kubernetes field"},
		{"no minimum", "harvester: v1.6.0\nkubernetes: v1.33.3+rke2r1\n", "has no minUpgradableVersion field"},
		{"kubernetes not a version", "harvester: v1.6.0\nkubernetes: latest\nminUpgradableVersion: v1.5.0\n", `kubernetes "latest" is not a version`},
		{"too big", "harvester: v1.6.0\n" + strings.Repeat("# padding\n", 7000), "more than the 65536"},
	}
	for _, tt := range bad {
		if _, err := ParseMetadata([]byte(tt.data)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error = %v, want one containing %q", tt.name, err, tt.want)
		}
	}
}

func TestCheckEligible(t *testing.T) {
	m, err := ParseMetadata([]byte(sampleRelease))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                     string
		release, target, current string
		want                     string // "" means eligible
	}{
		{"upgrade from the minimum", "v1.6.0", "v1.33.3+rke2r1", "v1.5.0", ""},
		{"upgrade from a patch above the minimum", "v1.6.0", "v1.33.3+rke2r1", "v1.5.2", ""},
		{"re-run on an upgraded node", "v1.6.0", "v1.33.3+rke2r1", "v1.6.0", ""},
		{"version without v", "1.6.0", "1.33.3+rke2r1", "v1.5.0", ""},
		{"another release asked", "v1.6.1", "v1.33.3+rke2r1", "v1.5.0", "the repository serves Harvester v1.6.0, but the HarvesterUpgrader asks for v1.6.1"},
		{"another kubernetes", "v1.6.0", "v1.34.1+rke2r1", "v1.5.0", "release Harvester v1.6.0 ships Kubernetes v1.33.3+rke2r1, but the upgrade targets v1.34.1+rke2r1"},
		{"another rke2 build of the same kubernetes", "v1.6.0", "v1.33.3+rke2r2", "v1.5.0", "ships Kubernetes v1.33.3+rke2r1, but the upgrade targets v1.33.3+rke2r2"},
		{"too old to upgrade", "v1.6.0", "v1.33.3+rke2r1", "v1.4.3", "the node runs Harvester v1.4.3, but Harvester v1.6.0 installs only over v1.5.0 or newer: upgrade to v1.5.0 first"},
		{"downgrade", "v1.6.0", "v1.33.3+rke2r1", "v1.7.0", "newer than the release v1.6.0: a downgrade is not possible"},
		{"current not a version", "v1.6.0", "v1.33.3+rke2r1", "unknown", `current Harvester version "unknown" is not a version`},
	}
	for _, tt := range tests {
		err := m.CheckEligible(tt.release, tt.target, tt.current)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: error = %v, want one containing %q", tt.name, err, tt.want)
		}
	}
}

func TestHarvesterVersionFromOSImage(t *testing.T) {
	if v, err := HarvesterVersionFromOSImage("Harvester v1.5.1"); err != nil || v != "v1.5.1" {
		t.Errorf("got %q, %v", v, err)
	}
	for _, img := range []string{"SUSE Linux Enterprise Micro 5.5", "Harvester", "Harvester next", ""} {
		if _, err := HarvesterVersionFromOSImage(img); err == nil {
			t.Errorf("%q: expected an error", img)
		}
	}
}
