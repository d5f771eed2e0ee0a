package releases

import (
	"testing"
)

// FuzzReleaseMetadata: no input makes the parser or the eligibility check panic; what the
// parser accepts has the three fields eligibility needs.
func FuzzReleaseMetadata(f *testing.F) {
	f.Add([]byte(sampleRelease), "v1.6.0", "v1.33.3+rke2r1", "v1.5.0")
	f.Add([]byte("harvester: v1.6.0\nkubernetes: v1.33.3+rke2r1\nminUpgradableVersion: v1.5.0\nextra: [1, 2]\n"), "1.6.0", "v1.33.3", "Harvester v1.5.0")
	f.Add([]byte("{\"harvester\": \"v1\", \"kubernetes\": 3}"), "", "", "")
	f.Add([]byte("harvester: &a v1.6.0\nkubernetes: *a\nminUpgradableVersion: *a\n"), "v1.6.0", "v1.6.0", "v1.6.0")
	f.Add([]byte("- - - -\n"), "x", "y", "z")
	f.Fuzz(func(t *testing.T, data []byte, release, target, current string) {
		m, err := ParseMetadata(data)
		if err != nil {
			return
		}
		if m.Harvester == "" || m.Kubernetes == "" || m.MinUpgradableVersion == "" {
			t.Fatalf("accepted metadata without a required field: %+v", m)
		}
		_ = m.CheckEligible(release, target, current)
		_, _ = HarvesterVersionFromOSImage(current)
	})
}
