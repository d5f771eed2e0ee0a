// Package nodeorder holds the one order in which the machines of a control plane or
// MachineDeployment are upgraded. The UpgradeTask controller picks its machines in this
// order and UpgradePreview shows it; both call Sort, so the preview cannot show an order
// the run would not follow.
package nodeorder

import (
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// LabelWitnessNode marks a Harvester witness node: an etcd member that runs nothing else.
// Harvester upgrades it after the management nodes and before the workers; within a
// control plane the witness goes last.
const LabelWitnessNode = "node-role.harvesterhci.io/witness"

// Candidate is what the order looks at of one machine.
type Candidate struct {
	// Machine is the Machine's name.
	Machine string
	// Node is the name of its Node; empty when it has none.
	Node string
	// Witness is true for a Harvester witness node (IsWitness).
	Witness bool
	// Created is the Machine's creation time; zero when the Machine is gone.
	Created time.Time
}

// IsWitness reports whether node carries Harvester's witness label (any value but "false").
func IsWitness(node *corev1.Node) bool {
	if node == nil {
		return false
	}
	v, ok := node.Labels[LabelWitnessNode]
	return ok && v != "false"
}

// Sort sorts items in the planned order: machines named (by node or machine name) in
// nodeOrder first, in that order; then witness nodes after the others; then, for a
// control plane, the oldest machine first; else by machine name. The sort is stable.
func Sort[T any](items []T, candidate func(T) Candidate, nodeOrder []string, controlPlane bool) {
	sort.SliceStable(items, func(i, j int) bool {
		return less(candidate(items[i]), candidate(items[j]), nodeOrder, controlPlane)
	})
}

func less(a, b Candidate, nodeOrder []string, controlPlane bool) bool {
	if ra, rb := rank(a, nodeOrder), rank(b, nodeOrder); ra != rb {
		return ra < rb
	}
	if a.Witness != b.Witness {
		return b.Witness
	}
	if controlPlane && !a.Created.IsZero() && !b.Created.IsZero() && !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Machine < b.Machine
}

// rank is the candidate's position in nodeOrder, or len(nodeOrder) when it is not named.
func rank(c Candidate, nodeOrder []string) int {
	for i, n := range nodeOrder {
		if n == c.Node || n == c.Machine {
			return i
		}
	}
	return len(nodeOrder)
}

// Reason says in words which rule of Sort places the candidate where it is, for an
// operator reading a preview: "spec.nodeOrder position 2", "witness node last", "oldest
// machine first", "by name".
func Reason(c Candidate, nodeOrder []string, controlPlane bool) string {
	switch r := rank(c, nodeOrder); {
	case r < len(nodeOrder):
		return fmt.Sprintf("spec.nodeOrder position %d", r+1)
	case c.Witness:
		return "witness node last"
	case controlPlane && !c.Created.IsZero():
		return "oldest machine first"
	}
	return "by name"
}
