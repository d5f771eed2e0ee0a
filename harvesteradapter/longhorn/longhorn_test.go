package longhorn

import (
	"maps"
	"slices"
	"strings"
	"testing"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

func volume(name string, engine longhornv1.DataEngineType, robustness longhornv1.VolumeRobustness) longhornv1.Volume {
	v := longhornv1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}}
	v.Spec.DataEngine = engine
	v.Status.State = longhornv1.VolumeStateAttached
	v.Status.Robustness = robustness
	return v
}

func replica(volume, node string, engine longhornv1.DataEngineType, healthy bool) longhornv1.Replica {
	r := longhornv1.Replica{ObjectMeta: metav1.ObjectMeta{Name: volume + "-r-" + node}}
	r.Spec.VolumeName, r.Spec.NodeID, r.Spec.DataEngine = volume, node, engine
	if healthy {
		r.Spec.HealthyAt = "2026-11-01T10:00:00Z"
	} else {
		r.Spec.FailedAt = "2026-11-01T11:00:00Z"
	}
	return r
}

func lhNodes(names ...string) []longhornv1.Node {
	var out []longhornv1.Node
	for _, n := range names {
		out = append(out, longhornv1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	return out
}

func resultOf(results []nodeupdater.CheckResult, name string) nodeupdater.CheckResult {
	for _, r := range results {
		if r.Name == name {
			return r
		}
	}
	return nodeupdater.CheckResult{Name: "missing " + name}
}

var (
	liveServed  = LiveUpgrade{Served: true}
	liveRunning = LiveUpgrade{Served: true, Running: []string{"InstanceManagerUpgrade upgrade-node-2-20261101100000 on node node-2 is relocating-engines"}}
)

func TestLonghornChecks(t *testing.T) {
	healthyCluster := &State{
		volumes: []longhornv1.Volume{volume("pvc-v1", longhornv1.DataEngineTypeV1, longhornv1.VolumeRobustnessHealthy)},
		replicas: []longhornv1.Replica{
			replica("pvc-v1", "node-1", longhornv1.DataEngineTypeV1, true),
			replica("pvc-v1", "node-2", longhornv1.DataEngineTypeV1, true),
		},
		nodes: lhNodes("node-1", "node-2", "node-3"),
	}
	v2Cluster := func() *State {
		return &State{
			volumes: []longhornv1.Volume{volume("pvc-v2", longhornv1.DataEngineTypeV2, longhornv1.VolumeRobustnessHealthy)},
			replicas: []longhornv1.Replica{
				replica("pvc-v2", "node-1", longhornv1.DataEngineTypeV2, true),
				replica("pvc-v2", "node-2", longhornv1.DataEngineTypeV2, true),
			},
			engines: []longhornv1.Engine{func() longhornv1.Engine {
				e := longhornv1.Engine{ObjectMeta: metav1.ObjectMeta{Name: "pvc-v2-e"}}
				e.Spec.VolumeName, e.Spec.NodeID, e.Spec.DataEngine = "pvc-v2", "node-1", longhornv1.DataEngineTypeV2
				return e
			}()},
			nodes: lhNodes("node-1", "node-2", "node-3"),
		}
	}

	tests := []struct {
		name        string
		state       *State
		node        string
		live        LiveUpgrade
		skipSwap    bool
		failing     []string // the checks that must fail; the first one's message is checked
		wantMessage string
	}{
		{name: "healthy v1 cluster", state: healthyCluster, node: "node-1"},
		{name: "degraded volume", node: "node-3", failing: []string{CheckLonghornVolumesHealthy}, wantMessage: "pvc-v1 (degraded)",
			state: &State{volumes: []longhornv1.Volume{volume("pvc-v1", longhornv1.DataEngineTypeV1, longhornv1.VolumeRobustnessDegraded)}, nodes: lhNodes("a", "b")}},
		{name: "v2 with a live swap available", state: v2Cluster(), node: "node-1", live: liveServed},
		{name: "v2 without the live swap API holds the node", state: v2Cluster(), node: "node-1", failing: []string{CheckLonghornV2SwapAvailable},
			wantMessage: "would interrupt the attached v2 volumes whose engine runs on it and that neither its VMs' evacuation nor its drain frees: pvc-v2; detach them, or set longhornV2Swap: Skip"},
		{name: "v2 without the live swap API, swap skipped", state: v2Cluster(), node: "node-1", skipSwap: true},
		{name: "without the live swap API a v2 replica alone does not hold the node", state: v2Cluster(), node: "node-2"},
		{name: "without the live swap API an engine that moved away does not hold the node", node: "node-1",
			state: func() *State { s := v2Cluster(); s.engines[0].Spec.NodeID = "node-2"; return s }()},
		{name: "without the live swap API a stopped engine does not hold the node", node: "node-1",
			state: func() *State {
				s := v2Cluster()
				s.engines[0].Status.CurrentState = longhornv1.InstanceStateStopped
				return s
			}()},
		{name: "node without v2 is not held", state: v2Cluster(), node: "node-3"},
		{name: "a running live upgrade holds every node while a v2 volume is attached", state: v2Cluster(), node: "node-3", live: liveRunning,
			failing: []string{CheckLonghornLiveUpgradeIdle}, wantMessage: "InstanceManagerUpgrade upgrade-node-2-20261101100000 on node node-2 is relocating-engines); node node-3 is not picked"},
		{name: "a running live upgrade does not hold a node when no v2 volume is attached or on it", state: healthyCluster, node: "node-1", live: liveRunning},
		{name: "a running live upgrade does not hold a node with longhornV2Swap: Skip", state: v2Cluster(), node: "node-1", live: liveRunning, skipSwap: true},
		{name: "only healthy v2 replica on the node", node: "node-1", live: liveServed, failing: []string{CheckLonghornV2ReplicaElsewhere, CheckLonghornV2NotSingleReplica},
			wantMessage: "v2 volumes would have no healthy replica outside the nodes down together, node-1 (this node): pvc-v2 (healthy replicas on node-1)",
			state: func() *State {
				s := v2Cluster()
				s.replicas[1] = replica("pvc-v2", "node-2", longhornv1.DataEngineTypeV2, false)
				return s
			}()},
		{name: "single-node Longhorn with v2", node: "node-1", live: liveServed, failing: []string{CheckLonghornV2NotSingleNode, CheckLonghornV2ReplicaElsewhere, CheckLonghornV2NotSingleReplica},
			wantMessage: "needs another Longhorn node",
			state: func() *State {
				s := v2Cluster()
				s.replicas = s.replicas[:1]
				s.nodes = lhNodes("node-1")
				return s
			}()},
	}
	for _, tt := range tests {
		results := tt.state.Checks(DownSet{Candidate: tt.node}, tt.live, tt.skipSwap)
		if len(results) != 7 {
			t.Errorf("%s: %d results, want one per check", tt.name, len(results))
		}
		for _, r := range results {
			shouldFail := slices.Contains(tt.failing, r.Name)
			if r.Passed == shouldFail {
				t.Errorf("%s: check %s passed=%v (%s)", tt.name, r.Name, r.Passed, r.Message)
			}
		}
		if len(tt.failing) > 0 {
			if msg := resultOf(results, tt.failing[0]).Message; !strings.Contains(msg, tt.wantMessage) {
				t.Errorf("%s: message %q, want it to contain %q", tt.name, msg, tt.wantMessage)
			}
		}
	}
}

// lhLayout is a Longhorn layout as the live-upgrade proposal's test plan draws it: where
// each attached volume's engine runs and where its healthy replicas are.
type lhLayout struct {
	engines  map[string]string   // volume -> node of its engine
	replicas map[string][]string // volume -> nodes of its healthy replicas
}

func (l lhLayout) state(engine longhornv1.DataEngineType, nodes ...string) *State {
	s := &State{nodes: lhNodes(nodes...)}
	for _, vol := range slices.Sorted(maps.Keys(l.replicas)) {
		v := volume(vol, engine, longhornv1.VolumeRobustnessHealthy)
		v.Spec.NumberOfReplicas = len(l.replicas[vol])
		s.volumes = append(s.volumes, v)
		for _, n := range l.replicas[vol] {
			s.replicas = append(s.replicas, replica(vol, n, engine, true))
		}
		if n, ok := l.engines[vol]; ok {
			e := longhornv1.Engine{ObjectMeta: metav1.ObjectMeta{Name: vol + "-e"}}
			e.Spec.VolumeName, e.Spec.NodeID, e.Spec.DataEngine = vol, n, engine
			s.engines = append(s.engines, e)
		}
	}
	return s
}

// TestLonghornLiveUpgradeLayouts runs the five layouts of the test plan of Longhorn's v2
// data engine live upgrade proposal (longhorn/longhorn PR #9807, head 722fe84,
// enhancements/20241114-v2-data-engine-live-upgrade.md, "Test Plan" 2 and 3): the two
// "setups that fail to upgrade" must hold node 1, the three "setups that succeed" must
// let it go. Node 1 is the node upgraded; the cluster serves the live upgrade API, so
// only the layout can hold the node.
func TestLonghornLiveUpgradeLayouts(t *testing.T) {
	all := []string{"node-1", "node-2", "node-3"}
	tests := []struct {
		name   string
		layout lhLayout
		held   []string // checks that must hold node 1; every other check must pass
	}{
		{
			name: "fail 1: engine and single replica on the node",
			layout: lhLayout{
				engines:  map[string]string{"vol-1": "node-1", "vol-2": "node-1", "vol-3": "node-1"},
				replicas: map[string][]string{"vol-1": {"node-1"}, "vol-2": all, "vol-3": all},
			},
			held: []string{CheckLonghornV2ReplicaElsewhere, CheckLonghornV2NotSingleReplica},
		},
		{
			name: "fail 2: engine on the node, single replica elsewhere",
			layout: lhLayout{
				engines:  map[string]string{"vol-1": "node-1", "vol-2": "node-1", "vol-3": "node-1"},
				replicas: map[string][]string{"vol-1": {"node-2"}, "vol-2": all, "vol-3": all},
			},
			held: []string{CheckLonghornV2NotSingleReplica},
		},
		{
			name: "pass 1: engines on the node, a replica on every node",
			layout: lhLayout{
				engines:  map[string]string{"vol-1": "node-1", "vol-2": "node-1", "vol-3": "node-1"},
				replicas: map[string][]string{"vol-1": all, "vol-2": all, "vol-3": all},
			},
		},
		{
			name: "pass 2: engines on the node, replicas on the two other nodes",
			layout: lhLayout{
				engines:  map[string]string{"vol-1": "node-1", "vol-2": "node-1", "vol-3": "node-1"},
				replicas: map[string][]string{"vol-1": {"node-2", "node-3"}, "vol-2": {"node-2", "node-3"}, "vol-3": {"node-2", "node-3"}},
			},
		},
		{
			name: "pass 3: one engine on each node, a replica on every node",
			layout: lhLayout{
				engines:  map[string]string{"vol-1": "node-1", "vol-2": "node-2", "vol-3": "node-3"},
				replicas: map[string][]string{"vol-1": all, "vol-2": all, "vol-3": all},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			results := tt.layout.state(longhornv1.DataEngineTypeV2, all...).Checks(DownSet{Candidate: "node-1"}, liveServed, false)
			for _, name := range tt.held {
				if r := resultOf(results, name); r.Passed || !strings.Contains(r.Message, "vol-1") {
					t.Errorf("check %s: passed=%v message %q; want it to hold node-1 for vol-1", name, r.Passed, r.Message)
				}
			}
			for _, r := range results {
				if !r.Passed && !slices.Contains(tt.held, r.Name) {
					t.Errorf("check %s holds node-1: %s", r.Name, r.Message)
				}
			}
		})
	}
}

// TestLonghornChecksAcrossDownNodes judges every volume against the candidate, the
// nodes already down and this round's other picks at once.
func TestLonghornChecksAcrossDownNodes(t *testing.T) {
	withReplicas := func(engine longhornv1.DataEngineType, nodes ...string) *State {
		return lhLayout{replicas: map[string][]string{"pvc-a": nodes}}.state(engine, "node-1", "node-2", "node-3")
	}
	detached := func(s *State) *State {
		s.volumes[0].Status.State = longhornv1.VolumeStateDetached
		s.volumes[0].Status.Robustness = longhornv1.VolumeRobustnessUnknown
		return s
	}
	tests := []struct {
		name        string
		state       *State
		down        DownSet
		held        string // the check that must hold the node, or "" when none may
		wantMessage []string
	}{
		{name: "v1: the other replica's node is down", state: withReplicas(longhornv1.DataEngineTypeV1, "node-1", "node-2"),
			down: DownSet{Candidate: "node-1", Disrupted: []string{"node-2"}}, held: CheckLonghornV1ReplicaElsewhere,
			wantMessage: []string{"pvc-a (healthy replicas on node-1, node-2)", "node-1 (this node)", "node-2 (down)"}},
		{name: "v1: the other replica's node is picked this round", state: withReplicas(longhornv1.DataEngineTypeV1, "node-1", "node-2"),
			down: DownSet{Candidate: "node-1", Picked: []string{"node-2"}}, held: CheckLonghornV1ReplicaElsewhere,
			wantMessage: []string{"pvc-a", "node-2 (picked this round)"}},
		{name: "v1: an unrelated node is down", state: withReplicas(longhornv1.DataEngineTypeV1, "node-1", "node-2"),
			down: DownSet{Candidate: "node-1", Disrupted: []string{"node-3"}}},
		{name: "v1: single replica on the candidate", state: withReplicas(longhornv1.DataEngineTypeV1, "node-1"),
			down: DownSet{Candidate: "node-1"}, held: CheckLonghornV1ReplicaElsewhere, wantMessage: []string{"pvc-a (healthy replicas on node-1)"}},
		{name: "v1: single replica on another node", state: withReplicas(longhornv1.DataEngineTypeV1, "node-2"),
			down: DownSet{Candidate: "node-1"}},
		{name: "v1: detached volume loses its replicas too", state: detached(withReplicas(longhornv1.DataEngineTypeV1, "node-1", "node-2")),
			down: DownSet{Candidate: "node-1", Disrupted: []string{"node-2"}}, held: CheckLonghornV1ReplicaElsewhere, wantMessage: []string{"pvc-a"}},
		{name: "v1: a failed replica elsewhere does not count", down: DownSet{Candidate: "node-1"}, held: CheckLonghornV1ReplicaElsewhere, wantMessage: []string{"pvc-a"},
			state: func() *State {
				s := withReplicas(longhornv1.DataEngineTypeV1, "node-1")
				s.replicas = append(s.replicas, replica("pvc-a", "node-3", longhornv1.DataEngineTypeV1, false))
				return s
			}()},
		{name: "v1: a volume never written has nothing to lose", down: DownSet{Candidate: "node-1"},
			state: func() *State {
				s := detached(withReplicas(longhornv1.DataEngineTypeV1, "node-1"))
				s.replicas[0].Spec.HealthyAt = ""
				return s
			}()},
		{name: "v2: the other replica's node is down", state: detached(withReplicas(longhornv1.DataEngineTypeV2, "node-1", "node-2")),
			down: DownSet{Candidate: "node-1", Disrupted: []string{"node-2"}}, held: CheckLonghornV2ReplicaElsewhere,
			wantMessage: []string{"pvc-a (healthy replicas on node-1, node-2)", "node-2 (down)"}},
		{name: "v2: a replica stays on a node that is up", state: detached(withReplicas(longhornv1.DataEngineTypeV2, "node-1", "node-2", "node-3")),
			down: DownSet{Candidate: "node-1", Disrupted: []string{"node-2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			results := tt.state.Checks(tt.down, liveServed, false)
			for _, r := range results {
				if !r.Passed && r.Name != tt.held {
					t.Errorf("check %s holds the node: %s", r.Name, r.Message)
				}
			}
			if tt.held == "" {
				return
			}
			r := resultOf(results, tt.held)
			if r.Passed {
				t.Fatalf("check %s passed; want it to hold %s", tt.held, tt.down.Candidate)
			}
			for _, want := range tt.wantMessage {
				if !strings.Contains(r.Message, want) {
					t.Errorf("check %s message %q, want it to contain %q", tt.held, r.Message, want)
				}
			}
		})
	}
}

// Harvester's volume check on a cluster of two storage nodes (two management nodes and a
// witness, or two nodes): a 3-replica volume stays degraded there for good, and passes
// with two replicas RW in its running engine (harvester-node-upgrade.md fact 36).
func TestLonghornVolumesHealthyOnTwoStorageNodes(t *testing.T) {
	engine := func(volume string, running bool, modes ...longhornv1.ReplicaMode) longhornv1.Engine {
		e := longhornv1.Engine{ObjectMeta: metav1.ObjectMeta{Name: volume + "-e-0"}}
		e.Spec.VolumeName = volume
		if running {
			e.Status.CurrentState = longhornv1.InstanceStateRunning
		} else {
			e.Status.CurrentState = longhornv1.InstanceStateStopped
		}
		e.Status.ReplicaModeMap = map[string]longhornv1.ReplicaMode{}
		for i, m := range modes {
			e.Status.ReplicaModeMap[volume+"-r-"+string(rune('a'+i))] = m
		}
		return e
	}
	withReplicas := func(v longhornv1.Volume, n int) longhornv1.Volume {
		v.Spec.NumberOfReplicas = n
		return v
	}
	degraded := longhornv1.VolumeRobustnessDegraded
	for name, tc := range map[string]struct {
		storageNodes int
		volume       longhornv1.Volume
		engine       longhornv1.Engine
		pass         bool
		message      string
	}{
		"two storage nodes, three replicas wanted, two RW": {2, withReplicas(volume("pvc", longhornv1.DataEngineTypeV1, degraded), 3), engine("pvc", true, "RW", "RW"), true, ""},
		"two storage nodes, one RW and one rebuilding":     {2, withReplicas(volume("pvc", longhornv1.DataEngineTypeV1, degraded), 3), engine("pvc", true, "RW", "WO"), false, "pvc (degraded, 1 replica(s) in mode RW; with 2 storage node(s) it needs 2)"},
		"two storage nodes, a one-replica volume":          {2, withReplicas(volume("pvc", longhornv1.DataEngineTypeV1, degraded), 1), engine("pvc", true, "RW"), true, ""},
		"two storage nodes, no engine running":             {2, withReplicas(volume("pvc", longhornv1.DataEngineTypeV1, degraded), 3), engine("pvc", false, "RW", "RW"), false, "pvc (degraded, 0 replica(s) in mode RW; with 2 storage node(s) it needs 2)"},
		"three storage nodes: degraded holds":              {3, withReplicas(volume("pvc", longhornv1.DataEngineTypeV1, degraded), 3), engine("pvc", true, "RW", "RW"), false, "pvc (degraded)"},
		"storage nodes not known: degraded holds":          {0, withReplicas(volume("pvc", longhornv1.DataEngineTypeV1, degraded), 3), engine("pvc", true, "RW", "RW"), false, "pvc (degraded)"},
	} {
		t.Run(name, func(t *testing.T) {
			s := &State{volumes: []longhornv1.Volume{tc.volume}, engines: []longhornv1.Engine{tc.engine}, nodes: lhNodes("node-1", "node-2"), storageNodes: tc.storageNodes}
			r := resultOf(s.Checks(DownSet{Candidate: "node-1"}, LiveUpgrade{}, false), CheckLonghornVolumesHealthy)
			if r.Passed != tc.pass {
				t.Fatalf("passed %v, want %v (%s)", r.Passed, tc.pass, r.Message)
			}
			if !tc.pass && !strings.Contains(r.Message, tc.message) {
				t.Errorf("message %q does not name %q", r.Message, tc.message)
			}
		})
	}
}

func TestCountStorageNodes(t *testing.T) {
	node := func(name string, labels map[string]string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	managed := map[string]string{labelManagedNode: "true"}
	witness := map[string]string{labelManagedNode: "true", labelWitnessNode: "true"}
	for name, tc := range map[string]struct {
		nodes []corev1.Node
		want  int
	}{
		"two management nodes and a witness":       {[]corev1.Node{node("a", managed), node("b", managed), node("w", witness)}, 2},
		"three management nodes":                   {[]corev1.Node{node("a", managed), node("b", managed), node("c", managed)}, 3},
		"a node Harvester does not manage is left": {[]corev1.Node{node("a", managed), node("b", managed), node("x", nil)}, 2},
		"not Harvester: every node but a witness":  {[]corev1.Node{node("a", nil), node("b", nil), node("c", nil), node("w", map[string]string{labelWitnessNode: "true"})}, 3},
	} {
		if got := countStorageNodes(tc.nodes); got != tc.want {
			t.Errorf("%s: %d storage nodes, want %d", name, got, tc.want)
		}
	}
}

// TestBudgetKeptBy: Longhorn keeps a cordoned node's instance-manager budgets while a
// volume is attached with its engine there or has its only healthy replicas there
// (fact 31), and lets them go otherwise.
func TestBudgetKeptBy(t *testing.T) {
	s := lhLayout{
		engines:  map[string]string{"pvc-attached": "node-1", "pvc-elsewhere": "node-2"},
		replicas: map[string][]string{"pvc-attached": {"node-2", "node-3"}, "pvc-elsewhere": {"node-1", "node-2"}, "pvc-last": {"node-1"}},
	}.state(longhornv1.DataEngineTypeV1, "node-1", "node-2", "node-3")
	got := s.BudgetKeptBy("node-1")
	want := []string{
		"volume pvc-attached is attached with its engine on node node-1",
		"volume pvc-last has its only healthy replica(s) on node node-1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("node-1: got %q, want %q", got, want)
	}
	if got := s.BudgetKeptBy("node-3"); len(got) != 0 {
		t.Errorf("node-3 holds no engine and no last replica: got %q", got)
	}
	for i := range s.volumes {
		s.volumes[i].Status.State = longhornv1.VolumeStateDetached
	}
	if got := s.BudgetKeptBy("node-1"); !slices.Equal(got, want[1:]) {
		t.Errorf("node-1 with every volume detached: got %q, want the last replica only", got)
	}
}
