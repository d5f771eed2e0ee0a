package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// The version bump of the orchestration benchmark.
const (
	orchFromVersion = "v1.35.0"
	orchToVersion   = "v1.36.0"
	// benchUpdaterName is the ConfigMap that stands for the bench's updater configuration.
	benchUpdaterName = "bench-updater"
)

// managerConcurrency is main.go's default --concurrency.
const managerConcurrency = 10

// benchUpdater is the bench's updater: by default the node work takes no time, so that
// what is measured is capi-inplace's own orchestration (UpgradeTask controller and
// NodeUpdate lifecycle) and nothing else; with a nodeTime (--orchestration-node-time) a
// node is done once that long has passed since the updater's first call for it, so that
// the upgrade goes no faster than the API server can carry. It writes nothing itself; it
// stamps when it was first called for each NodeUpdate, which is when a real updater would
// begin on the node.
type benchUpdater struct {
	nodeTime time.Duration

	mu    sync.Mutex
	first map[types.NamespacedName]time.Time
}

func newBenchUpdater(nodeTime time.Duration) *benchUpdater {
	return &benchUpdater{nodeTime: nodeTime, first: map[types.NamespacedName]time.Time{}}
}

func (u *benchUpdater) Reconcile(_ context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	now := time.Now()
	u.mu.Lock()
	key := types.NamespacedName{Namespace: nu.Namespace, Name: nu.Name}
	first, ok := u.first[key]
	if !ok {
		u.first[key], first = now, now
	}
	u.mu.Unlock()
	if left := u.nodeTime - now.Sub(first); left > 0 {
		return nodeupdater.Result{RequeueAfter: left}, nil
	}
	return nodeupdater.Result{Done: true}, nil
}

// firstCalls returns, in time order, when the updater was first called for each
// NodeUpdate of namespace ns.
func (u *benchUpdater) firstCalls(ns string) []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []time.Time
	for k, t := range u.first {
		if k.Namespace == ns {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

func (*benchUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) { return true, nil }

func (*benchUpdater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return nil
}

// orchResult is one upgrade of a MachineDeployment.
type orchResult struct {
	// clusters is how many Clusters were upgraded at once (1 but in the fleet section);
	// machines counts the machines of all of them.
	clusters                 int
	machines, maxUnavailable int
	// finished is false when the upgrade did not complete before the run's timeout.
	finished bool
	upgraded int
	// total is from the UpgradeTask's creation to its Completed phase.
	total time.Duration
	// firstStart is from the UpgradeTask's creation to its first NodeUpdate's.
	firstStart time.Duration
	// ending is the longest time from a task's last NodeUpdate success to its Completed
	// phase: its end (Machines released, taints removed, the last status).
	ending time.Duration
	// handoff is, for every NodeUpdate that succeeded while machines still waited, the
	// time from its success to the creation of the NodeUpdate that took its place.
	handoff latencies
	// updaterStart is, for the same successes, the time to the updater's first call for
	// the NodeUpdate that took its place (paired as handoff pairs creations): when the next
	// node's work begins, after whatever the NodeUpdate waits for once created.
	updaterStart latencies
	// nextStart is, for the same successes, the time to the first creation at or after
	// it: how soon the controller starts a node once one ended, whichever place it fills.
	nextStart latencies
	// maxRunning is the most NodeUpdates unfinished at once, as the watch saw them.
	maxRunning int
	// writes and reads are the manager's requests to the management API server by verb
	// and resource; workloadWrites and workloadReads its requests to the workload
	// cluster's (the upgrade-pending taints), which the writes per node leave out.
	writes      map[string]int
	writesTotal int
	// writeLatency is how long the manager's writes took, by verb and resource.
	writeLatency   map[string]latencies
	reads          map[string]int
	workloadWrites map[string]int
	workloadReads  map[string]int
	// reconciles counts the reconciles of each controller.
	reconciles map[string]int
	// events counts the Events in the namespace after the run by reason, each with the
	// number of times it occurred (an Event series counts every occurrence).
	events map[string]int
	// usage is the bench process's CPU time and memory while the upgrade ran.
	usage processUsage
	// apiServer is what the test API server spent over the same time.
	apiServer apiServerUsage
}

// apiServerCPUPerNode is the API server's CPU time per upgraded node.
func (r orchResult) apiServerCPUPerNode() time.Duration { return r.apiServer.per(r.upgraded).cpu }

// apiServerAllocatedPerNode is what the API server allocated per upgraded node, in bytes:
// its garbage collector runs once per so many bytes allocated.
func (r orchResult) apiServerAllocatedPerNode() float64 {
	return r.apiServer.per(r.upgraded).allocated
}

// apiServerText says what the API server spent on the run, for the console.
func (r orchResult) apiServerText() string {
	return fmt.Sprintf("API server %s ms CPU/node (%.2f cores), %.1f MB allocated/node, %s of its CPU in GC",
		ms(r.apiServerCPUPerNode()), r.apiServerCores(), r.apiServerAllocatedPerNode()/(1<<20), r.apiServer.gcShareText())
}

// apiServerCores is the API server's mean CPU use over the run, in cores.
func (r orchResult) apiServerCores() float64 {
	if r.usage.wall <= 0 {
		return 0
	}
	return r.apiServer.cpu.Seconds() / r.usage.wall.Seconds()
}

func (r orchResult) writesPerNode() float64 {
	if r.machines == 0 {
		return 0
	}
	return float64(r.writesTotal) / float64(r.machines)
}

// runOrchestration upgrades a MachineDeployment of n machines with maxUnavailable mu
// through the real UpgradeTask controller and NodeUpdate reconciler, wired as main.go
// wires them (default poll intervals, --concurrency 10, workload clients from the
// Cluster's kubeconfig Secret, Nodes from a cache per workload cluster), with an updater
// that finishes every node at once.
func runOrchestration(ctx context.Context, b *bench, n, mu int) (orchResult, error) {
	return runUpgrades(ctx, b, 1, n, mu, b.cfg.orchTimeout)
}

// benchCluster is one Cluster of an upgrade run: its namespace, its witness and its task.
type benchCluster struct {
	ns   string
	rec  *nodeUpdateRecorder
	task string
	// completed is when its task was seen Completed; zero if it was not.
	completed time.Time
}

// runUpgrades upgrades, at once and by one manager, the MachineDeployments of clusters
// Clusters of n machines each (each in a namespace of its own), every one with
// maxUnavailable mu, and measures the whole run: hand-offs pooled over the Clusters, the
// manager's requests, and the bench process's CPU time and memory (the manager runs in
// it). With more than one Cluster, each Cluster's workload cluster is the test API server
// seen through fleetView: its Node cache holds the Nodes of that Cluster only, as with a
// workload API server per Cluster.
func runUpgrades(ctx context.Context, b *bench, clusters, n, mu int, timeout time.Duration) (orchResult, error) {
	res := orchResult{clusters: clusters, machines: n * clusters, maxUnavailable: mu}
	c := b.client
	const clusterName = "bench"
	runs := make([]*benchCluster, clusters)
	namespaces := map[string]cache.Config{}
	for i := range runs {
		prefix := "bench-orch"
		if clusters > 1 {
			prefix = "bench-fleet"
		}
		ns, err := fixtures.Namespace(ctx, c, prefix)
		if err != nil {
			return res, err
		}
		runs[i] = &benchCluster{ns: ns}
		namespaces[ns] = cache.Config{}
		kubeconfig := b.kubeconfig
		if clusters > 1 {
			if kubeconfig, err = fleetKubeconfig(b.kubeconfig, ns); err != nil {
				return res, err
			}
		}
		if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: benchUpdaterName}}); err != nil {
			return res, err
		}
		if err := c.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: workloadcluster.KubeconfigSecretName(clusterName)},
			Data:       map[string][]byte{workloadcluster.KubeconfigSecretKey: kubeconfig},
		}); err != nil {
			return res, err
		}
		if err := createCluster(ctx, c, clusterShape{
			namespace: ns, name: clusterName, machines: n, version: orchFromVersion,
			annotations: map[string]string{inplacev1.UpdaterAnnotation: "ConfigMap/" + benchUpdaterName},
		}); err != nil {
			return res, err
		}
		defer func() {
			if err := deleteRun(ctx, c, ns); err != nil {
				b.printf("  (could not delete what the run left: %v)\n", err)
			}
		}()
		if runs[i].rec, err = watchNodeUpdates(ctx, b, ns, n); err != nil {
			return res, err
		}
		defer runs[i].rec.stop()
	}

	updater := newBenchUpdater(b.cfg.orchNodeTime)
	registry := nodeupdater.NewRegistry()
	if err := registry.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "ConfigMap"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater:   updater,
	}); err != nil {
		return res, err
	}
	counter, workloadCounter := newRequestCounter(), newRequestCounter()
	mgr, err := ctrl.NewManager(counter.wrap(managerRESTConfig(b.env.Config)), ctrl.Options{
		Scheme:                 b.env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		// main.go caches every namespace. Here earlier runs' objects sit in other
		// namespaces; caching only this run's keeps each run on its own, as on a
		// management cluster where nothing else is being upgraded.
		Cache: cache.Options{DefaultNamespaces: namespaces, DefaultTransform: cache.TransformStripManagedFields()},
	})
	if err != nil {
		return res, err
	}
	opts := controller.Options{MaxConcurrentReconciles: managerConcurrency}
	// Counting the workload cluster's requests changes nothing else of the clients; the
	// fleet's view (outermost) takes its path prefix off before they are counted.
	workloads := &workloadcluster.Clients{Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Configure: func(cfg *rest.Config) {
		workloadCounter.wrapInPlace(cfg)
		fleetView(cfg)
	}}
	if err := (&nodeupdater.Reconciler{Registry: registry}).SetupWithManager(mgr, opts); err != nil {
		return res, err
	}
	nodeCaches := &workloadcluster.NodeCaches{Clients: workloads}
	if err := mgr.Add(nodeCaches); err != nil {
		return res, err
	}
	if err := (&upgradetask.Reconciler{Registry: registry, Workload: nodeCaches}).SetupWithManager(ctx, mgr, opts); err != nil {
		return res, err
	}
	stop, err := startManager(ctx, mgr)
	if err != nil {
		return res, err
	}
	defer stop()
	// The controllers' informers are started and synced by now; what the manager wrote
	// while starting is not the upgrade's.
	sleep(ctx, 200*time.Millisecond)
	counter.reset()
	workloadCounter.reset()
	reconcilesBefore, err := reconcileTotals()
	if err != nil {
		return res, err
	}
	usage := startUsage(ctx)
	apiServerBefore, err := readAPIServerUsage(ctx, b)
	if err != nil {
		return res, err
	}

	requester := &upgraderequest.Requester{Client: c, Registry: registry}
	t0 := time.Now()
	for _, run := range runs {
		decision, err := requester.Request(ctx, upgraderequest.Request{
			Namespace: run.ns, ClusterName: clusterName,
			Target:         upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: mdName}},
			Version:        orchToVersion,
			MaxUnavailable: ptr.To(intstr.FromInt32(int32(mu))),
		})
		if err != nil {
			return res, err
		}
		if !decision.Accepted {
			return res, fmt.Errorf("the upgrade request of namespace %s was declined (%s): %s", run.ns, decision.Reason, decision.Message)
		}
		run.task = decision.TaskName
	}

	if b.cfg.apiserverProfile != "" {
		name := fmt.Sprintf("%s-%d-%d", b.cfg.apiserverProfile, n, mu)
		if clusters > 1 {
			name = fmt.Sprintf("%s-fleet-%dx%d-%d", b.cfg.apiserverProfile, clusters, n, mu)
		}
		go profileAPIServer(ctx, b, name)
	}
	// Watching the tasks themselves would add a decode of their whole status (an entry
	// per machine) at every write to the load measured; the NodeUpdates say when to look.
	deadline := t0.Add(timeout)
	res.finished = true
	for _, run := range runs {
		select {
		case <-run.rec.allSucceeded:
			if run.completed, err = waitTaskCompleted(ctx, c, run.ns, run.task, deadline); err != nil {
				return res, err
			}
		case <-time.After(time.Until(deadline)):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if run.completed.IsZero() {
			res.finished = false
			continue
		}
		res.total = max(res.total, run.completed.Sub(t0))
	}
	if !res.finished {
		res.total = 0
	}
	res.usage = usage.stop()
	apiServerAfter, err := readAPIServerUsage(ctx, b)
	if err != nil {
		return res, err
	}
	res.apiServer = apiServerAfter.since(apiServerBefore)
	// Trailing writes of the last node (its events, the task's last status) land.
	sleep(ctx, time.Second)
	res.writes, res.reads = split(counter.snapshot())
	res.writesTotal, _ = writeTotals(res.writes)
	res.writeLatency = counter.writeLatencies()
	res.workloadWrites, res.workloadReads = split(workloadCounter.snapshot())
	reconcilesAfter, err := reconcileTotals()
	if err != nil {
		return res, err
	}
	res.reconciles = map[string]int{}
	for name, n := range reconcilesAfter {
		res.reconciles[name] = n - reconcilesBefore[name]
	}

	res.events = map[string]int{}
	var handoff, next, updaterStart []time.Duration
	for _, run := range runs {
		events, err := eventsByReason(ctx, c, run.ns)
		if err != nil {
			return res, err
		}
		for k, v := range events {
			res.events[k] += v
		}
		created, succeeded, maxRunning := run.rec.results()
		res.upgraded += len(succeeded)
		if maxRunning > mu {
			return res, fmt.Errorf("%d NodeUpdates of namespace %s ran at once, more than maxUnavailable %d", maxRunning, run.ns, mu)
		}
		res.maxRunning = max(res.maxRunning, maxRunning)
		if len(succeeded) > 0 && !run.completed.IsZero() {
			res.ending = max(res.ending, run.completed.Sub(succeeded[len(succeeded)-1]))
		}
		if len(created) > 0 {
			res.firstStart = max(res.firstStart, created[0].Sub(t0))
		}
		handoff = append(handoff, handoffs(created, succeeded, mu)...)
		next = append(next, nextStarts(created, succeeded, mu)...)
		updaterStart = append(updaterStart, handoffs(updater.firstCalls(run.ns), succeeded, mu)...)
		if !run.completed.IsZero() && len(succeeded) != n {
			return res, fmt.Errorf("the task of namespace %s completed with %d of %d NodeUpdates succeeded", run.ns, len(succeeded), n)
		}
	}
	res.handoff = summarize(handoff)
	res.nextStart = summarize(next)
	res.updaterStart = summarize(updaterStart)
	return res, nil
}

// handoffs pairs each success with the creation it made room for: every success frees one
// of the mu places, so the k-th success (in time) lets the (mu+k)-th NodeUpdate be
// created. A success after which no machine waited has no hand-off.
func handoffs(created, succeeded []time.Time, mu int) []time.Duration {
	var out []time.Duration
	for k, s := range succeeded {
		if mu+k >= len(created) {
			break
		}
		out = append(out, max(created[mu+k].Sub(s), 0))
	}
	return out
}

// nextStarts is, for each success that handoffs pairs, the time to the first creation
// at or after it. created is in time order.
func nextStarts(created, succeeded []time.Time, mu int) []time.Duration {
	var out []time.Duration
	for k, s := range succeeded {
		if mu+k >= len(created) {
			break
		}
		i := sort.Search(len(created), func(i int) bool { return !created[i].Before(s) })
		if i == len(created) {
			break
		}
		out = append(out, created[i].Sub(s))
	}
	return out
}

// nodeUpdateRecorder is the bench's independent witness: a watch of the namespace's
// NodeUpdates that stamps when each was first seen and when it was first seen Succeeded.
type nodeUpdateRecorder struct {
	mu         sync.Mutex
	created    map[string]time.Time
	succeeded  map[string]time.Time
	phase      map[string]inplacev1.NodeUpdatePhase
	maxRunning int
	stop       func()
	// allSucceeded is closed once want NodeUpdates succeeded.
	allSucceeded chan struct{}
}

func watchNodeUpdates(ctx context.Context, b *bench, ns string, want int) (*nodeUpdateRecorder, error) {
	w, err := b.watchClient.Watch(ctx, &inplacev1.NodeUpdateList{}, client.InNamespace(ns))
	if err != nil {
		return nil, fmt.Errorf("watch NodeUpdates: %w", err)
	}
	rec := &nodeUpdateRecorder{created: map[string]time.Time{}, succeeded: map[string]time.Time{}, phase: map[string]inplacev1.NodeUpdatePhase{}, stop: w.Stop, allSucceeded: make(chan struct{})}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			nu, ok := ev.Object.(*inplacev1.NodeUpdate)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			rec.mu.Lock()
			if _, seen := rec.created[nu.Name]; !seen {
				rec.created[nu.Name] = now
			}
			if _, seen := rec.succeeded[nu.Name]; !seen && nu.Status.Phase == inplacev1.NodeUpdatePhaseSucceeded {
				rec.succeeded[nu.Name] = now
				if len(rec.succeeded) == want {
					close(rec.allSucceeded)
				}
			}
			rec.phase[nu.Name] = nu.Status.Phase
			running := 0
			for _, p := range rec.phase {
				if !p.IsFinal() {
					running++
				}
			}
			rec.maxRunning = max(rec.maxRunning, running)
			rec.mu.Unlock()
		}
	}()
	return rec, nil
}

// results returns the creation and success times, each sorted, and the most NodeUpdates
// seen unfinished at once.
func (r *nodeUpdateRecorder) results() (created, succeeded []time.Time, maxRunning int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.created {
		created = append(created, t)
	}
	for _, t := range r.succeeded {
		succeeded = append(succeeded, t)
	}
	slices.SortFunc(created, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(succeeded, func(a, b time.Time) int { return a.Compare(b) })
	return created, succeeded, r.maxRunning
}

// waitTaskCompleted polls the task until its phase is Completed and returns when it saw
// it so (to 10 ms); a zero time when the deadline passed first.
func waitTaskCompleted(ctx context.Context, c client.Client, ns, name string, deadline time.Time) (time.Time, error) {
	for time.Now().Before(deadline) {
		task := &inplacev1.UpgradeTask{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, task); err != nil {
			return time.Time{}, err
		}
		if task.Status.Phase == inplacev1.TaskPhaseCompleted {
			return time.Now(), nil
		}
		sleep(ctx, 10*time.Millisecond)
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Time{}, nil
}

// runOrchestrationBench runs every size and maxUnavailable.
func runOrchestrationBench(ctx context.Context, b *bench) ([]orchResult, error) {
	var out []orchResult
	for _, n := range b.cfg.orchSizes {
		for _, mu := range b.cfg.orchMaxUnavailable {
			r, err := runOrchestration(ctx, b, n, mu)
			if err != nil {
				return out, fmt.Errorf("upgrade of %d machines, maxUnavailable %d: %w", n, mu, err)
			}
			status := secs(r.total)
			if !r.finished {
				status = fmt.Sprintf("NOT FINISHED after %s (%d/%d upgraded)", b.cfg.orchTimeout, r.upgraded, n)
			}
			writes := fmt.Sprintf("%.1f writes/node", r.writesPerNode())
			if !r.finished {
				writes = fmt.Sprintf("%d writes", r.writesTotal)
			}
			b.printf("  %4d machines, maxUnavailable %2d: %s; first node after %s; hand-off p50 %s ms p99 %s ms (updater's start p50 %s ms p99 %s ms); ended %s ms after the last node; %s; %s\n",
				n, mu, status, secs(r.firstStart), ms(r.handoff.p50), ms(r.handoff.p99), ms(r.updaterStart.p50), ms(r.updaterStart.p99), ms(r.ending), writes,
				r.apiServerText())
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no orchestration run configured")
	}
	return out, nil
}

// eventsByReason counts the Events of a namespace by reason (events.k8s.io, as the
// manager records them), counting every occurrence of a series.
func eventsByReason(ctx context.Context, c client.Client, ns string) (map[string]int, error) {
	list := &eventsv1.EventList{}
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list Events: %w", err)
	}
	out := map[string]int{}
	for _, e := range list.Items {
		n := 1
		if e.Series != nil && e.Series.Count > 1 {
			n = int(e.Series.Count)
		}
		out[e.Regarding.Kind+" "+e.Reason] += n
	}
	return out, nil
}

// reconcileTotals sums controller-runtime's controller_runtime_reconcile_total by
// controller, over every result.
func reconcileTotals() (map[string]int, error) {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out, nil
}

// profileAPIServer writes a 30 s CPU profile of the test API server to file, for
// go tool pprof (kube-apiserver serves /debug/pprof to its administrators).
func profileAPIServer(ctx context.Context, b *bench, file string) {
	data, err := apiServerGet(ctx, b, "/debug/pprof/profile?seconds=30")
	if err == nil {
		err = os.WriteFile(file, data, 0o600)
	}
	if err != nil {
		_, _ = fmt.Fprintf(b.out, "  apiserver profile: %v\n", err)
	}
}

// apiServerMetrics returns the test API server's /metrics, in Prometheus text form.
func apiServerMetrics(ctx context.Context, b *bench) ([]byte, error) {
	return apiServerGet(ctx, b, "/metrics")
}

// apiServerGet returns the body of a GET of path from the test API server, as its
// administrator.
func apiServerGet(ctx context.Context, b *bench, path string) ([]byte, error) {
	hc, err := rest.HTTPClientFor(b.env.Config)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(b.env.Config.Host, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s from the API server: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s from the API server: %s", path, resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s from the API server: %w", path, err)
	}
	return data, nil
}
