package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// TestSmoke runs every section of `make bench` at tiny sizes, so that the harness does
// not rot between two runs of the real thing: it checks that each section measured what
// it says it measured, not how fast anything was (figures come from `make bench`, never
// from timing assertions).
func TestSmoke(t *testing.T) {
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two test API servers, builds and runs the manager")
	}
	cfg := defaultConfig()
	cfg.hookClients = []int{1, 4}
	cfg.hookDuration, cfg.hookWarmup, cfg.hookMachines = 200*time.Millisecond, 50*time.Millisecond, 4
	cfg.orchSizes, cfg.orchMaxUnavailable, cfg.orchTimeout = []int{4}, []int{1, 2}, 2*time.Minute
	cfg.fleetClusters, cfg.fleetMachines, cfg.fleetMaxUnavailable, cfg.fleetTimeout = 3, 3, 1, 2*time.Minute
	cfg.memClusters, cfg.machinesPerCluster, cfg.memSettle = []int{1, 2}, 3, 0
	cfg.memQuiet, cfg.memSampleEvery = 500*time.Millisecond, 50*time.Millisecond
	cfg.makespanSizes, cfg.makespanScale = []int{2}, 1000
	cfg.previewIterations = 5
	cfg.requestCostOps = 5
	cfg.out = filepath.Join(t.TempDir(), "benchmarks.md")

	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out, "(smoke test)")
	if err != nil {
		t.Fatalf("bench failed: %v\n%s", err, out.String())
	}
	t.Log(out.String())

	if got, want := len(rep.hooks.results), len(hookNames)*len(cfg.hookClients)*2; got != want {
		t.Errorf("%d hook measurements, want %d", got, want)
	}
	for _, h := range rep.hooks.results {
		if h.requests == 0 || h.failures > 0 || h.lat.p99 <= 0 {
			t.Errorf("%s %s at %d clients: %d requests, %d failed (%s), p99 %s", h.impl, h.hook, h.clients, h.requests, h.failures, h.firstFail, h.lat.p99)
		}
	}

	if len(rep.orchestration) != len(cfg.orchMaxUnavailable) {
		t.Fatalf("%d orchestration runs, want %d", len(rep.orchestration), len(cfg.orchMaxUnavailable))
	}
	for _, o := range rep.orchestration {
		n := o.machines
		if !o.finished || o.upgraded != n || o.total <= 0 {
			t.Errorf("%d machines, maxUnavailable %d: finished %v, %d upgraded, total %s", n, o.maxUnavailable, o.finished, o.upgraded, o.total)
		}
		if o.handoff.n != n-o.maxUnavailable {
			t.Errorf("%d machines, maxUnavailable %d: %d hand-offs, want %d", n, o.maxUnavailable, o.handoff.n, n-o.maxUnavailable)
		}
		// The updater is first called for a NodeUpdate after its creation: paired the same
		// way, each of its starts comes no sooner than the hand-off.
		if o.updaterStart.n != o.handoff.n || o.updaterStart.p50 < o.handoff.p50 {
			t.Errorf("%d machines, maxUnavailable %d: updater's starts %+v against hand-offs %+v", n, o.maxUnavailable, o.updaterStart, o.handoff)
		}
		if l := o.writeLatency["POST nodeupdates"]; l.n != n || l.p50 <= 0 {
			t.Errorf("%d machines: how long the NodeUpdate creations took was not measured: %+v", n, l)
		}
		if got := o.writes["POST nodeupdates"]; got != n {
			t.Errorf("%d machines: the manager created %d NodeUpdates, want one per machine (writes %v)", n, got, o.writes)
		}
		// The Go runtime brings its CPU classes up to date at the end of each collection,
		// which four nodes may not reach: the GC share is not asked for here.
		if a := o.apiServer; a.cpu <= 0 || o.apiServerCPUPerNode() <= 0 || o.apiServerCores() <= 0 || o.apiServerAllocatedPerNode() <= 0 || a.gc < 0 || a.busy < a.gc {
			t.Errorf("%d machines, maxUnavailable %d: the API server's usage was not measured: %+v (%s per node, %.2f cores, %.0f bytes per node)",
				n, o.maxUnavailable, a, o.apiServerCPUPerNode(), o.apiServerCores(), o.apiServerAllocatedPerNode())
		}
		if o.reconciles["upgradetask"] == 0 || o.reconciles["nodeupdate"] == 0 {
			t.Errorf("reconciles not counted: %v", o.reconciles)
		}
		// The Nodes come from the manager's Node cache, whose first list client-go streams
		// over a watch (WatchListClient), and watches are not reads: what is left to count
		// is the cache's discovery of the workload cluster (LIST ?) or a fallback LIST
		// nodes. Either shows that the workload cluster's requests are counted.
		if len(o.workloadReads) == 0 {
			t.Errorf("the workload cluster's reads were not counted: %v", o.workloadReads)
		}
		// Every node but the first carries the task's upgrade-pending taint until it ends
		// (the taint writer writes it in the background), and none at the end.
		if got := o.workloadWrites["PATCH nodes"]; got < n-o.maxUnavailable {
			t.Errorf("%d machines: %d taint writes to the workload cluster counted, want at least %d: %v", n, got, n-o.maxUnavailable, o.workloadWrites)
		}
	}

	// Every kind of request a node makes was sent and priced: the API server allocates for
	// each (its CPU over five requests can fall within one clock tick, so it is not asked).
	if got, want := len(rep.requestCosts), 7; got != want {
		t.Errorf("%d kinds of request priced, want %d: %+v", got, want, rep.requestCosts)
	}
	for _, c := range rep.requestCosts {
		if c.ops != cfg.requestCostOps || c.wall <= 0 || c.allocatedPerOp() <= 0 || c.usage.cpu < 0 {
			t.Errorf("%s: %d requests in %s, %.0f bytes allocated each, %s CPU", c.kind, c.ops, c.wall, c.allocatedPerOp(), c.usage.cpu)
		}
	}

	// The fleet: every Cluster's machines upgraded through its own view of the workload
	// cluster (a Node cache that saw other Clusters' Nodes would still finish, so the
	// view itself is proven by TestFleetView), the hand-offs of all pooled.
	if f := rep.fleet; f == nil {
		t.Error("no fleet run")
	} else {
		n := cfg.fleetClusters * cfg.fleetMachines
		if f.clusters != cfg.fleetClusters || f.machines != n || !f.finished || f.upgraded != n || f.total <= 0 {
			t.Errorf("fleet: %d Clusters, %d machines, finished %v, %d upgraded, total %s", f.clusters, f.machines, f.finished, f.upgraded, f.total)
		}
		if want := cfg.fleetClusters * (cfg.fleetMachines - cfg.fleetMaxUnavailable); f.handoff.n != want || f.updaterStart.n != want {
			t.Errorf("fleet: %d hand-offs and %d updater's starts, want %d", f.handoff.n, f.updaterStart.n, want)
		}
		if got := f.writes["POST nodeupdates"]; got != n {
			t.Errorf("fleet: the manager created %d NodeUpdates, want %d", got, n)
		}
		if a := f.apiServer; a.cpu <= 0 || a.allocated <= 0 || a.gc < 0 || a.busy < a.gc {
			t.Errorf("fleet: the API server's usage was not measured: %+v", a)
		}
		if f.usage.cpu <= 0 || f.usage.wall <= 0 || f.usage.rssPeak == 0 || f.usage.heapPeak == 0 {
			t.Errorf("fleet: the process's usage was not measured: %+v", f.usage)
		}
	}

	if len(rep.memory) != len(cfg.memClusters) {
		t.Fatalf("%d memory measurements, want %d", len(rep.memory), len(cfg.memClusters))
	}
	for i, m := range rep.memory {
		if want := cfg.memClusters[i] * cfg.machinesPerCluster; m.machines != want || m.rss == 0 || m.peak < m.rss || m.heapInUse == 0 {
			t.Errorf("memory at %d clusters: %d machines (want %d), RSS %d, peak %d, heap %d", cfg.memClusters[i], m.machines, want, m.rss, m.peak, m.heapInUse)
		}
		// With the Nodes cached: the dry-run task was planned (every Node found, a watch of
		// them opened) and the manager read again; its peak is since its start.
		if m.rssCached == 0 || m.peakCached < m.rssCached || m.peakCached < m.peak || m.heapCached == 0 || m.planned <= 0 {
			t.Errorf("memory at %d clusters with the Nodes cached: RSS %d, peak %d (peak before %d), heap %d, planned after %s", cfg.memClusters[i], m.rssCached, m.peakCached, m.peak, m.heapCached, m.planned)
		}
	}

	if len(rep.makespan) != 2*len(cfg.makespanSizes) {
		t.Fatalf("%d makespan runs, want %d (each size with the cluster-wide and the per-node preload)", len(rep.makespan), 2*len(cfg.makespanSizes))
	}
	for _, m := range rep.makespan {
		// Nothing can beat the critical path: a makespan below it was measured wrong (or a
		// simulator skipped its work).
		if !m.finished || m.makespan < m.bound || len(m.nodeTime) != m.nodes || m.setupTime() <= 0 {
			t.Errorf("makespan of %d nodes (per-node preload %v): finished %v, makespan %s, bound %s, %d nodes timed, setup %s",
				m.nodes, m.perNodePreload, m.finished, m.makespan, m.bound, len(m.nodeTime), m.setupTime())
		}
		// The plan's preload Plan ran once on every node, or, with each node preloading in
		// its turn, never (its ImagePreloading phase is then entered and skipped at once).
		if want := map[bool]int{false: m.nodes, true: 0}[m.perNodePreload]; m.clusterPreloads != want {
			t.Errorf("makespan of %d nodes (per-node preload %v): the plan's preload Plan ran %d times, want %d", m.nodes, m.perNodePreload, m.clusterPreloads, want)
		}
		// Every node ran its drain, RKE2 and OS Plans (and its preload, when it preloads in
		// its turn), each with SUC's chain around its work.
		if want := m.nodes * map[bool]int{false: 3, true: 4}[m.perNodePreload]; m.sucChains != want || m.sucChain <= 0 {
			t.Errorf("makespan of %d nodes (per-node preload %v): %d SUC chains of the nodes' Plans (%s), want %d", m.nodes, m.perNodePreload, m.sucChains, m.sucChain, want)
		}
		if _, ok := m.steps[harvesteradapter.StepImagePreload]; ok != m.perNodePreload {
			t.Errorf("makespan of %d nodes (per-node preload %v): the nodes' ImagePreload step seen %v", m.nodes, m.perNodePreload, ok)
		}
	}

	if rep.preview == nil || len(rep.preview.rows) != 2 {
		t.Fatalf("preview: %+v", rep.preview)
	}
	for _, row := range rep.preview.rows {
		if row.lat.n != cfg.previewIterations || row.lat.p50 <= 0 || !strings.HasPrefix(row.summary, "6 machines: 6 in place") {
			t.Errorf("preview, %s: %+v", row.updater, row)
		}
	}
	if h := rep.preview.rows[1]; totalReads(h.workloadReads) == 0 {
		t.Errorf("preview, %s: no read of the workload cluster counted: %+v", h.updater, h)
	}

	doc, err := os.ReadFile(cfg.out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Benchmarks", "| Machine |", "## Targets", "## 1. Hook server", "## 2. Orchestration overhead", "## 2b. A fleet upgraded at once", "## 3. API writes per upgraded node", "How long the manager's writes took", "## 3b. What one request costs the test API server", "priced per node ms", "## 4. Manager memory", "VmRSS with the Nodes cached", "## 5. How it grows", "## 6. Makespan of a Harvester upgrade", "## 7. UpgradePreview of a 3+3 cluster"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("the report lacks %q:\n%s", want, doc)
		}
	}
}
