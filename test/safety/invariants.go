package safety

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/version"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// Invariant numbers, as the issue lists them.
const (
	InvControlPlaneOne   = 1  // never more than one control plane node disrupted by upgrades
	InvMaxUnavailable    = 2  // never more than the task's maxUnavailable of its target down
	InvOneNodeUpdate     = 3  // never two live NodeUpdates for one node
	InvUpgradedOnce      = 4  // no node upgraded twice to the same version
	InvVolumeReplica     = 5  // no volume left without a replica off the disrupted nodes
	InvNothingAfterEnd   = 6  // nothing of a failed, aborted or skipped node still running
	InvNoNewerThanPlanes = 7  // no worker kubelet newer than the control plane
	InvNoRebootAfterEnd  = 8  // no host reboots for a NodeUpdate once it ended
	InvGateRed           = 9  // no NodeUpdate of a task starts while one of its gates is red
	InvSkipRetry         = 10 // a skipped machine is tried once more at most, and a task that skipped it twice never completes
)

var invariantNames = map[int]string{
	InvControlPlaneOne:   "never more than one control plane node disrupted by upgrades",
	InvMaxUnavailable:    "never more than the task's maxUnavailable nodes of its target taken down",
	InvOneNodeUpdate:     "never two live NodeUpdates for one node",
	InvUpgradedOnce:      "no node upgraded twice to the same version",
	InvVolumeReplica:     "every volume keeps a replica on a node that is up and not upgraded",
	InvNothingAfterEnd:   "nothing of a failed, aborted or skipped node still running",
	InvNoNewerThanPlanes: "no worker kubelet newer than the lowest control plane kubelet",
	InvNoRebootAfterEnd:  "no host reboots for a NodeUpdate once the updater ended it or the API shows it final",
	InvGateRed:           "no NodeUpdate is created while a health gate of its task is red",
	InvSkipRetry:         "a skipped machine is tried once more at most, by its task's <task>-<machine>-retry NodeUpdate after its first was Skipped, never for Cluster API's tasks, and a task whose retry was skipped again does not complete",
}

// Violation is one broken invariant, at the event that broke it.
type Violation struct {
	Invariant int
	// Seq is the position in the history of the event that broke it.
	Seq     int
	Message string
}

func (v Violation) String() string {
	return fmt.Sprintf("invariant %d (%s) broken at event #%d: %s", v.Invariant, invariantNames[v.Invariant], v.Seq, v.Message)
}

// Topology is what the Checker knows of the cluster before anything happens.
type Topology struct {
	// TargetOf maps each node to its control plane or MachineDeployment.
	TargetOf map[string]string
	// ControlPlane is the control plane's target name.
	ControlPlane string
	// Kubelet is each node's kubelet version at the start.
	Kubelet map[string]string
	// Slack is how long a disruption the updater did not cause (a flap, a deleting
	// machine) must have been visible before the controller created a NodeUpdate for it
	// to count against that NodeUpdate: the controller decides from what it read, and
	// cannot account for a node that went NotReady a moment before it created the
	// NodeUpdate.
	Slack time.Duration
	// GateSlack is how long a health gate must have been red (and named by the Cluster)
	// before a NodeUpdate was created for that NodeUpdate to break invariant 9: the
	// controller evaluates gates every gate interval, and decides from what it read, so
	// Slack plus the gate interval.
	GateSlack time.Duration
}

// Checker judges events against the invariants as they are recorded. It is not safe for
// concurrent use: History serializes it.
type Checker struct {
	topo Topology

	exists map[string]bool
	// live: NodeUpdates in the updater's hands (from its first call until it ended them),
	// by NodeUpdate, with their node.
	live map[string]liveUpdate
	// down: nodes the updater holds NotReady, with the NodeUpdate.
	down map[string]string
	// worldDownSince: nodes disrupted by something else, since when.
	worldDownSince map[string]time.Time
	// created: when the watch first saw each NodeUpdate.
	created map[string]time.Time
	// watched: NodeUpdates the watch shows not final, with their node; ended: those it
	// showed final or deleted.
	watched map[string]string
	ended   map[string]bool
	// successes counts, per node and version, the NodeUpdates the updater reported done.
	successes map[string]map[string]int
	kubelet   map[string]string
	replicas  map[string]map[string]bool
	// finished: NodeUpdates the updater ended (done, failed, aborted, put back after a
	// skip), until the updater starts one of the same name again.
	finished map[string]bool
	// gateOnSince: since when the Cluster names the health gate (zero: it does not);
	// gateRedSince: since when the gate is red (zero: green).
	gateOnSince, gateRedSince time.Time
	// phase: the last phase the watch showed of each NodeUpdate.
	phase map[string]string
	// retries counts, per task and machine, the retry NodeUpdates created; skippedTwice
	// lists, per task, the machines whose retry was skipped again; external: the tasks
	// Cluster API paces.
	retries      map[string]int
	skippedTwice map[string]map[string]string
	external     map[string]bool
	// deleting: nodes whose machine is being deleted.
	deleting map[string]bool

	violations []Violation
}

type liveUpdate struct {
	node, target, task string
	maxUnavailable     int
}

// NewChecker returns a Checker for a cluster laid out as topo.
func NewChecker(topo Topology) *Checker {
	c := &Checker{
		topo: topo, exists: map[string]bool{}, live: map[string]liveUpdate{}, down: map[string]string{},
		worldDownSince: map[string]time.Time{}, created: map[string]time.Time{}, watched: map[string]string{}, ended: map[string]bool{},
		successes: map[string]map[string]int{}, kubelet: map[string]string{}, replicas: map[string]map[string]bool{},
		finished: map[string]bool{}, phase: map[string]string{}, retries: map[string]int{}, skippedTwice: map[string]map[string]string{}, external: map[string]bool{},
		deleting: map[string]bool{},
	}
	for n := range topo.TargetOf {
		c.exists[n] = true
	}
	for n, v := range topo.Kubelet {
		c.kubelet[n] = v
	}
	return c
}

// Violations returns the violations found so far.
func (c *Checker) Violations() []Violation { return slices.Clone(c.violations) }

func (c *Checker) violate(inv int, e Event, format string, args ...any) {
	c.violations = append(c.violations, Violation{Invariant: inv, Seq: e.Seq, Message: fmt.Sprintf(format, args...)})
}

// Observe updates the Checker's view with e and judges it.
func (c *Checker) Observe(e Event) {
	switch e.Kind {
	case EventNodeDown, EventKubelet, EventNodeUpdateDone:
		if c.finished[e.NodeUpdate] {
			c.violate(InvNothingAfterEnd, e, "the updater acted on node %s for NodeUpdate %s after it had ended it (%s)", e.Node, e.NodeUpdate, e.Kind)
		}
	}
	switch e.Kind {
	case EventNodeUpdateStart:
		delete(c.finished, e.NodeUpdate)
		for nu, l := range c.live {
			if l.node == e.Node {
				c.violate(InvOneNodeUpdate, e, "the updater started NodeUpdate %s on node %s while it still runs NodeUpdate %s there", e.NodeUpdate, e.Node, nu)
			}
		}
		c.live[e.NodeUpdate] = liveUpdate{node: e.Node, target: e.Target, task: e.Task, maxUnavailable: e.MaxUnavailable}
		c.checkControlPlane(e)
	case EventNodeDown:
		c.down[e.Node] = e.NodeUpdate
		c.checkControlPlane(e)
		c.checkBudget(e)
		c.checkVolumes(e)
	case EventNodeUp:
		delete(c.down, e.Node)
	case EventHostReboot:
		c.checkReboot(e)
	case EventKubelet:
		c.kubelet[e.Node] = e.Version
	case EventNodeUpdateDone:
		c.end(e)
		if c.successes[e.Node] == nil {
			c.successes[e.Node] = map[string]int{}
		}
		c.successes[e.Node][e.Version]++
		if n := c.successes[e.Node][e.Version]; n > 1 {
			c.violate(InvUpgradedOnce, e, "node %s upgraded to %s for the %d. time (NodeUpdate %s)", e.Node, e.Version, n, e.NodeUpdate)
		}
		c.checkSkew(e)
	case EventNodeUpdateFailed, EventNodeUpdateAborted:
		c.end(e)
	case EventNodeUpdateSkipped:
		if c.down[e.Node] == e.NodeUpdate && c.exists[e.Node] {
			c.violate(InvNothingAfterEnd, e, "the updater put node %s back after skipping NodeUpdate %s, but it still holds it down", e.Node, e.NodeUpdate)
		}
		c.end(e)
	case EventAskedAfterSkip:
		if c.ended[e.NodeUpdate] {
			c.violate(InvNothingAfterEnd, e, "the updater was asked to go on with NodeUpdate %s on node %s after the API showed it %s", e.NodeUpdate, e.Node, c.phaseOrDeleted(e.NodeUpdate))
		}
	case EventGate:
		switch e.Phase {
		case "set":
			if c.gateOnSince.IsZero() {
				c.gateOnSince = e.At
			}
		case "removed":
			c.gateOnSince = time.Time{}
		case "red":
			if c.gateRedSince.IsZero() {
				c.gateRedSince = e.At
			}
		case "green":
			c.gateRedSince = time.Time{}
		}
	case EventResumedAfterEnd:
		c.violate(InvNothingAfterEnd, e, "the updater was asked to go on with NodeUpdate %s on node %s after it had %s it", e.NodeUpdate, e.Node, e.Why)
	case EventWatchNodeUpdate:
		c.observeNodeUpdate(e)
	case EventWatchTask:
		if strings.HasPrefix(e.Why, "External ") {
			c.external[e.Task] = true
		}
		if e.Phase == "Completed" {
			// A machine deleted after its retry was skipped leaves no node behind: it no
			// longer counts in its task.
			var left []string
			for machine, node := range c.skippedTwice[e.Task] {
				if c.exists[node] && !c.deleting[node] {
					left = append(left, machine)
				}
			}
			if len(left) > 0 {
				sort.Strings(left)
				c.violate(InvSkipRetry, e, "task %s completed though machine(s) %s were skipped again when tried once more", e.Task, strings.Join(left, ", "))
			}
		}
	case EventWorldDown:
		if strings.HasPrefix(e.Why, "machine ") {
			c.deleting[e.Node] = true
		}
		if _, ok := c.worldDownSince[e.Node]; !ok {
			c.worldDownSince[e.Node] = e.At
		}
	case EventWorldUp:
		delete(c.worldDownSince, e.Node)
	case EventNodeGone:
		delete(c.exists, e.Node)
		delete(c.worldDownSince, e.Node)
		delete(c.kubelet, e.Node)
	case EventReplica:
		if c.replicas[e.Volume] == nil {
			c.replicas[e.Volume] = map[string]bool{}
		}
		c.replicas[e.Volume][e.Node] = true
	case EventReplicaLost:
		delete(c.replicas[e.Volume], e.Node)
	}
}

func (c *Checker) end(e Event) {
	c.finished[e.NodeUpdate] = true
	delete(c.live, e.NodeUpdate)
	if c.down[e.Node] == e.NodeUpdate {
		delete(c.down, e.Node)
	}
}

func (c *Checker) observeNodeUpdate(e Event) {
	_, seen := c.created[e.NodeUpdate]
	if !seen {
		c.created[e.NodeUpdate] = e.At
	}
	final := inplacev1.NodeUpdatePhase(e.Phase).IsFinal()
	if (!seen || c.ended[e.NodeUpdate]) && !e.Deleted && !final {
		// A NodeUpdate created now (or made again under the same name).
		c.checkGate(e)
		c.checkRetry(e)
	}
	if e.Deleted {
		c.phase[e.NodeUpdate] = ""
	} else {
		c.phase[e.NodeUpdate] = e.Phase
	}
	if final && e.Phase == "Skipped" && e.Task != "" && e.NodeUpdate == upgraderequest.RetryNodeUpdateName(e.Task, e.Machine) {
		if c.skippedTwice[e.Task] == nil {
			c.skippedTwice[e.Task] = map[string]string{}
		}
		c.skippedTwice[e.Task][e.Machine] = e.Node
	}
	if e.Deleted || final {
		delete(c.watched, e.NodeUpdate)
		c.ended[e.NodeUpdate] = true
		return
	}
	c.watched[e.NodeUpdate] = e.Node
	delete(c.ended, e.NodeUpdate) // a NodeUpdate of the same name, made again
	var others []string
	for nu, node := range c.watched {
		if node == e.Node && nu != e.NodeUpdate {
			others = append(others, nu)
		}
	}
	if len(others) > 0 {
		sort.Strings(others)
		c.violate(InvOneNodeUpdate, e, "NodeUpdate %s (%s) of node %s is live while NodeUpdate(s) %s of the same node are not final", e.NodeUpdate, e.Phase, e.Node, strings.Join(others, ", "))
	}
	if c.topo.TargetOf[e.Node] == c.topo.ControlPlane {
		nodes := map[string]bool{}
		for _, node := range c.watched {
			if c.topo.TargetOf[node] == c.topo.ControlPlane && c.exists[node] {
				nodes[node] = true
			}
		}
		if len(nodes) > 1 {
			c.violate(InvControlPlaneOne, e, "the watch shows live NodeUpdates on %d control plane nodes at once: %s", len(nodes), strings.Join(sortedKeys(nodes), ", "))
		}
	}
}

// phaseOrDeleted says how the watch last showed a NodeUpdate: its phase, or deleted.
func (c *Checker) phaseOrDeleted(nu string) string {
	if p := c.phase[nu]; p != "" {
		return p
	}
	return "deleted"
}

// checkGate judges a NodeUpdate created now: the Cluster's health gate, which every task
// of the Cluster carries, must not have been named and red since GateSlack before.
func (c *Checker) checkGate(e Event) {
	if c.gateOnSince.IsZero() || c.gateRedSince.IsZero() {
		return
	}
	from := e.At.Add(-c.topo.GateSlack)
	if c.gateOnSince.After(from) || c.gateRedSince.After(from) {
		return
	}
	c.violate(InvGateRed, e, "NodeUpdate %s of task %s on node %s created while the health gate %s has been red since %s and named by the Cluster since %s (slack %s)",
		e.NodeUpdate, e.Task, e.Node, gateName, c.gateRedSince.Format("15:04:05.000"), c.gateOnSince.Format("15:04:05.000"), c.topo.GateSlack)
}

// checkRetry judges a NodeUpdate created now that is a task's retry of a skipped machine:
// only after the machine's first NodeUpdate of the task ended Skipped, once per task and
// machine, and never for a task Cluster API paces (there a skip is the machine's failure).
func (c *Checker) checkRetry(e Event) {
	if e.Task == "" || e.NodeUpdate != upgraderequest.RetryNodeUpdateName(e.Task, e.Machine) {
		return
	}
	key := e.Task + "/" + e.Machine
	c.retries[key]++
	first := upgraderequest.NodeUpdateName(e.Task, e.Machine)
	switch {
	case c.retries[key] > 1:
		c.violate(InvSkipRetry, e, "task %s tries machine %s again for the %d. time (NodeUpdate %s)", e.Task, e.Machine, c.retries[key], e.NodeUpdate)
	case c.external[e.Task]:
		c.violate(InvSkipRetry, e, "task %s, which Cluster API paces, tries machine %s again (NodeUpdate %s)", e.Task, e.Machine, e.NodeUpdate)
	case c.phase[first] != "Skipped":
		c.violate(InvSkipRetry, e, "task %s tries machine %s again (NodeUpdate %s) while its first NodeUpdate %s is %s, not Skipped", e.Task, e.Machine, e.NodeUpdate, first, c.phaseOrDeleted(first))
	}
}

// upgrading is the set of nodes disrupted by upgrades: in the updater's hands (a
// NodeUpdate started and not ended) or held down by it. A node that is gone (its machine
// deleted) disrupts nothing any more, even while its NodeUpdate is being aborted.
func (c *Checker) upgrading() map[string]bool {
	out := map[string]bool{}
	for _, l := range c.live {
		if c.exists[l.node] {
			out[l.node] = true
		}
	}
	for n := range c.down {
		if c.exists[n] {
			out[n] = true
		}
	}
	return out
}

// worldDownBefore is the set of nodes disrupted by something else than the updater
// since at least Slack before the NodeUpdate nu was created, and still now.
func (c *Checker) worldDownBefore(nu string) map[string]bool {
	out := map[string]bool{}
	created, ok := c.created[nu]
	if !ok {
		return out
	}
	for n, since := range c.worldDownSince {
		if !since.After(created.Add(-c.topo.Slack)) {
			out[n] = true
		}
	}
	return out
}

// checkReboot judges a host's reboot: the NodeUpdate that armed it must still be in the
// updater's hands (its Abort waits for an armed reboot) and not final in the API (the
// controller ends a NodeUpdate only once its updater said it was done). A node that is
// gone disrupts nothing.
func (c *Checker) checkReboot(e Event) {
	if !c.exists[e.Node] {
		return
	}
	if _, live := c.live[e.NodeUpdate]; !live {
		c.violate(InvNoRebootAfterEnd, e, "the host of node %s rebooted for NodeUpdate %s after the updater had ended it", e.Node, e.NodeUpdate)
		return
	}
	if c.ended[e.NodeUpdate] {
		c.violate(InvNoRebootAfterEnd, e, "the host of node %s rebooted for NodeUpdate %s after the API showed it final or deleted", e.Node, e.NodeUpdate)
	}
}

func (c *Checker) checkControlPlane(e Event) {
	var cp []string
	for n := range c.upgrading() {
		if c.topo.TargetOf[n] == c.topo.ControlPlane {
			cp = append(cp, n)
		}
	}
	if len(cp) > 1 {
		sort.Strings(cp)
		c.violate(InvControlPlaneOne, e, "%d control plane nodes are being upgraded at once: %s", len(cp), strings.Join(cp, ", "))
	}
}

func (c *Checker) checkBudget(e Event) {
	l, ok := c.live[e.NodeUpdate]
	if !ok {
		return
	}
	target := c.topo.TargetOf[e.Node]
	down := map[string]bool{}
	for n := range c.upgrading() {
		if c.topo.TargetOf[n] == target {
			down[n] = true
		}
	}
	for n := range c.worldDownBefore(e.NodeUpdate) {
		if c.topo.TargetOf[n] == target && c.exists[n] {
			down[n] = true
		}
	}
	if len(down) > l.maxUnavailable {
		c.violate(InvMaxUnavailable, e, "node %s of %s taken down by NodeUpdate %s of task %s (maxUnavailable %d) while %d nodes of %s are disrupted: %s",
			e.Node, target, e.NodeUpdate, l.task, l.maxUnavailable, len(down), target, strings.Join(sortedKeys(down), ", "))
	}
}

func (c *Checker) checkVolumes(e Event) {
	unavailable := c.upgrading()
	for n := range c.worldDownBefore(e.NodeUpdate) {
		unavailable[n] = true
	}
	for _, vol := range sortedKeys(c.replicas) {
		if len(c.replicas[vol]) == 0 {
			// The volume lost its only replica with a deleted machine (Longhorn has no
			// source to rebuild it from): no upgrade can keep what is already gone.
			continue
		}
		var on []string
		healthy := 0
		for n := range c.replicas[vol] {
			on = append(on, n)
			if c.exists[n] && !unavailable[n] {
				healthy++
			}
		}
		if healthy == 0 {
			sort.Strings(on)
			c.violate(InvVolumeReplica, e, "node %s taken down by NodeUpdate %s leaves volume %s (replicas on %s) without a replica on a node that is up and not upgraded; disrupted: %s",
				e.Node, e.NodeUpdate, vol, strings.Join(on, ", "), strings.Join(sortedKeys(unavailable), ", "))
		}
	}
}

func (c *Checker) checkSkew(e Event) {
	if c.topo.TargetOf[e.Node] == c.topo.ControlPlane {
		return
	}
	worker, err := version.ParseSemantic(e.Version)
	if err != nil {
		return
	}
	for n, v := range c.kubelet {
		if c.topo.TargetOf[n] != c.topo.ControlPlane || !c.exists[n] {
			continue
		}
		cp, err := version.ParseSemantic(v)
		if err != nil {
			continue
		}
		if cp.LessThan(worker) {
			c.violate(InvNoNewerThanPlanes, e, "worker node %s now runs kubelet %s while control plane node %s runs %s", e.Node, e.Version, n, v)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
