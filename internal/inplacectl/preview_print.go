package inplacectl

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// The output formats of -o.
const (
	OutputTable = "table"
	OutputYAML  = "yaml"
	OutputJSON  = "json"
)

// ValidOutput says whether format is one the printers know.
func ValidOutput(format string) error {
	switch format {
	case OutputTable, OutputYAML, OutputJSON:
		return nil
	}
	return fmt.Errorf("-o %s: the output formats are table, yaml and json", format)
}

// PrintObject writes obj as YAML or JSON, with its kind and apiVersion, as kubectl get -o
// does.
func PrintObject(w io.Writer, obj runtime.Object, format string) error {
	if obj.GetObjectKind().GroupVersionKind().Kind == "" {
		if p, ok := obj.(*inplacev1.UpgradePreview); ok {
			p = p.DeepCopy()
			p.APIVersion, p.Kind = inplacev1.GroupVersion.String(), "UpgradePreview"
			obj = p
		}
	}
	var data []byte
	var err error
	if format == OutputJSON {
		// JSON escapes the C0 controls (\u001b) but not DEL and the C1 controls, which
		// escapeControls adds: nothing reaches the terminal raw, and the data stays whole.
		data, err = json.MarshalIndent(obj, "", "  ")
		data = escapeControls(data)
		data = append(data, '\n')
	} else {
		// YAML cannot hold control characters (sigs.k8s.io/yaml refuses the object), so
		// it shows the text cleaned, as the table does.
		if p, ok := obj.(*inplacev1.UpgradePreview); ok {
			obj = CleanCopy(p)
		}
		data, err = yaml.Marshal(obj)
	}
	if err != nil {
		return fmt.Errorf("encode as %s: %w", format, err)
	}
	_, err = w.Write(data)
	return err
}

// PrintPreview writes a preview for a person: a header with the counts and the estimate,
// one table row per machine in the order nodes would go, then per node what it would
// disrupt and what holds it.
func PrintPreview(w io.Writer, p *inplacev1.UpgradePreview) error {
	// What the cluster wrote is shown without the controls a terminal would act on.
	p = CleanCopy(p)
	pw := &errWriter{w: w}
	printPreviewHeader(pw, p)
	if len(p.Status.Machines) > 0 {
		pw.printf("\n")
		printPreviewTable(pw, p.Status.Machines)
		printPreviewDetails(pw, p.Status.Machines)
	}
	return pw.err
}

func printPreviewHeader(w *errWriter, p *inplacev1.UpgradePreview) {
	s := p.Status
	w.printf("UpgradePreview %s/%s: Cluster %s to %s\n", p.Namespace, p.Name, p.Spec.ClusterName, p.Spec.Version)
	computed := "not yet"
	if s.ComputedTime != nil {
		computed = s.ComputedTime.UTC().Format(time.RFC3339)
	}
	w.printf("Phase:       %s (computed %s)\n", orDash(string(s.Phase)), computed)
	if s.Message != "" {
		w.printf("Message:     %s\n", s.Message)
	}
	failClosed := "no (a change that cannot be done in place makes Cluster API replace the machine)"
	if s.FailClosed {
		failClosed = "yes (a change that cannot be done in place is refused, never a replacement)"
	}
	w.printf("Fail-closed: %s\n", failClosed)
	w.printf("Machines:    %d in place, %d replaced, %d refused, %d at target; %d held by a preflight check today\n",
		s.InPlace, s.Replaced, s.Refused, s.AtTarget, s.Held)
	estimate := "none"
	if s.EstimatedDuration != nil {
		estimate = s.EstimatedDuration.Duration.String()
		if s.EstimateSource != "" {
			estimate += " (" + s.EstimateSource + ")"
		}
	}
	w.printf("Estimate:    %s\n", estimate)
	if s.Summary != "" {
		w.printf("Summary:     %s\n", s.Summary)
	}
}

// outcome is the machine's outcome, with the path of Cluster API that replaces or deletes
// it without asking the hooks when there is one: Replaced/MaxSurge.
func outcome(m inplacev1.PreviewMachine) string {
	if m.UnaskedPath != "" {
		return string(m.Outcome) + "/" + string(m.UnaskedPath)
	}
	return string(m.Outcome)
}

func printPreviewTable(w *errWriter, machines []inplacev1.PreviewMachine) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "ORDER\tMACHINE\tNODE\tTARGET\tOUTCOME\tHOLDS\tVMS MIGRATE/STOP\tPDB-BLOCKED\tDEGRADED VOLS\tESTIMATE\tREASON")
	for _, m := range machines {
		d := disruptionOf(m)
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\t%s\n",
			order(m.Order), m.Name, orDash(m.NodeName), orDash(m.Target), outcome(m),
			holds(m),
			len(d.MigratingVMs), len(d.StoppedVMs), len(d.BlockingPods), len(d.DegradedVolumes),
			duration(m.EstimatedDuration), orDash(oneLine(m.Reason)))
	}
	if err := tw.Flush(); err != nil && w.err == nil {
		w.err = err
	}
}

// printPreviewDetails writes, per node that has any, what it would disrupt and what holds
// it, in the table's order.
func printPreviewDetails(w *errWriter, machines []inplacev1.PreviewMachine) {
	for _, m := range machines {
		d := disruptionOf(m)
		failing := failingPreflight(m.Preflight)
		if len(d.MigratingVMs)+len(d.StoppedVMs)+len(d.BlockingPods)+len(d.DegradedVolumes)+len(failing) == 0 && d.Capacity == "" && m.OrderReason == "" {
			continue
		}
		w.printf("\n%s (machine %s, %s)\n", orDash(m.NodeName), m.Name, placeOf(m))
		if len(d.MigratingVMs)+len(d.StoppedVMs)+len(d.BlockingPods)+len(d.DegradedVolumes)+len(failing) == 0 && d.Capacity == "" {
			w.printf("  no VM to move or stop, no pod or volume in the way, no check holds it\n")
		}
		for _, vm := range d.MigratingVMs {
			w.printf("  VM %s/%s live-migrates%s\n", vm.Namespace, vm.Name, suffix(": ", vm.Reason))
		}
		for _, vm := range d.StoppedVMs {
			w.printf("  VM %s/%s is stopped and restarted after the node%s\n", vm.Namespace, vm.Name, suffix(": ", vm.Reason))
		}
		if d.Capacity != "" {
			w.printf("  capacity: %s\n", d.Capacity)
		}
		for _, pod := range d.BlockingPods {
			w.printf("  pod %s/%s blocks the drain (PodDisruptionBudget %s)%s\n", pod.Namespace, pod.Name, orDash(pod.PodDisruptionBudget), suffix(": ", pod.Reason))
		}
		for _, v := range d.DegradedVolumes {
			w.printf("  volume %s degrades%s\n", v.Name, suffix(": ", v.Reason))
		}
		for _, c := range failing {
			w.printf("  held by %s: %s\n", c.Name, orDash(c.Message))
		}
	}
}

func placeOf(m inplacev1.PreviewMachine) string {
	if m.Order == 0 {
		return strings.ToLower(string(m.Outcome[:1])) + string(m.Outcome[1:]) + ", not upgraded in place"
	}
	place := fmt.Sprintf("goes %s", ordinal(m.Order))
	return place + suffix(": ", m.OrderReason)
}

func disruptionOf(m inplacev1.PreviewMachine) inplacev1.NodeDisruption {
	if m.Disruption == nil {
		return inplacev1.NodeDisruption{}
	}
	return *m.Disruption
}

func failingPreflight(checks []inplacev1.PreflightCheckStatus) []inplacev1.PreflightCheckStatus {
	var out []inplacev1.PreflightCheckStatus
	for _, c := range checks {
		if !c.Passed {
			out = append(out, c)
		}
	}
	return out
}

// holds names the checks that would hold the machine today; "yes" when the preview says
// it would be held without naming a failing check.
func holds(m inplacev1.PreviewMachine) string {
	names := failingChecks(m.Preflight)
	if len(names) == 0 && m.WouldHold {
		return "yes"
	}
	return orDash(strings.Join(names, ","))
}

func failingChecks(checks []inplacev1.PreflightCheckStatus) []string {
	var names []string
	for _, c := range failingPreflight(checks) {
		names = append(names, c.Name)
	}
	return names
}

// escapeControls writes DEL and the C1 controls of a JSON document as \u escapes, which
// encoding/json leaves raw. They can only stand inside strings, where the escape means
// the same character.
func escapeControls(data []byte) []byte {
	s := string(data)
	if !needsCleaning(s) {
		return data
	}
	var b strings.Builder
	for _, r := range s {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return []byte(b.String())
}
