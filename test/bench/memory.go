package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/jobupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// memResult is the manager's memory with a given number of Clusters, Machines and Nodes.
type memResult struct {
	clusters, machines, nodes int
	// rss is the median of VmRSS samples once the manager settled; peak is VmHWM.
	rss, peak uint64
	// heapInUse is go_memstats_heap_inuse_bytes from the manager's /metrics (no GC forced).
	heapInUse uint64
	// startup is from the process start to its controllers' workers running.
	startup time.Duration

	// The same readings, from the same manager, once it caches the workload cluster's
	// Nodes (see cacheNodes): all of the API server's Nodes, the nodes field.
	rssCached, peakCached, heapCached uint64
	// planned is from the dry-run UpgradeTask's creation to its Planned phase: the
	// manager's first list of the Nodes into its cache and the plan.
	planned time.Duration
}

// rssMax is the larger of the two VmRSS figures: what the manager needs once it also
// caches Nodes, as it does while an UpgradeTask runs.
func (r memResult) rssMax() uint64 { return max(r.rss, r.rssCached) }

// runMemoryBench creates Clusters of machinesPerCluster Machines (each with its Node) in
// steps up to the largest size asked, and at each size starts the real manager binary as a
// process (test/manager), lets it fill its cache and settle, and reads its VmRSS from
// /proc; then makes the same manager cache the workload cluster's Nodes (cacheNodes) and
// reads it again. Each size gets a fresh manager, so every figure is a manager that
// started with that many objects.
func runMemoryBench(ctx context.Context, b *bench) ([]memResult, error) {
	bin := b.cfg.managerBinary
	if bin == "" {
		b.printf("  building the manager binary...\n")
		var err error
		if bin, err = manager.Build(ctx, b.env.RepoRoot, b.tempDir("manager-bin")); err != nil {
			return nil, err
		}
	}
	certs, err := manager.NewServingCerts(b.tempDir("manager-certs"))
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(b.tempDir("manager-kubeconfig"), "kubeconfig")
	if err := os.WriteFile(kubeconfig, b.kubeconfig, 0o600); err != nil {
		return nil, err
	}

	sizes := slices.Clone(b.cfg.memClusters)
	slices.Sort(sizes)
	var out []memResult
	var nodes *nodeCacheTask
	created := 0
	for _, clusters := range sizes {
		start := time.Now()
		for ; created < clusters; created++ {
			ns, err := fixtures.Namespace(ctx, b.client, fmt.Sprintf("bench-mem-%02d", created+1))
			if err != nil {
				return out, err
			}
			name := fmt.Sprintf("cluster-%02d", created+1)
			if err := createCluster(ctx, b.client, clusterShape{namespace: ns, name: name, machines: b.cfg.machinesPerCluster, version: orchFromVersion}); err != nil {
				return out, err
			}
			if nodes == nil {
				if nodes, err = newNodeCacheTask(ctx, b, ns, name); err != nil {
					return out, err
				}
			}
		}
		b.printf("  %d clusters of %d machines and nodes in the API server (created in %s)\n", clusters, b.cfg.machinesPerCluster, secs(time.Since(start)))
		r, err := measureManager(ctx, b, bin, kubeconfig, certs.Dir, nodes)
		if err != nil {
			return out, err
		}
		r.clusters, r.machines, r.nodes = clusters, clusters*b.cfg.machinesPerCluster, clusters*b.cfg.machinesPerCluster
		b.printf("  %5d machines: VmRSS %s (peak %s), Go heap in use %s, ready in %s; with the %d Nodes cached: VmRSS %s (peak %s), Go heap in use %s, planned in %s\n",
			r.machines, mib(r.rss), mib(r.peak), mib(r.heapInUse), secs(r.startup), r.nodes, mib(r.rssCached), mib(r.peakCached), mib(r.heapCached), secs(r.planned))
		out = append(out, r)
	}
	return out, nil
}

// measureManager runs the manager until its controllers run and its memory settles, and
// reads its memory; then has it cache the workload cluster's Nodes through nodes, and
// reads its memory again.
func measureManager(ctx context.Context, b *bench, bin, kubeconfig, certDir string, nodes *nodeCacheTask) (memResult, error) {
	var r memResult
	logFile := filepath.Join(b.tempDir("manager-log"), "manager.log")
	started := time.Now()
	p, err := manager.Start(manager.Options{Binary: bin, Kubeconfig: kubeconfig, CertDir: certDir, LogFile: logFile})
	if err != nil {
		return r, err
	}
	defer func() { _ = p.Stop() }()
	if err := p.WaitReady(2 * time.Minute); err != nil {
		return r, fmt.Errorf("%w; its log is %s", err, logFile)
	}
	pid, err := findProcess(bin)
	if err != nil {
		return r, err
	}
	// Controllers start their workers once their caches synced: wait for the number of
	// "Starting workers" lines to stop growing for memQuiet.
	last, stableSince := -1, time.Now()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		data, _ := os.ReadFile(logFile)
		n := bytes.Count(data, []byte(`"Starting workers"`))
		if n != last {
			last, stableSince = n, time.Now()
		}
		if n > 0 && time.Since(stableSince) >= b.cfg.memQuiet {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the manager's controllers did not start within 3 minutes; its log is %s", logFile)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	r.startup = stableSince.Sub(started)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricsPort)
	// Let the start-up garbage be collected, then sample.
	sleep(ctx, b.cfg.memSettle)
	if r.rss, r.peak, r.heapInUse, err = sampleMemory(ctx, b, pid, metricsURL); err != nil {
		return r, err
	}

	// The same manager, now with the Nodes in its cache.
	if r.planned, err = nodes.cacheNodes(ctx, b); err != nil {
		return r, fmt.Errorf("%w; the manager's log is %s", err, logFile)
	}
	sleep(ctx, b.cfg.memSettle)
	if r.rssCached, r.peakCached, r.heapCached, err = sampleMemory(ctx, b, pid, metricsURL); err != nil {
		return r, err
	}
	// The peak is since the manager's start: the first reads count too.
	r.peakCached = max(r.peakCached, r.peak)
	// The manager releases the task (its finalizer) before it stops.
	if err := nodes.remove(ctx, b); err != nil {
		return r, fmt.Errorf("%w; the manager's log is %s", err, logFile)
	}
	return r, nil
}

// sampleMemory reads VmRSS five times memSampleEvery apart (the median), then VmHWM and
// the Go heap in use. The peak is the highest of every VmHWM and VmRSS read: since Linux
// 6.2 both come from the mm's per-CPU RSS counters read without summing (approximate by
// up to a batch per CPU), and the high-water mark behind VmHWM is raised only when pages
// are unmapped, so a VmHWM read after a VmRSS read can be below it (CI saw a median VmRSS
// of 85,192,704 bytes and a later VmHWM of 84,951,040).
func sampleMemory(ctx context.Context, b *bench, pid int, metricsURL string) (rss, peak, heapInUse uint64, err error) {
	var reads []memRead
	read := func() error {
		r, hwm, err := procMemory(pid)
		reads = append(reads, memRead{rss: r, hwm: hwm})
		return err
	}
	for i := range 5 {
		if i > 0 {
			sleep(ctx, b.cfg.memSampleEvery)
		}
		if err := read(); err != nil {
			return 0, 0, 0, err
		}
	}
	// One more read for the peak.
	if err := read(); err != nil {
		return 0, 0, 0, err
	}
	rss, peak = summarizeMemory(reads[:5], reads)
	heapInUse, _ = metricValue(metricsURL, "go_memstats_heap_inuse_bytes")
	return rss, peak, heapInUse, nil
}

// memRead is one read of /proc/<pid>/status: VmRSS and VmHWM, in bytes.
type memRead struct{ rss, hwm uint64 }

// summarizeMemory gives the median VmRSS of samples and the peak over all reads: the
// highest VmHWM or VmRSS any of them showed.
func summarizeMemory(samples, all []memRead) (median, peak uint64) {
	rss := make([]uint64, 0, len(samples))
	for _, s := range samples {
		rss = append(rss, s.rss)
	}
	slices.Sort(rss)
	if len(rss) > 0 {
		median = rss[len(rss)/2]
	}
	for _, r := range all {
		peak = max(peak, r.rss, r.hwm)
	}
	return median, peak
}

// memTaskTimeout bounds the wait for the dry-run task's plan and for its deletion. The
// manager lists the Nodes within 10 s or retries at its next poll (15 s), so this is
// several retries.
const memTaskTimeout = 3 * time.Minute

// nodeCacheTask makes the manager cache Nodes as it does in production: the UpgradeTask
// controller lists the Nodes of a task's workload cluster through the manager's Node
// cache (workloadcluster.NodeCaches) at every reconcile, and the cache is started by the
// first such list. A dry-run UpgradeTask of one Cluster's MachineDeployment is enough: it
// plans (every preflight check of every machine, NodeReady reading the machine's Node)
// without starting a node or writing a Machine, and its plan is refreshed at every poll,
// which keeps the cache read.
//
// Every Cluster's workload cluster is the test API server itself (the Secret holds the
// bench's kubeconfig), and Nodes are cluster-scoped: the cache of that one Cluster holds
// every Node of the server, machinesPerCluster × Clusters of them, the number of Node
// objects one cache per Cluster would hold on a management cluster whose Clusters each
// have their own API server.
type nodeCacheTask struct {
	namespace, cluster string
	requester          *upgraderequest.Requester
	// task is the name of the live task, once created.
	task string
}

// memUpdaterName is the JobUpdater the dry-run tasks name. A dry run starts no Job: the
// JobUpdater has no preflight checks, and its image is never pulled.
const memUpdaterName = "bench-nodes"

// newNodeCacheTask gives the Cluster namespace/cluster what an UpgradeTask of it needs:
// its kubeconfig Secret (the test API server) and a JobUpdater. Neither is in the
// manager's cache (it reads kubeconfig Secrets from the API server, and updater
// configurations only for a task), so the figures without a task stay without Nodes.
func newNodeCacheTask(ctx context.Context, b *bench, namespace, cluster string) (*nodeCacheTask, error) {
	if err := b.client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: workloadcluster.KubeconfigSecretName(cluster)},
		Data:       map[string][]byte{workloadcluster.KubeconfigSecretKey: b.kubeconfig},
	}); err != nil {
		return nil, fmt.Errorf("create the kubeconfig Secret of Cluster %s/%s: %w", namespace, cluster, err)
	}
	if err := b.client.Create(ctx, &inplacev1.JobUpdater{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: memUpdaterName},
		Spec:       inplacev1.JobUpdaterSpec{Image: "registry.example/node-upgrade:v1"},
	}); err != nil {
		return nil, fmt.Errorf("create JobUpdater %s/%s: %w", namespace, memUpdaterName, err)
	}
	// The Requester checks the updater against the updaters the manager runs; only the
	// JobUpdater's kind matters here, as the bench never runs it.
	registry := nodeupdater.NewRegistry()
	if err := registry.Register((&jobupdater.Updater{}).Registration()); err != nil {
		return nil, err
	}
	return &nodeCacheTask{namespace: namespace, cluster: cluster, requester: &upgraderequest.Requester{Client: b.client, Registry: registry}}, nil
}

// cacheNodes asks, as ExternalUpgradeRequest does, for a dry-run upgrade of the Cluster's
// MachineDeployment, and waits until the manager planned it with every machine's Node
// found. It returns how long that took.
//
// The task lives only while one manager is measured (remove deletes it): a task kept
// across sizes would be reconciled by the next size's manager as soon as it starts, and
// its first figures would no longer be without Nodes.
func (t *nodeCacheTask) cacheNodes(ctx context.Context, b *bench) (time.Duration, error) {
	watchesBefore, err := nodeWatches(ctx, b)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	d, err := t.requester.Request(ctx, upgraderequest.Request{
		Namespace: t.namespace, ClusterName: t.cluster,
		Target:     upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: mdName}},
		Version:    orchToVersion,
		UpdaterRef: &inplacev1.UpdaterReference{Kind: inplacev1.JobUpdaterKind, Name: memUpdaterName},
		DryRun:     true,
	})
	if err != nil {
		return 0, fmt.Errorf("request a dry-run upgrade of Cluster %s/%s: %w", t.namespace, t.cluster, err)
	}
	if !d.Accepted {
		return 0, fmt.Errorf("the dry-run upgrade request of Cluster %s/%s was declined (%s): %s", t.namespace, t.cluster, d.Reason, d.Message)
	}
	t.task = d.TaskName
	key := client.ObjectKey{Namespace: t.namespace, Name: d.TaskName}
	deadline := time.Now().Add(memTaskTimeout)
	for {
		task := &inplacev1.UpgradeTask{}
		if err := b.client.Get(ctx, key, task); err != nil {
			return 0, fmt.Errorf("read UpgradeTask %s: %w", key, err)
		}
		if task.Status.Phase == inplacev1.TaskPhasePlanned && task.Status.ObservedGeneration == task.Generation {
			if err := checkPlan(task, b.cfg.machinesPerCluster); err != nil {
				return 0, err
			}
			break
		}
		if time.Now().After(deadline) {
			why := ""
			if c := meta.FindStatusCondition(task.Status.Conditions, inplacev1.ProgressingCondition); c != nil {
				why = fmt.Sprintf(" (Progressing: %s)", c.Message)
			}
			return 0, fmt.Errorf("the dry-run UpgradeTask %s was not Planned within %s: phase %q%s", key, memTaskTimeout, task.Status.Phase, why)
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	planned := time.Since(start)
	// The plan shows the manager read the Nodes; the watch shows it reads them from its
	// cache, not from the API server (as it does while a Node watch fails).
	watchesAfter, err := nodeWatches(ctx, b)
	if err != nil {
		return 0, err
	}
	if watchesAfter <= watchesBefore {
		return 0, fmt.Errorf("the dry-run UpgradeTask %s is Planned but the API server serves no new watch of Nodes (%d before, %d after): the manager did not cache the Nodes", key, watchesBefore, watchesAfter)
	}
	return planned, nil
}

// checkPlan checks that a dry run planned every machine with every preflight check
// passed: in particular NodeReady, which fails for a machine whose Node was not listed.
func checkPlan(task *inplacev1.UpgradeTask, machines int) error {
	if len(task.Status.Machines) != machines {
		return fmt.Errorf("the dry-run UpgradeTask %s/%s planned %d machines, want %d", task.Namespace, task.Name, len(task.Status.Machines), machines)
	}
	for _, m := range task.Status.Machines {
		if len(m.Preflight) == 0 {
			return fmt.Errorf("the dry-run UpgradeTask %s/%s ran no preflight check for machine %s: %s", task.Namespace, task.Name, m.Name, m.Message)
		}
		for _, c := range m.Preflight {
			if !c.Passed {
				return fmt.Errorf("the dry-run UpgradeTask %s/%s holds machine %s: %s: %s", task.Namespace, task.Name, m.Name, c.Name, c.Message)
			}
		}
	}
	return nil
}

// remove deletes the task and waits until the manager released it (its finalizer) and it
// is gone, so that the next size starts without a task.
func (t *nodeCacheTask) remove(ctx context.Context, b *bench) error {
	if t.task == "" {
		return nil
	}
	key := client.ObjectKey{Namespace: t.namespace, Name: t.task}
	if err := b.client.Delete(ctx, &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete UpgradeTask %s: %w", key, err)
	}
	deadline := time.Now().Add(memTaskTimeout)
	for {
		err := b.client.Get(ctx, key, &inplacev1.UpgradeTask{})
		if apierrors.IsNotFound(err) {
			t.task = ""
			return nil
		}
		if err != nil {
			return fmt.Errorf("read UpgradeTask %s: %w", key, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("UpgradeTask %s still exists %s after its deletion: the manager did not remove its finalizer", key, memTaskTimeout)
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// nodeWatches is the number of watches of Nodes the test API server serves now
// (apiserver_longrunning_requests). In the memory section nothing but the manager's Node
// cache and the API server's own loopback clients watches Nodes.
func nodeWatches(ctx context.Context, b *bench) (int, error) {
	data, err := apiServerMetrics(ctx, b)
	if err != nil {
		return 0, err
	}
	const name = "apiserver_longrunning_requests{"
	found, n := false, 0.0
	for _, line := range strings.Split(string(data), "\n") {
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, name), "} ")
		if !ok || !strings.HasPrefix(line, name) {
			continue
		}
		found = true
		if strings.Contains(labels, `resource="nodes"`) && strings.Contains(labels, `verb="WATCH"`) {
			v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s: %w", line, err)
			}
			n += v
		}
	}
	if !found {
		return 0, fmt.Errorf("the API server's metrics have no %s}", strings.TrimSuffix(name, "{"))
	}
	return int(n), nil
}

// findProcess returns the pid of the process running bin. The bench builds the manager
// into a directory of its own, so exactly one process runs that path.
func findProcess(bin string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && exe == bin {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process runs %s", bin)
}

// procMemory reads VmRSS and VmHWM of a process, in bytes.
func procMemory(pid int) (rss, hwm uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseUint(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm, s.Err()
}

// metricValue reads one unlabelled sample from a Prometheus text endpoint.
func metricValue(url, name string) (uint64, error) {
	resp, err := http.Get(url) //nolint:gosec,noctx // the manager's loopback metrics endpoint
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return uint64(v), err
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}
