package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// machineState is what the demo knows of one Machine rolled out by Cluster API: from the
// Machine (Cluster API's word), its newest NodeUpdate (capi-inplace's) and its Node on the
// workload cluster (the kubelet's).
type machineState struct {
	name, node   string
	controlPlane bool
	// version is the Machine's spec.version, which KCP or the MachineSet controller
	// writes when it decides to update the machine in place.
	version string
	// updating and updatingReason are Cluster API's Updating condition; upToDate its
	// UpToDate condition's status.
	updating       metav1.ConditionStatus
	updatingReason string
	updatingMsg    string
	upToDate       metav1.ConditionStatus
	// oursFailed is capi-inplace's InPlaceUpgradeFailed condition's message, when True.
	oursFailed string

	nodeUpdate string
	phase      inplacev1.NodeUpdatePhase
	step       string
	stepMsg    string
	nuFailure  string

	ready   bool
	kubelet string

	// deleted: the Machine is gone or being deleted; added: it was not there before the bump.
	deleted, added bool

	// When the demo first saw Cluster API start the machine's update, and saw it end.
	started, ended time.Time
}

func (m *machineState) done() bool {
	return !m.deleted && m.version == capiToVersion && m.kubelet == capiToVersion && m.ready &&
		m.updating != metav1.ConditionTrue && m.upToDate == metav1.ConditionTrue
}

// capiFailed says that Cluster API shows the failed update on the Machine, and
// capi-inplace its node's error.
func (m *machineState) capiFailed() bool {
	return m.updatingReason == clusterv1.MachineInPlaceUpdateFailedReason && m.oursFailed != ""
}

func (m *machineState) nodeFailed() bool { return m.phase == inplacev1.NodeUpdatePhaseFailed }

// progress is the machine's share of its rollout, from 0 to 1.
func (m *machineState) progress() float64 {
	switch {
	case m.done():
		return 1
	case m.phase == inplacev1.NodeUpdatePhaseSucceeded:
		return 0.8
	case m.nodeUpdate != "":
		return 0.5
	case m.version == capiToVersion || m.updating == metav1.ConditionTrue:
		return 0.2
	}
	return 0
}

func (m *machineState) elapsed(now time.Time) time.Duration {
	switch {
	case m.started.IsZero():
		return 0
	case !m.ended.IsZero():
		return m.ended.Sub(m.started)
	}
	return now.Sub(m.started)
}

// capiColumn is Cluster API's word on the machine, from its Updating and UpToDate conditions.
func (m *machineState) capiColumn() string {
	switch {
	case m.deleted:
		return "Deleting"
	case m.updating == metav1.ConditionTrue && m.updatingReason == clusterv1.MachineInPlaceUpdateFailedReason:
		return "UpdateFailed"
	case m.updating == metav1.ConditionTrue:
		return "Updating"
	case m.upToDate == metav1.ConditionTrue:
		return "UpToDate"
	case m.upToDate == metav1.ConditionFalse:
		return "NotUpToDate"
	}
	return "-"
}

// nodeUpdateColumn is capi-inplace's NodeUpdate of the machine: its phase, and its step
// while it runs.
func (m *machineState) nodeUpdateColumn() string {
	switch {
	case m.nodeUpdate == "":
		return "-"
	case m.phase == inplacev1.NodeUpdatePhaseInProgress && m.step != "":
		return m.step
	case m.phase == "":
		return string(inplacev1.NodeUpdatePhasePending)
	}
	return string(m.phase)
}

func (m *machineState) nodeColumn() string {
	ready := "Ready"
	if !m.ready {
		ready = "NotReady"
	}
	return ready + " " + m.kubelet
}

func (m *machineState) result() string {
	switch {
	case m.done():
		return "upgraded in place"
	case m.deleted:
		return "DELETED (replaced, not in place)"
	case m.added:
		return "NEW (a replacement)"
	case m.nodeFailed():
		return "FAILED: " + m.nuFailure
	case m.nodeUpdate == "" && m.version != capiToVersion:
		return "not started"
	}
	return fmt.Sprintf("unfinished (%s, NodeUpdate %s)", m.capiColumn(), m.nodeUpdateColumn())
}

// failureText is what an operator sees of a failed update on the Machine.
func (m *machineState) failureText() string {
	var lines []string
	if m.updating != "" {
		lines = append(lines, fmt.Sprintf("Cluster API, condition Updating=%s %s: %s", m.updating, m.updatingReason, m.updatingMsg))
	}
	if m.oursFailed != "" {
		lines = append(lines, fmt.Sprintf("capi-inplace, condition %s=True: %s", inplacev1.InPlaceUpgradeFailedCondition, m.oursFailed))
	}
	if m.nuFailure != "" {
		lines = append(lines, fmt.Sprintf("NodeUpdate %s: %s", m.nodeUpdate, m.nuFailure))
	}
	return strings.Join(lines, "\n")
}

// capiTracker samples the machines of the demo's Cluster; safe for concurrent use.
type capiTracker struct {
	d        *realCAPI
	workload client.Client

	mu       sync.Mutex
	machines []*machineState
	start    time.Time
	events   []string
	// hooksSeen is how many of the recorder's exchanges were read; calls counts them by
	// hook, updateCalls the UpdateMachine calls by machine.
	hooksSeen   int
	calls       map[string]int
	updateCalls map[string]int
}

func newCAPITracker(d *realCAPI) *capiTracker {
	t := &capiTracker{d: d, start: time.Now(), calls: map[string]int{}, updateCalls: map[string]int{}}
	for i := range d.before {
		m := &d.before[i]
		ms := &machineState{name: m.Name, node: m.Status.NodeRef.Name, controlPlane: capienv.IsControlPlane(m), kubelet: capiFromVersion, ready: true}
		t.readMachine(ms, m)
		t.machines = append(t.machines, ms)
	}
	// The calls made while the Cluster was provisioned are not the rollout's.
	t.hooksSeen = len(d.recorder.Exchanges(""))
	return t
}

func (t *capiTracker) sample(ctx context.Context) error {
	mc := t.d.env.Client
	list := &clusterv1.MachineList{}
	if err := mc.List(ctx, list, client.InNamespace(demoNamespace), client.MatchingLabels{clusterv1.ClusterNameLabel: capiClusterName}); err != nil {
		return err
	}
	nus := &inplacev1.NodeUpdateList{}
	if err := mc.List(ctx, nus, client.InNamespace(demoNamespace)); err != nil {
		return err
	}
	if t.workload == nil {
		wc, err := capienv.Workload(ctx, mc, t.d.env.Scheme, demoNamespace, capiClusterName)
		if err != nil {
			return err
		}
		t.workload = wc
	}
	nodes := &corev1.NodeList{}
	if err := t.workload.List(ctx, nodes); err != nil {
		return err
	}
	now := time.Now()

	newest := map[string]*inplacev1.NodeUpdate{}
	for i := range nus.Items {
		nu := &nus.Items[i]
		if cur := newest[nu.Spec.MachineName]; cur == nil || cur.CreationTimestamp.Before(&nu.CreationTimestamp) ||
			(cur.CreationTimestamp.Equal(&nu.CreationTimestamp) && cur.Name < nu.Name) {
			newest[nu.Spec.MachineName] = nu
		}
	}
	byNode := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byNode[nodes.Items[i].Name] = &nodes.Items[i]
	}
	byName := map[string]*clusterv1.Machine{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}

	// The hook calls are printed as steps, on a terminal too: they are what Cluster API
	// asked of capi-inplace.
	for _, call := range t.readHooks() {
		t.d.view.step(call)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	known := map[string]bool{}
	for _, m := range t.machines {
		known[m.name] = true
	}
	for i := range list.Items {
		m := &list.Items[i]
		if !known[m.Name] {
			ms := &machineState{name: m.Name, controlPlane: capienv.IsControlPlane(m), added: true, kubelet: "-"}
			t.machines = append(t.machines, ms)
			t.events = append(t.events, fmt.Sprintf("%-28s new machine: Cluster API is replacing one instead of updating it in place", m.Name))
		}
	}
	for _, ms := range t.machines {
		before := *ms
		m := byName[ms.name]
		if m == nil || !m.DeletionTimestamp.IsZero() {
			ms.deleted = true
		} else {
			t.readMachine(ms, m)
		}
		if n := byNode[ms.node]; n != nil && ms.node != "" {
			ms.kubelet, ms.ready = n.Status.NodeInfo.KubeletVersion, sim.NodeReady(n)
		}
		if nu := newest[ms.name]; nu != nil {
			ms.nodeUpdate, ms.phase, ms.step = nu.Name, nu.Status.Phase, nu.Status.CurrentStep
			ms.stepMsg = ""
			for _, s := range nu.Status.Steps {
				if s.Name == nu.Status.CurrentStep {
					ms.stepMsg = s.Message
				}
			}
			ms.nuFailure = nu.Status.FailureMessage
		}
		if ms.started.IsZero() && (ms.version != before.version || ms.updating == metav1.ConditionTrue || ms.nodeUpdate != "") && !before.done() {
			ms.started = now
		}
		if (ms.done() || ms.capiFailed()) && ms.ended.IsZero() && !ms.started.IsZero() {
			ms.ended = now
		}
		t.noteChange(&before, ms, now)
	}
	return nil
}

func (t *capiTracker) readMachine(ms *machineState, m *clusterv1.Machine) {
	ms.version = m.Spec.Version
	if m.Status.NodeRef.IsDefined() {
		ms.node = m.Status.NodeRef.Name
	}
	ms.updating, ms.updatingReason, ms.updatingMsg, ms.upToDate, ms.oursFailed = "", "", "", "", ""
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineUpdatingCondition); c != nil {
		ms.updating, ms.updatingReason, ms.updatingMsg = c.Status, c.Reason, c.Message
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineUpToDateCondition); c != nil {
		ms.upToDate = c.Status
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeFailedCondition); c != nil && c.Status == metav1.ConditionTrue {
		ms.oursFailed = c.Message
	}
}

// noteChange records, for the plain output, what changed on a machine, in the order it
// happens in a rollout.
func (t *capiTracker) noteChange(before, m *machineState, now time.Time) {
	var what []string
	if m.deleted && !before.deleted {
		what = append(what, "DELETED by Cluster API: replaced, not updated in place")
	}
	if m.version != before.version {
		what = append(what, fmt.Sprintf("Cluster API wrote spec.version %s", m.version))
	}
	if m.updating != before.updating || m.updatingReason != before.updatingReason {
		switch {
		case m.updating == metav1.ConditionTrue && m.updatingReason == clusterv1.MachineInPlaceUpdateFailedReason:
			what = append(what, "Cluster API: Updating, "+m.updatingReason)
		case m.updating == metav1.ConditionTrue:
			what = append(what, fmt.Sprintf("Cluster API: Updating (%s), calls the UpdateMachine hook", m.updatingReason))
		case before.updating == metav1.ConditionTrue:
			what = append(what, "Cluster API: update done (Updating=False)")
		}
	}
	if m.nodeUpdate != before.nodeUpdate {
		what = append(what, fmt.Sprintf("capi-inplace created NodeUpdate %s (updater %s)", m.nodeUpdate, t.d.updaterRef()))
	}
	if m.step != before.step && m.step != "" && m.phase == inplacev1.NodeUpdatePhaseInProgress {
		// Each step of the NodeUpdate as it starts: with the KubeadmUpdater, kubeadm's
		// phases on the node (Fetch, Upgrade, Drain, Kubelet, Uncordon).
		what = append(what, fmt.Sprintf("step %s: %s", m.step, m.stepMsg))
	}
	if !m.ready && before.ready {
		what = append(what, "node NotReady: being upgraded")
	}
	if m.phase != before.phase && m.phase.IsFinal() {
		switch m.phase {
		case inplacev1.NodeUpdatePhaseFailed:
			what = append(what, "NodeUpdate FAILED: "+m.nuFailure)
		default:
			what = append(what, "NodeUpdate "+string(m.phase))
		}
	}
	if m.ready && !before.ready {
		what = append(what, "node Ready again, kubelet "+m.kubelet)
	} else if m.kubelet != before.kubelet {
		what = append(what, "kubelet "+m.kubelet)
	}
	if m.oursFailed != "" && before.oursFailed == "" {
		what = append(what, fmt.Sprintf("capi-inplace: %s=True: %s", inplacev1.InPlaceUpgradeFailedCondition, m.oursFailed))
	}
	if m.upToDate != before.upToDate && m.upToDate == metav1.ConditionTrue {
		what = append(what, "Cluster API: UpToDate")
	}
	if m.done() && !before.done() && !m.started.IsZero() {
		what = append(what, "updated in place in "+formatDuration(m.elapsed(now)))
	}
	for _, w := range what {
		t.events = append(t.events, fmt.Sprintf("%-28s %s", m.name, w))
	}
}

func (t *capiTracker) takeEvents() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.events
	t.events = nil
	return out
}

// snapshot copies the machine states, control plane first.
func (t *capiTracker) snapshot() []machineState {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]machineState, 0, len(t.machines))
	for _, m := range t.machines {
		out = append(out, *m)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].controlPlane && !out[j].controlPlane })
	return out
}

func (t *capiTracker) count() (done, total int, frac float64) {
	sum := 0.0
	machines := t.snapshot()
	for i := range machines {
		sum += machines[i].progress()
		if machines[i].done() {
			done++
		}
	}
	if len(machines) > 0 {
		frac = sum / float64(len(machines))
	}
	return done, len(machines), frac
}

func (t *capiTracker) unit() string     { return "machines" }
func (t *capiTracker) began() time.Time { return t.start }

// allDone says every machine is at the new version, as Cluster API and the node say.
func (t *capiTracker) allDone() bool {
	done, total, _ := t.count()
	return total > 0 && done == total
}

// failed returns a machine whose node failed its upgrade.
func (t *capiTracker) failed() (machineState, bool) {
	for _, m := range t.snapshot() {
		if m.nodeFailed() {
			return m, true
		}
	}
	return machineState{}, false
}

// lines are a table: role, machine, Cluster API's conditions, the NodeUpdate, the node.
func (t *capiTracker) lines(v *view) []string {
	machines := t.snapshot()
	nameWidth := 7
	for i := range machines {
		nameWidth = max(nameWidth, len(machines[i].name))
	}
	now := time.Now()
	out := []string{v.style(dim, truncate(fmt.Sprintf("  %-13s %-*s   %-8s %-12s %-17s %-16s %7s", "", nameWidth, "MACHINE", "VERSION", "CAPI", "NODEUPDATE", "NODE", ""), v.width))}
	lastRole := ""
	for i := range machines {
		m := &machines[i]
		role := "workers"
		if m.controlPlane {
			role = "control plane"
		}
		shownRole := ""
		if role != lastRole {
			shownRole, lastRole = role, role
		}
		symbol, color := "·", dim
		switch {
		case m.done():
			symbol, color = "✔", green
		case m.nodeFailed() || m.deleted || m.added:
			symbol, color = "✘", red
		case m.progress() > 0:
			symbol, color = "▶", yellow
		}
		elapsed := ""
		if !m.started.IsZero() {
			elapsed = formatDuration(m.elapsed(now))
		}
		line := fmt.Sprintf("  %-13s %-*s %s %-8s %-12s %-17s %-16s %7s", shownRole, nameWidth, m.name, "%s", m.version, m.capiColumn(),
			truncate(m.nodeUpdateColumn(), 17), m.nodeColumn(), elapsed)
		// The symbol is styled after truncation, so that escapes are not cut.
		line = truncate(line, v.width)
		out = append(out, strings.Replace(line, "%s", v.style(color, symbol), 1))
	}
	return out
}

func (t *capiTracker) compactLines(v *view) []string {
	var out []string
	upgraded, waiting := 0, 0
	for _, m := range t.snapshot() {
		switch {
		case m.done():
			upgraded++
		case m.progress() == 0 && !m.nodeFailed():
			waiting++
		default:
			out = append(out, truncate(fmt.Sprintf("  %-28s %-12s %-17s %s", m.name, m.capiColumn(), m.nodeUpdateColumn(), m.nodeColumn()), v.width))
		}
	}
	return append(out, fmt.Sprintf("  %s %d upgraded   %s %d waiting", v.style(green, "✔"), upgraded, v.style(dim, "·"), waiting))
}

// readHooks says what hook calls Cluster API made since the last sample, a line each
// (UpdateMachine: its first call, its last and a failure).
func (t *capiTracker) readHooks() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var events []string
	all := t.d.recorder.Exchanges("")
	for _, e := range all[min(t.hooksSeen, len(all)):] {
		t.calls[e.Hook]++
		switch e.Hook {
		case "canupdatemachineset":
			req, resp := &runtimehooksv1.CanUpdateMachineSetRequest{}, &runtimehooksv1.CanUpdateMachineSetResponse{}
			if json.Unmarshal(e.Request, req) != nil || json.Unmarshal(e.Response, resp) != nil {
				continue
			}
			events = append(events, fmt.Sprintf("Cluster API asked CanUpdateMachineSet for MachineDeployment %s (MachineSet %s -> %s): %s",
				req.Desired.MachineSet.Labels[clusterv1.MachineDeploymentNameLabel], req.Current.MachineSet.Name, req.Desired.MachineSet.Name,
				verdict(resp.Status, resp.Message, func() (bool, []string, error) { return capisim.VerdictMachineSet(req, resp) })))
		case "canupdatemachine":
			req, resp := &runtimehooksv1.CanUpdateMachineRequest{}, &runtimehooksv1.CanUpdateMachineResponse{}
			if json.Unmarshal(e.Request, req) != nil || json.Unmarshal(e.Response, resp) != nil {
				continue
			}
			events = append(events, fmt.Sprintf("Cluster API asked CanUpdateMachine for %s: %s", req.Desired.Machine.Name,
				verdict(resp.Status, resp.Message, func() (bool, []string, error) { return capisim.VerdictMachine(req, resp) })))
		case "updatemachine":
			req, resp := &runtimehooksv1.UpdateMachineRequest{}, &runtimehooksv1.UpdateMachineResponse{}
			if json.Unmarshal(e.Request, req) != nil || json.Unmarshal(e.Response, resp) != nil {
				continue
			}
			name := req.Desired.Machine.Name
			t.updateCalls[name]++
			switch {
			case resp.Status == runtimehooksv1.ResponseStatusFailure:
				events = append(events, fmt.Sprintf("Cluster API called UpdateMachine for %s: answered Failure: %s", name, resp.Message))
			case t.updateCalls[name] == 1:
				events = append(events, fmt.Sprintf("Cluster API called UpdateMachine for %s (and again every %ds while capi-inplace answers in progress)", name, max(resp.RetryAfterSeconds, 1)))
			case resp.RetryAfterSeconds == 0:
				events = append(events, fmt.Sprintf("Cluster API called UpdateMachine for %s: answered done, after %d calls", name, t.updateCalls[name]))
			}
		}
	}
	t.hooksSeen = len(all)
	return events
}

// verdict says how Cluster API reads a CanUpdate answer (test/capisim applies its patches
// as Cluster API does): in place, or not.
func verdict(status runtimehooksv1.ResponseStatus, message string, read func() (bool, []string, error)) string {
	if status != runtimehooksv1.ResponseStatusSuccess {
		return fmt.Sprintf("answered %s: %s", status, message)
	}
	inPlace, left, err := read()
	switch {
	case err != nil:
		return "answered patches that do not apply: " + err.Error()
	case inPlace:
		return "capi-inplace answered with patches that make it in place"
	}
	return "capi-inplace answered without an in-place patch (" + strings.Join(left, ", ") + " left): Cluster API replaces"
}

// hookCounts says how many calls of each in-place hook Cluster API made during the rollout.
func (t *capiTracker) hookCounts() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("CanUpdateMachineSet %d, CanUpdateMachine %d, UpdateMachine %d",
		t.calls["canupdatemachineset"], t.calls["canupdatemachine"], t.calls["updatemachine"])
}

// hookCalls copies the count of calls by hook.
func (t *capiTracker) hookCalls() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for k, v := range t.calls {
		out[k] = v
	}
	return out
}
