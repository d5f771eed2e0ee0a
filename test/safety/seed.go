package safety

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// Options size one seed's run.
type Options struct {
	// Operations is how many random operations the random phase makes.
	Operations int
	// Settle bounds each of the two settle phases: first the world finishes by itself,
	// then what still runs is aborted and must stop.
	Settle time.Duration
	// Slack: see Topology.Slack.
	Slack time.Duration
}

// DefaultOptions are the options the test uses.
func DefaultOptions() Options {
	return Options{Operations: 30, Settle: 20 * time.Second, Slack: 300 * time.Millisecond}
}

// Result is what one seed did and found.
type Result struct {
	Seed       int64
	Operations map[string]int
	Duration   time.Duration
	Violations []Violation
	// Unsettled says why the seed did not settle within its bound; empty when it did.
	Unsettled string
	// Updates counts the NodeUpdates the updater started and how they ended.
	Updates map[string]int
	// Setup says what the seed set up before its operations (the gate, the drain policy).
	Setup string
	// History is the whole history, rendered.
	History *History
}

// Failed reports whether the seed found a violation or did not settle.
func (r *Result) Failed() bool { return len(r.Violations) > 0 || r.Unsettled != "" }

// Report renders the seed's failure: each violation with the history up to it, or why
// it did not settle with the whole history.
func (r *Result) Report() string {
	var b strings.Builder
	replay := fmt.Sprintf("SAFETY_SEED=%d go test ./test/safety -run 'TestSafety$' -count=1 -v", r.Seed)
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "seed %d: %s\nreplay: %s\nhistory up to the violation:\n%s\n", r.Seed, v, replay, r.History.Format(v.Seq))
	}
	if r.Unsettled != "" {
		fmt.Fprintf(&b, "seed %d did not settle: %s\nreplay: %s\nhistory:\n%s\n", r.Seed, r.Unsettled, replay, r.History.Format(0))
	}
	return b.String()
}

// Summary is one line about the seed.
func (r *Result) Summary() string {
	status := "ok"
	switch {
	case len(r.Violations) > 0:
		status = fmt.Sprintf("VIOLATION x%d", len(r.Violations))
	case r.Unsettled != "":
		status = "UNSETTLED"
	}
	var ops []string
	for _, k := range sortedKeys(r.Operations) {
		ops = append(ops, fmt.Sprintf("%s=%d", k, r.Operations[k]))
	}
	return fmt.Sprintf("seed %-6d %-14s %6.1fs  events=%-5d nodeupdates started=%d succeeded=%d failed=%d aborted=%d skipped=%d  %s ops: %s",
		r.Seed, status, r.Duration.Seconds(), r.History.Len(), r.Updates["started"], r.Updates["succeeded"], r.Updates["failed"], r.Updates["aborted"],
		r.Updates["skipped"], r.Setup, strings.Join(ops, " "))
}

// RunSeed builds a world for seed, runs the random phase and the settle phase, and
// returns what the Checker found.
func RunSeed(ctx context.Context, env *testenv.Environment, seed int64, opts Options) (*Result, error) {
	start := time.Now()
	rng := rand.New(rand.NewSource(seed))
	w, err := NewWorld(ctx, env, seed, rng, opts.Slack)
	if err != nil {
		return nil, err
	}
	// Some seeds have no node failures, some many.
	w.Updater.FailProbability = []float64{0, 0.1, 0.25}[rng.Intn(3)]
	// Under drainPolicy Skip, some drains stay blocked: the node is put back.
	w.Updater.SkipProbability = []float64{0.25, 0.5}[rng.Intn(2)]
	gateOn, clusterSkip := rng.Intn(2) == 0, rng.Intn(3) == 0
	w.History.Action("seed %d: namespace %s, node failure probability %.2f, skip probability under drainPolicy Skip %.2f, health gate on the Cluster %t, Cluster drain policy Skip %t",
		seed, w.ns, w.Updater.FailProbability, w.Updater.SkipProbability, gateOn, clusterSkip)
	if err := w.Watch(ctx); err != nil {
		return nil, err
	}
	if gateOn {
		if err := w.SetGate(ctx, true); err != nil {
			return nil, err
		}
	}
	if clusterSkip {
		if err := w.SetClusterDrainPolicy(ctx, true); err != nil {
			return nil, err
		}
	}
	defer w.StopWatches()
	witness, err := sim.WatchNodeUpdates(ctx, w.watcher, w.ns)
	if err != nil {
		return nil, err
	}
	defer witness.Stop()
	if err := w.StartManager(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = w.StopManager() }()

	d := &driver{w: w, rng: rng, capi: newCAPIPlayer(w), ops: map[string]int{}, gateOn: gateOn, clusterSkip: clusterSkip}
	if err := d.randomPhase(ctx, opts.Operations); err != nil {
		return nil, err
	}
	unsettled := d.settle(ctx, opts.Settle)
	if err := w.StopManager(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("stop manager: %w", err)
	}
	res := &Result{Seed: seed, Operations: d.ops, Duration: time.Since(start), Unsettled: unsettled, Updates: w.Updater.Counts(), History: w.History,
		Setup: fmt.Sprintf("setup: gate=%t skip-policy=%t", gateOn, clusterSkip)}
	if twice := witness.RunTwice(); len(twice) > 0 {
		w.History.Action("the NodeUpdate witness saw machines with two NodeUpdates running at once: %v", twice)
		res.Violations = append(res.Violations, Violation{Invariant: InvOneNodeUpdate, Seq: w.History.Len(),
			Message: fmt.Sprintf("sim.NodeUpdateWitness saw two NodeUpdates running at once on machines %v", twice)})
	}
	res.Violations = append(w.Checker.Violations(), res.Violations...)
	return res, nil
}

// driver makes the random operations of one seed.
type driver struct {
	w    *World
	rng  *rand.Rand
	capi *capiPlayer
	ops  map[string]int
	// async are the operations that run on (flaps, machine deletions).
	async     sync.WaitGroup
	deletions int
	// gateOn: the Cluster's gates annotation names the health gate; gateRed: its
	// ConfigMap is red (an operation turned it red for a while); clusterSkip: the
	// Cluster's drain-policy annotation is Skip.
	gateOn, clusterSkip bool
	gateRed             atomic.Bool
}

// errNothingToDo is an operation that found nothing to act on (no live task, no machine
// it may delete); it is not counted.
var errNothingToDo = errors.New("nothing to do")

type operation struct {
	name   string
	weight int
	do     func(ctx context.Context) error
}

func (d *driver) operations() []operation {
	return []operation{
		{"annotate", 14, d.annotate},
		{"unannotate", 3, d.unannotate},
		{"external", 12, d.externalRequest},
		{"capi", 8, d.capiBump},
		{"delete-task", 3, d.deleteTask},
		{"abort-task", 3, d.abortTask},
		{"flap", 14, d.flap},
		{"delete-machine", 3, d.deleteMachine},
		{"restart-manager", 4, d.restartManager},
		{"lag-machines", 4, d.lagMachines},
		{"gate", 3, d.toggleGate},
		{"gate-red", 10, d.redGate},
		{"skip-policy", 4, d.skipPolicy},
	}
}

// toggleGate gives every task of the Cluster the health gate, or takes it away (the
// Cluster's gates annotation).
func (d *driver) toggleGate(ctx context.Context) error {
	d.gateOn = !d.gateOn
	d.w.History.Action("health gate %s on the Cluster", map[bool]string{true: "set", false: "removed"}[d.gateOn])
	return d.w.SetGate(ctx, d.gateOn)
}

// redGate turns the health gate red for 500 to 3000 ms (the workload object it reads),
// then green again: no task of the Cluster may start a node meanwhile (invariant 9). The
// window is long against the Checker's gate slack (400 ms), so that a controller that
// starts nodes under a red gate is caught (a mutant that took every gate for green was
// caught in 4 of 10 seeds, against 1 of 10 with the former 200 to 1500 ms windows at
// weight 6).
func (d *driver) redGate(ctx context.Context) error {
	if d.gateRed.Load() {
		return errNothingToDo
	}
	dur := time.Duration(500+d.rng.Intn(2500)) * time.Millisecond
	d.w.History.Action("health gate red for %s (the gate on the Cluster: %t)", dur, d.gateOn)
	d.gateRed.Store(true)
	if err := d.w.SetGateRed(ctx, true); err != nil {
		d.gateRed.Store(false)
		return err
	}
	d.async.Add(1)
	go func() {
		defer d.async.Done()
		_ = sleep(ctx, dur)
		_ = d.w.SetGateRed(context.WithoutCancel(ctx), false)
		d.gateRed.Store(false)
	}()
	return nil
}

// skipPolicy gives a live task drainPolicy Skip (its spec: the nodes it has not started
// yet carry it), or sets or removes the Cluster's drain-policy annotation Skip (every task
// of the Cluster that sets none).
func (d *driver) skipPolicy(ctx context.Context) error {
	if d.rng.Intn(2) == 0 {
		t, err := d.randomTask(ctx)
		if err == nil {
			d.w.History.Action("UpgradeTask %s: spec.drainPolicy %s", t.Name, skipPolicyJSON)
			patch := map[string]any{"spec": map[string]any{"drainPolicy": map[string]any{"mode": string(inplacev1.DrainModeSkip), "gracePeriod": "1s"}}}
			return client.IgnoreNotFound(d.w.env.Client.Patch(ctx, t, client.RawPatch("application/merge-patch+json", mustJSON(patch))))
		}
		if !errors.Is(err, errNothingToDo) {
			return err
		}
	}
	d.clusterSkip = !d.clusterSkip
	d.w.History.Action("Cluster drain-policy annotation: %s", map[bool]string{true: skipPolicyJSON, false: "removed"}[d.clusterSkip])
	return d.w.SetClusterDrainPolicy(ctx, d.clusterSkip)
}

// lagMachines makes Cluster API's copy of new kubelet versions into the Machines lag the
// Nodes for a while (issue #34 point 1: a reader of the Machines alone would take a node
// that its NodeUpdate just upgraded for one still to upgrade, and upgrade it twice,
// invariant 4).
func (d *driver) lagMachines(ctx context.Context) error {
	lag := time.Duration(300+d.rng.Intn(1700)) * time.Millisecond
	window := time.Duration(500+d.rng.Intn(2500)) * time.Millisecond
	d.w.History.Action("Machines lag their Nodes' kubelet versions by %s for %s", lag, window)
	d.w.Kubelets.LagMachines(lag)
	d.async.Add(1)
	go func() {
		defer d.async.Done()
		_ = sleep(ctx, window)
		d.w.Kubelets.LagMachines(0)
		d.w.Kubelets.WaitMachines()
	}()
	return nil
}

func (d *driver) randomPhase(ctx context.Context, n int) error {
	ops := d.operations()
	total := 0
	for _, op := range ops {
		total += op.weight
	}
	for i := 0; i < n; i++ {
		pick := d.rng.Intn(total)
		for _, op := range ops {
			if pick < op.weight {
				err := op.do(ctx)
				if errors.Is(err, errNothingToDo) {
					break
				}
				if err != nil {
					return fmt.Errorf("%s: %w", op.name, err)
				}
				d.ops[op.name]++
				break
			}
			pick -= op.weight
		}
		if err := sleep(ctx, time.Duration(20+d.rng.Intn(230))*time.Millisecond); err != nil {
			return err
		}
	}
	d.async.Wait()
	return nil
}

// version picks a target version: mostly the next minor, so that control planes get
// there and workers follow; sometimes another build of it, or the minor after, which a
// control plane still at v1.33 refuses.
func (d *driver) version() string {
	switch p := d.rng.Intn(100); {
	case p < 60:
		return targetVersions[0]
	case p < 85:
		return targetVersions[1]
	default:
		return targetVersions[2]
	}
}

// subject is an object the cascade upgrades by annotation.
func (d *driver) subject(i int) client.Object {
	switch i {
	case 0:
		return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: d.w.ns, Name: clusterName}}
	case 1:
		return &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: d.w.ns, Name: controlPlane}}
	default:
		return &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: d.w.ns, Name: machineDeployments[i-2]}}
	}
}

func (d *driver) annotate(ctx context.Context) error {
	obj, v := d.subject(d.rng.Intn(4)), d.version()
	d.w.History.Action("annotate %T %s: in-place-upgrade-to=%s", obj, obj.GetName(), v)
	return setAnnotation(ctx, d.w.env.Client, obj, inplacev1.UpgradeToAnnotation, v)
}

func (d *driver) unannotate(ctx context.Context) error {
	obj := d.subject(d.rng.Intn(4))
	d.w.History.Action("remove in-place-upgrade-to from %T %s", obj, obj.GetName())
	return setAnnotation(ctx, d.w.env.Client, obj, inplacev1.UpgradeToAnnotation, "")
}

// setAnnotation sets (or removes, with "") one annotation with a merge patch.
func setAnnotation(ctx context.Context, c client.Client, obj client.Object, key, value string) error {
	var v any
	if value != "" {
		v = value
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: v}}}
	return client.IgnoreNotFound(c.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", mustJSON(patch))))
}

// externalRequest sends an ExternalUpgradeRequest for the control plane (maxUnavailable
// 1: more is refused by design) or a MachineDeployment (1 to 3).
func (d *driver) externalRequest(ctx context.Context) error {
	target := Targets()[d.rng.Intn(3)]
	v := d.version()
	mu := 1
	req := &hooksv1.ExternalUpgradeRequestRequest{}
	req.SetGroupVersionKind(hooksv1.GroupVersion.WithKind("ExternalUpgradeRequestRequest"))
	req.Cluster = clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: d.w.ns, Name: clusterName}}
	if target == controlPlane {
		req.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: controlPlane}
	} else {
		req.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: target}
		mu = 1 + d.rng.Intn(3)
	}
	req.NewMachineSpec.Version = v
	req.Options.MaxUnavailable = ptrTo(intstr.FromInt32(int32(mu)))
	resp := &hooksv1.ExternalUpgradeRequestResponse{}
	err := d.w.withHooks(func(_ *extension.InPlaceHooks, h *extension.ExternalUpgradeHandler) error {
		h.ExternalUpgradeRequest(ctx, req, resp)
		return nil
	})
	if errors.Is(err, errManagerDown) {
		d.w.History.Action("ExternalUpgradeRequest %s to %s maxUnavailable %d: manager down, not sent", target, v, mu)
		return nil
	}
	d.w.History.Action("ExternalUpgradeRequest %s to %s maxUnavailable %d: %s %s %s %s", target, v, mu, resp.Status, resp.Decision, resp.UpgradeTaskName, resp.Message)
	return err
}

func (d *driver) capiBump(ctx context.Context) error {
	v := d.version()
	mus := map[string]int{}
	for _, md := range machineDeployments {
		mus[md] = 1 + d.rng.Intn(3)
	}
	if !d.capi.Bump(ctx, v, mus) {
		d.w.History.Action("CAPI: topology version %s refused (a downgrade from %s)", v, d.capi)
		return nil
	}
	d.w.History.Action("CAPI: topology version bumped to %s, MachineDeployments' maxUnavailable %v", v, mus)
	return nil
}

func (d *driver) randomTask(ctx context.Context) (*inplacev1.UpgradeTask, error) {
	tasks, err := d.w.liveTasks(ctx)
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return nil, errNothingToDo
	}
	return &tasks[d.rng.Intn(len(tasks))], nil
}

func (d *driver) deleteTask(ctx context.Context) error {
	t, err := d.randomTask(ctx)
	if err != nil {
		return err
	}
	d.w.History.Action("delete UpgradeTask %s", t.Name)
	return client.IgnoreNotFound(d.w.env.Client.Delete(ctx, t))
}

func (d *driver) abortTask(ctx context.Context) error {
	t, err := d.randomTask(ctx)
	if err != nil {
		return err
	}
	d.w.History.Action("abort UpgradeTask %s (spec.phase Abort)", t.Name)
	return abortTask(ctx, d.w.env.Client, t)
}

func abortTask(ctx context.Context, c client.Client, t *inplacev1.UpgradeTask) error {
	patch := map[string]any{"spec": map[string]any{"phase": string(inplacev1.TaskActionAbort)}}
	return client.IgnoreNotFound(c.Patch(ctx, t, client.RawPatch("application/merge-patch+json", mustJSON(patch))))
}

// flap makes a random node NotReady for 50 to 800ms, as a kubelet that loses its API
// server connection for a moment; most flaps are shorter than the Checker's slack, some
// long enough for the controller to see them before it starts a node.
func (d *driver) flap(ctx context.Context) error {
	nodes := d.w.Nodes()
	node := nodes[d.rng.Intn(len(nodes))]
	dur := time.Duration(50+d.rng.Intn(750)) * time.Millisecond
	d.w.History.Action("flap node %s NotReady for %s", node, dur)
	d.async.Add(1)
	go func() {
		defer d.async.Done()
		if err := d.w.Kubelets.Hold(ctx, node, "flap", true); err != nil {
			return
		}
		d.w.History.Record(Event{Kind: EventWorldDown, Node: node, Why: "flap"})
		_ = sleep(ctx, dur)
		d.w.History.Record(Event{Kind: EventWorldUp, Node: node, Why: "flap"})
		_ = d.w.Kubelets.Hold(context.WithoutCancel(ctx), node, "flap", false)
	}()
	return nil
}

// deleteMachine deletes a machine as Cluster API does (scale down, remediation): the
// Machine gets its finalizer, is deleted, its node goes away (the infrastructure provider
// deletes the host), and the Machine controller removes the finalizer a moment later. At
// most two per seed, never the last machine of a target; no replacement is created.
func (d *driver) deleteMachine(ctx context.Context) error {
	if d.deletions >= 2 {
		return errNothingToDo
	}
	target := Targets()[d.rng.Intn(3)]
	machines := d.w.Machines(target)
	if len(machines) < 2 {
		return errNothingToDo
	}
	machine := machines[d.rng.Intn(len(machines))]
	node := d.w.nodeOf(machine)
	d.deletions++
	c := d.w.env.Client
	key := client.ObjectKey{Namespace: d.w.ns, Name: machine}
	const finalizer = "machine.cluster.x-k8s.io"
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, key, m); err != nil {
			return err
		}
		controllerutil.AddFinalizer(m, finalizer)
		return c.Update(ctx, m)
	}); err != nil {
		return err
	}
	if err := c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: d.w.ns, Name: machine}}); err != nil {
		return err
	}
	d.w.History.Record(Event{Kind: EventWorldDown, Node: node, Why: "machine " + machine + " deleting"})
	dur := time.Duration(100+d.rng.Intn(300)) * time.Millisecond
	d.async.Add(1)
	go func() {
		defer d.async.Done()
		ctx := context.WithoutCancel(ctx)
		_ = sleep(ctx, dur)
		d.w.Kubelets.Gone(node)
		d.w.machineDeleted(machine)
		if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err == nil || apierrors.IsNotFound(err) {
			d.w.History.Record(Event{Kind: EventNodeGone, Node: node})
			d.w.Volumes.NodeGone(d.rng2(), node, d.w.replicaTargets(), d.w.History)
		}
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			m := &clusterv1.Machine{}
			if err := c.Get(ctx, key, m); err != nil {
				return client.IgnoreNotFound(err)
			}
			controllerutil.RemoveFinalizer(m, finalizer)
			return c.Update(ctx, m)
		})
		d.w.History.Action("machine %s gone", machine)
	}()
	d.w.History.Action("delete machine %s (node %s goes in %s)", machine, node, dur)
	return nil
}

// rng2 is a generator for the asynchronous operations, so that they do not take from the
// plan's generator at moments that depend on timing.
func (d *driver) rng2() *rand.Rand { return rand.New(rand.NewSource(int64(d.deletions))) }

func (d *driver) restartManager(ctx context.Context) error {
	d.w.History.Action("stop the manager")
	if err := d.w.StopManager(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if err := sleep(ctx, time.Duration(d.rng.Intn(200))*time.Millisecond); err != nil {
		return err
	}
	d.w.History.Action("start the manager")
	return d.w.StartManager(ctx)
}

// settle stops the faults and lets the world end: first on its own (tasks finish, the
// CAPI rollout ends) within bound; then the CAPI rollout is stopped, every
// in-place-upgrade-to removed and every live task aborted, and everything must stop
// within bound again. It returns why the world did not settle, or "".
func (d *driver) settle(ctx context.Context, bound time.Duration) string {
	d.async.Wait()
	d.w.History.Action("settle: no more faults; waiting up to %s for the tasks to end", bound)
	why := d.waitSettled(ctx, bound, false)
	if why == "" {
		return ""
	}
	d.w.History.Action("settle: still running: %s; stopping the CAPI rollout, removing in-place-upgrade-to, aborting every live task", why)
	d.capi.Stop(ctx)
	for i := 0; i < 4; i++ {
		_ = setAnnotation(ctx, d.w.env.Client, d.subject(i), inplacev1.UpgradeToAnnotation, "")
	}
	return d.waitSettled(ctx, bound, true)
}

// idleBeforeAbort is how long the first settle phase waits without any NodeUpdate moving.
const idleBeforeAbort = 3 * time.Second

func (d *driver) waitSettled(ctx context.Context, bound time.Duration, abort bool) string {
	started := time.Now()
	deadline := started.Add(bound)
	for {
		why, err := d.unsettled(ctx, abort)
		if err == nil && why == "" {
			return ""
		}
		if err != nil {
			why = err.Error()
		}
		// Without abort, a world where no NodeUpdate moved for a while is waiting for
		// something that will not come by itself (a node a preflight check holds, a
		// worker waiting for a control plane that failed): the abort phase ends it.
		idle := min(d.w.History.SinceProgress(), time.Since(started))
		if time.Now().After(deadline) || ctx.Err() != nil || (!abort && idle > idleBeforeAbort) {
			return why
		}
		_ = sleep(ctx, 200*time.Millisecond)
	}
}

// unsettled says what still runs: live tasks, NodeUpdates not final, nodes in the
// updater's hands, a CAPI rollout, an annotation still asking. With abort, it aborts the
// live tasks it finds.
func (d *driver) unsettled(ctx context.Context, abort bool) (string, error) {
	var why []string
	tasks, err := d.w.liveTasks(ctx)
	if err != nil {
		return "", err
	}
	for i := range tasks {
		t := &tasks[i]
		held := ""
		for _, m := range t.Status.Machines {
			if m.Message != "" && m.State != inplacev1.MachineStateUpgraded {
				held = fmt.Sprintf(" (%s: %s)", m.Name, m.Message)
				break
			}
		}
		why = append(why, fmt.Sprintf("task %s %s %s%s", t.Name, t.Status.Phase, t.Status.Progress, held))
		if abort && t.Spec.Phase != inplacev1.TaskActionAbort {
			_ = abortTask(ctx, d.w.env.Client, t)
		}
	}
	nus := &inplacev1.NodeUpdateList{}
	if err := d.w.env.Client.List(ctx, nus, client.InNamespace(d.w.ns)); err != nil {
		return "", err
	}
	for _, nu := range nus.Items {
		if !nu.Status.Phase.IsFinal() {
			why = append(why, fmt.Sprintf("NodeUpdate %s %s", nu.Name, nu.Status.Phase))
		}
	}
	if n := d.w.Updater.Running(); n > 0 {
		why = append(why, fmt.Sprintf("%d NodeUpdates in the updater's hands", n))
	}
	if !abort && d.capi.Busy() {
		why = append(why, "the CAPI rollout runs")
	}
	for i := 0; i < 4; i++ {
		obj := d.subject(i)
		if err := d.w.env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err == nil {
			if v := obj.GetAnnotations()[inplacev1.UpgradeToAnnotation]; v != "" {
				why = append(why, fmt.Sprintf("%T %s asks for %s", obj, obj.GetName(), v))
			}
		}
	}
	sort.Strings(why)
	return strings.Join(why, "; "), nil
}

func semverLess(a, b string) bool {
	va, err1 := version.ParseSemantic(a)
	vb, err2 := version.ParseSemantic(b)
	return err1 == nil && err2 == nil && va.LessThan(vb)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func ptrTo[T any](v T) *T { return &v }

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}
