package inplacectl

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/api/meta"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// printCascade writes the Cluster's in-place-upgrade-* annotations: what the cascade was
// asked and where it stands, whichever path created the tasks.
func printCascade(w *errWriter, st *UpgradeStatus) {
	a := st.Annotations
	w.printf("Cluster %s/%s\n", st.Namespace, st.Cluster)
	to, status := a[inplacev1.UpgradeToAnnotation], a[inplacev1.UpgradeStatusAnnotation]
	if to == "" && status == "" && a[inplacev1.UpgradeReleaseAnnotation] == "" {
		w.printf("  in-place-upgrade annotations: none (the upgrade was not asked through them)\n")
		return
	}
	w.printf("  in-place-upgrade-to:       %s\n", orDash(to))
	w.printf("  in-place-upgrade-status:   %s\n", orDash(status))
	if p := a[inplacev1.UpgradeProgressAnnotation]; p != "" {
		w.printf("  in-place-upgrade-progress: %s\n", p)
	}
	if r := a[inplacev1.UpgradeReleaseAnnotation]; r != "" {
		w.printf("  in-place-upgrade-release:  %s\n", r)
	}
	if m := a[inplacev1.UpgradeMessageAnnotation]; m != "" {
		w.printf("  in-place-upgrade-message:  %s\n", oneLine(m))
	}
}

// printTask writes one task's line, its Paused and Degraded conditions when they are
// True, and its machines in order.
func printTask(w *errWriter, st *UpgradeStatus, t *inplacev1.UpgradeTask) {
	s := t.Status
	w.printf("\nUpgradeTask %s: %s to %s: %s, %s upgraded", t.Name, TaskTarget(t), t.Spec.Version, orDash(string(s.Phase)), orDash(s.Progress))
	if s.InProgress > 0 || s.Waiting > 0 || s.Failed > 0 {
		w.printf(" (%d in progress, %d waiting, %d failed)", s.InProgress, s.Waiting, s.Failed)
	}
	if s.StartTime != nil {
		end := st.Now
		if s.CompletionTime != nil {
			end = s.CompletionTime.Time
		}
		w.printf(", for %s", humanDuration(end.Sub(s.StartTime.Time)))
	}
	w.printf("\n")
	if s.CurrentNodes != "" {
		w.printf("  now upgrading: %s\n", s.CurrentNodes)
	}
	for _, ct := range []string{inplacev1.PausedCondition, inplacev1.DegradedCondition} {
		if c := meta.FindStatusCondition(s.Conditions, ct); c != nil && c.Status == "True" {
			w.printf("  %s (%s): %s\n", ct, c.Reason, oneLine(c.Message))
		}
	}
	if len(s.Machines) > 0 {
		printMachines(w, st, t)
	}
}

func printMachines(w *errWriter, st *UpgradeStatus, t *inplacev1.UpgradeTask) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "  ORDER\tMACHINE\tNODE\tSTATE\tSTEP\tFOR\tMESSAGE")
	for _, m := range t.Status.Machines {
		step, runningFor := nodeStep(st, m)
		_, _ = fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", order(m.Order), m.Name, orDash(m.NodeName), m.State,
			orDash(step), orDash(runningFor), orDash(oneLine(machineMessage(st, t, m))))
	}
	if err := tw.Flush(); err != nil && w.err == nil {
		w.err = err
	}
}

// nodeStep is the machine's NodeUpdate's current step (with how many steps are done) and
// how long it has run: the step's own time while it runs, the node's whole time once it
// ended.
func nodeStep(st *UpgradeStatus, m inplacev1.MachineUpgradeStatus) (step, runningFor string) {
	nu, ok := st.NodeUpdates[m.NodeUpdate]
	if !ok {
		return "", ""
	}
	s := nu.Status
	done := 0
	var current *inplacev1.NodeUpdateStep
	for i := range s.Steps {
		switch s.Steps[i].State {
		case inplacev1.StepStateSucceeded, inplacev1.StepStateSkipped:
			done++
		}
		if s.Steps[i].Name == s.CurrentStep {
			current = &s.Steps[i]
		}
	}
	if s.CurrentStep != "" {
		step = fmt.Sprintf("%s (%d/%d)", s.CurrentStep, done+1, len(s.Steps))
	}
	if s.Phase.IsFinal() {
		step = string(s.Phase)
		if s.Phase == inplacev1.NodeUpdatePhaseFailed && s.CurrentStep != "" {
			step += " at " + s.CurrentStep
		}
		if s.StartTime != nil && s.CompletionTime != nil {
			runningFor = "took " + humanDuration(s.CompletionTime.Sub(s.StartTime.Time))
		}
		return step, runningFor
	}
	if current != nil && current.StartTime != nil {
		runningFor = humanDuration(st.Now.Sub(current.StartTime.Time))
	} else if s.StartTime != nil {
		runningFor = humanDuration(st.Now.Sub(s.StartTime.Time))
	}
	return step, runningFor
}

// machineMessage says what holds a waiting machine (of a task that still runs), what a running node is doing and is
// retrying, or why it failed.
func machineMessage(st *UpgradeStatus, t *inplacev1.UpgradeTask, m inplacev1.MachineUpgradeStatus) string {
	nu, ok := st.NodeUpdates[m.NodeUpdate]
	if m.State == inplacev1.MachineStateInProgress && ok {
		if nu.Status.LastError != "" {
			return fmt.Sprintf("retrying (attempt %d): %s", nu.Status.Attempts, nu.Status.LastError)
		}
		for _, s := range nu.Status.Steps {
			if s.Name == nu.Status.CurrentStep && s.Message != "" {
				return s.Message
			}
		}
	}
	if m.State == inplacev1.MachineStateFailed {
		return "failed: see below"
	}
	// The UpgradeTask controller writes "held by <check>: ..."; a message in other words
	// is marked as a hold all the same.
	// A task that ended holds nothing: its waiting machines will not start.
	if m.Message != "" && m.State == inplacev1.MachineStateWaiting && !t.Status.Phase.IsFinal() && !strings.HasPrefix(m.Message, "held") {
		return "held: " + m.Message
	}
	return m.Message
}

// printFailures writes each failed machine with its node's own error, which the table
// only points to: it is the line a person acts on.
func printFailures(w *errWriter, st *UpgradeStatus) {
	first := true
	for _, t := range st.Tasks {
		for _, m := range t.Status.Machines {
			if m.State != inplacev1.MachineStateFailed {
				continue
			}
			if first {
				w.printf("\nFailures:\n")
				first = false
			}
			w.printf("  machine %s (node %s) of %s: %s\n", m.Name, orDash(m.NodeName), TaskTarget(&t), failureText(st, m))
		}
	}
}

func failureText(st *UpgradeStatus, m inplacev1.MachineUpgradeStatus) string {
	nu, ok := st.NodeUpdates[m.NodeUpdate]
	if !ok || nu.Status.FailureMessage == "" {
		return orDash(oneLine(m.Message))
	}
	var b strings.Builder
	if nu.Status.FailureReason != "" {
		b.WriteString(nu.Status.FailureReason + ": ")
	}
	b.WriteString(oneLine(nu.Status.FailureMessage))
	if nu.Status.CurrentStep != "" {
		fmt.Fprintf(&b, " (NodeUpdate %s, step %s)", nu.Name, nu.Status.CurrentStep)
	}
	if nu.Status.CompletionTime != nil {
		fmt.Fprintf(&b, ", %s ago", humanDuration(st.Now.Sub(nu.Status.CompletionTime.Time)))
	}
	return b.String()
}
