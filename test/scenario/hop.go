package scenario

import (
	"fmt"
	"strings"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// Hop is the Harvester release a scenario's cluster runs at first and the one it is
// upgraded to, with the release metadata the repository simulator serves for it.
type Hop struct {
	// FromRelease is the Harvester release the cluster runs at first, FromRancher its
	// Rancher and FromKubernetes its nodes' RKE2.
	FromRelease, FromRancher, FromKubernetes string
	// ToRelease is the Harvester release the nodes are upgraded to, ToKubernetes its RKE2.
	ToRelease, ToKubernetes string
	// Metadata is the release's harvester-release.yaml.
	Metadata string
}

// FromOSImage is the operating system the nodes start on.
func (h Hop) FromOSImage() string { return "Harvester " + h.FromRelease }

// ToOSImage is what a node reports once its OS upgrade to ToRelease rebooted it.
func (h Hop) ToOSImage() string { return "Harvester " + h.ToRelease }

// String names the hop.
func (h Hop) String() string { return h.FromRelease + " -> " + h.ToRelease }

// DefaultHop is v1.7.1 to v1.8.1 (FromRelease, HarvesterRelease, ReleaseMetadata).
var DefaultHop = Hop{
	FromRelease: FromRelease, FromRancher: FromRancher, FromKubernetes: FromVersion,
	ToRelease: HarvesterRelease, ToKubernetes: ToVersion, Metadata: ReleaseMetadata,
}

// Release171Metadata is Harvester v1.7.1's harvester-release.yaml as the scenario serves
// it (harvester-release-steps.md fact 5: v1.7.1 ships RKE2 v1.34.3+rke2r3 and Rancher
// v2.13.1, and upgrades from v1.6.0 on, fact 3), with the KubeVirt and Rancher system
// charts the simulators take it to carry, as ReleaseMetadata has them.
var Release171Metadata = `harvester: v1.7.1
harvesterChart: 1.7.1
os: Harvester v1.7.1
kubernetes: v1.34.3+rke2r3
rancher: v2.13.1
# the KubeVirt the simulators take chart 1.7.1 to carry (sim.KubeVirtVersionOfChart)
kubevirt: v-harvester-1.7.1
` + sim.RancherDependenciesYAML("v2.13.1") + `minUpgradableVersion: v1.6.0
`

// Hop16 is v1.6.1 to v1.7.1, the hop with node migrations (NetworkManager, the hostname,
// the GLIBC bind; harvester-release-steps.md fact 53, docs/harvester.md): a v1.6.1
// cluster runs Rancher v2.12.3 and RKE2 v1.33.5+rke2r1.
var Hop16 = Hop{
	FromRelease: "v1.6.1", FromRancher: "v2.12.3", FromKubernetes: "v1.33.5+rke2r1",
	ToRelease: "v1.7.1", ToKubernetes: "v1.34.3+rke2r3", Metadata: Release171Metadata,
}

// Hops are the hops a scenario can run, by the release it starts at.
var Hops = []Hop{DefaultHop, Hop16}

// HopFrom is the hop that starts at release, or an error naming the ones there are.
func HopFrom(release string) (Hop, error) {
	var from []string
	for _, h := range Hops {
		if h.FromRelease == release {
			return h, nil
		}
		from = append(from, h.FromRelease)
	}
	return Hop{}, fmt.Errorf("no scenario starts at Harvester %q: it starts at %s", release, strings.Join(from, " or "))
}
