package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/scenario"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// nodeState is what the demo knows of one node: from its NodeUpdate and UpgradeTask on
// the management cluster, and from its Node on the workload cluster.
type nodeState struct {
	scenario.Node

	// From the newest NodeUpdate of the node.
	nodeUpdate string
	phase      inplacev1.NodeUpdatePhase
	step       string
	stepIndex  int // 1-based position of step among the declared steps
	stepCount  int
	finished   int // steps succeeded or skipped
	skipped    int
	failedStep string
	failure    string

	// waiting is the node's machine message in its UpgradeTask while it has no NodeUpdate
	// (for example the preflight check holding it back).
	waiting string

	// From the Node.
	kubelet  string
	osImage  string
	ready    bool
	cordoned bool

	// When the demo first saw the NodeUpdate, and saw it end.
	started time.Time
	ended   time.Time
}

func (n *nodeState) done() bool { return n.phase == inplacev1.NodeUpdatePhaseSucceeded }

// reached says whether the node runs the target Kubernetes version and OS.
func (n *nodeState) reached(h scenario.Hop) bool {
	return n.done() && n.kubelet == h.ToKubernetes && n.osImage == h.ToOSImage()
}

// progress is the node's share of its steps, from 0 to 1.
func (n *nodeState) progress() float64 {
	switch {
	case n.done():
		return 1
	case n.stepCount == 0:
		return 0
	}
	return float64(n.finished) / float64(n.stepCount)
}

func (n *nodeState) elapsed(now time.Time) time.Duration {
	switch {
	case n.started.IsZero():
		return 0
	case !n.ended.IsZero():
		return n.ended.Sub(n.started)
	}
	return now.Sub(n.started)
}

// tracker samples the state of every node; safe for concurrent use.
type tracker struct {
	s     *scenario.Scenario
	mu    sync.Mutex
	nodes []*nodeState
	start time.Time
	// events are the changes seen by the samples not yet taken by takeEvents.
	events []string
	// plans are the UpgradePlans' phases and messages, by name, as last seen.
	plans map[string]string
	// settingsSeen counts the changes of the scenario's settings watch already told, and
	// settings holds each setting's value as last told.
	settingsSeen int
	settings     map[string]string
}

func newTracker(s *scenario.Scenario) *tracker {
	t := &tracker{s: s, start: time.Now()}
	for _, n := range s.Nodes {
		t.nodes = append(t.nodes, &nodeState{Node: n, kubelet: s.Options.Hop.FromKubernetes, osImage: s.Options.Hop.FromOSImage(), ready: true})
	}
	return t
}

// sample reads the NodeUpdates, UpgradeTasks and Nodes once and records what changed.
func (t *tracker) sample(ctx context.Context) error {
	ns := t.s.Options.Namespace
	nus := &inplacev1.NodeUpdateList{}
	if err := t.s.Management.Client.List(ctx, nus, client.InNamespace(ns)); err != nil {
		return err
	}
	tasks := &inplacev1.UpgradeTaskList{}
	if err := t.s.Management.Client.List(ctx, tasks, client.InNamespace(ns)); err != nil {
		return err
	}
	nodes := &corev1.NodeList{}
	if err := t.s.Workload.Client.List(ctx, nodes); err != nil {
		return err
	}
	plans := &harvesterv1.UpgradePlanList{}
	if err := t.s.Management.Client.List(ctx, plans, client.InNamespace(ns)); err != nil {
		return err
	}
	now := time.Now()
	t.notePlans(plans.Items)
	t.noteSettings()

	newest := map[string]*inplacev1.NodeUpdate{}
	for i := range nus.Items {
		nu := &nus.Items[i]
		if cur := newest[nu.Spec.NodeName]; cur == nil || cur.CreationTimestamp.Before(&nu.CreationTimestamp) ||
			(cur.CreationTimestamp.Equal(&nu.CreationTimestamp) && cur.Name < nu.Name) {
			newest[nu.Spec.NodeName] = nu
		}
	}
	// The newest task's word on each machine.
	sort.Slice(tasks.Items, func(i, j int) bool {
		return tasks.Items[i].CreationTimestamp.Before(&tasks.Items[j].CreationTimestamp)
	})
	machineMessage := map[string]string{}
	for _, task := range tasks.Items {
		for _, m := range task.Status.Machines {
			machineMessage[m.Name] = string(m.State)
			if m.Message != "" {
				machineMessage[m.Name] += ": " + m.Message
			}
		}
	}
	byName := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byName[nodes.Items[i].Name] = &nodes.Items[i]
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.nodes {
		before := *n
		if node := byName[n.Name]; node != nil {
			n.kubelet, n.osImage = node.Status.NodeInfo.KubeletVersion, node.Status.NodeInfo.OSImage
			n.ready, n.cordoned = sim.NodeReady(node), node.Spec.Unschedulable
		}
		n.waiting = machineMessage[n.Machine]
		if nu := newest[n.Name]; nu != nil {
			t.readNodeUpdate(n, nu, now)
		}
		t.noteChange(&before, n, now)
	}
	return nil
}

func (t *tracker) readNodeUpdate(n *nodeState, nu *inplacev1.NodeUpdate, now time.Time) {
	if nu.Name != n.nodeUpdate {
		n.nodeUpdate, n.started, n.ended = nu.Name, now, time.Time{}
	}
	n.phase = nu.Status.Phase
	if n.phase == "" {
		n.phase = inplacev1.NodeUpdatePhasePending
	}
	n.step, n.stepIndex, n.stepCount, n.finished, n.skipped, n.failedStep = nu.Status.CurrentStep, 0, len(nu.Status.Steps), 0, 0, ""
	for i, st := range nu.Status.Steps {
		switch st.State {
		case inplacev1.StepStateSucceeded:
			n.finished++
		case inplacev1.StepStateSkipped:
			n.finished++
			n.skipped++
		case inplacev1.StepStateFailed:
			n.failedStep = st.Name
		}
		if st.Name == n.step {
			n.stepIndex = i + 1
		}
	}
	n.failure = failureText(nu.Status.FailureReason, nu.Status.FailureMessage)
	if n.phase.IsFinal() && n.ended.IsZero() {
		n.ended = now
	}
}

// failureText is a NodeUpdate's failure, the node's own words first: its failureMessage
// without the "step S: " the nodeupdater puts before it (the demo's lines say "FAILED at
// S"), then its failureReason in parentheses.
func failureText(reason, message string) string {
	if step, rest, ok := strings.Cut(message, ": "); ok && strings.HasPrefix(step, "step ") && !strings.Contains(strings.TrimPrefix(step, "step "), " ") {
		message = rest
	}
	switch {
	case reason == "":
		return message
	case message == "":
		return reason
	}
	return fmt.Sprintf("%s (%s)", message, reason)
}

// notePlans records each UpgradePlan's phase changes: the cluster-level work (the
// repository, the release metadata, the preload of every node, the cluster upgrade) shows
// before any node moves, and image cleanup and cleanup after the last.
func (t *tracker) notePlans(plans []harvesterv1.UpgradePlan) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.plans == nil {
		t.plans = map[string]string{}
	}
	for _, p := range plans {
		phase := string(p.Status.Phase)
		if held := meta.FindStatusCondition(p.Status.Conditions, harvesterv1.UpgradePlanDegraded); held != nil && held.Status == metav1.ConditionTrue {
			if key := p.Name + "/held"; t.plans[key] != held.Message {
				t.plans[key] = held.Message
				t.events = append(t.events, fmt.Sprintf("%-18s held in %s: %s", "UpgradePlan", phase, held.Message))
			}
		}
		if phase == "" || t.plans[p.Name] == phase {
			continue
		}
		t.plans[p.Name] = phase
		line := fmt.Sprintf("%-18s cluster phase %s", "UpgradePlan", phase)
		switch p.Status.Phase {
		case harvesterv1.UpgradePlanSucceeded:
			line += fmt.Sprintf(": Harvester %s on %s nodes", p.Spec.Version, p.Status.Upgraded)
		case harvesterv1.UpgradePlanFailed:
			line += ": " + p.Status.Message
		}
		t.events = append(t.events, line)
	}
}

// noteSettings tells each change the scenario's settings watch saw since the last call
// (scenario.SettingsWatch: the settings the release changes for the nodes), as the old
// value and the new.
func (t *tracker) noteSettings() {
	history := t.s.Settings.History()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.settings == nil {
		t.settings = map[string]string{}
	}
	for _, ch := range history[min(t.settingsSeen, len(history)):] {
		if prev, seen := t.settings[ch.Setting]; seen {
			t.events = append(t.events, fmt.Sprintf("%-18s %s: %s → %s", "setting", ch.Setting, prev, ch.Value))
		}
		t.settings[ch.Setting] = ch.Value
	}
	t.settingsSeen = len(history)
}

// planLines are the UpgradePlans' phases, for the live view.
func (t *tracker) planLines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name, phase := range t.plans {
		if !strings.HasSuffix(name, "/held") {
			out = append(out, fmt.Sprintf("UpgradePlan %s: %s", name, phase))
		}
	}
	sort.Strings(out)
	return out
}

// noteChange records, for the plain output, what changed on a node, in the order it
// happened: a node back up ends the previous step, a node going down belongs to the new one.
func (t *tracker) noteChange(before, n *nodeState, now time.Time) {
	var what []string
	if n.ready && !before.ready {
		what = append(what, fmt.Sprintf("node Ready again: kubelet %s, %s", n.kubelet, n.osImage))
	}
	switch {
	case n.nodeUpdate != before.nodeUpdate:
		what = append(what, "started: NodeUpdate "+n.nodeUpdate)
	case n.phase != before.phase && n.phase.IsFinal():
		// said below
	case n.step != before.step && n.step != "":
		what = append(what, fmt.Sprintf("step %s (%d/%d)", n.step, n.stepIndex, n.stepCount))
	}
	if !n.ready && before.ready {
		what = append(what, "node NotReady: cordoned, drained, restarting")
	}
	if n.phase != before.phase && n.phase.IsFinal() {
		switch n.phase {
		case inplacev1.NodeUpdatePhaseSucceeded:
			what = append(what, "upgraded in "+formatDuration(n.elapsed(now)))
		case inplacev1.NodeUpdatePhaseFailed:
			what = append(what, fmt.Sprintf("FAILED at %s: %s", n.failedStepOr(), n.failure))
		default:
			what = append(what, string(n.phase))
		}
	}
	for _, w := range what {
		t.events = append(t.events, fmt.Sprintf("%-18s %s", n.Name, w))
	}
}

func (n *nodeState) failedStepOr() string {
	if n.failedStep != "" {
		return n.failedStep
	}
	if n.step != "" {
		return n.step
	}
	return "?"
}

func (t *tracker) count() (done, total int, frac float64) {
	sum := 0.0
	nodes := t.snapshot()
	for _, n := range nodes {
		sum += n.progress()
		if n.done() {
			done++
		}
	}
	if len(nodes) > 0 {
		frac = sum / float64(len(nodes))
	}
	return done, len(nodes), frac
}

func (t *tracker) unit() string     { return "nodes" }
func (t *tracker) began() time.Time { return t.start }
func (t *tracker) lines(v *view) []string {
	return append(t.planLines(), v.nodeLines(t.snapshot())...)
}
func (t *tracker) compactLines(v *view) []string { return v.compactLines(t.snapshot()) }

// takeEvents returns the changes seen since the last call.
func (t *tracker) takeEvents() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.events
	t.events = nil
	return out
}

// snapshot copies the node states.
func (t *tracker) snapshot() []nodeState {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]nodeState, 0, len(t.nodes))
	for _, n := range t.nodes {
		out = append(out, *n)
	}
	return out
}

// summaryRow is one line of the final table.
type summaryRow struct {
	node, role, from, to, steps, duration, result string
	reached                                       bool
	// failure is the node's failure, its own words first, and failedAt its step.
	failure, failedAt string
}

// summary builds the final table and says whether every node reached the target.
func (t *tracker) summary() ([]summaryRow, bool) {
	all := true
	var rows []summaryRow
	for _, n := range t.snapshot() {
		r := summaryRow{node: n.Name, role: "worker", from: t.s.Options.Hop.FromKubernetes, to: n.kubelet, reached: n.reached(t.s.Options.Hop)}
		if n.ControlPlane {
			r.role = "control plane"
		}
		switch {
		case n.stepCount == 0:
			r.steps = "-"
		case n.skipped > 0:
			r.steps = fmt.Sprintf("%d/%d (%d skipped)", n.finished, n.stepCount, n.skipped)
		default:
			r.steps = fmt.Sprintf("%d/%d", n.finished, n.stepCount)
		}
		r.duration = "-"
		if !n.started.IsZero() {
			r.duration = formatDuration(n.elapsed(time.Now()))
		}
		switch {
		case r.reached:
			r.result = "upgraded"
		case n.phase == inplacev1.NodeUpdatePhaseFailed:
			r.result = "FAILED at " + n.failedStepOr()
			r.failure, r.failedAt = n.failure, n.failedStepOr()
		case n.done():
			r.result = fmt.Sprintf("NOT at target (%s, %s)", n.kubelet, n.osImage)
		case n.nodeUpdate == "":
			r.result = "not started"
		default:
			r.result = "unfinished (" + string(n.phase) + ")"
		}
		all = all && r.reached
		rows = append(rows, r)
	}
	return rows, all
}

// formatDuration shows tenths of a second under a minute, whole seconds above.
func formatDuration(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}
