package upgradetask

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/controllers/nodeorder"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// member is one machine of a task, with what was read about it and the state derived
// from its NodeUpdate: the NodeUpdate is the truth of a machine's progress.
type member struct {
	name     string
	machine  *clusterv1.Machine // nil when the machine is gone but its NodeUpdate remains
	node     *corev1.Node
	nodeName string
	nu       *inplacev1.NodeUpdate
	// claimedBy names another live task that holds the machine; the task does not touch it.
	claimedBy string
	// busyWith names the NodeUpdate of another task (or a hand-made one) that has not
	// ended on the machine: the machine is not started before it ends.
	busyWith string
	// atTarget is true when the task holds the machine, no NodeUpdate of the task touched
	// it, and its node already runs the target: it is done without one.
	atTarget bool
	// upgradedBy names the NodeUpdate of another task that upgraded the machine to the
	// target, when that is why it is atTarget.
	upgradedBy string
	// removed is true when the machine is being deleted or is gone: its NodeUpdate is
	// aborted, and its end is not a failure of the task.
	removed   bool
	state     inplacev1.MachineState
	message   string
	preflight []preflight.Result
	// picked is true when this round starts the machine.
	picked bool
	// retry is true when the machine was skipped (drainPolicy Skip) and is tried once
	// more now: its NodeUpdate is the retry's (RetryNodeUpdateName).
	retry bool
	// skippedFirst is the machine's first NodeUpdate, skipped, once it is tried again.
	skippedFirst *inplacev1.NodeUpdate
}

func (m *member) machineNode() preflight.MachineNode {
	return preflight.MachineNode{Machine: m.machine, Node: m.node}
}

// collectMembers derives the task's machines: every machine of the target that requires
// the upgrade (restricted to spec.machines when set), that the task claims, or that has a
// NodeUpdate of the task. For an externally paced task only the machines Cluster API
// handed over (spec.machines) are members; the others are counted as pending handover.
func collectMembers(s *taskScope) ([]*member, int) {
	task := s.task
	claimValue := upgraderequest.LabelValue(task.Name)
	listed := map[string]bool{}
	for _, name := range task.Spec.Machines {
		listed[name] = true
	}
	external := task.Spec.Pacing == inplacev1.PacingExternal

	var members []*member
	pending := 0
	seen := map[string]bool{}
	for i := range s.targetMachines {
		m := &s.targetMachines[i]
		nu := s.nodeUpdates[m.Name]
		claimedByUs := m.Labels[inplacev1.UpgradeTaskLabel] == claimValue
		requires := upgraderequest.RequiresUpgrade(m, s.version)
		inScope := len(listed) == 0 || listed[m.Name]
		if external {
			inScope = listed[m.Name]
			// Cluster API marks a machine it is about to hand over and writes the target
			// into its spec.version first: that machine is still to come.
			_, handingOver := m.Annotations[clusterv1.UpdateInProgressAnnotation]
			if !inScope && (requires || handingOver) && nu == nil {
				pending++
			}
			if inScope {
				// Cluster API sets spec.version to the target before it hands a machine
				// over, so only the node's own version says whether it is done.
				requires = !upgraderequest.ReachedInPlace(m, s.version)
			}
		}
		j, judged := s.atTarget[m.Name]
		judgedBehind := judged && !j.at
		if judgedBehind {
			// Its kubelet runs the target, its updater says the rest does not (an OS
			// step that failed after the kubelet was upgraded): upgrade it again.
			requires = true
		}
		if live, known := liveOrder(s, m); requires && nu == nil && known && (live > 0 || (live == 0 && !judgedBehind)) {
			// The live Node runs the target while the Machine does not show it yet, and
			// its updater, asked now, does not say it is behind (judgeAtTarget): an
			// earlier NodeUpdate got it there, and starting it again would take a node
			// down for nothing. Or the live Node runs a newer version than the target:
			// a NodeUpdate would be a downgrade, which the hooks refuse from the Machine
			// and which a Machine that lags the Node must not let through (the soak's
			// seed 20056).
			requires = false
		}
		upgradedBy := ""
		if by := s.upgradedBy[m.Name]; by != "" && nu == nil && requires && !judgedBehind {
			// Another task's NodeUpdate (or a hand-made one) upgraded it to the target
			// or newer, and Succeeded: the node is there even while the cached Machine
			// does not show it yet (its nodeInfo is Cluster API's copy of the Node and
			// lags; the release annotation is written behind). Upgrading it again would
			// take a node down for nothing (issue #34, the soak's seed 9238). The
			// updater's judge, when it says the node is not there, still wins.
			requires, upgradedBy = false, by
		}
		// A machine that only another task's NodeUpdate showed at the target is still a
		// member, shown Upgraded with that NodeUpdate named.
		if nu == nil && !claimedByUs && (!inScope || (!requires && upgradedBy == "")) {
			continue
		}
		mem := &member{name: m.Name, machine: m, nu: nu, nodeName: m.Status.NodeRef.Name, removed: !m.DeletionTimestamp.IsZero(),
			// A machine the task holds whose node already runs the target (its kubelet,
			// and its updater when it judges) and that no NodeUpdate of the task has
			// touched is done: a task never starts a NodeUpdate on a node at the target.
			// (The soak's seed 264: a NodeUpdate whose node had reached the target was
			// marked Aborted when its task's abort and a manager restart overtook the
			// success; Cluster API then handed the machine to a new task, which upgraded
			// it a second time.)
			atTarget: nu == nil && !requires, upgradedBy: upgradedBy}
		if mem.nodeName != "" {
			mem.node = s.nodes[mem.nodeName]
		}
		if claim := m.Labels[inplacev1.UpgradeTaskLabel]; claim != "" && claim != claimValue {
			mem.claimedBy = s.liveClaims[claim]
		}
		if live := s.budget.LiveNodeUpdate(m.Name); live != nil && !metav1IsControlledBy(live, task) {
			mem.busyWith = live.Name
		}
		members = append(members, mem)
		seen[m.Name] = true
	}
	for name, nu := range s.nodeUpdates {
		if !seen[name] {
			members = append(members, &member{name: name, nu: nu, nodeName: nu.Spec.NodeName, node: s.nodes[nu.Spec.NodeName], removed: true})
		}
	}
	for _, mem := range members {
		mem.state, mem.message = stateFromNodeUpdate(mem.nu)
		mem.skippedFirst = s.skippedFirst[mem.name]
		judgeSkipped(s.task, mem)
		if mem.atTarget && !mem.removed {
			mem.state, mem.message = inplacev1.MachineStateUpgraded, "needs no NodeUpdate: its node already runs "+s.task.Spec.Version+" (or newer)"
			if mem.upgradedBy != "" {
				mem.message = "needs no NodeUpdate: NodeUpdate " + mem.upgradedBy + " of another task upgraded its node to " + s.task.Spec.Version + " (or newer)"
			}
		}
		if mem.removed && mem.nu != nil && mem.state != inplacev1.MachineStateUpgraded {
			mem.message = "the machine is being deleted or is gone; its NodeUpdate is aborted at a safe point (" + inplacev1.MachineDeletedReason + ")"
		}
	}
	return members, pending
}

// failedForTask reports whether a member's end stops the task: its node failed or was
// aborted outside the task. A machine deleted in the middle (scale down, remediation) is
// Cluster API's decision, not a failure of the upgrade.
func (m *member) failedForTask() bool {
	return !m.removed && (m.state == inplacev1.MachineStateFailed || m.state == inplacev1.MachineStateAborted)
}

// stateFromNodeUpdate is a machine's state as its NodeUpdate tells it.
func stateFromNodeUpdate(nu *inplacev1.NodeUpdate) (inplacev1.MachineState, string) {
	if nu == nil {
		return inplacev1.MachineStateWaiting, ""
	}
	switch nu.Status.Phase {
	case inplacev1.NodeUpdatePhaseSucceeded:
		return inplacev1.MachineStateUpgraded, ""
	case inplacev1.NodeUpdatePhaseFailed:
		msg := nu.Status.FailureMessage
		if msg == "" {
			msg = nu.Status.FailureReason
		}
		if msg == "" {
			msg = "the NodeUpdate failed without a message"
		}
		return inplacev1.MachineStateFailed, msg
	case inplacev1.NodeUpdatePhaseAborted:
		return inplacev1.MachineStateAborted, "the NodeUpdate was aborted"
	case inplacev1.NodeUpdatePhaseSkipped:
		return inplacev1.MachineStateSkipped, "skipped and put back: " + nu.Status.FailureMessage
	}
	if c := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition); c != nil && c.Status == metav1.ConditionTrue {
		// The node's drain policy at work: which pods block it and what happens next.
		return inplacev1.MachineStateInProgress, truncate("step "+nu.Status.CurrentStep+": "+c.Message, 10240)
	}
	if nu.Status.CurrentStep != "" {
		return inplacev1.MachineStateInProgress, "step " + nu.Status.CurrentStep
	}
	return inplacev1.MachineStateInProgress, ""
}

// orderMembers sorts the members in the planned order (nodeorder.Sort: nodeOrder first,
// witness last, a control plane oldest first, else by name), the order UpgradePreview shows.
func orderMembers(members []*member, nodeOrder []string, controlPlane bool) {
	nodeorder.Sort(members, (*member).orderCandidate, nodeOrder, controlPlane)
}

// orderCandidate is what the order looks at of the member.
func (m *member) orderCandidate() nodeorder.Candidate {
	c := nodeorder.Candidate{Machine: m.name, Node: m.nodeName, Witness: nodeorder.IsWitness(m.node)}
	if m.machine != nil {
		c.Created = m.machine.CreationTimestamp.Time
	}
	return c
}

// Round is what the preflight checks of one round of a target are computed from.
// UpgradePreview fills it from what it read, so that its checks see what the task's see.
type Round struct {
	// Cluster is the CAPI Cluster.
	Cluster *clusterv1.Cluster
	// Version is the target version.
	Version string
	// UpdaterRef names the updater configuration.
	UpdaterRef inplacev1.UpdaterReference
	// ControlPlane is true when the target is a control plane.
	ControlPlane bool
	// MaxUnavailable is maxUnavailable resolved against the target's size.
	MaxUnavailable int
	// TargetMachines are every machine of the target.
	TargetMachines []clusterv1.Machine
	// Nodes are the workload cluster's Nodes by name.
	Nodes map[string]*corev1.Node
	// Budget is what is disrupted in the whole Cluster now.
	Budget *disruption.Budget
}

// PreflightInput is the preflight.Input of a round: the target's nodes that are
// disrupted now (disruption.Budget: upgraded by any task, NotReady, missing, cordoned, in
// maintenance mode or being deleted) count as unavailable.
func PreflightInput(r Round) *preflight.Input {
	in := &preflight.Input{
		Cluster:        r.Cluster,
		Version:        r.Version,
		UpdaterRef:     r.UpdaterRef,
		ControlPlane:   r.ControlPlane,
		MaxUnavailable: r.MaxUnavailable,
		Budget:         r.Budget,
	}
	for i := range r.TargetMachines {
		m := &r.TargetMachines[i]
		if _, down := r.Budget.Disrupted(m.Name); down {
			in.Unavailable = append(in.Unavailable, displayMachine(m.Name, m.Status.NodeRef.Name))
		}
		if r.ControlPlane {
			in.ControlPlaneMachines = append(in.ControlPlaneMachines, preflight.MachineNode{Machine: m, Node: r.Nodes[m.Status.NodeRef.Name]})
		}
	}
	slices.Sort(in.Unavailable)
	return in
}

func displayMachine(machine, node string) string {
	if node != "" {
		return node
	}
	return "machine " + machine
}

func displayName(m *member) string { return displayMachine(m.name, m.nodeName) }

func (r *Reconciler) preflightInput(s *taskScope) *preflight.Input {
	in := PreflightInput(Round{
		Cluster: s.cluster, Version: s.task.Spec.Version, UpdaterRef: s.task.Spec.UpdaterRef,
		ControlPlane: s.task.Spec.ControlPlaneRef != nil, MaxUnavailable: s.maxUnavailable,
		TargetMachines: s.targetMachines, Nodes: s.nodes, Budget: s.budget,
	})
	// A machine of this task that is gone still holds its node until its NodeUpdate ends.
	seen := map[string]bool{}
	for i := range s.targetMachines {
		seen[s.targetMachines[i].Name] = true
	}
	for _, mem := range s.members {
		if !seen[mem.name] && mem.state == inplacev1.MachineStateInProgress {
			in.Unavailable = append(in.Unavailable, displayName(mem))
		}
	}
	slices.Sort(in.Unavailable)
	return in
}

// selectNextMachines walks the waiting members in the planned order and picks those that
// may start now: not claimed by another task, not paused, and passing every preflight
// check, with each pick counted as unavailable for the checks of the next. In a dry run
// it records every check's result for every waiting member and picks nothing. It
// records on each member why it waits.
func (r *Reconciler) selectNextMachines(ctx context.Context, s *taskScope, gate preflight.GateResult, stoppedBy *member) {
	in := r.preflightInput(s)
	dryRun := s.task.Spec.DryRun
	position := 0
	for _, mem := range s.members {
		if mem.state != inplacev1.MachineStateWaiting {
			continue
		}
		position++
		switch {
		case mem.claimedBy != "":
			mem.message = fmt.Sprintf("claimed by UpgradeTask %s, which has not ended; waits for it", mem.claimedBy)
			continue
		case mem.busyWith != "":
			mem.message = fmt.Sprintf("NodeUpdate %s of another task is upgrading node %s; waits until it ends", mem.busyWith, displayName(mem))
			continue
		case mem.removed:
			mem.message = "the machine is being deleted"
			continue
		case mem.machine == nil:
			mem.message = "the machine no longer exists"
			continue
		case isPausedNode(s.task, mem):
			mem.message = "listed in spec.pauseNodes"
			continue
		}
		if dryRun {
			mem.preflight = preflight.Run(ctx, r.Checks, in, mem.machineNode())
			if f := preflight.FirstFailure(mem.preflight); f != nil {
				mem.message = "dry run: would be held by " + preflight.Describe(*f)
			} else {
				mem.message = fmt.Sprintf("dry run: would start at position %d; every preflight check passes now", position)
			}
			continue
		}
		if stoppedBy != nil {
			mem.message = fmt.Sprintf("not started: the task stopped after machine %s failed", stoppedBy.name)
			continue
		}
		if !gate.Open {
			mem.message = gate.Message
			continue
		}
		if f := runUntilFailure(ctx, r.Checks, in, mem.machineNode()); f != nil {
			mem.message = heldPrefix + preflight.Describe(*f)
			mem.preflight = []preflight.Result{*f}
			continue
		}
		mem.picked = true
		mem.message = ""
		in.Unavailable = append(in.Unavailable, displayName(mem))
		in.Picked = append(in.Picked, preflight.MachineNode{Machine: mem.machine, Node: mem.node})
	}
}

// runUntilFailure runs the checks in order and stops at the first that fails, so that the
// updater's checks, the most expensive, run only for a node that could start.
func runUntilFailure(ctx context.Context, checks []preflight.Check, in *preflight.Input, c preflight.MachineNode) *preflight.Result {
	for _, check := range checks {
		if res := check.Check(ctx, in, c); !res.Passed {
			return &res
		}
	}
	return nil
}

func isPausedNode(task *inplacev1.UpgradeTask, m *member) bool {
	return slices.Contains(task.Spec.PauseNodes, m.nodeName) || slices.Contains(task.Spec.PauseNodes, m.name)
}
