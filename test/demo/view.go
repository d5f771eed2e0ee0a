package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/capi-inplace/capi-inplace/test/scenario"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// view is everything the demo prints. On a terminal the live progress is one block
// redrawn in place; elsewhere (CI logs, a pipe) every change is a line of its own.
type view struct {
	out    io.Writer
	tty    bool
	width  int
	height int // lines the live block may take
	began  time.Time

	mu        sync.Mutex
	drawn     int // lines of the live block on screen
	liveOn    bool
	lastFrame []string
	t         progress
	doneSeen  int
}

// progress is what the live view follows: the simulated nodes of the scenario (tracker)
// or the machines of a Cluster rolled out by Cluster API's own controllers (capiTracker).
type progress interface {
	// sample reads the objects once and records what changed.
	sample(ctx context.Context) error
	// takeEvents returns the changes seen since the last call, one line each.
	takeEvents() []string
	// count says how many items are done, of how many, and the share of the work done.
	count() (done, total int, frac float64)
	// unit names the items ("nodes", "machines").
	unit() string
	// lines are the live block's lines under the progress bar, one per item.
	lines(v *view) []string
	// compactLines stand for lines when they do not fit on the screen.
	compactLines(v *view) []string
	// began is when the upgrade was asked for.
	began() time.Time
}

func newView(out io.Writer, tty bool) *view {
	v := &view{out: out, tty: tty, width: 100, height: 1 << 20, began: time.Now()}
	if tty {
		v.width = terminalWidth(80)
		// The block is redrawn by moving the cursor up over it, which works only while
		// it fits on the screen.
		v.height = 40
		if _, rows := ttySize(os.Stdout); rows > 5 {
			v.height = rows - 3
		}
	}
	return v
}

func terminalWidth(fallback int) int {
	if w, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && w > 20 {
		return w
	}
	if w, _ := ttySize(os.Stdout); w > 20 {
		return w
	}
	return fallback
}

// ANSI styles, used on a terminal only.
const (
	bold   = "\x1b[1m"
	dim    = "\x1b[2m"
	red    = "\x1b[31m"
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	cyan   = "\x1b[36m"
	reset  = "\x1b[0m"
)

func (v *view) style(s, text string) string {
	if !v.tty {
		return text
	}
	return s + text + reset
}

// println prints a line above the live block, which is redrawn under it.
func (v *view) println(line string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clearBlock()
	_, _ = fmt.Fprintln(v.out, line)
	if v.liveOn && v.tty {
		v.drawBlock(v.lastFrame)
	}
}

func (v *view) clock() string {
	d := time.Since(v.began)
	return fmt.Sprintf("%2d:%04.1f", int(d.Minutes()), d.Seconds()-60*float64(int(d.Minutes())))
}

func (v *view) title(cfg config) {
	how := map[string]string{
		viaAnnotation: "the in-place-upgrade-to annotation on the Cluster",
		viaHook:       "an ExternalUpgradeRequest per control plane and MachineDeployment",
		viaCAPI:       "Cluster API's in-place update hooks (CanUpdateMachine[Set], UpdateMachine)",
	}[cfg.via]
	v.println(v.style(bold, "capi-inplace demo") + ": an in-place upgrade of simulated Harvester nodes, on this machine")
	h := cfg.hop()
	v.println(fmt.Sprintf("  Harvester %s -> %s, Kubernetes %s -> %s, asked for with %s",
		h.FromRelease, h.ToRelease, h.FromKubernetes, h.ToKubernetes, how))
	v.println("")
}

// titleRealCAPI is the title of --via=capi on Cluster API's own controllers.
func (v *view) titleRealCAPI() {
	v.println(v.style(bold, "capi-inplace demo") + ": Cluster API's own controllers roll a Kubernetes version bump out in place, on this machine")
	v.println(fmt.Sprintf("  Kubernetes %s -> %s on a ClusterClass Cluster of CAPD in-memory machines, asked for with a spec.topology.version bump",
		capiFromVersion, capiToVersion))
	v.println("")
}

// fallback says that --via=capi plays Cluster API in-process, and how to get the real one.
func (v *view) fallback(why error) {
	v.println(fmt.Sprintf("%s Cluster API's controllers are not built (run `make capi-binaries`): playing Cluster API's side in-process instead",
		v.style(yellow+bold, "FALLBACK:")))
	v.println("  (test/capisim: the demo calls the hooks as our reading of Cluster API's code says it would; " + why.Error() + ")")
	v.println("")
}

// stage tells what the setup is doing.
func (v *view) stage(what string) {
	v.println(fmt.Sprintf("%s  %s", v.style(dim, v.clock()), what))
}

// ready describes what runs, once the scenario started.
func (v *view) ready(s *scenario.Scenario, cfg config, took time.Duration) {
	md := s.MachineDeployment
	v.println(fmt.Sprintf("%s  ready in %s:", v.style(dim, v.clock()), formatDuration(took)))
	v.println(fmt.Sprintf("         management API server %s  (CAPI objects, UpgradeTasks, NodeUpdates)", s.Management.Config.Host))
	v.println(fmt.Sprintf("         workload API server   %s  (Nodes, SUC Plans and Jobs, Longhorn)", s.Workload.Config.Host))
	v.println(fmt.Sprintf("         manager               hooks on https://127.0.0.1:%d (CAPI) and :%d (ExternalUpgradeRequest), log %s",
		s.Manager.WebhookPort, s.Manager.ExternalHookPort, s.ManagerLog))
	v.println(fmt.Sprintf("         Cluster %s/%s, updater HarvesterUpgrader/%s; KubeadmControlPlane %s (%d, one at a time); MachineDeployment %s (%d, maxUnavailable %d)",
		s.Cluster.Namespace, s.Cluster.Name, scenario.UpdaterName, s.ControlPlane.Name, len(s.Nodes)-cfg.workers, md.Name, cfg.workers, cfg.maxUnavailable))
	if cfg.fail != "" {
		n, _ := s.Node(cfg.fail)
		v.println(fmt.Sprintf("         %s the OS upgrade of %s will fail (--fail)", v.style(yellow, "!"), n.Name))
	}
	v.println("")
}

// problem reports what ended the upgrade badly.
func (v *view) problem(what string) {
	v.println(fmt.Sprintf("%s  %s %s", v.style(dim, v.clock()), v.style(red, "✘"), what))
}

// step reports a step of the trigger (a hook call, an annotation written).
func (v *view) step(what string) {
	v.println(fmt.Sprintf("%s  %s %s", v.style(dim, v.clock()), v.style(cyan, "→"), what))
}

// live samples the tracker and shows the progress until the returned stop is called.
func (v *view) live(ctx context.Context, t progress) (stop func()) {
	v.mu.Lock()
	v.t, v.liveOn = t, true
	v.mu.Unlock()
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := t.sample(loopCtx); err == nil {
				v.frame()
			}
			select {
			case <-loopCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
		v.frame()
		v.mu.Lock()
		v.liveOn, v.drawn = false, 0
		v.mu.Unlock()
	}
}

// frame shows the tracker's current state: the block redrawn on a terminal, the new
// events as lines elsewhere.
func (v *view) frame() {
	events := v.t.takeEvents()
	done, _, _ := v.t.count()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.tty {
		for _, e := range events {
			_, _ = fmt.Fprintf(v.out, "%s  %s\n", v.clock(), e)
		}
		if done != v.doneSeen {
			v.doneSeen = done
			_, _ = fmt.Fprintf(v.out, "%s  %s\n", v.clock(), v.progressLine())
		}
		return
	}
	lines := append([]string{v.progressLine()}, v.t.lines(v)...)
	if len(lines) > v.height {
		lines = append([]string{v.progressLine()}, v.t.compactLines(v)...)
	}
	v.clearBlock()
	v.drawBlock(lines)
}

func (v *view) clearBlock() {
	if v.tty && v.drawn > 0 {
		_, _ = fmt.Fprintf(v.out, "\x1b[%dA\r\x1b[J", v.drawn)
		v.drawn = 0
	}
}

func (v *view) drawBlock(lines []string) {
	v.lastFrame = lines
	for _, l := range lines {
		_, _ = fmt.Fprintln(v.out, l)
	}
	v.drawn = len(lines)
}

// progressLine is the bar, the count of items done and the time since the trigger.
func (v *view) progressLine() string {
	const width = 30
	done, total, frac := v.t.count()
	filled := int(frac*width + 0.5)
	full, empty := "#", "."
	if v.tty {
		full, empty = "█", "░"
	}
	bar := strings.Repeat(full, filled) + strings.Repeat(empty, width-filled)
	since := time.Since(v.t.began())
	return fmt.Sprintf("[%s] %3.0f%%  %d/%d %s upgraded  %s", v.style(green, bar), frac*100, done, total, v.t.unit(),
		fmt.Sprintf("%d:%02d", int(since.Minutes()), int(since.Seconds())%60))
}

// nodeLines are the per-node lines: role, node, state, elapsed time.
func (v *view) nodeLines(nodes []nodeState) []string {
	cpDone := true
	for _, n := range nodes {
		if n.ControlPlane && !n.done() {
			cpDone = false
		}
	}
	now := time.Now()
	var out []string
	lastRole := ""
	for _, n := range nodes {
		role := "workers"
		if n.ControlPlane {
			role = "control plane"
		}
		shownRole := ""
		if role != lastRole {
			shownRole, lastRole = role, role
		}
		symbol, color, text := v.nodeStatus(n, cpDone)
		elapsed := ""
		if !n.started.IsZero() {
			elapsed = formatDuration(n.elapsed(now))
		}
		// The status column takes what the terminal leaves, up to 60 columns.
		avail := min(max(v.width-(2+14+1+18+1+2+9), 10), 60)
		text = truncate(text, avail)
		line := fmt.Sprintf("  %-14s %-18s %s %-*s %7s", shownRole, n.Name, v.style(color, symbol), avail, text, elapsed)
		out = append(out, line)
	}
	return out
}

// compactLines stand for the node lines when they do not fit on the screen: the nodes
// being upgraded or failed, one line each, and a count of the others.
func (v *view) compactLines(nodes []nodeState) []string {
	cpDone := true
	for _, n := range nodes {
		if n.ControlPlane && !n.done() {
			cpDone = false
		}
	}
	var out []string
	upgraded, waiting := 0, 0
	for _, n := range nodes {
		switch {
		case n.done():
			upgraded++
		case n.nodeUpdate == "":
			waiting++
		default:
			symbol, color, text := v.nodeStatus(n, cpDone)
			out = append(out, fmt.Sprintf("  %-18s %s %s", n.Name, v.style(color, symbol), truncate(text, max(v.width-24, 10))))
		}
	}
	return append(out, fmt.Sprintf("  %s %d upgraded   %s %d waiting", v.style(green, "✔"), upgraded, v.style(dim, "·"), waiting))
}

func (v *view) nodeStatus(n nodeState, cpDone bool) (symbol, color, text string) {
	switch {
	case n.done():
		return "✔", green, fmt.Sprintf("upgraded: %s, %s", n.kubelet, n.osImage)
	case n.phase == "Failed":
		return "✘", red, fmt.Sprintf("FAILED at %s: %s", n.failedStepOr(), n.failure)
	case n.nodeUpdate != "" && n.phase.IsFinal():
		return "✘", red, string(n.phase)
	case n.nodeUpdate != "":
		text = "starting"
		if n.step != "" {
			text = fmt.Sprintf("%s (%d/%d)", n.step, n.stepIndex, n.stepCount)
		}
		switch {
		case !n.ready:
			text += "  node down"
		case n.cordoned:
			text += "  cordoned"
		}
		return "▶", yellow, text
	case n.waiting != "":
		return "·", dim, "waiting" + shortHold(n.waiting)
	case !n.ControlPlane && !cpDone:
		return "·", dim, "waiting for the control plane"
	}
	return "·", dim, "waiting"
}

// availabilityHold is how the UpgradeTask says a machine waits for room under maxUnavailable.
var availabilityHold = regexp.MustCompile(`already unavailable \(([^)]*)\); maxUnavailable is (\d+)`)

// shortHold says in a few words why a machine waits, from its UpgradeTask's message.
func shortHold(message string) string {
	if m := availabilityHold.FindStringSubmatch(message); m != nil {
		return fmt.Sprintf(" (maxUnavailable %s: %s)", m[2], m[1])
	}
	message = strings.TrimPrefix(strings.TrimPrefix(message, "Waiting"), ": ")
	if message == "" {
		return ""
	}
	return ": " + message
}

func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// summary prints the final table, the failures with the nodes' own messages, the safety
// checks and the verdict.
func (v *view) summary(s *scenario.Scenario, cfg config, res *outcome) {
	v.println("")
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "NODE\tROLE\tFROM\tTO\tSTEPS\tDURATION\tRESULT")
	for _, r := range res.rows {
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.node, r.role, r.from, r.to, r.steps, r.duration, r.result)
	}
	_ = tw.Flush()
	v.printTable(b.String(), "upgraded")
	for _, r := range res.rows {
		if r.failure != "" {
			v.println("")
			v.println(v.style(red, fmt.Sprintf("%s failed at %s: %s", r.node, r.failedAt, r.failure)))
		}
	}
	if journeys := s.VMJourneys(); len(journeys) > 0 {
		v.println("")
		v.println("Virtual machines (KubeVirt simulator):")
		for _, j := range journeys {
			v.println("  " + j)
		}
	}
	if journeys := s.NodeJourneys(); len(journeys) > 0 {
		v.println("")
		v.println("On each node, in order (SUC and Rancher simulators' records; the release's own node steps are the node program's rke2-settings and os-upgrade):")
		for _, j := range journeys {
			v.println("  " + j)
		}
	}
	if len(res.settings) > 0 {
		v.println("")
		v.println("Settings the release changes for the nodes (watched on the workload cluster; the skip file from the SUC simulator's record of the hosts):")
		for _, st := range res.settings {
			v.println("  " + st.String())
		}
	}
	v.planHeld(res)
	v.println("")
	v.println("Safety, from the simulators' records:")
	for _, c := range res.checks {
		if c.OK {
			v.println(fmt.Sprintf("  %s %s", v.style(green, "✔"), c.Name))
		} else {
			v.println(fmt.Sprintf("  %s %s: %s", v.style(red, "✘"), c.Name, c.Detail))
		}
	}
	v.println("")
	took := formatDuration(time.Since(v.t.began()))
	via := cfg.via
	if via == viaCAPI {
		via += " played in-process (fallback: Cluster API's controllers are not built)"
	}
	reached := 0
	for _, r := range res.rows {
		if r.reached {
			reached++
		}
	}
	h := s.Options.Hop
	if res.ok() {
		v.println(v.style(green+bold, fmt.Sprintf("All %d nodes reached Kubernetes %s and %s in %s (upgrade) / %s (whole demo), via %s.",
			len(res.rows), h.ToKubernetes, h.ToOSImage(), took, formatDuration(time.Since(v.began)), via)))
		return
	}
	verdict := fmt.Sprintf("%d of %d nodes reached Kubernetes %s and %s (%s, via %s).",
		reached, len(res.rows), h.ToKubernetes, h.ToOSImage(), took, via)
	if !res.interrupted {
		verdict += " Manager log: " + s.ManagerLog
	}
	v.println(v.style(red+bold, verdict))
}

// planHeld says, when the run ends with the UpgradePlan held, what holds the cluster, in
// the plan's own words (its Degraded condition: the failed node's words first, the
// settings it keeps for the roll, the two ways on), and why the settings above are not
// back: the plan has not ended.
func (v *view) planHeld(res *outcome) {
	if res.planHold == "" {
		return
	}
	v.println("")
	v.println(v.style(yellow+bold, "What holds the cluster:") + " " + res.planStanding +
		"; it has not ended, so the settings above keep the roll's values until it does. The plan says:")
	v.println("  " + res.planHold)
}

// keep tells how to look at what keeps running.
func (v *view) keep(s *scenario.Scenario) {
	kubectl := "bin/k8s/kubectl"
	if root, err := testenv.RepoRoot(); err == nil {
		kubectl = filepath.Join(root, "bin", "k8s", "kubectl")
		if wd, err := os.Getwd(); err == nil {
			if rel, err := filepath.Rel(wd, kubectl); err == nil && !strings.HasPrefix(rel, "..") {
				kubectl = rel
			}
		}
	}
	v.println("")
	v.println(v.style(bold, "Everything keeps running (--keep). In another terminal:"))
	v.println("  export KUBECONFIG=" + s.ManagementKubeconfig + "   # the management cluster")
	v.println("  " + kubectl + " get upgradetasks,nodeupdates -A -w")
	v.println("  " + kubectl + " get clusters,kubeadmcontrolplanes,machinedeployments,machines -A")
	v.println("  " + kubectl + " --kubeconfig " + s.WorkloadKubeconfig + " get nodes -o wide -w   # the workload (Harvester) cluster")
	v.println("  " + kubectl + " --kubeconfig " + s.WorkloadKubeconfig + " get plans.upgrade.cattle.io,jobs -n " + scenario.SUCNamespace)
	v.println("  tail -f " + s.ManagerLog)
	v.println("Press Ctrl-C to stop everything.")
}

// printTable prints a summary table tabwriter wrote: the header bold, the rows that end in
// ok as they are, the others red.
func (v *view) printTable(text, ok string) {
	for i, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		switch {
		case i == 0:
			line = v.style(bold, line)
		case strings.HasSuffix(line, ok):
		default:
			line = v.style(red, line)
		}
		v.println(line)
	}
}
