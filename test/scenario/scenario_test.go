package scenario

import (
	"testing"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// The demo's release metadata names the system charts its simulated Rancher installs:
// otherwise the cluster upgrade would wait for versions that never come.
func TestReleaseMetadataAgreesWithTheSimulatedRancher(t *testing.T) {
	m, err := releases.ParseMetadata([]byte(ReleaseMetadata))
	if err != nil {
		t.Fatal(err)
	}
	if want := sim.DefaultRancherDependencies(m.Rancher); m.RancherDependencies == nil || *m.RancherDependencies != want {
		t.Errorf("ReleaseMetadata's rancherDependencies are %+v, the simulated Rancher %s installs %+v", m.RancherDependencies, m.Rancher, want)
	}
}
