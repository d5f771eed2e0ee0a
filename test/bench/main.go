// Command bench is `make bench`: it measures how fast, how light and how well capi-inplace
// grows, on the real test control plane (kube-apiserver and etcd from bin/k8s), and writes
// the figures with the machine, the date and the command to docs/benchmarks.md.
//
//  1. Hook server: requests per second and p50 / p99 latency of CanUpdateMachineSet,
//     CanUpdateMachine and UpdateMachine over HTTPS, side by side with Cluster API's
//     reference in-place handlers on the same runtime SDK server, in the same process.
//
//  2. Orchestration: MachineDeployments upgraded by the real UpgradeTask controller and
//     NodeUpdate lifecycle with node work that takes no time: total time and hand-off
//     latency from one NodeUpdate's success to the next one's creation.
//
//  3. API efficiency: the manager's writes to the API server per upgraded node.
//
//  4. Memory: the real manager binary's RSS with thousands of Machines and Nodes.
//
//  5. Growth: 2 and 4 at three sizes.
//
//  6. Makespan: a whole Harvester upgrade of 3, 5 and 10 simulated nodes with the step
//     durations of a real one scaled down, against its critical path.
//
//     go run ./test/bench [--out docs/benchmarks.md] [--sections hooks,orchestration,memory,makespan,preview] ...
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// config is the bench's flags.
type config struct {
	out      string
	sections []string
	logFile  string

	hookClients  []int
	hookDuration time.Duration
	hookWarmup   time.Duration
	hookMachines int

	orchSizes          []int
	orchMaxUnavailable []int
	orchTimeout        time.Duration
	// orchNodeTime is how long the bench's updater takes per node in the orchestration and
	// fleet sections (benchUpdater); zero, as make bench runs them, is no time at all.
	orchNodeTime time.Duration
	// requestCostOps is how many requests of each kind the orchestration section sends to
	// price one request for the API server (runRequestCosts).
	requestCostOps int

	// The fleet section: fleetClusters Clusters of fleetMachines machines each, all
	// upgraded at once with maxUnavailable fleetMaxUnavailable.
	fleetClusters, fleetMachines, fleetMaxUnavailable int
	fleetTimeout                                      time.Duration

	memClusters        []int
	machinesPerCluster int
	memSettle          time.Duration
	// memQuiet is how long the manager's "Starting workers" lines must stop growing
	// before its controllers count as running; memSampleEvery spaces the RSS samples.
	memQuiet       time.Duration
	memSampleEvery time.Duration
	managerBinary  string

	makespanSizes []int
	// makespanScale is how many times faster than Harvester's real run the simulated
	// upgrade goes; makespanPoll is the manager's --poll-interval and the simulators'.
	makespanScale float64
	makespanPoll  time.Duration
	makespanTrace bool

	// previewIterations is how many times the preview section computes its preview.
	previewIterations int

	cpuProfile       string
	apiserverProfile string
}

func defaultConfig() config {
	return config{
		sections:            allSections,
		hookClients:         []int{1, 8, 64},
		hookDuration:        2 * time.Second,
		hookWarmup:          300 * time.Millisecond,
		hookMachines:        64,
		orchSizes:           []int{100, 250, 500},
		orchMaxUnavailable:  []int{1, 10},
		orchTimeout:         2 * time.Minute,
		requestCostOps:      200,
		fleetClusters:       20,
		fleetMachines:       50,
		fleetMaxUnavailable: 1,
		fleetTimeout:        5 * time.Minute,
		memClusters:         []int{10, 25, 50},
		machinesPerCluster:  100,
		memSettle:           5 * time.Second,
		memQuiet:            3 * time.Second,
		memSampleEvery:      time.Second,
		makespanSizes:       []int{3, 5, 10},
		makespanScale:       100,
		makespanPoll:        20 * time.Millisecond,
		previewIterations:   300,
	}
}

// The sections of the bench.
const (
	sectionHooks         = "hooks"
	sectionOrchestration = "orchestration"
	sectionFleet         = "fleet"
	sectionMemory        = "memory"
	sectionMakespan      = "makespan"
	sectionPreview       = "preview"
)

// allSections are the sections of the bench, in the order they run.
var allSections = []string{sectionHooks, sectionOrchestration, sectionFleet, sectionMemory, sectionMakespan, sectionPreview}

func (c *config) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.out, "out", c.out, "write the figures as Markdown to this file (make bench: docs/benchmarks.md); empty writes none")
	fs.Func("sections", "comma-separated sections to run: hooks, orchestration, fleet, memory, makespan, preview (default all)", func(s string) error {
		c.sections = strings.Split(s, ",")
		for _, sec := range c.sections {
			if !slices.Contains(allSections, sec) {
				return fmt.Errorf("unknown section %q", sec)
			}
		}
		return nil
	})
	fs.StringVar(&c.logFile, "log-file", c.logFile, "write the in-process managers' logs here (default: discarded)")
	intList(fs, &c.hookClients, "hook-clients", "concurrent clients of each hook measurement")
	fs.DurationVar(&c.hookDuration, "hook-duration", c.hookDuration, "measured time per implementation, hook and number of clients")
	fs.DurationVar(&c.hookWarmup, "hook-warmup", c.hookWarmup, "unmeasured warm-up before each half of a measurement")
	fs.IntVar(&c.hookMachines, "hook-machines", c.hookMachines, "machines (each with a running NodeUpdate) UpdateMachine is called for, in turn")
	intList(fs, &c.orchSizes, "orchestration-sizes", "machines of the upgraded MachineDeployment")
	intList(fs, &c.orchMaxUnavailable, "max-unavailable", "maxUnavailable of each upgrade")
	fs.DurationVar(&c.orchTimeout, "orchestration-timeout", c.orchTimeout, "give up on one upgrade after this long and report how far it got")
	fs.DurationVar(&c.orchNodeTime, "orchestration-node-time", c.orchNodeTime, "how long the bench's updater takes per node in the orchestration and fleet sections; the targets are for the default, no time at all")
	fs.IntVar(&c.requestCostOps, "request-cost-ops", c.requestCostOps, "requests of each kind the orchestration section sends, after its upgrades, to price one request for the API server; 0 skips it")
	fs.IntVar(&c.fleetClusters, "fleet-clusters", c.fleetClusters, "Clusters the fleet section upgrades at once, each in a namespace of its own")
	fs.IntVar(&c.fleetMachines, "fleet-machines", c.fleetMachines, "machines of each fleet Cluster's MachineDeployment")
	fs.IntVar(&c.fleetMaxUnavailable, "fleet-max-unavailable", c.fleetMaxUnavailable, "maxUnavailable of each fleet Cluster's upgrade")
	fs.DurationVar(&c.fleetTimeout, "fleet-timeout", c.fleetTimeout, "give up on the fleet after this long and report how far it got")
	intList(fs, &c.memClusters, "memory-clusters", "numbers of Clusters the manager's memory is measured with")
	fs.IntVar(&c.machinesPerCluster, "machines-per-cluster", c.machinesPerCluster, "Machines (each with its Node) per Cluster of the memory measurement")
	fs.DurationVar(&c.memSettle, "memory-settle", c.memSettle, "wait after the manager's controllers started before its memory is read")
	fs.StringVar(&c.managerBinary, "manager", c.managerBinary, "a manager binary to measure instead of building one from this checkout")
	intList(fs, &c.makespanSizes, "makespan-sizes", "nodes of the simulated Harvester clusters of the makespan section")
	fs.Float64Var(&c.makespanScale, "makespan-scale", c.makespanScale, "how many times faster than Harvester's real run the makespan section's simulated upgrade goes")
	fs.DurationVar(&c.makespanPoll, "makespan-poll-interval", c.makespanPoll, "the makespan section's --poll-interval of the manager, and the simulators' interval")
	fs.BoolVar(&c.makespanTrace, "makespan-trace", c.makespanTrace, "print each makespan run's timeline: the plan's phases, each node's steps and each SUC Job, as the bench saw them")
	fs.IntVar(&c.previewIterations, "preview-iterations", c.previewIterations, "how many times the preview section computes the UpgradePreview of its 3+3 cluster")
	fs.StringVar(&c.apiserverProfile, "apiserver-cpuprofile", c.apiserverProfile, "write a 30 s CPU profile of the test API server from the start of each upgrade to this file, suffixed -<machines>-<maxUnavailable>")
	fs.StringVar(&c.cpuProfile, "cpuprofile", c.cpuProfile, "write a CPU profile of the bench process (clients, hook servers and in-process managers) to this file, for go tool pprof")
}

func intList(fs *flag.FlagSet, dst *[]int, name, usage string) {
	fs.Func(name, fmt.Sprintf("%s, comma-separated (default %s)", usage, joinInts(*dst)), func(s string) error {
		var out []int
		for _, f := range strings.Split(s, ",") {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || v < 1 {
				return fmt.Errorf("%q is not a positive number", f)
			}
			out = append(out, v)
		}
		*dst = out
		return nil
	})
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func (c *config) has(section string) bool {
	for _, s := range c.sections {
		if s == section {
			return true
		}
	}
	return false
}

func main() {
	cfg := defaultConfig()
	cfg.bind(flag.CommandLine)
	flag.Parse()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout, strings.Join(os.Args[1:], " ")); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// bench holds what the sections share.
type bench struct {
	cfg         config
	env         *testenv.Environment
	client      client.Client
	watchClient client.WithWatch
	kubeconfig  []byte
	out         io.Writer
	tmp         string
}

func (b *bench) printf(format string, args ...any) { _, _ = fmt.Fprintf(b.out, format, args...) }

// tempDir returns a new directory under the bench's temporary directory.
func (b *bench) tempDir(name string) string {
	dir, err := os.MkdirTemp(b.tmp, name+"-")
	if err != nil {
		panic(err)
	}
	return dir
}

// run runs the configured sections, prints the figures to out as it goes and writes the
// report. args are the command's arguments, for the report.
func run(ctx context.Context, cfg config, out io.Writer, args string) (*report, error) {
	logOut := io.Discard
	if cfg.logFile != "" {
		f, err := os.Create(cfg.logFile)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		logOut = f
	}
	// The manager's logger (main.go), at its default verbosity; only where it goes differs.
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logOut)))
	ctrl.SetLogger(logger)
	klog.SetLoggerWithOptions(logger, klog.ContextualLogger(true))

	tmp, err := os.MkdirTemp("", "capi-inplace-bench-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if abs, err := filepath.Abs(cfg.managerBinary); err == nil && cfg.managerBinary != "" {
		cfg.managerBinary = abs
	}

	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}

	rep := newReport(cfg, args)
	_, _ = fmt.Fprintf(out, "capi-inplace bench on %s\n", rep.machine.summary())
	started := time.Now()

	if cfg.has(sectionHooks) || cfg.has(sectionOrchestration) {
		err := withEnvironment(ctx, cfg, out, tmp, func(b *bench) error {
			if cfg.has(sectionHooks) {
				_, _ = fmt.Fprintln(out, "== 1. Hook server over HTTPS (capi-inplace | CAPI reference)")
				s := time.Now()
				res, err := runHookBench(ctx, b)
				if err != nil {
					return fmt.Errorf("hook server: %w", err)
				}
				rep.hooks, rep.hooksTime = res, time.Since(s)
			}
			if cfg.has(sectionOrchestration) {
				_, _ = fmt.Fprintln(out, "== 2./3. Orchestration overhead and API writes per node")
				s := time.Now()
				res, err := runOrchestrationBench(ctx, b)
				rep.orchestration, rep.orchestrationTime = res, time.Since(s)
				if err != nil {
					return fmt.Errorf("orchestration: %w", err)
				}
				if cfg.requestCostOps > 0 {
					_, _ = fmt.Fprintf(out, "== 3b. What one request costs the test API server (%d of each kind)\n", cfg.requestCostOps)
					costs, err := runRequestCosts(ctx, b, cfg.requestCostOps)
					rep.requestCosts, rep.orchestrationTime = costs, time.Since(s)
					if err != nil {
						return fmt.Errorf("request costs: %w", err)
					}
					for _, c := range costs {
						b.printf("  %-26s %6s ms CPU, %5.0f KB allocated, %6s ms each\n", c.kind, ms(c.cpuPerOp()), c.allocatedPerOp()/1024, ms(c.wallPerOp()))
					}
				}
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	if cfg.has(sectionFleet) {
		// A fresh API server: the fleet's Machines, Nodes and watches are its own.
		err := withEnvironment(ctx, cfg, out, tmp, func(b *bench) error {
			_, _ = fmt.Fprintf(out, "== 2b. A fleet: %d Clusters of %d machines upgraded at once\n", cfg.fleetClusters, cfg.fleetMachines)
			s := time.Now()
			res, err := runFleetBench(ctx, b)
			rep.fleet, rep.fleetTime = &res, time.Since(s)
			if err != nil {
				return fmt.Errorf("fleet: %w", err)
			}
			b.printf("  %s; hand-off p50 %s ms p99 %s ms (updater's start p50 %s ms p99 %s ms); %.1f writes/node; %.2f cores, peak RSS %s; %s\n",
				totalText(res, cfg.fleetTimeout), ms(res.handoff.p50), ms(res.handoff.p99), ms(res.updaterStart.p50), ms(res.updaterStart.p99), res.writesPerNode(), res.usage.cores(), mib(res.usage.rssPeak),
				res.apiServerText())
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	if cfg.has(sectionMemory) {
		// A fresh API server: the manager caches every namespace, so the objects of the
		// sections above would add to the sizes measured.
		err := withEnvironment(ctx, cfg, out, tmp, func(b *bench) error {
			_, _ = fmt.Fprintln(out, "== 4. Manager memory (real binary, VmRSS)")
			s := time.Now()
			res, err := runMemoryBench(ctx, b)
			rep.memory, rep.memoryTime = res, time.Since(s)
			if err != nil {
				return fmt.Errorf("memory: %w", err)
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	if cfg.has(sectionMakespan) {
		// A management API server of its own; each upgrade gets a workload API server.
		err := withEnvironment(ctx, cfg, out, tmp, func(b *bench) error {
			_, _ = fmt.Fprintln(out, "== 6. Makespan of a simulated Harvester upgrade")
			s := time.Now()
			res, err := runMakespanBench(ctx, b)
			rep.makespan, rep.makespanTime = res, time.Since(s)
			if err != nil {
				return fmt.Errorf("makespan: %w", err)
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	if cfg.has(sectionPreview) {
		err := withEnvironment(ctx, cfg, out, tmp, func(b *bench) error {
			_, _ = fmt.Fprintln(out, "== 7. UpgradePreview of a 3+3 cluster")
			s := time.Now()
			res, err := runPreviewBench(ctx, b)
			rep.preview, rep.previewTime = res, time.Since(s)
			if err != nil {
				return fmt.Errorf("preview: %w", err)
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	rep.elapsed = time.Since(started)
	rep.machine.loadEnd = loadAverage()

	_, _ = fmt.Fprintln(out)
	if err := rep.render(out, false); err != nil {
		return rep, err
	}
	if cfg.out != "" {
		var buf strings.Builder
		if err := rep.render(&buf, true); err != nil {
			return rep, err
		}
		if err := os.WriteFile(cfg.out, []byte(buf.String()), 0o644); err != nil { //nolint:gosec // documentation file
			return rep, err
		}
		_, _ = fmt.Fprintf(out, "\nWrote %s\n", cfg.out)
	}
	return rep, nil
}

// withEnvironment starts a test API server, runs fn with it, and stops it.
func withEnvironment(ctx context.Context, cfg config, out io.Writer, tmp string, fn func(*bench) error) error {
	_, _ = fmt.Fprintln(out, "-- starting the test API server (kube-apiserver and etcd from bin/k8s)")
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			_, _ = fmt.Fprintf(os.Stderr, "bench: stop the test API server: %v\n", err)
		}
	}()
	direct := rest.CopyConfig(env.Config)
	direct.QPS = -1
	c, err := client.NewWithWatch(direct, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	kubeconfig, err := env.Kubeconfig()
	if err != nil {
		return err
	}
	b := &bench{cfg: cfg, env: env, client: c, watchClient: c, kubeconfig: kubeconfig, out: out, tmp: tmp}
	if err := fn(b); err != nil {
		return err
	}
	return ctx.Err()
}

// managerRESTConfig is the REST config the manager runs with: controller-runtime's
// GetConfig turns client-side rate limiting off (QPS -1) unless a QPS is set.
func managerRESTConfig(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.QPS = -1
	out.Burst = 0
	return out
}
