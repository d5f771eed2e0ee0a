// Package disruption is the one disruption budget of a Cluster: which of its nodes are
// down, or going down, now. Every path that starts a node (the UpgradeTask controller for
// extension-paced and externally paced tasks alike) and every updater's preflight judge
// from it, so that no task, path or failure can take down more than is safe.
package disruption

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// HarvesterMaintainStatusAnnotation is the annotation Harvester sets on a Node while it
// is in maintenance mode or entering it (values "running", "completed"): Harvester's
// maintain-node controller, pkg/controller/master/node/maintain_controller.go
// (MaintainStatusAnnotationKey). Such a node is the operator's, not ours to take down.
const HarvesterMaintainStatusAnnotation = "harvesterhci.io/maintain-status"

// Budget is what is disrupted in one Cluster now, read once per reconcile.
type Budget struct {
	// byMachine says, for each disrupted machine, why.
	byMachine map[string]string
	// nodeOf maps a machine to its node name.
	nodeOf map[string]string
	// live maps a machine to the NodeUpdate that has not ended on it, of any task.
	live map[string]*inplacev1.NodeUpdate
	// controlPlane are the control plane machines of the Cluster.
	controlPlane map[string]bool
}

// Compute derives the budget of a Cluster from all its Machines, its workload Nodes by
// name and all its NodeUpdates. A machine is disrupted when a NodeUpdate of any task has
// not ended on it (running or aborting), when it or its node is being deleted, when it has
// no node or its node is not Ready, or when its node is cordoned or in Harvester
// maintenance mode without a NodeUpdate of ours explaining it (someone else took it).
func Compute(machines []clusterv1.Machine, nodes map[string]*corev1.Node, nodeUpdates []inplacev1.NodeUpdate) *Budget {
	b := &Budget{byMachine: map[string]string{}, nodeOf: map[string]string{}, live: map[string]*inplacev1.NodeUpdate{}, controlPlane: map[string]bool{}}
	for i := range nodeUpdates {
		nu := &nodeUpdates[i]
		if !nu.Status.Phase.IsFinal() {
			b.live[nu.Spec.MachineName] = nu
		}
	}
	for i := range machines {
		m := &machines[i]
		if IsControlPlane(m) {
			b.controlPlane[m.Name] = true
		}
		nodeName := m.Status.NodeRef.Name
		b.nodeOf[m.Name] = nodeName
		if why := machineDisruption(m, nodes[nodeName], b.live[m.Name]); why != "" {
			b.byMachine[m.Name] = why
		}
	}
	// A NodeUpdate whose machine is gone still holds its node until it ends.
	for name, nu := range b.live {
		if _, known := b.nodeOf[name]; !known {
			b.nodeOf[name] = nu.Spec.NodeName
			b.byMachine[name] = fmt.Sprintf("being upgraded by NodeUpdate %s", nu.Name)
		}
	}
	return b
}

func machineDisruption(m *clusterv1.Machine, node *corev1.Node, live *inplacev1.NodeUpdate) string {
	switch {
	case live != nil:
		return fmt.Sprintf("being upgraded by NodeUpdate %s", live.Name)
	case !m.DeletionTimestamp.IsZero():
		return "machine being deleted"
	case !m.Status.NodeRef.IsDefined():
		return "machine has no node"
	case node == nil:
		return "node not found"
	case !node.DeletionTimestamp.IsZero():
		return "node being deleted"
	case !nodeReady(node):
		return "node not Ready"
	case node.Annotations[HarvesterMaintainStatusAnnotation] != "":
		return fmt.Sprintf("node in Harvester maintenance mode (%s)", node.Annotations[HarvesterMaintainStatusAnnotation])
	case node.Spec.Unschedulable:
		return "node cordoned"
	}
	return ""
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// IsControlPlane reports whether a machine is a control plane machine (Cluster API's
// cluster.x-k8s.io/control-plane label, set by every control plane provider).
func IsControlPlane(m *clusterv1.Machine) bool {
	_, ok := m.Labels[clusterv1.MachineControlPlaneLabel]
	return ok
}

// Disrupted says whether a machine is disrupted now, and why.
func (b *Budget) Disrupted(machine string) (string, bool) {
	why, ok := b.byMachine[machine]
	return why, ok
}

// LiveNodeUpdate is the NodeUpdate of any task that has not ended on a machine, or nil.
func (b *Budget) LiveNodeUpdate(machine string) *inplacev1.NodeUpdate {
	return b.live[machine]
}

// DisruptedNodes names the disrupted nodes of the Cluster (machines without a node by
// "machine <name>"), except those of the machines in except; sorted.
func (b *Budget) DisruptedNodes(except ...string) []string {
	var out []string
	for m := range b.byMachine {
		if !slices.Contains(except, m) {
			out = append(out, b.displayName(m))
		}
	}
	slices.Sort(out)
	return out
}

// DisruptedControlPlane describes the disrupted control plane machines other than the
// machines in except, as "node (why)"; sorted.
func (b *Budget) DisruptedControlPlane(except ...string) []string {
	var out []string
	for m, why := range b.byMachine {
		if b.controlPlane[m] && !slices.Contains(except, m) {
			out = append(out, fmt.Sprintf("%s (%s)", b.displayName(m), why))
		}
	}
	slices.Sort(out)
	return out
}

// NodeName is the node of a machine the budget knows, else "".
func (b *Budget) NodeName(machine string) string { return b.nodeOf[machine] }

func (b *Budget) displayName(machine string) string {
	if n := b.nodeOf[machine]; n != "" {
		return n
	}
	return "machine " + machine
}

// Describe renders disrupted items for a message, at most limit of them.
func Describe(items []string, limit int) string {
	if len(items) <= limit {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:limit], ", "), len(items)-limit)
}
