// Command demo is `make demo`: the whole product on one machine. It starts a management
// and a workload API server, a Cluster API cluster of simulated Harvester nodes (3
// control plane machines and a MachineDeployment of workers), the simulators and the
// real manager binary as a separate process, then asks for an in-place upgrade the way a
// user would and shows it live, node by node, ending with a summary table. It exits 0
// only if every node reached the target version and no safety invariant was broken.
//
// --via=capi runs Cluster API's own controllers instead when they are built in bin/capi
// (realcapi.go): a ClusterClass Cluster of CAPD in-memory machines whose
// spec.topology.version bump Cluster API rolls out through capi-inplace's hooks. Without
// them it plays Cluster API's hook calls in-process (capi.go) and says it is a fallback.
//
//	go run ./test/demo [--via=annotation|hook|capi] [--from v1.6.1] [--nodes N] [--fail NODE] [--abort-at NODE] [--step-delay D] [--keep] [--preview]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/scenario"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The ways of asking for the upgrade (--via).
const (
	viaAnnotation = "annotation"
	viaHook       = "hook"
	viaCAPI       = "capi"
)

// The updaters of --via=capi (--updater).
const (
	// updaterExternal is the external updater simulator (ExternalUpgrader), which takes
	// each node NotReady for --step-delay and reports the new kubelet.
	updaterExternal = "external"
	// updaterKubeadm is the KubeadmUpdater, its node Jobs run by sim.KubeadmNodes: the
	// node program's kubeadm phases on a fake root per node.
	updaterKubeadm = "kubeadm"
)

// config is the demo's flags.
type config struct {
	via            string
	updater        string
	workers        int
	controlPlane   int
	maxUnavailable int
	stepDelay      time.Duration
	pollInterval   time.Duration
	fail           string
	keep           bool
	longhornV2     bool
	timeout        time.Duration
	managerBinary  string
	// preview shows an UpgradePreview of the upgrade before asking for it, waiting at
	// most previewWait for the manager to compute it.
	preview     bool
	previewWait time.Duration
	// gateRedAt names the node while whose upgrade a health gate turns red (redGate).
	gateRedAt string
	// abortAt names the node at whose pre-drain hook the upgrade is aborted (aborter).
	abortAt string
	// from is the Harvester release the cluster runs at first, which names the hop
	// (scenario.HopFrom).
	from string
}

func defaultConfig() config {
	return config{
		via: viaAnnotation, updater: updaterExternal, workers: 3, controlPlane: 3, maxUnavailable: 1,
		stepDelay: 2 * time.Second, pollInterval: 250 * time.Millisecond,
		longhornV2: true, timeout: 5 * time.Minute, previewWait: time.Minute,
		from: scenario.DefaultHop.FromRelease,
	}
}

func (c *config) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.updater, "updater", c.updater, "with --via=capi, the updater of the Cluster: external (a simulator that takes each node NotReady for --step-delay and reports the new kubelet) or kubeadm (the KubeadmUpdater, named on the Cluster; its node Jobs run the node program's kubeadm phases on a simulated root per node)")
	fs.StringVar(&c.via, "via", c.via, "how the upgrade is asked for: annotation (the in-place-upgrade-to annotation on the Cluster), hook (an ExternalUpgradeRequest per control plane and MachineDeployment) or capi (a spec.topology.version bump rolled out by Cluster API's own controllers from bin/capi, built by make capi-binaries; without them, the demo plays Cluster API's hook calls in-process)")
	fs.IntVar(&c.workers, "nodes", c.workers, "number of worker machines in the MachineDeployment (the control plane has 3)")
	fs.IntVar(&c.maxUnavailable, "max-unavailable", c.maxUnavailable, "the MachineDeployment's maxUnavailable: how many workers may be down at once")
	fs.DurationVar(&c.stepDelay, "step-delay", c.stepDelay, "how long each simulated step takes (a SUC Plan's Job on a node, a state of Longhorn's live upgrade of a node's v2 instance manager)")
	fs.StringVar(&c.fail, "fail", c.fail, "make the OS upgrade of this node (or machine) fail, to show how a failure looks; the demo then exits non-zero (on Cluster API's controllers, cp-N or workers-N names the Nth machine of the control plane or the workers, whose names Cluster API generates)")
	fs.BoolVar(&c.keep, "keep", c.keep, "leave everything running at the end, print the kubeconfigs and kubectl commands, and wait for Ctrl-C")
	fs.BoolVar(&c.longhornV2, "longhorn-v2", c.longhornV2, "give the workers a Longhorn v2 volume and run Longhorn's own live upgrade of v2 instance managers meanwhile, which the LonghornDataEngine step pauses and waits for")
	fs.DurationVar(&c.pollInterval, "poll-interval", c.pollInterval, "the manager's --poll-interval: how often it looks at running steps and tasks again")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "give up when the upgrade has not ended after this long")
	fs.StringVar(&c.managerBinary, "manager", c.managerBinary, "a manager binary to run instead of building one from this checkout")
	fs.BoolVar(&c.preview, "preview", c.preview, "before the upgrade, ask for an UpgradePreview of the Cluster at the target version, wait for the manager to compute it and print it as `kubectl inplace preview` does; the upgrade runs either way")
	fs.DurationVar(&c.previewWait, "preview-wait", c.previewWait, "how long --preview waits for the manager to compute the preview (a manager without the UpgradePreview controller never does: the demo then says so and goes on)")
	fs.StringVar(&c.from, "from", c.from, "the Harvester release the cluster runs at first, which says the hop: "+hopsUsage()+". Not with --via=capi on Cluster API's own controllers")
	fs.StringVar(&c.abortAt, "abort-at", c.abortAt, "abort the upgrade (the UpgradeTask's spec.phase Abort) once Rancher has taken this node (or machine): cordoned it and asked for its pre-drain hook; the demo shows how the abort ends (Rancher's drain withdrawn, the node uncordoned, no RKE2 restart) and exits non-zero. Not with --via=capi")
	fs.StringVar(&c.gateRedAt, "gate-red-at", c.gateRedAt, "give every task of the Cluster a health gate (a CEL expression over a ConfigMap of the workload cluster, by the Cluster's gates annotation) that turns red while this node (or machine) is upgraded and green again a few seconds after the task shows the pause; not the last node of its control plane or MachineDeployment (after it no node is left to hold). Not with --via=capi")
}

func (c *config) validate() error {
	switch c.via {
	case viaAnnotation, viaHook, viaCAPI:
	default:
		return fmt.Errorf("--via=%s: must be annotation, hook or capi", c.via)
	}
	switch {
	case c.updater != updaterExternal && c.updater != updaterKubeadm:
		return fmt.Errorf("--updater=%s: must be %s or %s", c.updater, updaterExternal, updaterKubeadm)
	case c.updater == updaterKubeadm && c.via != viaCAPI:
		return fmt.Errorf("--updater=%s works with --via=capi only: the other ways upgrade a simulated Harvester cluster, whose updater is the HarvesterUpgrader", c.updater)
	}
	if c.workers < 1 || c.workers > 50 {
		return fmt.Errorf("--nodes=%d: must be from 1 to 50", c.workers)
	}
	if c.maxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable=%d: must be at least 1", c.maxUnavailable)
	}
	if c.stepDelay <= 0 || c.pollInterval <= 0 || c.timeout <= 0 || c.previewWait <= 0 {
		return errors.New("--step-delay, --poll-interval, --timeout and --preview-wait must be positive")
	}
	if c.fail != "" && !c.knows(c.fail) {
		return fmt.Errorf("--fail=%s: no such node or machine; the nodes are %s", c.fail, strings.Join(c.nodeNames(), ", "))
	}
	if c.abortAt != "" && !c.knows(c.abortAt) {
		return fmt.Errorf("--abort-at=%s: no such node or machine; the nodes are %s", c.abortAt, strings.Join(c.nodeNames(), ", "))
	}
	if c.abortAt != "" && c.via == viaCAPI {
		return errors.New("--abort-at works with --via=annotation or --via=hook; with --via=capi, Cluster API's controllers name the machines only once they run")
	}
	if c.gateRedAt != "" && !c.knows(c.gateRedAt) {
		return fmt.Errorf("--gate-red-at=%s: no such node or machine; the nodes are %s", c.gateRedAt, strings.Join(c.nodeNames(), ", "))
	}
	if _, err := scenario.HopFrom(c.from); err != nil {
		return fmt.Errorf("--from=%s: %w", c.from, err)
	}
	if c.gateRedAt != "" && c.via == viaCAPI {
		return errors.New("--gate-red-at works with --via=annotation or --via=hook; with --via=capi, Cluster API's controllers name the machines only once they run")
	}
	return nil
}

// hop is the hop --from names (validate checked it).
func (c *config) hop() scenario.Hop {
	h, _ := scenario.HopFrom(c.from)
	return h
}

// hopsUsage lists the hops --from can name.
func hopsUsage() string {
	var out []string
	for _, h := range scenario.Hops {
		out = append(out, fmt.Sprintf("%s (Harvester %s, Kubernetes %s -> %s)", h.FromRelease, h, h.FromKubernetes, h.ToKubernetes))
	}
	return strings.Join(out, " or ")
}

// nodeNames are the names the scenario gives the Nodes, known before it starts, so a
// mistyped --fail is refused before anything is started.
func (c *config) nodeNames() []string {
	var out []string
	for i := 1; i <= c.controlPlane; i++ {
		out = append(out, fixtures.NodeName(demoNamespace, fmt.Sprintf("%s-%d", scenario.ControlPlaneName, i)))
	}
	for i := 1; i <= c.workers; i++ {
		out = append(out, fixtures.NodeName(demoNamespace, fmt.Sprintf("%s-%d", scenario.MachineDeploymentName, i)))
	}
	return out
}

func (c *config) knows(name string) bool {
	for _, n := range c.nodeNames() {
		if n == name || strings.TrimPrefix(n, demoNamespace+"-") == name {
			return true
		}
	}
	return false
}

// demoNamespace holds the demo's CAPI objects on the management cluster.
const demoNamespace = "demo"

func main() {
	// The simulators' informers log through controller-runtime's logger. The demo prints
	// its own account of the run, and the manager, a process of its own, keeps its logs:
	// theirs are dropped, rather than left to controller-runtime's warning, with a stack,
	// that no logger was set.
	ctrllog.SetLogger(logr.Discard())
	cfg := defaultConfig()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cfg.bind(fs)
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "Usage: make demo [ARGS=\"--via=hook --nodes 5 ...\"]   (or: go run ./test/demo [flags])\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(2)
	}
	// make, or whatever started the demo, killed on its own: the demo gets SIGTERM and
	// stops what it started, as on Ctrl-C (its API servers and manager also die with it,
	// test/procguard).
	if err := procguard.StopWithParent(syscall.SIGTERM); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "demo: %v (the demo runs on if what started it dies)\n", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stdout, isTerminal(os.Stdout))
	if err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "demo: %v\n", err)
	}
	stop()
	os.Exit(res.exitCode())
}

// isTerminal says whether f is a terminal a live view can be redrawn on.
func isTerminal(f *os.File) bool {
	if os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// outcome is what a run of the demo ended with.
type outcome struct {
	// rows are the summary table's rows, one per node.
	rows []summaryRow
	// checks are the safety invariants, checked from the simulators' records.
	checks []scenario.Check
	// record is what the simulators did.
	record *sim.Record
	// upgraded is true when every node reached the target version.
	upgraded bool
	// interrupted is true when the run was stopped by a signal.
	interrupted bool
	// capi is what a run on Cluster API's own controllers did (--via=capi, built).
	capi *capiResult
	// settings are the settings the release changes for the nodes: before, during, at the
	// end (the scenario's settings watch).
	settings []scenario.SettingStory
	// planHold is what holds the cluster's UpgradePlan at the end, in its own words (its
	// Degraded condition), and planStanding where it stands; empty when it has ended or
	// nothing holds it.
	planHold, planStanding string
}

func (o *outcome) ok() bool {
	if o == nil || !o.upgraded || o.interrupted {
		return false
	}
	for _, c := range o.checks {
		if !c.OK {
			return false
		}
	}
	return true
}

func (o *outcome) exitCode() int {
	switch {
	case o.ok():
		return 0
	case o != nil && o.interrupted:
		return 130
	default:
		return 1
	}
}

// run is the demo: start, trigger, follow, summarise, and stop (or keep).
func run(ctx context.Context, cfg config, out io.Writer, tty bool) (*outcome, error) {
	if err := cfg.validate(); err != nil {
		return &outcome{}, err
	}
	began := time.Now()
	view := newView(out, tty)
	if cfg.via == viaCAPI {
		root, err := testenv.RepoRoot()
		if err == nil {
			err = capienv.Built(root)
		}
		if err == nil && cfg.hop() != scenario.DefaultHop {
			return &outcome{}, fmt.Errorf("--from=%s: Cluster API's own controllers run a Kubernetes version bump of their own machines, no Harvester hop; use --via=annotation or --via=hook", cfg.from)
		}
		if err != nil && cfg.updater == updaterKubeadm {
			return &outcome{}, fmt.Errorf("--updater=kubeadm needs Cluster API's own controllers: %w", err)
		}
		if err == nil {
			view.titleRealCAPI()
			return runRealCAPI(ctx, cfg, root, view)
		}
		view.title(cfg)
		view.fallback(err)
	} else {
		view.title(cfg)
	}

	workDir, err := os.MkdirTemp("", "capi-inplace-demo-")
	if err != nil {
		return &outcome{}, err
	}
	keepWorkDir := false // kept when something failed: the manager's log tells why
	defer func() {
		if !keepWorkDir {
			_ = os.RemoveAll(workDir)
		}
	}()

	s, err := scenario.Start(ctx, scenario.Options{
		Namespace: demoNamespace, ClusterName: "harvester",
		ControlPlaneMachines: cfg.controlPlane, Workers: cfg.workers, WorkerMaxUnavailable: cfg.maxUnavailable,
		StepDelay: cfg.stepDelay, LonghornV2: cfg.longhornV2, WorkDir: workDir, ManagerBinary: cfg.managerBinary,
		ManagerArgs: managerArgs(cfg),
		Progress:    view.stage,
		Hop:         cfg.hop(),
	})
	if err != nil {
		if ctx.Err() != nil {
			return &outcome{interrupted: true}, errors.New("interrupted while starting")
		}
		keepWorkDir = true
		return &outcome{}, fmt.Errorf("start the demo: %w (files in %s)", err, workDir)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			_, _ = fmt.Fprintf(out, "stopping: %v\n", err)
		}
	}()
	if cfg.fail != "" {
		if err := s.FailNode(cfg.fail, "elemental upgrade failed with return code: 33 (failure injected by --fail)"); err != nil {
			return &outcome{}, err
		}
	}
	view.ready(s, cfg, time.Since(began))
	if cfg.preview {
		showPreview(ctx, s.Management.Client, view, s.Cluster.Namespace, s.Cluster.Name, s.Options.Hop.ToKubernetes, cfg.previewWait)
	}
	var gate *redGate
	gateCtx, stopGate := context.WithCancel(ctx)
	defer stopGate()
	gateDone := make(chan struct{})
	if cfg.gateRedAt != "" {
		if gate, err = newRedGate(ctx, s, view, cfg.gateRedAt); err != nil {
			return &outcome{}, err
		}
		go func() { defer close(gateDone); gate.run(gateCtx) }()
	} else {
		close(gateDone)
	}

	var abort *aborter
	abortDone := make(chan struct{})
	if cfg.abortAt != "" {
		if abort, err = newAborter(s, view, cfg.abortAt); err != nil {
			return &outcome{}, err
		}
		go func() { defer close(abortDone); abort.run(gateCtx) }()
	} else {
		close(abortDone)
	}

	res := follow(ctx, s, cfg, view)
	stopGate()
	<-gateDone
	<-abortDone
	if gate != nil {
		res.checks = append(res.checks, gate.check())
	}
	if abort != nil {
		checkCtx, cancelCheck := context.WithTimeout(context.Background(), 10*time.Second)
		res.checks = append(res.checks, abort.check(checkCtx))
		cancelCheck()
	}
	keepWorkDir = !res.ok() && !res.interrupted
	view.summary(s, cfg, res)
	if cfg.keep && !res.interrupted {
		view.keep(s)
		<-ctx.Done()
		_, _ = fmt.Fprintln(out, "\nstopping the manager, the simulators and both API servers...")
	}
	return res, nil
}

// managerArgs are the manager's flags in the demo.
func managerArgs(cfg config) []string {
	args := []string{"--poll-interval=" + cfg.pollInterval.String()}
	if cfg.gateRedAt != "" {
		args = append(args, "--gate-interval="+demoGateInterval.String())
	}
	return args
}

// waitForPlans waits until every UpgradePlan of the demo's namespace has ended.
func waitForPlans(ctx context.Context, s *scenario.Scenario) error {
	for {
		plans := &harvesterv1.UpgradePlanList{}
		if err := s.Management.Client.List(ctx, plans, client.InNamespace(s.Options.Namespace)); err != nil {
			return fmt.Errorf("list the UpgradePlans: %w", err)
		}
		running := false
		for _, p := range plans.Items {
			if p.Status.Phase == harvesterv1.UpgradePlanFailed {
				return fmt.Errorf("UpgradePlan %s failed: %s", p.Name, p.Status.Message)
			}
			running = running || p.Status.Phase != harvesterv1.UpgradePlanSucceeded
		}
		if !running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// planCaughtUp waits, until ctx ends, for the cluster's running UpgradePlan to say what
// holds it (its Degraded condition) when a NodeUpdate failed: a run that ended at a
// failure reads the plan to say what holds it, and the plan records the failure on its
// next pass.
func planCaughtUp(ctx context.Context, s *scenario.Scenario) {
	for ctx.Err() == nil {
		plan := s.UpgradePlan(ctx)
		if plan == nil || scenario.PlanEnded(plan) || scenario.PlanHold(plan) != "" {
			return
		}
		nus := &inplacev1.NodeUpdateList{}
		if err := s.Management.Client.List(ctx, nus, client.InNamespace(s.Options.Namespace)); err != nil {
			return
		}
		failed := false
		for _, nu := range nus.Items {
			failed = failed || nu.Status.Phase == inplacev1.NodeUpdatePhaseFailed
		}
		if !failed {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// follow triggers the upgrade and shows it live until it ends, then checks the result.
func follow(ctx context.Context, s *scenario.Scenario, cfg config, view *view) *outcome {
	runCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	t := newTracker(s)
	stopLive := view.live(runCtx, t)

	var triggerErr error
	switch cfg.via {
	case viaAnnotation:
		triggerErr = upgradeByAnnotation(runCtx, s, view)
	case viaHook:
		triggerErr = upgradeByHook(runCtx, s, view)
	case viaCAPI:
		triggerErr = upgradeByCAPI(runCtx, s, view)
	}
	if triggerErr == nil {
		// The nodes are done; the UpgradePlan still cleans the images and what it created.
		triggerErr = waitForPlans(runCtx, s)
	}
	// One last look, so the final frame shows the end state.
	sampleCtx, cancelSample := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelSample()
	if triggerErr != nil {
		planCaughtUp(sampleCtx, s)
	}
	_ = t.sample(sampleCtx)
	stopLive()

	res := &outcome{record: s.Record, interrupted: ctx.Err() != nil}
	switch {
	case res.interrupted:
		view.problem("interrupted")
	case runCtx.Err() != nil:
		view.problem(fmt.Sprintf("the upgrade did not end within --timeout=%s", cfg.timeout))
	case triggerErr != nil:
		view.problem(triggerErr.Error())
	}
	res.rows, res.upgraded = t.summary()
	var upgraded []string
	for _, r := range res.rows {
		if r.reached {
			upgraded = append(upgraded, r.node)
		}
	}
	res.checks = s.Invariants(sampleCtx, upgraded)
	// One read of the plan for the settings' lines and for what holds it: two could
	// straddle its Degraded condition turning true.
	plan := s.UpgradePlan(sampleCtx)
	res.settings = s.SettingStoriesOf(sampleCtx, plan)
	if plan != nil {
		res.planHold, res.planStanding = scenario.PlanHold(plan), scenario.PlanStanding(plan)
	}
	return res
}
