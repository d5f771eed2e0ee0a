package preflight

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Check names, as they appear in conditions, events and messages.
const (
	NodeReadyName           = "NodeReady"
	NotDeletingName         = "NotDeleting"
	AvailabilityName        = "Availability"
	ControlPlaneHealthyName = "ControlPlaneHealthy"
	UpdaterChecksName       = "UpdaterChecks"
	NodeSchedulableName     = "NodeSchedulable"
	ControlPlaneQuorumName  = "ControlPlaneQuorum"
	EtcdHealthyName         = "EtcdHealthy"
)

// NodeReady holds a node that does not exist or is not Ready: upgrading a node that is
// already unhealthy hides the cause and can take the last replica of something with it.
type NodeReady struct{}

// Name implements Check.
func (NodeReady) Name() string { return NodeReadyName }

// Check implements Check.
func (NodeReady) Check(_ context.Context, _ *Input, c MachineNode) Result {
	switch {
	case c.Machine != nil && !c.Machine.Status.NodeRef.IsDefined():
		return failed(NodeReadyName, "machine %s has no node yet", c.Machine.Name)
	case c.Node == nil:
		return failed(NodeReadyName, "node %s of machine %s not found in the workload cluster", c.NodeName(), c.Machine.Name)
	case !NodeIsReady(c.Node):
		return failed(NodeReadyName, "node %s is not Ready", c.Node.Name)
	}
	return passed(NodeReadyName)
}

// NotDeleting holds a machine or node that is being deleted: CAPI is replacing it anyway.
type NotDeleting struct{}

// Name implements Check.
func (NotDeleting) Name() string { return NotDeletingName }

// Check implements Check.
func (NotDeleting) Check(_ context.Context, _ *Input, c MachineNode) Result {
	if c.Machine != nil && !c.Machine.DeletionTimestamp.IsZero() {
		return failed(NotDeletingName, "machine %s is being deleted", c.Machine.Name)
	}
	if c.Node != nil && !c.Node.DeletionTimestamp.IsZero() {
		return failed(NotDeletingName, "node %s is being deleted", c.Node.Name)
	}
	return passed(NotDeletingName)
}

// NodeSchedulable holds a node that someone else cordoned or put in Harvester maintenance
// mode: the operator is doing something with it, and capi-inplace does not take it over
// (nor undo the cordon when it ends).
type NodeSchedulable struct{}

// Name implements Check.
func (NodeSchedulable) Name() string { return NodeSchedulableName }

// Check implements Check.
func (NodeSchedulable) Check(_ context.Context, _ *Input, c MachineNode) Result {
	switch {
	case c.Node == nil:
		return passed(NodeSchedulableName)
	case c.Node.Annotations[disruption.HarvesterMaintainStatusAnnotation] != "":
		return failed(NodeSchedulableName, "node %s is in Harvester maintenance mode (%s=%s); take it out of maintenance mode to let it be upgraded",
			c.Node.Name, disruption.HarvesterMaintainStatusAnnotation, c.Node.Annotations[disruption.HarvesterMaintainStatusAnnotation])
	case c.Node.Spec.Unschedulable && c.Node.Annotations[inplacev1.UpgradeTurnAnnotation] != "":
		// Cordoned by the owner of its Kubernetes for its upgrade's turn (Rancher, before
		// asking its pre-drain hook): the node is waiting for exactly this.
		return passed(NodeSchedulableName)
	case c.Node.Spec.Unschedulable:
		return failed(NodeSchedulableName, "node %s is cordoned by someone else; uncordon it to let it be upgraded, or list it in spec.pauseNodes", c.Node.Name)
	}
	return passed(NodeSchedulableName)
}

// ControlPlaneQuorum holds a control plane node while any other control plane node of
// the Cluster is disrupted (upgraded by any task or path, NotReady, cordoned, in
// maintenance mode, being deleted) or picked this round: one control plane node at a
// time keeps etcd and the API server's quorum, whatever maxUnavailable or pacing says.
type ControlPlaneQuorum struct{}

// Name implements Check.
func (ControlPlaneQuorum) Name() string { return ControlPlaneQuorumName }

// Check implements Check.
func (ControlPlaneQuorum) Check(_ context.Context, in *Input, c MachineNode) Result {
	if !in.ControlPlane {
		return passed(ControlPlaneQuorumName)
	}
	var down []string
	if in.Budget != nil {
		down = in.Budget.DisruptedControlPlane(c.Machine.Name)
	}
	for _, p := range in.Picked {
		down = append(down, p.NodeName()+" (starts in this round)")
	}
	if len(down) > 0 {
		return failed(ControlPlaneQuorumName, "control plane node(s) already disrupted: %s; one control plane node at a time keeps etcd and API server quorum",
			joinLimited(down, 5))
	}
	return passed(ControlPlaneQuorumName)
}

// Availability holds a node when starting it would make more nodes of the target
// unavailable than maxUnavailable allows, counting nodes already NotReady. The node
// itself, when it is unavailable already (cordoned for its turn by the owner of its
// Kubernetes, UpgradeTurnAnnotation), is not counted twice: starting it takes nothing
// more down. NodeReady and NodeSchedulable hold a node that is down for another reason.
type Availability struct{}

// Name implements Check.
func (Availability) Name() string { return AvailabilityName }

// Check implements Check.
func (Availability) Check(_ context.Context, in *Input, c MachineNode) Result {
	others := make([]string, 0, len(in.Unavailable))
	for _, n := range in.Unavailable {
		if name := c.NodeName(); name == "" || n != name {
			others = append(others, n)
		}
	}
	if len(others)+1 > in.MaxUnavailable {
		return failed(AvailabilityName, "%d node(s) of the target already unavailable (%s); maxUnavailable is %d",
			len(others), joinLimited(others, 5), in.MaxUnavailable)
	}
	return passed(AvailabilityName)
}

// ControlPlaneHealthy holds a control plane node unless every control plane machine is
// healthy and none is being deleted or remediated, so that quorum is never put at risk.
// It passes for MachineDeployments.
type ControlPlaneHealthy struct{}

// Name implements Check.
func (ControlPlaneHealthy) Name() string { return ControlPlaneHealthyName }

// Check implements Check.
func (ControlPlaneHealthy) Check(_ context.Context, in *Input, _ MachineNode) Result {
	if !in.ControlPlane {
		return passed(ControlPlaneHealthyName)
	}
	if len(in.ControlPlaneMachines) == 0 {
		return failed(ControlPlaneHealthyName, "no control plane machine found")
	}
	for _, m := range in.ControlPlaneMachines {
		if reason := controlPlaneMachineProblem(m); reason != "" {
			return failed(ControlPlaneHealthyName, "%s", reason)
		}
	}
	return passed(ControlPlaneHealthyName)
}

func controlPlaneMachineProblem(m MachineNode) string {
	machine := m.Machine
	switch {
	case !machine.DeletionTimestamp.IsZero():
		return fmt.Sprintf("control plane machine %s is being deleted", machine.Name)
	case hasAnnotation(machine, clusterv1.RemediateMachineAnnotation):
		return fmt.Sprintf("control plane machine %s is marked for remediation", machine.Name)
	case meta.IsStatusConditionFalse(machine.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition):
		return fmt.Sprintf("control plane machine %s failed its health check", machine.Name)
	case meta.FindStatusCondition(machine.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition) != nil:
		return fmt.Sprintf("control plane machine %s is being remediated", machine.Name)
	case m.Node == nil:
		return fmt.Sprintf("control plane machine %s has no node in the workload cluster", machine.Name)
	case !m.Node.DeletionTimestamp.IsZero():
		return fmt.Sprintf("control plane node %s is being deleted", m.Node.Name)
	case !NodeIsReady(m.Node):
		return fmt.Sprintf("control plane node %s is not Ready", m.Node.Name)
	}
	return ""
}

// UpdaterChecks runs the updater's own checks (for Harvester: Longhorn volumes healthy,
// no v2 volume whose only healthy replica is on this node, ...). An updater run outside
// the manager has no checks here.
type UpdaterChecks struct {
	// Registry finds the Updater for the task's updaterRef.
	Registry *nodeupdater.Registry
}

// Name implements Check.
func (UpdaterChecks) Name() string { return UpdaterChecksName }

// Check implements Check. A failing updater check is reported under its own name,
// prefixed with UpdaterChecks/, so that the operator sees which one.
func (u UpdaterChecks) Check(ctx context.Context, in *Input, c MachineNode) Result {
	if u.Registry == nil {
		return passed(UpdaterChecksName)
	}
	reg, found, err := u.Registry.Lookup(in.UpdaterRef)
	if err != nil {
		return failed(UpdaterChecksName, "%v", err)
	}
	if !found {
		return passed(UpdaterChecksName)
	}
	target := nodeupdater.PreflightTarget{
		Namespace:    in.Cluster.Namespace,
		ClusterName:  in.Cluster.Name,
		MachineName:  c.Machine.Name,
		NodeName:     c.NodeName(),
		Version:      in.Version,
		UpdaterRef:   in.UpdaterRef,
		ControlPlane: in.ControlPlane,
		Disrupted:    in.disruptedExcept(c),
		Picked:       in.pickedNodes(),
	}
	for _, r := range reg.Updater.Preflight(ctx, target) {
		if !r.Passed {
			return failed(UpdaterChecksName+"/"+r.Name, "%s", r.Message)
		}
	}
	return passed(UpdaterChecksName)
}

// hasAnnotation reports whether an annotation is present; CAPI's remediate-machine
// annotation is usually set with an empty value.
func hasAnnotation(m *clusterv1.Machine, key string) bool {
	_, ok := m.Annotations[key]
	return ok
}
