package harvesteradapter

import (
	"slices"
	"strings"
	"testing"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
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

func TestLonghornChecks(t *testing.T) {
	healthyCluster := &longhornState{
		volumes: []longhornv1.Volume{volume("pvc-v1", longhornv1.DataEngineTypeV1, longhornv1.VolumeRobustnessHealthy)},
		replicas: []longhornv1.Replica{
			replica("pvc-v1", "node-1", longhornv1.DataEngineTypeV1, true),
			replica("pvc-v1", "node-2", longhornv1.DataEngineTypeV1, true),
		},
		nodes: lhNodes("node-1", "node-2", "node-3"),
	}
	v2Cluster := func() *longhornState {
		return &longhornState{
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
		state       *longhornState
		node        string
		swapServed  bool
		skipSwap    bool
		failing     []string // the checks that must fail; the first one's message is checked
		wantMessage string
	}{
		{name: "healthy v1 cluster", state: healthyCluster, node: "node-1"},
		{name: "degraded volume", node: "node-3", failing: []string{CheckLonghornVolumesHealthy}, wantMessage: "pvc-v1 (degraded)",
			state: &longhornState{volumes: []longhornv1.Volume{volume("pvc-v1", longhornv1.DataEngineTypeV1, longhornv1.VolumeRobustnessDegraded)}, nodes: lhNodes("a", "b")}},
		{name: "v2 with a live swap available", state: v2Cluster(), node: "node-1", swapServed: true},
		{name: "v2 without the live swap API holds the node", state: v2Cluster(), node: "node-1", failing: []string{CheckLonghornV2SwapAvailable},
			wantMessage: "would interrupt its attached v2 volumes: pvc-v2; detach them, or set longhornV2Swap: Skip"},
		{name: "v2 without the live swap API, swap skipped", state: v2Cluster(), node: "node-1", skipSwap: true},
		{name: "node without v2 is not held", state: v2Cluster(), node: "node-3"},
		{name: "only healthy v2 replica on the node", node: "node-1", swapServed: true, failing: []string{CheckLonghornV2ReplicaElsewhere},
			wantMessage: "only healthy replica on node node-1: pvc-v2",
			state: func() *longhornState {
				s := v2Cluster()
				s.replicas[1] = replica("pvc-v2", "node-2", longhornv1.DataEngineTypeV2, false)
				return s
			}()},
		{name: "single-node Longhorn with v2", node: "node-1", swapServed: true, failing: []string{CheckLonghornV2NotSingleNode, CheckLonghornV2ReplicaElsewhere},
			wantMessage: "needs another Longhorn node",
			state: func() *longhornState {
				s := v2Cluster()
				s.replicas = s.replicas[:1]
				s.nodes = lhNodes("node-1")
				return s
			}()},
	}
	for _, tt := range tests {
		results := tt.state.longhornChecks(tt.node, tt.swapServed, tt.skipSwap)
		if len(results) != 4 {
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
