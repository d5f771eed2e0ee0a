package scenario

import (
	"testing"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// Each hop's release metadata names the release and RKE2 the hop upgrades to and the
// system charts its simulated Rancher installs: otherwise the cluster upgrade would wait
// for versions that never come.
func TestReleaseMetadataAgreesWithTheSimulatedRancher(t *testing.T) {
	for _, h := range Hops {
		m, err := releases.ParseMetadata([]byte(h.Metadata))
		if err != nil {
			t.Fatalf("hop %s: %v", h, err)
		}
		if m.Harvester != h.ToRelease || m.Kubernetes != h.ToKubernetes {
			t.Errorf("hop %s: the metadata says Harvester %s, Kubernetes %s; the hop goes to %s, %s", h, m.Harvester, m.Kubernetes, h.ToRelease, h.ToKubernetes)
		}
		if want := sim.DefaultRancherDependencies(m.Rancher); m.RancherDependencies == nil || *m.RancherDependencies != want {
			t.Errorf("hop %s: the metadata's rancherDependencies are %+v, the simulated Rancher %s installs %+v", h, m.RancherDependencies, m.Rancher, want)
		}
	}
	if _, err := HopFrom("v1.5.0"); err == nil {
		t.Error("HopFrom(v1.5.0) found a hop")
	}
	if h, err := HopFrom("v1.6.1"); err != nil || h.ToRelease != "v1.7.1" {
		t.Errorf("HopFrom(v1.6.1) = %v, %v; want the hop to v1.7.1", h, err)
	}
}
