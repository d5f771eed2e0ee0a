// Package safety is a randomized safety test of the whole orchestration: one Cluster (3
// control plane machines, two MachineDeployments of 3) on a real API server, the real
// controllers (UpgradeTask, NodeUpdate, the annotation cascade) in a manager that is
// restarted at random, and a random sequence of upgrade requests through all three paths
// (annotation, ExternalUpgradeRequest, Cluster API's UpdateMachine), aborts, task
// deletions, node failures, NotReady flaps, machine deletions, a health gate turning red
// and green, and nodes put back under drainPolicy Skip. A simulated updater and
// independent watches record what happened; a Checker judges every recorded event against
// the safety invariants as it is recorded. A seed determines the sequence of faults, so a
// violation is replayed with SAFETY_SEED=<seed> (the controllers' timing is not replayed:
// a replay follows the same plan, not necessarily the same interleaving).
package safety

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// EventKind names what one recorded event is.
type EventKind string

// The events the simulators, the watches and the fault injector record.
const (
	// EventNodeUpdateStart: the simulated updater was called for a NodeUpdate for the
	// first time; the node is in the updater's hands from now on.
	EventNodeUpdateStart EventKind = "updater-start"
	// EventNodeDown: the updater took the node down (its disruptive step).
	EventNodeDown EventKind = "updater-down"
	// EventNodeUp: the updater brought the node back Ready.
	EventNodeUp EventKind = "updater-up"
	// EventHostReboot: the node's host rebooted, as the updater's disruptive step had
	// armed it (a Harvester node's OS step arms the reboot and its Job completes before
	// the host goes down: node sheet fact 28).
	EventHostReboot EventKind = "host-reboot"
	// EventKubelet: the updater set the node's kubelet version.
	EventKubelet EventKind = "kubelet"
	// EventNodeUpdateDone: the updater reported the node at the target.
	EventNodeUpdateDone EventKind = "updater-done"
	// EventNodeUpdateFailed: the updater failed the node and cleaned up.
	EventNodeUpdateFailed EventKind = "updater-failed"
	// EventNodeUpdateAborted: the updater's Abort said done.
	EventNodeUpdateAborted EventKind = "updater-aborted"
	// EventNodeUpdateSkipping: the updater found the node's drain blocked past its grace
	// period under drainPolicy Skip and answered a SkipError; it puts the node back when
	// the reconciler calls Abort next.
	EventNodeUpdateSkipping EventKind = "updater-skipping"
	// EventNodeUpdateSkipped: the updater's Abort put the skipped node back and said done.
	EventNodeUpdateSkipped EventKind = "updater-skipped"
	// EventAskedAfterSkip: the updater was called again for a NodeUpdate whose skip it had
	// already put back (it answers the same skip and touches nothing).
	EventAskedAfterSkip EventKind = "asked-after-skip"
	// EventGate: the Cluster's health gate changed: Phase "set" (the Cluster's gates
	// annotation names it), "removed" (the annotation is gone), "red" or "green" (the
	// workload object it reads).
	EventGate EventKind = "gate"
	// EventResumedAfterEnd: the updater was asked to go on with a NodeUpdate it had
	// already failed or aborted.
	EventResumedAfterEnd EventKind = "resumed-after-end"
	// EventWatchNodeUpdate: the NodeUpdate watch saw a NodeUpdate added, changed or deleted.
	EventWatchNodeUpdate EventKind = "watch-nodeupdate"
	// EventWatchTask: the UpgradeTask watch saw a task added, changed or deleted.
	EventWatchTask EventKind = "watch-task"
	// EventWorldDown: a node became disrupted by something else than the updater (a
	// NotReady flap, its machine being deleted).
	EventWorldDown EventKind = "world-down"
	// EventWorldUp: that disruption ended (the flap ended, the node is gone).
	EventWorldUp EventKind = "world-up"
	// EventNodeGone: the node was deleted with its machine.
	EventNodeGone EventKind = "node-gone"
	// EventReplica: a volume's replica was placed on a node (initially, or rebuilt after
	// the node holding it was deleted).
	EventReplica EventKind = "replica"
	// EventReplicaLost: a volume's replica went away with its node.
	EventReplicaLost EventKind = "replica-lost"
	// EventAction: something the test did (a request, a fault), for the history only.
	EventAction EventKind = "action"
)

// Event is one recorded event. Only the fields of its kind are set.
type Event struct {
	// Seq is the event's position in the history, from 1.
	Seq int
	// At is when it was recorded.
	At   time.Time
	Kind EventKind
	// Node, Machine, NodeUpdate, Task, Version, Volume name what it is about.
	Node       string
	Machine    string
	NodeUpdate string
	Task       string
	Version    string
	Volume     string
	// Target is the control plane or MachineDeployment of the node or task ("cp", "md-a").
	Target string
	// MaxUnavailable is, on EventNodeUpdateStart, the resolved maxUnavailable of the
	// NodeUpdate's task (1 for a control plane, as the controller takes it), and on
	// EventWatchTask the task's.
	MaxUnavailable int
	// Phase is, on watch events, the object's status phase; Deleted is true when the
	// watch saw it deleted.
	Phase   string
	Deleted bool
	// Why says, on EventWorldDown, what disrupted the node; on EventAction, what was done.
	Why string
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-18s", e.Kind)
	add := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	add("node", e.Node)
	add("machine", e.Machine)
	add("nu", e.NodeUpdate)
	add("task", e.Task)
	add("target", e.Target)
	add("version", e.Version)
	add("volume", e.Volume)
	if e.MaxUnavailable > 0 {
		add("maxUnavailable", fmt.Sprint(e.MaxUnavailable))
	}
	add("phase", e.Phase)
	if e.Deleted {
		add("deleted", "true")
	}
	add("why", e.Why)
	return b.String()
}

// History is the ordered record of one seed's events. Record appends an event and has
// the Checker judge it at once, under one lock, so the order of the history is the
// order the Checker saw.
type History struct {
	mu      sync.Mutex
	start   time.Time
	events  []Event
	checker *Checker
	// progress is when the last NodeUpdate moved (the updater acted, or the watch saw one change).
	progress time.Time
}

// NewHistory returns an empty history judged by checker.
func NewHistory(checker *Checker) *History {
	return &History{start: time.Now(), checker: checker}
}

// Record appends e (stamped with its position and the time) and judges it.
func (h *History) Record(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.Seq = len(h.events) + 1
	if e.At.IsZero() {
		e.At = time.Now()
	}
	h.events = append(h.events, e)
	switch e.Kind {
	case EventAction, EventWatchTask, EventWorldDown, EventWorldUp, EventReplica, EventReplicaLost, EventGate:
	default:
		h.progress = e.At
	}
	if h.checker != nil {
		h.checker.Observe(e)
	}
}

// Action records something the test did.
func (h *History) Action(format string, args ...any) {
	h.Record(Event{Kind: EventAction, Why: fmt.Sprintf(format, args...)})
}

// SinceProgress is how long ago a NodeUpdate last moved.
func (h *History) SinceProgress() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.progress.IsZero() {
		return time.Since(h.start)
	}
	return time.Since(h.progress)
}

// Events returns the events so far.
func (h *History) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

// Len is how many events were recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.events)
}

// Format renders the events up to and including seq (all when seq is 0), one a line,
// with the time since the seed started.
func (h *History) Format(upTo int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return formatEvents(h.events, h.start, upTo)
}

func formatEvents(events []Event, start time.Time, upTo int) string {
	var b strings.Builder
	for _, e := range events {
		if upTo > 0 && e.Seq > upTo {
			break
		}
		fmt.Fprintf(&b, "  #%-5d %8.3fs  %s\n", e.Seq, e.At.Sub(start).Seconds(), e)
	}
	return b.String()
}
