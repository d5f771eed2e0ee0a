package longhorn

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// LonghornNamespace is where Longhorn keeps its objects on a Harvester cluster.
const Namespace = "longhorn-system"

// Names of the Harvester updater's Longhorn preflight checks. Each judges the candidate
// node together with the nodes down or going down and this round's other picks.
const (
	// CheckLonghornVolumesHealthy: every attached volume is healthy.
	CheckLonghornVolumesHealthy = "LonghornVolumesHealthy"
	// CheckLonghornV1ReplicaElsewhere: every v1 volume keeps a healthy replica on a node
	// that stays up.
	CheckLonghornV1ReplicaElsewhere = "LonghornV1ReplicaElsewhere"
	// CheckLonghornV2ReplicaElsewhere: every v2 volume keeps a healthy replica on a node
	// that stays up.
	CheckLonghornV2ReplicaElsewhere = "LonghornV2ReplicaElsewhere"
	// CheckLonghornV2NotSingleReplica: no attached v2 volume on the node has a single
	// replica, which Longhorn's live data engine upgrade cannot carry.
	CheckLonghornV2NotSingleReplica = "LonghornV2NotSingleReplica"
	// CheckLonghornV2NotSingleNode: a live v2 swap has another Longhorn node to go to.
	CheckLonghornV2NotSingleNode = "LonghornV2NotSingleNode"
	// CheckLonghornV2SwapAvailable: a node where attached v2 volumes have their engine is
	// in a cluster whose Longhorn serves the live upgrade of v2 instance managers
	// (InstanceManagerUpgradeControl), or the HarvesterUpgrader accepts interrupting them.
	CheckLonghornV2SwapAvailable = "LonghornV2SwapAvailable"
	// CheckLonghornLiveUpgradeIdle: where Longhorn serves the live upgrade of v2 instance
	// managers, none runs: no InstanceManagerUpgrade in an active state and no node
	// in-progress in the InstanceManagerUpgradeControl (facts 37 and 39). No node is
	// picked while Longhorn's own roll runs.
	CheckLonghornLiveUpgradeIdle = "LonghornLiveUpgradeIdle"
)

// longhornState is what the preflight and the data engine step read of Longhorn, with
// longhorn-manager's released v1beta2 types.
type State struct {
	volumes  []longhornv1.Volume
	replicas []longhornv1.Replica
	engines  []longhornv1.Engine
	nodes    []longhornv1.Node
	// storageNodes is how many nodes can hold Longhorn data, as Harvester counts them for
	// its volume check (unhealthyVolumes): the Kubernetes nodes it manages that are not
	// witnesses; 0 when not known.
	storageNodes int
}

// Harvester's node labels that say which nodes hold Longhorn data: the nodes it manages,
// except a witness (upgrade_node.sh wait_longhorn_engines's selector
// harvesterhci.io/managed=true,node-role.harvesterhci.io/witness!=true).
const (
	labelManagedNode = "harvesterhci.io/managed"
	labelWitnessNode = "node-role.harvesterhci.io/witness"
)

// countStorageNodes counts the nodes that can hold Longhorn data: the managed nodes that
// are not witnesses, or, on a cluster whose nodes carry no managed label (not
// Harvester), every node that is not a witness.
func countStorageNodes(nodes []corev1.Node) int {
	managed, all := 0, 0
	for _, n := range nodes {
		if n.Labels[labelWitnessNode] == "true" {
			continue
		}
		all++
		if n.Labels[labelManagedNode] == "true" {
			managed++
		}
	}
	if managed > 0 {
		return managed
	}
	return all
}

func Read(ctx context.Context, c client.Reader) (*State, error) {
	s := &State{}
	lists := []struct {
		what string
		list client.ObjectList
	}{
		{"volumes", &longhornv1.VolumeList{}}, {"replicas", &longhornv1.ReplicaList{}},
		{"engines", &longhornv1.EngineList{}}, {"nodes", &longhornv1.NodeList{}},
	}
	for _, l := range lists {
		if err := c.List(ctx, l.list, client.InNamespace(Namespace)); err != nil {
			return nil, fmt.Errorf("list Longhorn %s: %w", l.what, err)
		}
	}
	s.volumes = lists[0].list.(*longhornv1.VolumeList).Items
	s.replicas = lists[1].list.(*longhornv1.ReplicaList).Items
	s.engines = lists[2].list.(*longhornv1.EngineList).Items
	s.nodes = lists[3].list.(*longhornv1.NodeList).Items
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	s.storageNodes = countStorageNodes(nodes.Items)
	return s, nil
}

func (s *State) volume(name string) *longhornv1.Volume {
	for i := range s.volumes {
		if s.volumes[i].Name == name {
			return &s.volumes[i]
		}
	}
	return nil
}

// unhealthyVolumes lists the attached volumes that are not healthy (degraded or
// faulted): taking a node down now could cost them their last good replica. On a
// cluster of two storage nodes or fewer (two management nodes and a witness, or two
// nodes) it applies Harvester's own rule there instead: a volume passes when its running
// engine has at least two replicas in mode RW (one for a volume of one replica). Such a
// cluster cannot place the third replica of Harvester's default 3-replica volumes, which
// stay degraded for good (shared/facts/harvester-node-upgrade.md fact 36,
// upgrade_node.sh wait_longhorn_engines; harvester-release-steps.md fact 45).
func (s *State) unhealthyVolumes() []string {
	var out []string
	for _, v := range s.volumes {
		if v.Status.State != longhornv1.VolumeStateAttached || v.Status.Robustness == longhornv1.VolumeRobustnessHealthy {
			continue
		}
		if s.storageNodes == 0 || s.storageNodes > 2 {
			out = append(out, fmt.Sprintf("%s (%s)", v.Name, v.Status.Robustness))
			continue
		}
		want := 2
		if v.Spec.NumberOfReplicas == 1 {
			want = 1
		}
		if rw := s.readWriteReplicas(v.Name); rw < want {
			out = append(out, fmt.Sprintf("%s (%s, %d replica(s) in mode RW; with %d storage node(s) it needs %d)", v.Name, v.Status.Robustness, rw, s.storageNodes, want))
		}
	}
	sort.Strings(out)
	return out
}

// readWriteReplicas counts the replicas in mode RW of the volume's running engine
// (status.replicaModeMap); 0 when no engine of it runs.
func (s *State) readWriteReplicas(volume string) int {
	rw := 0
	for _, e := range s.engines {
		if e.Spec.VolumeName != volume || e.Status.CurrentState != longhornv1.InstanceStateRunning {
			continue
		}
		n := 0
		for _, mode := range e.Status.ReplicaModeMap {
			if mode == longhornv1.ReplicaModeRW {
				n++
			}
		}
		rw = max(rw, n)
	}
	return rw
}

func replicaHealthy(r *longhornv1.Replica) bool {
	return r.Spec.HealthyAt != "" && r.Spec.FailedAt == ""
}

// describe lists the down set, candidate first, each with why it counts, for messages.
func (d DownSet) describe() string {
	parts := []string{d.Candidate + " (this node)"}
	for _, n := range d.Disrupted {
		parts = append(parts, n+" (down)")
	}
	for _, n := range d.Picked {
		parts = append(parts, n+" (picked this round)")
	}
	return strings.Join(parts, ", ")
}

func (d DownSet) contains(node string) bool {
	return node == d.Candidate || slices.Contains(d.Disrupted, node) || slices.Contains(d.Picked, node)
}

// dataEngineOf is the data engine of a volume's replica: the volume's own when it is
// known, else the replica's; Longhorn leaves it empty on volumes older than v2, which
// are v1.
func (s *State) dataEngineOf(r *longhornv1.Replica) longhornv1.DataEngineType {
	engine := r.Spec.DataEngine
	if v := s.volume(r.Spec.VolumeName); v != nil && v.Spec.DataEngine != "" {
		engine = v.Spec.DataEngine
	}
	if engine == "" {
		return longhornv1.DataEngineTypeV1
	}
	return engine
}

// healthyReplicaNodes maps each volume of a data engine to the sorted nodes of its
// healthy replicas.
func (s *State) healthyReplicaNodes(engine longhornv1.DataEngineType) map[string][]string {
	out := map[string][]string{}
	for i := range s.replicas {
		r := &s.replicas[i]
		if s.dataEngineOf(r) != engine || !replicaHealthy(r) {
			continue
		}
		if !slices.Contains(out[r.Spec.VolumeName], r.Spec.NodeID) {
			out[r.Spec.VolumeName] = append(out[r.Spec.VolumeName], r.Spec.NodeID)
		}
	}
	for _, nodes := range out {
		sort.Strings(nodes)
	}
	return out
}

// LostVolume is a volume that would have no healthy replica outside the nodes down
// together: Nodes are the nodes of its healthy replicas today, all of them down.
type LostVolume struct {
	Name       string
	DataEngine longhornv1.DataEngineType
	Nodes      []string
}

// LostVolumes lists the volumes of a data engine, attached or not, that hold data in a
// healthy replica today and would have none on a node outside down: with all of down's
// nodes down at once, nothing could serve them. A volume with no healthy replica
// anywhere is not listed: taking nodes down costs it nothing (an attached one is
// LonghornVolumesHealthy's business). The preflight (Checks) and the disruption preview
// both judge with it.
func (s *State) LostVolumes(down DownSet, engine longhornv1.DataEngineType) []LostVolume {
	var out []LostVolume
	for vol, nodes := range s.healthyReplicaNodes(engine) {
		if !slices.ContainsFunc(nodes, func(n string) bool { return !down.contains(n) }) {
			out = append(out, LostVolume{Name: vol, DataEngine: engine, Nodes: nodes})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// volumesLeftWithoutReplica is LostVolumes in words, for the preflight's messages.
func (s *State) volumesLeftWithoutReplica(down DownSet, engine longhornv1.DataEngineType) []string {
	var out []string
	for _, v := range s.LostVolumes(down, engine) {
		out = append(out, fmt.Sprintf("%s (healthy replicas on %s)", v.Name, strings.Join(v.Nodes, ", ")))
	}
	return out
}

// v2SingleReplicaOn lists the attached v2 volumes with an engine or replica on node that
// have fewer than two healthy replicas. Longhorn's live data engine upgrade moves a
// volume's engine to a node holding another healthy replica and detaches the replicas
// on the node; its proposal lists a single replica of such a volume as a setup that
// fails to upgrade, wherever that replica is (longhorn/longhorn PR #9807, head 722fe84,
// enhancements/20241114-v2-data-engine-live-upgrade.md, "Test Plan" 2, cases 1 and 2),
// and the design that replaced it fails at once without a replica outside the node
// (shared/facts/longhorn-v2-live-upgrade.md, facts 17 and 19).
func (s *State) v2SingleReplicaOn(node string) []string {
	healthy := s.healthyReplicaNodes(longhornv1.DataEngineTypeV2)
	var out []string
	for _, vol := range s.attachedV2On(node) {
		switch nodes := healthy[vol]; len(nodes) {
		case 0:
			out = append(out, vol+" (no healthy replica)")
		case 1:
			out = append(out, fmt.Sprintf("%s (one healthy replica, on %s)", vol, nodes[0]))
		}
	}
	return out
}

// attachedV2On lists the attached v2 volumes with an engine or a replica on node: their
// I/O stops while the node's v2 data engine restarts, unless it is swapped live.
func (s *State) attachedV2On(node string) []string {
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

// downSet is what a preflight judges storage against: the candidate node together with
// the cluster's nodes that are down or going down and the nodes this round already
// picked, since all of them can be down at the same time.
type DownSet struct {
	Candidate string
	Disrupted []string
	Picked    []string
	// Leaving, when set, says which attached volumes with their engine on the candidate
	// the candidate's own steps free before it goes down (its VMs' evacuation, its
	// drain): those do not hold it at pick time.
	Leaving Leaving
}

// Checks are the Harvester updater's Longhorn preflight checks for the candidate
// node of down. live is what the workload cluster serves and runs of Longhorn's live
// upgrade of v2 instance managers; skipSwap is the HarvesterUpgrader's longhornV2Swap:
// Skip.
func (s *State) Checks(down DownSet, live LiveUpgrade, skipSwap bool) []nodeupdater.CheckResult {
	node := down.Candidate
	results := make([]nodeupdater.CheckResult, 0, 7)
	add := func(name string, problems []string, message func(list string) string) {
		r := nodeupdater.CheckResult{Name: name, Passed: len(problems) == 0}
		if !r.Passed {
			r.Message = message(strings.Join(problems, ", "))
		}
		results = append(results, r)
	}
	add(CheckLonghornVolumesHealthy, s.unhealthyVolumes(), func(list string) string {
		return "Longhorn volumes are not healthy: " + list + "; wait until Longhorn has rebuilt their replicas"
	})
	leftWithout := func(engine string) func(list string) string {
		return func(list string) string {
			return fmt.Sprintf("%s volumes would have no healthy replica outside the nodes down together, %s: %s; wait until those nodes are back, or add a replica on another node first",
				engine, down.describe(), list)
		}
	}
	add(CheckLonghornV1ReplicaElsewhere, s.volumesLeftWithoutReplica(down, longhornv1.DataEngineTypeV1), leftWithout("v1"))
	add(CheckLonghornV2ReplicaElsewhere, s.volumesLeftWithoutReplica(down, longhornv1.DataEngineTypeV2), leftWithout("v2"))

	onNode := s.attachedV2On(node)
	var single, singleReplica, unavailable, running []string
	if len(onNode) > 0 && !skipSwap {
		if len(s.nodes) <= 1 {
			single = onNode
		}
		singleReplica = s.v2SingleReplicaOn(node)
	}
	if !skipSwap && !live.Served {
		unavailable = s.V2EnginesStaying(node, down.Leaving)
	}
	if !skipSwap && live.Served && s.V2Concerned(node) {
		running = live.Running
	}
	add(CheckLonghornV2NotSingleNode, single, func(list string) string {
		return "a live v2 data engine swap needs another Longhorn node, and this cluster has one; attached v2 volumes on it: " + list
	})
	add(CheckLonghornV2NotSingleReplica, singleReplica, func(list string) string {
		return "Longhorn's live v2 data engine upgrade cannot carry a volume with a single replica, and attached v2 volumes on node " + node + " have one: " + list +
			"; give them a second replica (numberOfReplicas 2 or more), detach them, or set longhornV2Swap: Skip on the HarvesterUpgrader to accept interrupting them"
	})
	add(CheckLonghornV2SwapAvailable, unavailable, func(list string) string {
		return "the cluster's Longhorn does not serve the live upgrade of v2 instance managers (instancemanagerupgradecontrols.longhorn.io), so upgrading node " + node +
			" would interrupt the attached v2 volumes whose engine runs on it and that neither its VMs' evacuation nor its drain frees: " + list +
			"; detach them, or set longhornV2Swap: Skip on the HarvesterUpgrader to accept the interruption"
	})
	add(CheckLonghornLiveUpgradeIdle, running, func(list string) string {
		return "Longhorn's live upgrade of v2 instance managers is running (" + strings.Join(running, "; ") + "); node " + node +
			" is not picked until it ends, since it may hold engines moved there or replicas the upgrade counts on"
	})
	return results
}

// BudgetKeptBy says why Longhorn keeps the PodDisruptionBudgets of node's instance
// managers once the node is cordoned, as longhorn-manager v1.10.0 decides it
// (controller/instance_manager_controller.go syncInstanceManagerPDB,
// canDeleteInstanceManagerPDB; shared/facts/longhorn-v2-live-upgrade.md fact 31): a
// volume attached with its engine on the node, or a volume whose every healthy replica
// is on the node. Deleting the instance manager's pod then crashes the engines it runs or
// loses the only good copy of a volume's data. It is empty when neither holds: Longhorn
// lifts the budgets itself shortly (the node-drain-policy setting may keep a stricter
// rule, which it names in its own log).
func (s *State) BudgetKeptBy(node string) []string {
	var out []string
	seen := map[string]bool{}
	for i := range s.engines {
		e := &s.engines[i]
		if e.Spec.NodeID != node || seen[e.Spec.VolumeName] {
			continue
		}
		if v := s.volume(e.Spec.VolumeName); v != nil && v.Status.State == longhornv1.VolumeStateAttached {
			seen[e.Spec.VolumeName] = true
			out = append(out, fmt.Sprintf("volume %s is attached with its engine on node %s", e.Spec.VolumeName, node))
		}
	}
	for _, engine := range []longhornv1.DataEngineType{longhornv1.DataEngineTypeV1, longhornv1.DataEngineTypeV2} {
		for _, v := range s.LostVolumes(DownSet{Candidate: node}, engine) {
			out = append(out, fmt.Sprintf("volume %s has its only healthy replica(s) on node %s", v.Name, node))
		}
	}
	return out
}
