package safety

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/cascade"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The cluster every seed builds, and the versions it is upgraded between.
const (
	clusterName  = "harvester"
	controlPlane = "cp"
	fromVersion  = "v1.33.3+rke2r1"
	updaterRef   = "ConfigMap/updater"
)

var (
	machineDeployments = []string{"md-a", "md-b"}
	targetVersions     = []string{"v1.34.1+rke2r1", "v1.34.1+rke2r2", "v1.35.0+rke2r1"}
)

// World is one seed's cluster in its own namespace of the shared API server, with its
// simulators, its record, and the manager that runs the controllers for it.
type World struct {
	env     *testenv.Environment
	watcher client.WithWatch
	ns      string

	History  *History
	Checker  *Checker
	Kubelets *Kubelets
	Volumes  *Volumes
	Updater  *Updater

	// targetOf maps a node to its target; machineOf a node to its machine.
	targetOf  map[string]string
	machineOf map[string]string
	// members lists each target's machines, in creation order.
	members map[string][]string

	mu      sync.Mutex
	deleted map[string]bool

	mgrMu     sync.RWMutex
	mgrCancel context.CancelFunc
	mgrDone   chan error
	requester *upgraderequest.Requester
	hooks     *extension.InPlaceHooks
	external  *extension.ExternalUpgradeHandler

	stopWatches []func()
}

// NewWorld creates the seed's namespace and cluster: a Cluster whose updater is
// ConfigMap/updater, a KubeadmControlPlane of 3 machines, two MachineDeployments of 3,
// every node Ready at fromVersion, and volumes over the nodes.
func NewWorld(ctx context.Context, env *testenv.Environment, seed int64, rng *rand.Rand, slack time.Duration) (*World, error) {
	c := env.Client
	ns, err := fixtures.Namespace(ctx, c, fmt.Sprintf("safety-%d", seed))
	if err != nil {
		return nil, err
	}
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	w := &World{env: env, watcher: watcher, ns: ns, targetOf: map[string]string{}, machineOf: map[string]string{},
		members: map[string][]string{}, deleted: map[string]bool{}}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "updater"}}); err != nil {
		return nil, fmt.Errorf("create the updater's ConfigMap: %w", err)
	}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gateConfigMap, Labels: map[string]string{gateLabel: gateConfigMap}},
		Data: map[string]string{"state": "green"}}); err != nil {
		return nil, fmt.Errorf("create the health gate's ConfigMap: %w", err)
	}
	if _, err := fixtures.Cluster(ctx, c, ns, clusterName, controlPlane, map[string]string{inplacev1.UpdaterAnnotation: updaterRef}); err != nil {
		return nil, err
	}
	_, cpMachines, err := fixtures.ControlPlane(ctx, c, ns, clusterName, controlPlane, fromVersion, 3, false)
	if err != nil {
		return nil, err
	}
	all := map[string][]*clusterv1.Machine{controlPlane: cpMachines}
	for _, md := range machineDeployments {
		_, machines, err := fixtures.MachineDeployment(ctx, c, ns, clusterName, md, fromVersion, 3)
		if err != nil {
			return nil, err
		}
		all[md] = machines
	}
	initial := map[string]string{}
	var nodes, workers []string
	for _, target := range append([]string{controlPlane}, machineDeployments...) {
		for _, m := range all[target] {
			node := fixtures.NodeName(ns, m.Name)
			w.targetOf[node], w.machineOf[node] = target, m.Name
			w.members[target] = append(w.members[target], m.Name)
			initial[node] = fromVersion
			nodes = append(nodes, node)
			if target != controlPlane {
				workers = append(workers, node)
			}
		}
	}
	w.Kubelets = NewKubelets(c, ns)
	for node, machine := range w.machineOf {
		if err := w.Kubelets.SetVersion(ctx, machine, node, fromVersion); err != nil {
			return nil, fmt.Errorf("set the kubelet version of node %s: %w", node, err)
		}
	}
	w.Checker = NewChecker(Topology{TargetOf: w.targetOf, ControlPlane: controlPlane, Kubelet: initial, Slack: slack, GateSlack: slack + gateInterval})
	w.History = NewHistory(w.Checker)
	w.Volumes = PlaceVolumes(rng, nodes, workers, 4, w.History)
	w.Updater = NewUpdater(seed, initial)
	w.Updater.Client, w.Updater.Kubelets, w.Updater.Volumes, w.Updater.History = c, w.Kubelets, w.Volumes, w.History
	w.Updater.TargetOf, w.Updater.ControlPlane, w.Updater.TargetSize = w.targetOf, controlPlane, w.targetSize
	return w, nil
}

// The health gate a seed gives its Cluster's tasks: a CEL gate over a ConfigMap of the
// workload cluster (here the same API server), green while its data.state is "green".
const (
	gateConfigMap = "health"
	gateLabel     = "safety.capi-inplace.io/gate"
	gateName      = "safety-health"
	// gateInterval is how often the UpgradeTask controller evaluates a task's gates
	// again (the manager's --gate-interval, 20 s by default): short, so that a red gate is
	// seen within the Checker's gate slack.
	gateInterval = 100 * time.Millisecond
)

// gateAnnotation is the Cluster's gates annotation that gives every task of the Cluster
// the seed's health gate.
func (w *World) gateAnnotation() string {
	gates := []inplacev1.HealthGate{{Name: gateName, CEL: &inplacev1.CELGate{
		Resource: inplacev1.GateResource{APIVersion: "v1", Kind: "ConfigMap", Namespace: w.ns,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{gateLabel: gateConfigMap}}},
		Expression: `objects.size() == 1 && objects.all(o, has(o.data) && has(o.data.state) && o.data.state == "green")`,
	}}}
	return string(mustJSON(gates))
}

// SetGate gives every task of the Cluster the health gate (on) or takes it away, by the
// Cluster's gates annotation. The History records a gate set once the write went
// through, and a gate removed before it is written: the Checker judges a gate from when
// the controller can have seen it until it can have stopped seeing it.
func (w *World) SetGate(ctx context.Context, on bool) error {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: clusterName}}
	if !on {
		w.History.Record(Event{Kind: EventGate, Phase: "removed", Why: "Cluster annotation " + inplacev1.GatesAnnotation + " removed"})
		return setAnnotation(ctx, w.env.Client, cluster, inplacev1.GatesAnnotation, "")
	}
	if err := setAnnotation(ctx, w.env.Client, cluster, inplacev1.GatesAnnotation, w.gateAnnotation()); err != nil {
		return err
	}
	w.History.Record(Event{Kind: EventGate, Phase: "set", Why: "Cluster annotation " + inplacev1.GatesAnnotation + " names gate " + gateName})
	return nil
}

// SetGateRed turns the gate's ConfigMap red or green. Red is recorded once written, green
// before it is written (as SetGate).
func (w *World) SetGateRed(ctx context.Context, red bool) error {
	state := "green"
	if red {
		state = "red"
	} else {
		w.History.Record(Event{Kind: EventGate, Phase: "green", Why: "ConfigMap " + gateConfigMap + " data.state=green"})
	}
	patch := map[string]any{"data": map[string]any{"state": state}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: gateConfigMap}}
	if err := w.env.Client.Patch(ctx, cm, client.RawPatch("application/merge-patch+json", mustJSON(patch))); err != nil {
		return err
	}
	if red {
		w.History.Record(Event{Kind: EventGate, Phase: "red", Why: "ConfigMap " + gateConfigMap + " data.state=red"})
	}
	return nil
}

// SetClusterDrainPolicy sets the Cluster's drain-policy annotation to mode Skip (skip) or
// removes it: the policy of every task of the Cluster that sets none of its own.
func (w *World) SetClusterDrainPolicy(ctx context.Context, skip bool) error {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: clusterName}}
	value := ""
	if skip {
		value = skipPolicyJSON
	}
	return setAnnotation(ctx, w.env.Client, cluster, inplacev1.DrainPolicyAnnotation, value)
}

// skipPolicyJSON is the drain policy Skip the seed gives tasks; the simulated updater
// decides when a drain stays blocked past the grace period, so its length is not waited.
const skipPolicyJSON = `{"mode":"Skip","gracePeriod":"1s"}`

// Nodes lists the nodes that exist, sorted.
func (w *World) Nodes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for node, m := range w.machineOf {
		if !w.deleted[m] {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// replicaTargets lists the nodes Longhorn could rebuild a replica on: those that exist,
// are up, and are not being upgraded (cordoned by the updater).
func (w *World) replicaTargets() []string {
	var out []string
	for _, node := range w.Nodes() {
		if !w.Kubelets.Down(node) && !w.Updater.Upgrading(node) {
			out = append(out, node)
		}
	}
	return out
}

// Machines lists the target's machines that were not deleted.
func (w *World) Machines(target string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, m := range w.members[target] {
		if !w.deleted[m] {
			out = append(out, m)
		}
	}
	return out
}

func (w *World) targetSize(target string) int { return len(w.Machines(target)) }

// StartManager runs the controllers for the world's namespace, wired as main.go wires
// them: the NodeUpdate reconciler with the simulated updater for ConfigMap configurations,
// the UpgradeTask controller reading the Nodes from the same API server, the cascade, and
// the hooks' handlers, with short poll intervals and a cache of the namespace only.
func (w *World) StartManager(ctx context.Context) error {
	w.mgrMu.Lock()
	defer w.mgrMu.Unlock()
	mgr, err := ctrl.NewManager(w.env.Config, ctrl.Options{
		Scheme:                 w.env.Scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	registry := nodeupdater.NewRegistry()
	if err := registry.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "ConfigMap"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater:   w.Updater,
	}); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	opts := controller.Options{MaxConcurrentReconciles: 2}
	if err := (&nodeupdater.Reconciler{
		Registry: registry, PollInterval: 50 * time.Millisecond, UpdaterRecheckInterval: 200 * time.Millisecond,
		RetryBaseDelay: 100 * time.Millisecond, RetryMaxDelay: time.Second,
	}).SetupWithManager(mgr, opts); err != nil {
		cancel()
		return err
	}
	if err := (&upgradetask.Reconciler{Registry: registry, Workload: upgradetask.SameCluster{Management: w.env.Client}, PollInterval: 200 * time.Millisecond,
		GateInterval: gateInterval}).
		SetupWithManager(mctx, mgr, opts); err != nil {
		cancel()
		return err
	}
	requester := &upgraderequest.Requester{Client: mgr.GetClient(), TaskReader: mgr.GetAPIReader(), Registry: registry,
		Recorder: mgr.GetEventRecorder("capi-inplace-requests")}
	if err := (&cascade.UpgradeCascade{Requester: requester, PollInterval: 200 * time.Millisecond}).SetupWithManager(mctx, mgr, opts); err != nil {
		cancel()
		return err
	}
	if err := extension.IndexNodeUpdates(mctx, mgr.GetFieldIndexer()); err != nil {
		cancel()
		return err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		cancel()
		return errors.Join(errors.New("the manager's cache did not sync"), <-done)
	}
	w.mgrCancel, w.mgrDone = cancel, done
	w.requester = requester
	w.hooks = &extension.InPlaceHooks{Client: mgr.GetClient(), Requester: requester, Registry: registry}
	w.external = extension.NewExternalUpgradeHandler(requester)
	return nil
}

// StopManager stops the manager and waits until it stopped.
func (w *World) StopManager() error {
	w.mgrMu.Lock()
	defer w.mgrMu.Unlock()
	if w.mgrCancel == nil {
		return nil
	}
	w.mgrCancel()
	err := <-w.mgrDone
	w.mgrCancel, w.mgrDone, w.requester, w.hooks, w.external = nil, nil, nil, nil, nil
	return err
}

// withHooks runs call with the running manager's handlers; errManagerDown while the
// manager restarts.
func (w *World) withHooks(call func(*extension.InPlaceHooks, *extension.ExternalUpgradeHandler) error) error {
	w.mgrMu.RLock()
	defer w.mgrMu.RUnlock()
	if w.hooks == nil {
		return errManagerDown
	}
	return call(w.hooks, w.external)
}

var errManagerDown = errors.New("the manager is restarting")

// Watch starts the independent watches of the namespace's NodeUpdates and UpgradeTasks,
// whose events go into the history.
func (w *World) Watch(ctx context.Context) error {
	for _, list := range []client.ObjectList{&inplacev1.NodeUpdateList{}, &inplacev1.UpgradeTaskList{}} {
		// A watch the API server ends is followed again from where it stopped, so the
		// history misses no change (sim.Follow).
		f, err := sim.Follow(ctx, w.watcher, list, w.recordWatched, client.InNamespace(w.ns))
		if err != nil {
			return fmt.Errorf("watch in %s: %w", w.ns, err)
		}
		w.stopWatches = append(w.stopWatches, f.Stop)
	}
	return nil
}

func (w *World) recordWatched(ev watch.Event) {
	deleted := ev.Type == watch.Deleted
	switch o := ev.Object.(type) {
	case *inplacev1.NodeUpdate:
		w.History.Record(Event{Kind: EventWatchNodeUpdate, NodeUpdate: o.Name, Node: o.Spec.NodeName, Machine: o.Spec.MachineName, Task: ownerTask(o.OwnerReferences),
			Version: o.Spec.Version, Phase: string(o.Status.Phase), Deleted: deleted, Why: string(o.Spec.Phase) + abortReason(o)})
	case *inplacev1.UpgradeTask:
		target := upgraderequest.TargetOf(o).Name()
		mu := ""
		if o.Spec.MaxUnavailable != nil {
			mu = " maxUnavailable=" + o.Spec.MaxUnavailable.String()
		}
		w.History.Record(Event{Kind: EventWatchTask, Task: o.Name, Target: target, Version: o.Spec.Version, Phase: string(o.Status.Phase),
			Deleted: deleted || !o.DeletionTimestamp.IsZero(), Why: string(o.Spec.Pacing) + " " + string(o.Spec.Phase) + mu})
	}
}

func abortReason(nu *inplacev1.NodeUpdate) string {
	if nu.Spec.AbortReason == "" {
		return ""
	}
	return " (" + nu.Spec.AbortReason + ")"
}

func ownerTask(refs []metav1.OwnerReference) string {
	for _, r := range refs {
		if r.Kind == "UpgradeTask" {
			return r.Name
		}
	}
	return ""
}

// StopWatches ends the watches.
func (w *World) StopWatches() {
	for _, stop := range w.stopWatches {
		stop()
	}
}

// machineDeleted records that machine and its node are gone.
func (w *World) machineDeleted(machine string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleted[machine] = true
}

func (w *World) isDeleted(machine string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleted[machine]
}

func (w *World) nodeOf(machine string) string { return fixtures.NodeName(w.ns, machine) }

// Targets lists the control plane and the MachineDeployments.
func Targets() []string { return append([]string{controlPlane}, machineDeployments...) }

// liveTasks lists the namespace's tasks that have not ended.
func (w *World) liveTasks(ctx context.Context) ([]inplacev1.UpgradeTask, error) {
	list := &inplacev1.UpgradeTaskList{}
	if err := w.env.Client.List(ctx, list, client.InNamespace(w.ns)); err != nil {
		return nil, err
	}
	var out []inplacev1.UpgradeTask
	for _, t := range list.Items {
		if !t.Status.Phase.IsFinal() || !t.DeletionTimestamp.IsZero() {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b inplacev1.UpgradeTask) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out, nil
}
