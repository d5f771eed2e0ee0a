package nodeorder

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSortAndReason(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cands := []Candidate{
		{Machine: "a", Node: "node-a", Created: t0.Add(2 * time.Second)},
		{Machine: "b", Node: "node-b", Created: t0},
		{Machine: "c", Node: "node-c", Created: t0.Add(time.Second), Witness: true},
		{Machine: "d", Node: "node-d", Created: t0.Add(3 * time.Second)},
	}
	for name, tc := range map[string]struct {
		nodeOrder    []string
		controlPlane bool
		want         []string
		reasons      []string
	}{
		"control plane: oldest first, witness last": {nil, true, []string{"b", "a", "d", "c"},
			[]string{"oldest machine first", "oldest machine first", "oldest machine first", "witness node last"}},
		"workers: by name, witness last": {nil, false, []string{"a", "b", "d", "c"},
			[]string{"by name", "by name", "by name", "witness node last"}},
		"nodeOrder first, by node or machine name": {[]string{"node-d", "c"}, true, []string{"d", "c", "b", "a"},
			[]string{"spec.nodeOrder position 1", "spec.nodeOrder position 2", "oldest machine first", "oldest machine first"}},
	} {
		t.Run(name, func(t *testing.T) {
			got := slices.Clone(cands)
			Sort(got, func(c Candidate) Candidate { return c }, tc.nodeOrder, tc.controlPlane)
			var names, reasons []string
			for _, c := range got {
				names = append(names, c.Machine)
				reasons = append(reasons, Reason(c, tc.nodeOrder, tc.controlPlane))
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("order %v, want %v", names, tc.want)
			}
			if !slices.Equal(reasons, tc.reasons) {
				t.Errorf("reasons %q, want %q", reasons, tc.reasons)
			}
		})
	}
}

func TestIsWitness(t *testing.T) {
	node := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
	}
	for _, tc := range []struct {
		node *corev1.Node
		want bool
	}{
		{nil, false},
		{node(nil), false},
		{node(map[string]string{LabelWitnessNode: "true"}), true},
		{node(map[string]string{LabelWitnessNode: ""}), true},
		{node(map[string]string{LabelWitnessNode: "false"}), false},
	} {
		if got := IsWitness(tc.node); got != tc.want {
			t.Errorf("IsWitness(%v) = %v, want %v", tc.node, got, tc.want)
		}
	}
}
