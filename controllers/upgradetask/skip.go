package upgradetask

import (
	"fmt"
	"strings"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// A node whose drain stays blocked under drainPolicy Skip is put back by its updater and
// its NodeUpdate ends Skipped. The task does not count that as a failure: it goes on with
// its other machines, and when none of them waits or runs any more it tries each skipped
// machine once more, with a second NodeUpdate named RetryNodeUpdateName (the first stays
// as the record of the skip). A machine skipped again fails the task: a task does not end
// Completed with a node left behind. An externally paced task (Cluster API's
// UpdateMachine) does not try again: Cluster API picks its machines, so the skip is the
// machine's failure there, and UpdateMachine reports it with the blocking pods named.

// addNodeUpdate keeps one of the task's NodeUpdates by its machine: the retry of a skipped
// machine wins over its first NodeUpdate, which is kept in skippedFirst.
func (s *taskScope) addNodeUpdate(nu *inplacev1.NodeUpdate) {
	machine := nu.Spec.MachineName
	prev := s.nodeUpdates[machine]
	if prev == nil {
		s.nodeUpdates[machine] = nu
		return
	}
	first, retry := prev, nu
	if isRetry(s.task, prev) {
		first, retry = nu, prev
	}
	s.nodeUpdates[machine], s.skippedFirst[machine] = retry, first
}

// isRetry reports whether nu is the NodeUpdate with which the task tries a skipped machine
// once more.
func isRetry(task *inplacev1.UpgradeTask, nu *inplacev1.NodeUpdate) bool {
	return nu.Name == upgraderequest.RetryNodeUpdateName(task.Name, nu.Spec.MachineName)
}

// nodeUpdateName is the name of the NodeUpdate the task starts for the member now.
func nodeUpdateName(task *inplacev1.UpgradeTask, mem *member) string {
	if mem.retry {
		return upgraderequest.RetryNodeUpdateName(task.Name, mem.name)
	}
	return upgraderequest.NodeUpdateName(task.Name, mem.name)
}

// judgeSkipped turns a skipped member into what it means for the task: Skipped, to be
// tried again, the first time; Failed when its retry was skipped too, or when Cluster API
// paces the task.
func judgeSkipped(task *inplacev1.UpgradeTask, mem *member) {
	if mem.nu == nil || mem.nu.Status.Phase != inplacev1.NodeUpdatePhaseSkipped {
		return
	}
	switch {
	case task.Spec.Pacing == inplacev1.PacingExternal:
		mem.state = inplacev1.MachineStateFailed
		mem.message = fmt.Sprintf("skipped and put back (drainPolicy Skip): %s; Cluster API picks this task's machines, so capi-inplace does not try it again",
			mem.nu.Status.FailureMessage)
	case isRetry(task, mem.nu):
		mem.state = inplacev1.MachineStateFailed
		mem.message = fmt.Sprintf("skipped again when tried after every other machine (%s, NodeUpdate %s): %s", inplacev1.SkippedAgainReason, mem.nu.Name, mem.nu.Status.FailureMessage)
	}
}

// skippedPending reports whether the member was skipped and waits to be tried once more.
func (m *member) skippedPending() bool {
	return m.state == inplacev1.MachineStateSkipped && !m.removed && m.machine != nil
}

// retrySkipped makes the skipped members waiting again, to be picked as any other, once
// no other member waits or runs: the task comes back to them at the end, once each.
func retrySkipped(s *taskScope) {
	if s.pendingHandover > 0 || s.task.Spec.Phase == inplacev1.TaskActionAbort {
		return
	}
	for _, mem := range s.members {
		if mem.state == inplacev1.MachineStateWaiting || mem.state == inplacev1.MachineStateInProgress {
			return
		}
	}
	for _, mem := range s.members {
		if mem.skippedPending() {
			mem.state, mem.retry = inplacev1.MachineStateWaiting, true
		}
	}
}

// setSkippedCondition sets the task's NodesSkipped condition: True while a machine that
// was skipped is not upgraded (waiting for its retry, being retried, or skipped again),
// naming each node and what blocked its drain; False once every skipped machine was
// upgraded on its retry. A task none of whose machines was skipped has none.
func setSkippedCondition(s *taskScope, set func(t string, ok bool, reason, msg string)) {
	var open, retried []string
	again := false
	for _, mem := range s.members {
		first := mem.skippedFirst
		if first == nil && mem.nu != nil && mem.nu.Status.Phase == inplacev1.NodeUpdatePhaseSkipped {
			first = mem.nu
		}
		if first == nil {
			continue
		}
		what := fmt.Sprintf("node %s (machine %s, NodeUpdate %s): %s", displayName(mem), mem.name, first.Name, first.Status.FailureMessage)
		switch {
		case mem.state == inplacev1.MachineStateUpgraded:
			retried = append(retried, fmt.Sprintf("node %s was skipped, then upgraded when tried again", displayName(mem)))
		case mem.nu != first && mem.nu.Status.Phase == inplacev1.NodeUpdatePhaseSkipped:
			again = true
			open = append(open, what+"; skipped again: "+mem.nu.Status.FailureMessage)
		case mem.skippedPending():
			open = append(open, what+"; tried once more when every other machine is done")
		case mem.state == inplacev1.MachineStateFailed && s.task.Spec.Pacing == inplacev1.PacingExternal:
			open = append(open, what+"; not tried again (Cluster API picks the machines)")
		default:
			open = append(open, what+"; tried again now")
		}
	}
	switch {
	case len(open) > 0 && again:
		set(inplacev1.NodesSkippedCondition, true, inplacev1.SkippedAgainReason, "the task fails with a node left behind: "+strings.Join(open, "; "))
	case len(open) > 0:
		set(inplacev1.NodesSkippedCondition, true, inplacev1.NodeSkippedReason, strings.Join(open, "; "))
	case len(retried) > 0:
		set(inplacev1.NodesSkippedCondition, false, inplacev1.DoneReason, strings.Join(retried, "; "))
	}
	// A task none of whose machines was skipped carries no NodesSkipped condition.
}
