package harvesteradapter

import (
	"context"
	"fmt"
	"sort"
	"strings"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// LonghornNamespace is where Longhorn keeps its objects on a Harvester cluster.
const LonghornNamespace = "longhorn-system"

// Names of the Harvester updater's preflight checks.
const (
	CheckLonghornVolumesHealthy     = "LonghornVolumesHealthy"
	CheckLonghornV2ReplicaElsewhere = "LonghornV2ReplicaElsewhere"
	CheckLonghornV2NotSingleNode    = "LonghornV2NotSingleNode"
	CheckLonghornV2SwapAvailable    = "LonghornV2SwapAvailable"
)

// longhornState is what the preflight and the data engine step read of Longhorn, with
// longhorn-manager's released v1beta2 types.
type longhornState struct {
	volumes  []longhornv1.Volume
	replicas []longhornv1.Replica
	engines  []longhornv1.Engine
	nodes    []longhornv1.Node
}

func readLonghorn(ctx context.Context, c client.Reader) (*longhornState, error) {
	s := &longhornState{}
	lists := []struct {
		what string
		list client.ObjectList
	}{
		{"volumes", &longhornv1.VolumeList{}}, {"replicas", &longhornv1.ReplicaList{}},
		{"engines", &longhornv1.EngineList{}}, {"nodes", &longhornv1.NodeList{}},
	}
	for _, l := range lists {
		if err := c.List(ctx, l.list, client.InNamespace(LonghornNamespace)); err != nil {
			return nil, fmt.Errorf("list Longhorn %s: %w", l.what, err)
		}
	}
	s.volumes = lists[0].list.(*longhornv1.VolumeList).Items
	s.replicas = lists[1].list.(*longhornv1.ReplicaList).Items
	s.engines = lists[2].list.(*longhornv1.EngineList).Items
	s.nodes = lists[3].list.(*longhornv1.NodeList).Items
	return s, nil
}

func (s *longhornState) volume(name string) *longhornv1.Volume {
	for i := range s.volumes {
		if s.volumes[i].Name == name {
			return &s.volumes[i]
		}
	}
	return nil
}

// unhealthyVolumes lists the attached volumes that are not healthy (degraded or
// faulted): taking a node down now could cost them their last good replica.
func (s *longhornState) unhealthyVolumes() []string {
	var out []string
	for _, v := range s.volumes {
		if v.Status.State == longhornv1.VolumeStateAttached && v.Status.Robustness != longhornv1.VolumeRobustnessHealthy {
			out = append(out, fmt.Sprintf("%s (%s)", v.Name, v.Status.Robustness))
		}
	}
	sort.Strings(out)
	return out
}

func replicaHealthy(r *longhornv1.Replica) bool {
	return r.Spec.HealthyAt != "" && r.Spec.FailedAt == ""
}

// v2VolumesOnlyHealthyOn lists the v2 volumes whose only healthy replicas are on node.
func (s *longhornState) v2VolumesOnlyHealthyOn(node string) []string {
	healthyOn := map[string]map[string]bool{}
	for i := range s.replicas {
		r := &s.replicas[i]
		if r.Spec.DataEngine != longhornv1.DataEngineTypeV2 || !replicaHealthy(r) {
			continue
		}
		if healthyOn[r.Spec.VolumeName] == nil {
			healthyOn[r.Spec.VolumeName] = map[string]bool{}
		}
		healthyOn[r.Spec.VolumeName][r.Spec.NodeID] = true
	}
	var out []string
	for vol, nodes := range healthyOn {
		if len(nodes) == 1 && nodes[node] {
			out = append(out, vol)
		}
	}
	sort.Strings(out)
	return out
}

// attachedV2On lists the attached v2 volumes with an engine or a replica on node: their
// I/O stops while the node's v2 data engine restarts, unless it is swapped live.
func (s *longhornState) attachedV2On(node string) []string {
	set := map[string]bool{}
	consider := func(volume, nodeID string, engine longhornv1.DataEngineType) {
		if engine != longhornv1.DataEngineTypeV2 || nodeID != node {
			return
		}
		if v := s.volume(volume); v != nil && v.Status.State == longhornv1.VolumeStateAttached {
			set[volume] = true
		}
	}
	for i := range s.engines {
		consider(s.engines[i].Spec.VolumeName, s.engines[i].Spec.NodeID, s.engines[i].Spec.DataEngine)
	}
	for i := range s.replicas {
		consider(s.replicas[i].Spec.VolumeName, s.replicas[i].Spec.NodeID, s.replicas[i].Spec.DataEngine)
	}
	out := make([]string, 0, len(set))
	for v := range set {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// longhornChecks are the Harvester updater's Longhorn preflight checks for one node.
// swapServed says whether the workload cluster serves Longhorn's live data engine
// upgrade API; skipSwap is the HarvesterUpgrader's longhornV2Swap: Skip.
func (s *longhornState) longhornChecks(node string, swapServed, skipSwap bool) []nodeupdater.CheckResult {
	results := make([]nodeupdater.CheckResult, 0, 4)
	add := func(name string, problems []string, message string) {
		r := nodeupdater.CheckResult{Name: name, Passed: len(problems) == 0}
		if !r.Passed {
			r.Message = fmt.Sprintf(message, strings.Join(problems, ", "))
		}
		results = append(results, r)
	}
	add(CheckLonghornVolumesHealthy, s.unhealthyVolumes(),
		"Longhorn volumes are not healthy: %s; wait until Longhorn has rebuilt their replicas")
	add(CheckLonghornV2ReplicaElsewhere, s.v2VolumesOnlyHealthyOn(node),
		"v2 volumes have their only healthy replica on node "+node+": %s; add a replica on another node first")

	onNode := s.attachedV2On(node)
	var single, unavailable []string
	if len(onNode) > 0 && !skipSwap {
		if len(s.nodes) <= 1 {
			single = onNode
		}
		if !swapServed {
			unavailable = onNode
		}
	}
	add(CheckLonghornV2NotSingleNode, single,
		"a live v2 data engine swap needs another Longhorn node, and this cluster has one; attached v2 volumes on it: %s")
	add(CheckLonghornV2SwapAvailable, unavailable,
		"the cluster's Longhorn does not serve the live data engine upgrade API, so upgrading node "+node+" would interrupt its attached v2 volumes: %s; detach them, or set longhornV2Swap: Skip on the HarvesterUpgrader to accept the interruption")
	return results
}
