package preflight

import (
	"context"
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-inplace/capi-inplace/workloadcluster/etcdhealth"
)

// recordingView answers with a fixed report and records what it was asked.
type recordingView struct {
	report etcdhealth.Report
	err    error
	asked  [][]string
}

func (v *recordingView) Read(_ context.Context, _ types.NamespacedName, nodes []string) (etcdhealth.Report, error) {
	v.asked = append(v.asked, slices.Clone(nodes))
	return v.report, v.err
}

func TestEtcdHealthy(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	cp := []MachineNode{
		{Machine: machine("cp-2", "n2"), Node: readyNode("n2", true)},
		{Machine: machine("cp-1", "n1"), Node: readyNode("n1", true)},
		{Machine: machine("cp-3", ""), Node: nil},
	}
	for _, tc := range []struct {
		name         string
		view         *recordingView
		controlPlane bool
		want         Result
	}{
		{"a worker passes without reading etcd", &recordingView{err: errors.New("unreachable")}, false, Result{Name: EtcdHealthyName, Passed: true}},
		{"a healthy etcd passes", &recordingView{report: etcdhealth.Report{Source: "members"}}, true, Result{Name: EtcdHealthyName, Passed: true}},
		{"etcd's problems hold the node in its words", &recordingView{report: etcdhealth.Report{Source: "members", Problems: []string{"etcd member n1 raises alarm NOSPACE"}}}, true,
			Result{Name: EtcdHealthyName, Message: "etcd is not healthy according to members: etcd member n1 raises alarm NOSPACE"}},
		{"a view that cannot be read holds the node", &recordingView{report: etcdhealth.Report{Source: "members"}, err: errors.New("no etcd member answered")}, true,
			Result{Name: EtcdHealthyName, Message: "etcd's view could not be read (members): no etcd member answered; the node is held until it can"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &Input{Cluster: cluster, ControlPlane: tc.controlPlane, ControlPlaneMachines: cp}
			check := EtcdHealthy{View: tc.view}
			for _, candidate := range cp[:2] {
				if got := check.Check(context.Background(), in, candidate); got != tc.want {
					t.Fatalf("EtcdHealthy = %+v; want %+v", got, tc.want)
				}
			}
			if !tc.controlPlane {
				if len(tc.view.asked) != 0 {
					t.Fatalf("a worker's preflight read etcd: %v", tc.view.asked)
				}
				return
			}
			if len(tc.view.asked) != 1 {
				t.Fatalf("etcd was read %d times in one round; want once", len(tc.view.asked))
			}
			if want := []string{"n1", "n2"}; !slices.Equal(tc.view.asked[0], want) {
				t.Fatalf("etcd was asked about nodes %v; want %v (the control plane's nodes, sorted)", tc.view.asked[0], want)
			}
		})
	}

	t.Run("no view configured holds a control plane node", func(t *testing.T) {
		got := EtcdHealthy{}.Check(context.Background(), &Input{Cluster: cluster, ControlPlane: true, ControlPlaneMachines: cp}, cp[0])
		if got.Passed {
			t.Fatalf("EtcdHealthy without a view passed")
		}
	})

	t.Run("WithEtcd runs it after ControlPlaneQuorum", func(t *testing.T) {
		var names []string
		for _, c := range WithEtcd(nil, &recordingView{}) {
			names = append(names, c.Name())
		}
		if i, j := slices.Index(names, ControlPlaneQuorumName), slices.Index(names, EtcdHealthyName); i < 0 || j != i+1 {
			t.Fatalf("checks %v: EtcdHealthy should follow ControlPlaneQuorum", names)
		}
	})
}
