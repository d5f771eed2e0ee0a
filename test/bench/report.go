package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// Targets of issues #10 and #55.
const (
	targetHookP99   = 5 * time.Millisecond
	targetHookRatio = 1.5
	// The hand-off p99 at maxUnavailable 1 and above it (issue #55).
	targetHandoffP99     = 200 * time.Millisecond
	targetHandoffP99Wide = 500 * time.Millisecond
	targetBigUpgrade     = 30 * time.Second
	targetBigMachines    = 500
	targetBigMU          = 10
	targetWritesPerNode  = 12
	targetRSS            = 300 << 20
	targetMemoryMachines = 5000
	targetHookClients    = 64
	// targetMakespanRatio bounds a simulated Harvester upgrade's makespan over its
	// critical path.
	targetMakespanRatio = 1.05
)

// machineInfo describes where the figures were measured.
type machineInfo struct {
	cpus       int
	cpuModel   string
	memTotal   uint64
	loadStart  string
	loadEnd    string
	goVersion  string
	gomaxprocs int
}

func currentMachine() machineInfo {
	return machineInfo{
		cpus: runtime.NumCPU(), cpuModel: cpuModel(), memTotal: memTotal(), loadStart: loadAverage(),
		goVersion: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH, gomaxprocs: runtime.GOMAXPROCS(0),
	}
}

func (m machineInfo) summary() string {
	return fmt.Sprintf("%d CPUs (nproc), %s, %.1f GiB memory, load average %s", m.cpus, m.cpuModel, float64(m.memTotal)/(1<<30), m.loadStart)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func memTotal() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			var kb uint64
			_, _ = fmt.Sscan(fields[1], &kb)
			return kb << 10
		}
	}
	return 0
}

// loadAverage is the 1, 5 and 15 minute load averages: how busy the shared machine was.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// gitCommit names the checkout's commit, read-only.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	if status, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(status))) > 0 {
		commit += " (with uncommitted changes)"
	}
	return commit
}

// report is everything the bench measured.
type report struct {
	cfg     config
	args    string
	date    time.Time
	machine machineInfo
	commit  string
	elapsed time.Duration

	hooks             *hookBenchResult
	hooksTime         time.Duration
	orchestration     []orchResult
	orchestrationTime time.Duration
	requestCosts      []requestCost
	fleet             *orchResult
	fleetTime         time.Duration
	memory            []memResult
	memoryTime        time.Duration
	makespan          []makespanResult
	makespanTime      time.Duration
	preview           *previewResult
	previewTime       time.Duration
}

func newReport(cfg config, args string) *report {
	return &report{cfg: cfg, args: args, date: time.Now().UTC(), machine: currentMachine(), commit: gitCommit()}
}

func (r *report) command() string {
	direct := "bin/capi-inplace-bench"
	if r.args != "" {
		direct += " " + r.args
	}
	if os.Getenv("MAKELEVEL") != "" {
		return fmt.Sprintf("`make bench` (which builds and runs `%s`)", direct)
	}
	return fmt.Sprintf("`%s`", direct)
}

// render writes the report as Markdown; full adds the header and how each figure is measured.
func (r *report) render(w io.Writer, full bool) error {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	if full {
		p("# Benchmarks\n\n")
		p("Written by `make bench` (`test/bench`); do not edit by hand, run `make bench` again. ")
		p("Every figure below comes from one run on one machine, so compare figures within this file, not across machines.\n\n")
		p("| | |\n|---|---|\n")
		p("| Date | %s |\n", r.date.Format("2006-01-02 15:04 MST"))
		p("| Command | %s |\n", r.command())
		p("| Machine | %d CPUs (`nproc`), %s, %.1f GiB memory |\n", r.machine.cpus, r.machine.cpuModel, float64(r.machine.memTotal)/(1<<30))
		p("| Load average (1, 5, 15 min) | %s at the start, %s at the end: the machine is shared, so figures move with what else runs |\n", r.machine.loadStart, r.machine.loadEnd)
		p("| Go | %s, GOMAXPROCS %d |\n", r.machine.goVersion, r.machine.gomaxprocs)
		p("| Commit | %s |\n", r.commit)
		p("| Test control plane | kube-apiserver v1.36.3 and etcd v3.6.14 built into `bin/k8s`, run by envtest on the same machine |\n")
		p("| Run time | %s (hooks %s, orchestration %s, fleet %s, memory %s, makespan %s, preview %s) |\n\n", r.elapsed.Round(time.Second), r.hooksTime.Round(time.Second), r.orchestrationTime.Round(time.Second), r.fleetTime.Round(time.Second), r.memoryTime.Round(time.Second), r.makespanTime.Round(time.Second), r.previewTime.Round(time.Second))
	}
	r.renderTargets(w)
	r.renderHooks(w, full)
	r.renderOrchestration(w, full)
	r.renderFleet(w, full)
	r.renderWrites(w, full)
	r.renderRequestCosts(w, full)
	r.renderMemory(w, full)
	r.renderGrowth(w, full)
	r.renderMakespan(w, full)
	r.renderPreview(w, full)
	if full {
		r.renderLimits(w)
	}
	return nil
}

// renderLimits says what bounds the figures, from how the code works (profiles of the
// bench process with --cpuprofile, the request counts above), so that it stays true when
// the figures are measured again.
func (r *report) renderLimits(w io.Writer) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## What limits the figures\n\n")
	p("- **Hook latency at %d clients.** The clients are closed loops on the same cores as the servers, so the mean latency is at least ", targetHookClients)
	p("%d / throughput (Little's law): %s ms at p99 would take far more requests per second than two cores serve with TLS, HTTP/2 and ", targetHookClients, ms(targetHookP99))
	p("JSON of the bodies above, for either implementation. The CanUpdate hooks cost about what the reference's cost (their CPU ")
	p("per request is mostly decoding and encoding the request and TLS, the same for both); UpdateMachine reads the Machine and the ")
	p("machine's own NodeUpdates (through a cache index on spec.machineName) from the manager's cache without copying them, where the ")
	p("reference only looks into a map in memory.\n")
	p("- **Hand-off.** An UpgradeTask reconcile reads only from caches: the task (with the status it last computed), the Machines ")
	p("(those it wrote taken as written until the cache shows the write), the NodeUpdates (those it created and the cache does not ")
	p("show yet counted in, as the ReplicaSet controller counts the Pods it created) and the workload cluster's Nodes (a watch per ")
	p("workload cluster), without copying them (a Machine is copied before it is written), and parses each version string once. ")
	p("On its path to the next node it writes only the claim of each machine it picks and the machine's NodeUpdate, the machines of ")
	p("one round side by side (at most %d). The rest is handed to writers in the background: the Machines' conditions, ", upgradetask.HandOffConcurrency)
	p("release annotations and the claims of waiting machines (at most %d writes in flight; the last hand-over of a Machine wins), ", upgradetask.MachineWriteConcurrency)
	p("the workload Nodes' upgrade-pending taints (at most %d in flight per task: a task's first reconcile taints every node ", upgradetask.TaintWriteConcurrency)
	p("still to go, which took 13 s at 500 nodes when the reconcile wrote them itself), ")
	p("and the task's status (an entry per machine, the costliest write for the API server), at most once a second for every 100 ")
	p("entries (at most one write in 10 s from 1,000 machines on), so that what it costs per second does not grow with the task. The task's own ")
	p("writes to a Machine wake no reconcile of it (only a change of something else does). Only a task's ")
	p("end, an abort or a deletion writes its Machines before it returns. What remains is the API server, on the same two cores: it ")
	p("spends most of its time decoding, validating and storing Machines (`--apiserver-cpuprofile`), and section 3b prices each request: ")
	p("a write of a Machine (a Cluster API object with a large schema, coerced, validated and tracked field by field on every write) costs ")
	p("it several times what any other request of a node costs. With node work that takes no time the upgrade goes as fast as the API ")
	p("server lets it, so the API server is busy through the run (its cores column in section 2); its garbage collector then starts about ")
	p("once for every heap's worth of allocation and marks for a few hundred ms on these cores, and every request in flight meanwhile waits ")
	p("longer: the hand-offs that meet a marking make the p99 at maxUnavailable 1 (section 2's GC share column). With maxUnavailable 10 and node work that takes no time, maxUnavailable nodes run at once and a node ends ")
	p("every few tens of milliseconds: a success waits for the reconcile in progress to end and for the next one, which fills every ")
	p("free place at once, while all requests queue at the saturated API server. The next start column is how soon after any success ")
	p("a node starts. Real nodes take minutes and end one by one.\n")
	p("- **First node.** A reconcile claims the machines it starts before it creates their NodeUpdates; the claims of the other ")
	p("waiting machines (a claim label and a Waiting condition each) go to the background writer, so the first node waits for none of them.\n")
	p("- **Writes per node.** Per node the design asks for: the Machine's claim label, its skip-remediation annotation when its node starts ")
	p("(written before its NodeUpdate exists), its InPlaceUpgradeUpToDate condition as Waiting, InProgress and Done (the status ")
	p("subresource: a request of its own), its release annotation with the claim and skip-remediation removed (six Machine writes); the NodeUpdate's creation (with its ")
	p("finalizer) and its status (two); the task's status (at most one a second, shared by the nodes that started or ended meanwhile); ")
	p("and three Events (NodeStarted, the NodeUpdate's Succeeded, NodeUpgraded, each ")
	p("naming its Machine so that the events API does not fold them into one series), with one MachineClaimed Event per hand-over ")
	p("of claims. A Machine whose Waiting or InProgress condition is replaced before it was written is written once. An updater with steps adds one Machine condition write per step ")
	p("(the InProgress message names the step).\n")
	p("- **Memory.** The manager caches every Machine, MachineSet, MachineDeployment and Cluster of the management cluster (and its own ")
	p("kinds), without their managed fields, so its memory grows with the Machines; it caches the Nodes of a workload cluster (without their image lists and managed ")
	p("fields) while an UpgradeTask of that Cluster is reconciled, and for 10 minutes after the last read.\n\n")
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func (r *report) renderTargets(w io.Writer) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## Targets (issues #10 and #55)\n\n")
	if nt := r.cfg.orchNodeTime; nt > 0 {
		p("This run gave each node %s of work (`--orchestration-node-time`): the targets of sections 2 and 2b are for node work that ", nt)
		p("takes no time, so their rows below are not judged.\n\n")
	}
	p("| target | measured | met |\n|---|---|---|\n")
	judge := func(ok bool) string {
		if r.cfg.orchNodeTime > 0 {
			return "not judged"
		}
		return yesNo(ok)
	}
	if r.hooks != nil {
		var figs, ratios []string
		okAbs, okRatio, any64 := true, true, false
		for _, hook := range hookNames {
			if ours, ref, found := r.hookPair(hook, targetHookClients); found {
				any64 = true
				figs = append(figs, fmt.Sprintf("%s %s ms (reference %s ms)", hook, ms(ours.lat.p99), ms(ref.lat.p99)))
				okAbs = okAbs && ours.lat.p99 < targetHookP99 && ours.failures == 0
			}
			// The ratio at every number of clients; the worst is shown.
			worst, worstN, worstOurs, worstRef := 0.0, 0, time.Duration(0), time.Duration(0)
			for _, n := range r.cfg.hookClients {
				if ours, ref, found := r.hookPair(hook, n); found {
					if ratio := ratioOf(ours.lat.p99, ref.lat.p99); ratio > worst {
						worst, worstN, worstOurs, worstRef = ratio, n, ours.lat.p99, ref.lat.p99
					}
				}
			}
			if worstN > 0 {
				ratios = append(ratios, fmt.Sprintf("%s %.2f× at %s (%s vs %s ms)", hook, worst, clientsText(worstN), ms(worstOurs), ms(worstRef)))
				okRatio = okRatio && worst <= targetHookRatio
			}
		}
		if any64 {
			p("| hook p99 at %d clients under %s ms on %d cores | %s | %s |\n", targetHookClients, ms(targetHookP99), r.machine.cpus, strings.Join(figs, "; "), yesNo(okAbs))
		}
		if len(ratios) > 0 {
			p("| hook p99 at most %.1f× the reference's (worst over %s clients) | %s | %s |\n", targetHookRatio, joinInts(r.cfg.hookClients), strings.Join(ratios, "; "), yesNo(okRatio))
		}
	}
	runs := r.orchestration
	if r.fleet != nil {
		runs = append(slices.Clip(runs), *r.fleet)
	}
	for _, wide := range []bool{false, true} {
		var worst *orchResult
		finished := true
		for i, o := range runs {
			if (o.maxUnavailable > 1) != wide {
				continue
			}
			finished = finished && o.finished
			if worst == nil || o.handoff.p99 >= worst.handoff.p99 {
				worst = &runs[i]
			}
		}
		if worst == nil {
			continue
		}
		target, at := targetHandoffP99, "at maxUnavailable 1"
		if wide {
			target, at = targetHandoffP99Wide, "above maxUnavailable 1"
		}
		p("| hand-off p99 under %s ms %s | worst %s ms (%s) | %s |\n", ms(target), at, ms(worst.handoff.p99), worst.shape(), judge(worst.handoff.p99 < target && finished))
	}
	if len(r.orchestration) > 0 {
		for _, o := range r.orchestration {
			if o.machines == targetBigMachines && o.maxUnavailable == targetBigMU {
				p("| %d machines at maxUnavailable %d in under %s | %s | %s |\n", targetBigMachines, targetBigMU, targetBigUpgrade, totalText(o, r.cfg.orchTimeout), judge(o.finished && o.total < targetBigUpgrade))
			}
		}
		// Per node only means something for an upgrade that finished: an unfinished one
		// claimed every machine but upgraded only some.
		var worstW *orchResult
		for i, o := range r.orchestration {
			if o.finished && (worstW == nil || o.writesPerNode() > worstW.writesPerNode()) {
				worstW = &r.orchestration[i]
			}
		}
		if worstW != nil {
			p("| at most %d writes per upgraded node | worst %.1f (%d machines, maxUnavailable %d; upgrades that finished) | %s |\n", targetWritesPerNode, worstW.writesPerNode(), worstW.machines, worstW.maxUnavailable, yesNo(worstW.writesPerNode() <= targetWritesPerNode))
		}
	}
	if len(r.makespan) > 0 {
		var figs []string
		ok := true
		for _, m := range r.makespan {
			if m.perNodePreload {
				continue
			}
			figs = append(figs, fmt.Sprintf("%d nodes %.3f", m.nodes, m.ratio()))
			ok = ok && m.finished && m.ratio() <= targetMakespanRatio
		}
		p("| simulated Harvester upgrade within %.2f× its critical path at every size | %s | %s |\n", targetMakespanRatio, strings.Join(figs, "; "), yesNo(ok))
	}
	if r.preview != nil {
		var figs []string
		for _, row := range r.preview.rows {
			figs = append(figs, fmt.Sprintf("%s %s ms", row.updater, ms(row.lat.p99)))
		}
		p("| UpgradePreview of a 3+3 cluster computed in under %s (p99) | %s | %s |\n", targetPreview, strings.Join(figs, "; "), yesNo(r.preview.worst() < targetPreview))
	}
	for _, m := range r.memory {
		if m.machines == targetMemoryMachines {
			// Judged with the Nodes in the manager's cache (the larger figure).
			p("| manager RSS with %d Machines and Nodes across %d Clusters in the cache under %s | %s with the %d Nodes cached (%s before any Node was cached) | %s |\n",
				targetMemoryMachines, m.clusters, mib(targetRSS), mib(m.rssMax()), m.nodes, mib(m.rss), yesNo(m.rssMax() < targetRSS))
		}
	}
	p("\n")
}

// perCluster is the machines of each of the run's Clusters.
func (o orchResult) perCluster() int { return o.machines / max(o.clusters, 1) }

// shape names a run: its machines and maxUnavailable, and its Clusters in a fleet.
func (o orchResult) shape() string {
	if o.clusters > 1 {
		return fmt.Sprintf("fleet of %d Clusters of %d machines, maxUnavailable %d", o.clusters, o.perCluster(), o.maxUnavailable)
	}
	return fmt.Sprintf("%d machines, maxUnavailable %d", o.machines, o.maxUnavailable)
}

func totalText(o orchResult, timeout time.Duration) string {
	if !o.finished {
		return fmt.Sprintf("not finished after %s (%d/%d upgraded)", timeout, o.upgraded, o.machines)
	}
	return secs(o.total)
}

func ratioOf(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func (r *report) hookPair(hook string, clients int) (ours, ref hookResult, found bool) {
	var fo, fr bool
	for _, h := range r.hooks.results {
		if h.hook != hook || h.clients != clients {
			continue
		}
		switch h.impl {
		case implOurs:
			ours, fo = h, true
		case implReference:
			ref, fr = h, true
		}
	}
	return ours, ref, fo && fr
}

func (r *report) renderHooks(w io.Writer, full bool) {
	if r.hooks == nil {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 1. Hook server\n\n")
	if full {
		p("capi-inplace's handlers are served as the manager serves them: `extension.NewCAPIHookServer` (Cluster API's runtime SDK server, ")
		p("`sigs.k8s.io/cluster-api/exp/runtime/server`, TLS 1.2+) with `InPlaceHooks` wired as in `main.go`, reading through a controller-runtime ")
		p("manager's cached client from the test API server. Cluster API's reference handlers (`sigs.k8s.io/cluster-api/test` v1.14.0, ")
		p("`extension/handlers/inplaceupdate`) are served by a second runtime SDK server of the same manager, in the same process, with the same ")
		p("certificate and logger (the manager's text logger at verbosity 0, output discarded). Both get byte-identical request bodies, built as ")
		p("Cluster API v1.14 builds them: a MachineDeployment (CanUpdateMachineSet, %d bytes) and a KubeadmControlPlane machine ", r.hooks.requestBytes["CanUpdateMachineSet"])
		p("(CanUpdateMachine, %d bytes) going from %s to %s with their KubeadmConfig(Template) and DevMachine(Template) (Docker backend), ", r.hooks.requestBytes["CanUpdateMachine"], hookFromVersion, hookToVersion)
		p("and UpdateMachine (%d bytes) for %d machines in turn, each with its running NodeUpdate (the steady state). ", r.hooks.requestBytes["UpdateMachine"], r.hooks.machines)
		p("The clients are closed loops sharing one HTTP client built like Cluster API's runtime client (Kubernetes transport defaults, HTTP/2, ")
		p("`?timeout=10s`); a latency is one request's round trip as the client sees it. Each cell runs each implementation twice ")
		p("(capi-inplace, reference, reference, capi-inplace; %s each after %s of warm-up) so that a change of the shared machine's load weighs on both. ", r.cfg.hookDuration/2, r.cfg.hookWarmup)
		p("CPU/req is the whole process's CPU time (clients and both servers share it) per request. Every answer is checked (HTTP 200, status Success).\n\n")
		p("With n closed-loop clients, latency cannot be below n / throughput (Little's law): at %d clients on %d cores, a p99 under %s ms needs ", targetHookClients, r.machine.cpus, ms(targetHookP99))
		p("well over %.0f requests/s with clients, TLS and server on the same cores.\n\n", float64(targetHookClients)/targetHookP99.Seconds())
	}
	p("| hook | clients | capi-inplace req/s | p50 ms | p99 ms | CPU/req ms | reference req/s | p50 ms | p99 ms | CPU/req ms | p99 ratio |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, hook := range hookNames {
		for _, n := range r.cfg.hookClients {
			ours, ref, found := r.hookPair(hook, n)
			if !found {
				continue
			}
			p("| %s | %d | %.0f | %s | %s | %s | %.0f | %s | %s | %s | %.2f |\n", hook, n,
				ours.rps(), ms(ours.lat.p50), ms(ours.lat.p99), ms(ours.cpuPerRequest),
				ref.rps(), ms(ref.lat.p50), ms(ref.lat.p99), ms(ref.cpuPerRequest), ratioOf(ours.lat.p99, ref.lat.p99))
		}
	}
	p("\n")
	var failures []string
	for _, h := range r.hooks.results {
		if h.failures > 0 {
			failures = append(failures, fmt.Sprintf("%s %s at %d clients: %d failed, first: %s", h.impl, h.hook, h.clients, h.failures, h.firstFail))
		}
	}
	if len(failures) > 0 {
		p("Failed requests: %s.\n\n", strings.Join(failures, "; "))
	}
	if full {
		p("What each answered (the reference's CanUpdate patches cover only its own fields, so Cluster API's verdict on them may differ):\n\n")
		for _, hc := range r.hooks.cases {
			p("- %s: capi-inplace: %s; reference: %s\n", hc.hook, hc.answers[implOurs], hc.answers[implReference])
		}
		p("\n")
	}
}

func (r *report) renderOrchestration(w io.Writer, full bool) {
	if len(r.orchestration) == 0 {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 2. Orchestration overhead\n\n")
	if full {
		p("A MachineDeployment of N machines (each with a Ready Node, objects as Cluster API leaves them) is upgraded from %s to %s by an ", orchFromVersion, orchToVersion)
		p("extension-paced UpgradeTask (created through `upgraderequest.Requester`, as ExternalUpgradeRequest does). The real UpgradeTask controller ")
		p("and NodeUpdate reconciler run in a controller-runtime manager wired as `main.go` wires them: default poll intervals (UpgradeTask %s, ", "15s")
		p("NodeUpdate %s; `--poll-interval` unset), `--concurrency %d`, workload Nodes read through the Cluster's kubeconfig Secret ", "30s", managerConcurrency)
		if nt := r.cfg.orchNodeTime; nt > 0 {
			p("(`workloadcluster.Clients`). The updater is the bench's own and writes nothing; in this run (`--orchestration-node-time %s`) its ", nt)
			p("Reconcile answers Done once %s has passed since its first call for the node, so the upgrade goes no faster than that allows. ", nt)
		} else {
			p("(`workloadcluster.Clients`). The updater is the bench's own: its Reconcile answers Done at once and it writes nothing, so the node work takes ")
			p("no time and what is left is capi-inplace's orchestration. ")
		}
		p("A separate watch stamps each NodeUpdate when it is first seen and when it is first ")
		p("seen Succeeded. Total: from the UpgradeTask's creation to its `Completed` phase. First node: from the task's creation to its first NodeUpdate. ")
		p("Hand-off: each success frees one of the maxUnavailable places, so the k-th success is paired with the (maxUnavailable+k)-th creation; ")
		p("the latency is the time between the two (the target's figure). While fewer than maxUnavailable nodes run, the (maxUnavailable+k)-th ")
		p("creation comes well after the k-th success and this pairing measures how fast the places are refilled; so the table also gives ")
		p("the next start: from each of the same successes to the first creation after it, however many places were free; and the updater's start: ")
		p("from each of the same successes to the updater's first call for the NodeUpdate paired with it, which is when a real updater would begin ")
		p("on the node: the hand-off plus the NodeUpdate controller's first reconcile, which reads the NodeUpdate from the API server before it calls ")
		p("the updater (a figure that moves the creation earlier but not this one has moved the work, not sped it up). ")
		p("A run that does not finish within %s is stopped and reported as such. ", r.cfg.orchTimeout)
		p("The runs share one test API server, one after the other; each deletes what it created once it ended (its finalizers taken ")
		p("off first), so that the next meets only its own objects in the API server's store, though its watch cache may still hold ")
		p("the last minute's events. ")
		p("API server CPU: the test API server's own `process_cpu_seconds_total` (from its `/metrics`) from the task's creation to its completion, ")
		p("per upgraded node and as mean cores over that time. The API server shares the machine's cores with etcd and the manager, so with c ms of ")
		p("its CPU per node, P cores upgrade at most P/c nodes a second; at maxUnavailable m, with nodes that take no time, a place's cycle (its ")
		p("NodeUpdate's life and then the hand-off) takes at least m·c/P on average (Little's law): past the point where the API server is busy, ")
		p("the hand-off at maxUnavailable above 1 measures that cycle, not a delay of the controller. ")
		p("API server allocated per node and its GC share: its `go_gc_heap_allocs_bytes_total` over the same time, per upgraded node, and the part of ")
		p("its busy CPU the Go runtime reports for its garbage collector (`go_cpu_classes_gc_total_cpu_seconds_total` against that plus ")
		p("`go_cpu_classes_user_cpu_seconds_total` and the scavenger's; the runtime brings these up to date at the end of each collection, so ")
		p("over a run of many collections they are exact to one of them). The collector runs once per so many bytes allocated (GOGC 100: as many ")
		p("as its heap holds live), and while it marks, every request that allocates helps it: so the more a node makes the API server ")
		p("allocate, and the more nodes a second, the more often every request in flight, the hand-off's two among them, is slowed at once.\n\n")
	}
	p("| machines | maxUnavailable | total | per machine | first node after | hand-offs | hand-off p50 ms | p99 ms | max ms | next start p50 ms | p99 ms | updater's start p50 ms | p99 ms | most running at once | API server CPU per node ms | API server cores | API server allocated per node MB | its GC share |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, o := range r.orchestration {
		per := "-"
		if o.finished {
			per = ms(o.total/time.Duration(o.machines)) + " ms"
		}
		p("| %d | %d | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %d | %s | %.2f | %.1f | %s |\n", o.machines, o.maxUnavailable, totalText(o, r.cfg.orchTimeout), per, secs(o.firstStart),
			o.handoff.n, ms(o.handoff.p50), ms(o.handoff.p99), ms(o.handoff.max), ms(o.nextStart.p50), ms(o.nextStart.p99), ms(o.updaterStart.p50), ms(o.updaterStart.p99), o.maxRunning,
			ms(o.apiServerCPUPerNode()), o.apiServerCores(), o.apiServerAllocatedPerNode()/(1<<20), o.apiServer.gcShareText())
	}
	p("\n")
}

func (r *report) renderFleet(w io.Writer, full bool) {
	f := r.fleet
	if f == nil {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 2b. A fleet upgraded at once\n\n")
	if full {
		p("%d Clusters, each in a namespace of its own with a MachineDeployment of %d machines as in section 2, are upgraded at once by one ", f.clusters, f.perCluster())
		p("manager wired as in section 2 (the same updater, `--concurrency %d`), on a test API server of their own: an UpgradeTask per Cluster, ", managerConcurrency)
		p("requested one after the other, each with maxUnavailable %d. Each Cluster's workload cluster is the same test API server, reached ", f.maxUnavailable)
		p("through a kubeconfig whose server URL carries a path of the Cluster's own (as a proxy such as Rancher's hands out); a transport ")
		p("of the bench takes the path off and keeps, in the lists and watches of Nodes, the Nodes of that Cluster only, so that each ")
		p("Cluster's Node cache holds its own %d Nodes, as with an API server per workload cluster. The hand-offs of every Cluster are ", f.perCluster())
		p("pooled. Total: from the first request to the last task seen `Completed`; first node: the latest of the Clusters' first NodeUpdates. ")
		p("The manager runs in the bench process, so its CPU and memory are the process's (with the bench's watches of the NodeUpdates): ")
		p("CPU is user and system time from the first request to the last completion, divided by that time; VmRSS and the Go heap in use are ")
		p("sampled every %s, and the process's VmRSS at the start is what earlier sections left.\n\n", usageSampleEvery)
	}
	p("| Clusters | machines each | maxUnavailable | total | first node after | hand-offs | hand-off p50 ms | p99 ms | max ms | next start p50 ms | p99 ms | updater's start p50 ms | p99 ms | writes per node | manager CPU (cores) | VmRSS at start | peak VmRSS | peak Go heap |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	writes := "-"
	if f.finished {
		writes = fmt.Sprintf("%.1f", f.writesPerNode())
	}
	p("| %d | %d | %d | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %s | %s |\n\n", f.clusters, f.perCluster(), f.maxUnavailable,
		totalText(*f, r.cfg.fleetTimeout), secs(f.firstStart), f.handoff.n, ms(f.handoff.p50), ms(f.handoff.p99), ms(f.handoff.max),
		ms(f.nextStart.p50), ms(f.nextStart.p99), ms(f.updaterStart.p50), ms(f.updaterStart.p99), writes, f.usage.cores(), mib(f.usage.rssStart), mib(f.usage.rssPeak), mib(f.usage.heapPeak))
	p("Per node: %s; reconciles %s; workload writes %s; API server CPU %s ms (%.2f cores over the run), %.1f MB allocated, %s of its CPU in GC.\n\n",
		perNode(f.writes, f.machines), perNode(f.reconciles, f.machines), perNode(f.workloadWrites, f.machines), ms(f.apiServerCPUPerNode()), f.apiServerCores(),
		f.apiServerAllocatedPerNode()/(1<<20), f.apiServer.gcShareText())
	p("How long the manager's writes took (p50/p99 ms): %s.\n\n", latencyText(f.writes, f.writeLatency))
}

// latencyText lists how long each kind of write took, the most frequent first.
func latencyText(counts map[string]int, took map[string]latencies) string {
	_, keys := writeTotals(counts)
	var parts []string
	for _, k := range keys {
		if l, ok := took[k]; ok && l.n > 0 {
			parts = append(parts, fmt.Sprintf("%s %s/%s", k, ms(l.p50), ms(l.p99)))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (r *report) renderWrites(w io.Writer, full bool) {
	if len(r.orchestration) == 0 {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 3. API writes per upgraded node\n\n")
	if full {
		p("Every POST, PUT, PATCH and DELETE the manager of section 2 sent, counted by an `http.RoundTripper` wrapped around its REST config ")
		p("(cached and direct clients and its event recorder alike), from the UpgradeTask's creation until a second after it completed, divided by ")
		p("the machines upgraded. The updater writes nothing, so none of this is an updater's own work; the bench's watches and the request that ")
		p("created the task use another client and are not counted. Events are writes too and are counted.\n\n")
	}
	p("| machines | maxUnavailable | writes | per node | per node, by verb and resource |\n|---:|---:|---:|---:|---|\n")
	for _, o := range r.orchestration {
		if !o.finished {
			p("| %d | %d | %d | not finished (%d of %d upgraded, all claimed) | %s |\n", o.machines, o.maxUnavailable, o.writesTotal, o.upgraded, o.machines, perNode(o.writes, o.machines))
			continue
		}
		p("| %d | %d | %d | %.1f | %s |\n", o.machines, o.maxUnavailable, o.writesTotal, o.writesPerNode(), perNode(o.writes, o.machines))
	}
	p("\n")
	p("What the writes come with, per node: reconciles of each controller (controller-runtime's `controller_runtime_reconcile_total`), ")
	p("reads of the management API server (cached reads are not requests and do not show), and the requests to the workload cluster ")
	p("(its Nodes' upgrade-pending taints: written to the workload cluster, not counted in the writes above):\n\n")
	p("| machines | maxUnavailable | reconciles per node | reads per node | workload reads per node | workload writes per node |\n|---:|---:|---|---|---|---|\n")
	for _, o := range r.orchestration {
		size := strconv.Itoa(o.machines)
		if !o.finished {
			size += " (not finished)"
		}
		p("| %s | %d | %s | %s | %s | %s |\n", size, o.maxUnavailable, perNode(o.reconciles, o.machines), perNode(o.reads, o.machines), perNode(o.workloadReads, o.machines), perNode(o.workloadWrites, o.machines))
	}
	p("\n")
	p("How long the manager's writes took, from the request to the response (p50/p99 ms): what a write waits for in the API server at that load:\n\n")
	for _, o := range r.orchestration {
		p("- %d machines, maxUnavailable %d: %s\n", o.machines, o.maxUnavailable, latencyText(o.writes, o.writeLatency))
	}
	p("\n")
	p("Events recorded per node, by the kind they regard and their reason (an event repeated as a series counts each time):\n\n")
	for _, o := range r.orchestration {
		p("- %d machines, maxUnavailable %d: %s\n", o.machines, o.maxUnavailable, perNode(o.events, o.machines))
	}
	p("\n")
}

// renderRequestCosts writes what one request of each kind costs the API server, and what
// the requests section 3 counted per node come to at those prices.
func (r *report) renderRequestCosts(w io.Writer, full bool) {
	if len(r.requestCosts) == 0 {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 3b. What one request costs the test API server\n\n")
	if full {
		p("After the upgrades of section 2, on the same test API server: a cluster of %d machines as section 2 creates them, and %d requests ", r.requestCosts[0].ops, r.requestCosts[0].ops)
		p("of each kind an upgraded node makes, sent one after another, one per object, each as the manager sends it (the same patch types and ")
		p("optimistic locks, from the object the previous request returned, so that no read is counted with a write), with a watch of each kind ")
		p("open as the manager's informers are. What the API server spent (`process_cpu_seconds_total` and `go_gc_heap_allocs_bytes_total`, ")
		p("read %s after the last request of the kind, its watch events included), divided by the requests; the wall time is what one client ", requestCostSettle)
		p("waited for each. The figures include what the idle API server does meanwhile (its own controllers, a few ms a second).\n\n")
	}
	p("| request | CPU per request ms | allocated per request KB | wall per request ms |\n|---|---:|---:|---:|\n")
	price := map[string]time.Duration{}
	for _, c := range r.requestCosts {
		price[c.kind] = c.cpuPerOp()
		p("| %s | %s | %.0f | %s |\n", c.kind, ms(c.cpuPerOp()), c.allocatedPerOp()/1024, ms(c.wallPerOp()))
	}
	p("\n")
	p("Section 3's requests per node at these prices, against the API server CPU per node measured in section 2 (the rest is what is not ")
	p("priced here, the watches' reads and the idle API server):\n\n")
	p("| machines | maxUnavailable | priced per node ms | measured per node ms | not priced |\n|---:|---:|---:|---:|---|\n")
	for _, o := range r.orchestration {
		if !o.finished {
			continue
		}
		var priced time.Duration
		unpriced := map[string]int{}
		for _, counts := range []map[string]int{o.writes, o.reads, o.workloadWrites, o.workloadReads} {
			for k, n := range counts {
				if c, ok := price[k]; ok {
					priced += c * time.Duration(n)
				} else {
					unpriced[k] += n
				}
			}
		}
		p("| %d | %d | %s | %s | %s |\n", o.machines, o.maxUnavailable, ms(priced/time.Duration(max(o.upgraded, 1))), ms(o.apiServerCPUPerNode()), perNode(unpriced, o.machines))
	}
	p("\n")
}

func (r *report) renderMemory(w io.Writer, full bool) {
	if len(r.memory) == 0 {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 4. Manager memory\n\n")
	if full {
		p("The real manager binary (built from this checkout by `test/manager`, run as a process with the flags the tests use, no leader election) ")
		p("against a fresh test API server holding Clusters of %d Machines each (with a MachineDeployment and MachineSet per Cluster, ", r.cfg.machinesPerCluster)
		p("and one Ready Node per Machine, objects with the status Cluster API and kubelets report). Each size gets a freshly started manager; once ")
		p("its controllers run (the number of \"Starting workers\" lines stopped growing) and %s more passed, VmRSS is read from ", r.cfg.memSettle)
		p("`/proc/<pid>/status` five times %s apart (median shown), with the peak RSS since start (the highest VmHWM or VmRSS read: VmHWM, raised only when pages are unmapped, can lag a VmRSS read) and the Go heap in use ", r.cfg.memSampleEvery)
		p("(`go_memstats_heap_inuse_bytes` from its /metrics, no GC forced). The manager caches Machines, MachineSets, MachineDeployments, Clusters and ")
		p("its own kinds; with no UpgradeTask it reads no workload cluster, so in the first columns the Nodes are on the API server but not in its cache.\n\n")
		p("Then the same manager is made to cache Nodes as it does during an upgrade: the first Cluster gets a kubeconfig Secret (the test API ")
		p("server's) and a JobUpdater, and a dry-run UpgradeTask (`spec.dryRun: true`) of its MachineDeployment is requested through ")
		p("`upgraderequest.Requester`, as ExternalUpgradeRequest does. The UpgradeTask controller lists the workload cluster's Nodes through the ")
		p("manager's Node cache (`workloadcluster.NodeCaches`, a watch of the Nodes started by the first list, without their image lists and managed ")
		p("fields) at every reconcile, and plans every machine without starting one. Once the task is `Planned` with every preflight check of every ")
		p("machine passed (NodeReady found each Node) and the API server serves one more watch of Nodes, and %s more passed, the same readings are ", r.cfg.memSettle)
		p("taken again (the peak still counts from the manager's start). \"Planned after\" is from the task's creation to its `Planned` phase, which includes the ")
		p("first list of the Nodes. The task is deleted before the manager stops, and the next size starts a manager without it.\n\n")
		p("In the bench every Cluster's workload cluster is the same test API server, and Nodes are cluster-scoped objects of that one server: ")
		p("the Node cache of that one Cluster holds every Node of the server (the Nodes column), as many Node objects as one cache per Cluster would ")
		p("hold on a management cluster whose Clusters each have their own API server. What one cache per workload cluster adds beyond its Nodes ")
		p("(a REST client, an informer and a watch per Cluster) is counted once here, not once per Cluster.\n\n")
	}
	p("| Clusters | Machines | Nodes | VmRSS | peak | Go heap in use | controllers running after | VmRSS with the Nodes cached | peak | Go heap in use | planned after |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.memory {
		p("| %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.clusters, m.machines, m.nodes, mib(m.rss), mib(m.peak), mib(m.heapInUse), secs(m.startup),
			mib(m.rssCached), mib(m.peakCached), mib(m.heapCached), secs(m.planned))
	}
	p("\n")
}

func (r *report) renderGrowth(w io.Writer, full bool) {
	if len(r.orchestration) < 2 && len(r.memory) < 2 {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 5. How it grows\n\n")
	if full {
		p("The figures of sections 2 and 4 per unit of size: constant columns mean linear growth; a column that grows with the size means worse than linear.\n\n")
	}
	if len(r.orchestration) >= 2 {
		p("| machines | maxUnavailable | total per machine | hand-off p50 ms | writes per node |\n|---:|---:|---:|---:|---:|\n")
		for _, mu := range r.cfg.orchMaxUnavailable {
			for _, o := range r.orchestration {
				if o.maxUnavailable != mu {
					continue
				}
				per := "not finished"
				if o.finished {
					per = ms(o.total/time.Duration(o.machines)) + " ms"
				}
				writes := "-"
				if o.finished {
					writes = fmt.Sprintf("%.1f", o.writesPerNode())
				}
				p("| %d | %d | %s | %s | %s |\n", o.machines, o.maxUnavailable, per, ms(o.handoff.p50), writes)
			}
		}
		p("\n")
	}
	if len(r.memory) >= 2 {
		p("| Machines | VmRSS | VmRSS per 1,000 Machines | growth from the previous size per 1,000 Machines | VmRSS with the Nodes cached | its growth per 1,000 Machines (and Nodes) |\n|---:|---:|---:|---:|---:|---:|\n")
		growth := func(cur, prev uint64, dm int) string {
			if dm <= 0 || cur == 0 || prev == 0 {
				return "-"
			}
			return mib(uint64(max(float64(cur)-float64(prev), 0) * 1000 / float64(dm)))
		}
		for i, m := range r.memory {
			step, stepCached := "-", "-"
			if i > 0 {
				prev := r.memory[i-1]
				step = growth(m.rss, prev.rss, m.machines-prev.machines)
				stepCached = growth(m.rssCached, prev.rssCached, m.machines-prev.machines)
			}
			p("| %d | %s | %s | %s | %s | %s |\n", m.machines, mib(m.rss), mib(m.rss*1000/uint64(max(m.machines, 1))), step, mib(m.rssCached), stepCached)
		}
		p("\n")
	}
}

func (r *report) renderMakespan(w io.Writer, full bool) {
	if len(r.makespan) == 0 {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	d := scaleDurations(r.cfg.makespanScale)
	t := toolkitRun
	p("## 6. Makespan of a Harvester upgrade\n\n")
	if full {
		p("A Harvester cluster of N simulated nodes (up to %d management nodes, the rest workers) is upgraded from Harvester v1.7.1 to %s ", makespanManagement, makespanRelease)
		p("with the durations of a real run of Harvester's upgrade-toolkit, %.0f× shorter: ISO download %s, repository %s and metadata %s ", r.cfg.makespanScale, t.isoDownload, t.repository, t.metadata)
		p("(%s scaled), image preload of every node at once %s (%s), cluster upgrade %s (%s), about 21 minutes of disruptive work per node ", secs(d.setup), t.preload, secs(d.preload), t.clusterUpgrade, secs(d.clusterUpgrade))
		p("(%s), cleanup %s (%s). The node's 21 minutes are split among the Plans that do them: drain %s (%s; kubectl drain once the virtual machines ", secs(d.node()), t.cleanup, secs(d.cleanup), t.drain, secs(d.drain))
		p("left), RKE2 upgrade %s (%s; the kubelet restarts), OS upgrade and reboot %s (%s, the longest: the OS install and the node's reboot).\n\n", t.rke2, secs(d.rke2), t.osUpgrade, secs(d.osUpgrade))
		p("The real UpgradeTask controller, NodeUpdate reconciler with the Harvester updater and UpgradePlan controller run in one controller-runtime ")
		p("manager against a management test API server, wired as `main.go` wires them with `--poll-interval %s` (no preflight checks of the plan: ", r.cfg.makespanPoll)
		p("the simulated kubelets serve no disk statistics); the Harvester cluster is a workload test API server of its own per run, reached through ")
		p("the Cluster's kubeconfig Secret, with the simulators of `test/sim`, each acting on the events of informers of the kinds its real ")
		p("controller watches and when a delay it plays is due, as those controllers do (none of them polls; a pass every second without an ")
		p("event is the safety net), except Longhorn's, which looks every %s (once a second while the cluster does not serve the kinds of ", r.cfg.makespanPoll)
		p("its live upgrade, as here): System Upgrade Controller (`Work` per Plan kind: ")
		p("preload, drain, rke2, os, image-cleanup; it reads Plans, Nodes, Secrets and its Jobs from informers and acts at once on every Plan, ")
		p("Job and Node event and when a pod's work ends, as SUC's informer-driven handlers do, shared/facts/suc.md fact 50; each node's ")
		p("pods run on their own, as each node's kubelet runs them), the upgrade repository (`Delay` = ISO download + repository + metadata: its server answers ")
		p("the metadata at once, so the metadata's second is played by the repository's delay), Rancher and Fleet (their default small delays) ")
		p("and the cluster upgrade Job, which runs the real `clusterupgrade.Run` and completes no sooner than the scaled cluster upgrade ")
		p("(`ClusterUpgradeJobs.MinDuration`). The image cleanup runs one node at a time (as the toolkit's); the run's %s is shared among the ", t.cleanup)
		p("nodes, so that it adds up to the same at every size. The control plane's UpgradeTask is created first, the workers' once it completed ")
		p("(as the annotation cascade does), both with maxUnavailable 1: one node at a time, as Harvester. Before the clock starts the bench lists ")
		p("every custom kind of the new workload API server once: a fresh API server answers the first request for a kind only after about a ")
		p("second, which a real cluster, whose controllers have long watched their kinds, never shows.\n\n")
		p("What a ratio above 1 is made of: every hand-over between two steps is a chain of writes, each a round trip to one of the two ")
		p("test API servers on this machine (a few milliseconds, tens when the machine is busy). From the end of a Plan's work to the start of ")
		p("the next: the Job's completion, SUC's label on the node, the updater's next Plan (the label's Node event wakes the NodeUpdate, ")
		p("through the manager's watch of the cluster's Nodes), SUC's Job, created paused, ")
		p("the Plan's status, the Job resumed (fact 28), the pod's start. A node has four such hand-overs (the drain, RKE2 and OS Plans, and ")
		p("the node's success, after which the UpgradeTask reads Longhorn's state and picks the next node), the plan one per phase and per ")
		p("node of the image cleanup, and the preload of N nodes N Jobs created and resumed one after the other, as SUC's apply does. None ")
		p("of it shrinks with the scale, so at %.0f× a hand-over of a tenth of a second weighs what 10 s would on a real cluster.\n\n", r.cfg.makespanScale)
		p("Makespan: from the first NodeUpdate seen (the control plane's UpgradeTask creates it, and it creates the UpgradePlan) to the ")
		p("UpgradePlan seen `Succeeded`, by the bench's own clock (watches of the plan and the NodeUpdates; the status timestamps have whole ")
		p("seconds only). The time from the UpgradeTask's creation to its first NodeUpdate is the task's first look at a workload cluster ")
		p("(its clients and its Node cache), a constant of a few seconds that does not scale with the upgrade; it is shown apart. Bound: the critical path, setup + preload + cluster upgrade + N × the node's disruptive work + cleanup, all scaled: ")
		p("nothing can finish sooner. The per-node preload variant is the same run with `imagePreload.concurrency: -1`: no cluster-wide ")
		p("preload, each node preloads (%s) in its own turn before its drain; its ratio is to the same bound, and its own critical path adds ", secs(d.preload))
		p("N × the preload.\n\n")
	}
	p("| nodes | makespan | bound | ratio | makespan with per-node preload | its ratio to the bound | its own critical path |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range r.cfg.makespanSizes {
		var cw, pn *makespanResult
		for i := range r.makespan {
			if m := &r.makespan[i]; m.nodes == n && m.perNodePreload {
				pn = m
			} else if m.nodes == n {
				cw = m
			}
		}
		if cw == nil {
			continue
		}
		perNode, perNodeRatio := "-", "-"
		if pn != nil {
			perNode, perNodeRatio = secs(pn.makespan), fmt.Sprintf("%.3f", pn.ratio())
		}
		p("| %d | %s | %s | %.3f | %s | %s | %s |\n", n, secs(cw.makespan), secs(cw.bound), cw.ratio(), perNode, perNodeRatio, secs(cw.bound+time.Duration(n)*d.preload))
	}
	p("\n")
	p("Where the time went, by the plan's phases as the bench saw them (measured, and in parentheses over the simulated work of the phase): ")
	p("setup is from the first NodeUpdate to ImagePreloading (or the phase after it when it is skipped), the nodes are NodeUpgrading (with the per-node preload, the nodes' ")
	p("work includes their preloads), cleanup is ImageCleaning and CleaningUp. A node is from when it may go (its NodeUpdate's creation, or the ")
	p("plan's NodeUpgrading for the first) to its success; the hand-off from one node's success to the next NodeUpdate. A phase's ")
	p("bounds are when the bench saw the plan's status change, which the controller writes at the end of a reconcile that may already have ")
	p("started the next phase's work (and retries after a write conflict), so a phase can show a little less than its work; the makespan ")
	p("does not depend on that. The nodes' SUC chains are what the simulated System Upgrade Controller takes around the work of each ")
	p("of the nodes' own Plans (drain, RKE2, OS; sim.PlanRun): from when it first saw the Plan to its pod's start (a Job created paused, ")
	p("the Plan's applying status, the Job resumed, the pod: shared/facts/suc.md fact 28) and from the Job's completion to the node's ")
	p("label (fact 46); they lie on the critical path one after the other and are part of the nodes' time over their work. What the rest ")
	p("of that time is made of: capi-inplace's hand-overs (the wake, a reconcile, its requests) and the requests' latency on these ")
	p("two cores.\n\n")
	p("| nodes | preload | setup | preload | cluster upgrade | nodes | cleanup | node mean | hand-off mean | nodes' SUC chains |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.makespan {
		how := "cluster-wide"
		nodeWork := time.Duration(m.nodes) * d.node()
		preload := d.preload
		if m.perNodePreload {
			how, preload = "per node", 0
			nodeWork += time.Duration(m.nodes) * d.preload
		}
		over := func(got, work time.Duration) string {
			return fmt.Sprintf("%s (%+.1f s)", secs(got), (got - work).Seconds())
		}
		setup := m.setupTime()
		cleanup := m.phaseTime(harvesterv1.UpgradePlanImageCleaning) + m.phaseTime(harvesterv1.UpgradePlanCleaningUp)
		nodeMean, handoffMean := meanOf(m.nodeTime), meanOf(m.handoff)
		perNodeWork := d.node()
		if m.perNodePreload {
			perNodeWork += d.preload
		}
		p("| %d | %s | %s | %s | %s | %s | %s | %s | %s ms | %s (%d, %s ms each) |\n", m.nodes, how, over(setup, d.setup), over(m.phaseTime(harvesterv1.UpgradePlanImagePreloading), preload),
			over(m.phaseTime(harvesterv1.UpgradePlanClusterUpgrading), d.clusterUpgrade), over(m.phaseTime(harvesterv1.UpgradePlanNodeUpgrading), nodeWork),
			over(cleanup, d.cleanup), over(nodeMean, perNodeWork), ms(handoffMean), secs(m.sucChain), m.sucChains, ms(m.sucChainMean()))
	}
	p("\n")
	p("A node's steps, mean over the nodes of each run (from when the bench first saw the step as the NodeUpdate's current step to the next one; ")
	p("a step that began and ended within one reconcile is never seen and counts in the step before):\n\n")
	for _, m := range r.makespan {
		how := "cluster-wide preload"
		if m.perNodePreload {
			how = "per-node preload"
		}
		var parts []string
		for _, step := range harvesterStepOrder() {
			if v, ok := m.steps[step]; ok {
				parts = append(parts, fmt.Sprintf("%s %s ms", step, ms(v)))
			}
		}
		p("- %d nodes, %s: %s\n", m.nodes, how, strings.Join(parts, ", "))
	}
	p("\n")
}

// harvesterStepOrder is the Harvester updater's steps in their order.
func harvesterStepOrder() []string {
	return []string{
		harvesteradapter.StepClusterUpgrade, harvesteradapter.StepRepository, harvesteradapter.StepImagePreload, harvesteradapter.StepLonghornPause,
		harvesteradapter.StepCordon, harvesteradapter.StepEvacuateVMs, harvesteradapter.StepDrain, harvesteradapter.StepLonghornDataEngine,
		harvesteradapter.StepKubernetesUpgrade, harvesteradapter.StepOSUpgrade, harvesteradapter.StepRestoreVMs, harvesteradapter.StepFinish,
	}
}

func meanOf(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range v {
		sum += x
	}
	return sum / time.Duration(len(v))
}

// perNode lists counts divided by machines, largest first.
func perNode(counts map[string]int, machines int) string {
	_, keys := writeTotals(counts)
	var parts []string
	for _, k := range keys {
		if counts[k] == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(counts[k])/float64(max(machines, 1))))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func clientsText(n int) string {
	if n == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", n)
}
