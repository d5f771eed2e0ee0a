// Command capi-inplace is the manager of capi-inplace, a Cluster API runtime extension
// that upgrades the machines of a cluster in place. It runs the runtime hook servers,
// the controllers that orchestrate upgrades and the updaters that do the work on nodes.
//
// `capi-inplace node <subcommand>` is the other program of the same binary (and image):
// the node program the Harvester updater's Plans run on nodes (package nodeprogram).
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/cascade"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/preview"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/config"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi/toolkit"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhornlive"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/internal/faults"
	"github.com/capi-inplace/capi-inplace/internal/notify"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/jobupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/kubeadmupdater"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
	"github.com/capi-inplace/capi-inplace/workloadcluster/etcdhealth"
)

// The secure metrics endpoint asks the API server who a caller is and whether it may read
// /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// version is stamped by `make build` (-X main.version=...).
var version = "dev"

// nodeImage is the image this binary is built into, stamped by `make build`
// (-X main.nodeImage=$(IMG)), the default of --harvester-node-image. Unstamped, it is
// config.DefaultNodeImageRepository at version.
var nodeImage = ""

func defaultNodeImage() string {
	if nodeImage != "" {
		return nodeImage
	}
	return config.DefaultNodeImageRepository + ":" + version
}

// options are the manager's flags (DESIGN.md section 8).
type options struct {
	webhookPort             int
	externalHookPort        int
	webhookCertDir          string
	metricsBindAddress      string
	metricsSecure           bool
	healthProbeBindAddress  string
	leaderElect             bool
	leaderElectionNamespace string
	concurrency             int
	defaultUpdater          string
	pollInterval            time.Duration
	hookAuth                hookAuthOptions
	harvesterNodeImage      string
	gateInterval            time.Duration
	fetch                   fetchOptions
	gates                   gateOptions
}

func (o *options) bind(fs *flag.FlagSet) {
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the HTTPS server of Cluster API's in-place update hooks (registered by an ExtensionConfig)")
	fs.IntVar(&o.externalHookPort, "external-hook-port", 9444, "port of the HTTPS server of capi-inplace's ExternalUpgradeRequest hook")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory holding tls.crt and tls.key, the serving certificate of both hook servers")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", ":8443", "address the Prometheus metrics endpoint binds to; 0 disables it")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "serve metrics over HTTPS, to callers authenticated and authorized by the API server")
	fs.StringVar(&o.healthProbeBindAddress, "health-probe-bind-address", ":9440", "address the /healthz and /readyz probes bind to")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader so that only one replica orchestrates upgrades at a time")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease; defaults to the manager's own namespace in a cluster")
	fs.IntVar(&o.concurrency, "concurrency", 10, "how many objects of each kind are reconciled at once")
	fs.StringVar(&o.defaultUpdater, "default-updater", "", "updater used when neither the Cluster's annotation nor the request names one, as Kind/name in the Cluster's namespace (for example HarvesterUpgrader/default); empty means none")
	fs.StringVar(&o.harvesterNodeImage, "harvester-node-image", defaultNodeImage(), "the image whose node program (capi-inplace node ...) the Harvester and kubeadm updaters run on nodes when a HarvesterUpgrader leaves images.node or a KubeadmUpdater leaves spec.image empty; a tag or digest is required. The default is this manager's own image at its version")
	fs.DurationVar(&o.pollInterval, "poll-interval", 0, "how often running node steps, NodeUpdates and UpgradeTasks are looked at again when no event comes; 0 keeps each one's default (5s Harvester steps, 10s JobUpdater Jobs, 30s NodeUpdates, 15s UpgradeTasks; UpdateMachine asks Cluster API to call again after 10s or 15s, and after this interval rounded up to whole seconds when it is set; the Harvester cluster upgrade's Cluster API stability window is 30s, and six intervals when it is set). Short values are for simulated clusters (make demo, tests)")
	fs.DurationVar(&o.gateInterval, "gate-interval", upgradetask.DefaultGateInterval, "how often a running UpgradeTask's health gates (spec.gates, the Cluster's gates annotation) are evaluated again while a node waits for them; a node's end evaluates them at once. Each evaluation queries Prometheus, lists the objects of a CEL gate or looks at a Job gate, so keep it at seconds, not milliseconds, on a real cluster")
	o.fetch.bind(fs)
	o.gates.bind(fs)
	o.hookAuth.bind(fs)
}

func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		clusterv1.AddToScheme,
		controlplanev1.AddToScheme,
		bootstrapv1.AddToScheme,
		inplacev1.AddToScheme,
		harvesterv1.AddToScheme,
		// The kinds the updaters read and write on workload clusters.
		sucv1.AddToScheme,
		longhornv1.AddToScheme,
		longhornlive.AddToScheme,
		kubevirtv1.AddToScheme,
		harvesterapi.AddToScheme,
		toolkit.AddToScheme,
		rancher.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(runNodeProgram(os.Args[2:]))
	}
	var opts options
	opts.bind(flag.CommandLine)
	logConfig := textlogger.NewConfig()
	flag.Var(logConfig.Verbosity(), "v", "log verbosity: 0 logs every decision, 4 and above add detail")
	flag.Usage = func() {
		_, _ = fmt.Fprintf(flag.CommandLine.Output(), "Usage: %s [flags]           the manager\n       %s node <subcommand> ...  the node program (%s node --help lists the subcommands)\n\nFlags of the manager:\n", os.Args[0], os.Args[0], os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()

	logger := textlogger.NewLogger(logConfig)
	ctrl.SetLogger(logger)
	klog.SetLoggerWithOptions(logger, klog.ContextualLogger(true))

	if err := run(opts); err != nil {
		// Said plainly on standard error: most of these are flag or configuration
		// mistakes an operator reads in `kubectl logs` or a terminal.
		fmt.Fprintf(os.Stderr, "capi-inplace: %v\n", err)
		os.Exit(1)
	}
}

// nodeCommand is the first argument that selects the node program instead of the manager.
const nodeCommand = "node"

// runNodeProgram runs `capi-inplace node ...` and returns its exit code. The pod's name
// (SUC's SYSTEM_UPGRADE_POD_NAME, or POD_NAME, or the host name) identifies this process
// in the repository's leader lock.
func runNodeProgram(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	identity := os.Getenv("SYSTEM_UPGRADE_POD_NAME")
	if identity == "" {
		identity = os.Getenv("POD_NAME")
	}
	if identity == "" {
		identity, _ = os.Hostname()
	}
	return nodeprogram.Main(ctx, args, &nodeprogram.Env{Stdout: os.Stdout, Stderr: os.Stderr, Identity: identity})
}

func run(opts options) error {
	log := ctrl.Log.WithName("setup")

	if opts.defaultUpdater != "" {
		if _, err := inplacev1.ParseUpdaterReference(opts.defaultUpdater); err != nil {
			return fmt.Errorf("--default-updater: %w", err)
		}
	}
	if opts.concurrency < 1 {
		return fmt.Errorf("--concurrency must be at least 1, got %d", opts.concurrency)
	}
	if opts.pollInterval < 0 {
		return fmt.Errorf("--poll-interval must not be negative, got %s", opts.pollInterval)
	}
	if opts.gateInterval <= 0 {
		return fmt.Errorf("--gate-interval must be positive, got %s", opts.gateInterval)
	}
	gatePolicy, err := opts.gates.policy()
	if err != nil {
		return err
	}
	gatePolicy.Fetch = opts.fetch.policy()
	if err := config.CheckNodeImage(opts.harvesterNodeImage); err != nil {
		return fmt.Errorf("--harvester-node-image: %w", err)
	}

	scheme, err := newScheme()
	if err != nil {
		return fmt.Errorf("build scheme: %w", err)
	}
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}

	tlsOpts := []func(*tls.Config){extension.ServingTLS}
	capiCallers, externalCallers, allowAnonymous, err := opts.hookAuth.servers()
	if err != nil {
		return err
	}
	if allowAnonymous {
		log.Info("the ExternalUpgradeRequest server lets every caller in (--" + extension.FlagExternalHookAllowAnonymousLab + "): for a lab only")
	}
	metricsOpts := metricsserver.Options{
		BindAddress:   opts.metricsBindAddress,
		SecureServing: opts.metricsSecure,
		TLSOpts:       tlsOpts,
	}
	if opts.metricsSecure {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  opts.healthProbeBindAddress,
		LeaderElection:          opts.leaderElect,
		LeaderElectionID:        "capi-inplace-manager.inplace.cluster.x-k8s.io",
		LeaderElectionNamespace: opts.leaderElectionNamespace,
		// Nothing reads managed fields (writes are merge patches and status updates): without
		// them every cached object is smaller to hold and cheaper to copy.
		Cache: cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}

	// The updaters the manager runs, by configuration kind, and the NodeUpdate lifecycle
	// that drives them.
	workloads := &workloadcluster.Clients{Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Recheck: workloadcluster.SecretRecheck}
	// The UpgradeTask controller and the Harvester updater list every Node of a workload
	// cluster often: from a watch of them, per Cluster. A change of a Node wakes its
	// running NodeUpdates (a Plan that ended, a node back after its reboot) before their
	// next poll.
	nodeCaches := &workloadcluster.NodeCaches{Clients: workloads}
	if err := mgr.Add(nodeCaches); err != nil {
		return fmt.Errorf("add the workload clusters' Node caches: %w", err)
	}
	registry := nodeupdater.NewRegistry()
	harvester := &harvesteradapter.Updater{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Workloads: nodeCaches, Releases: repository.ClusterReleaseReader{Configs: workloads}, PollInterval: opts.pollInterval,
		NodeImage: opts.harvesterNodeImage, Version: version, Recorder: mgr.GetEventRecorder("harvester-updater"),
	}
	updaters := []nodeupdater.Registration{
		(&jobupdater.Updater{Client: mgr.GetClient(), Clusters: workloads, PollInterval: opts.pollInterval, Ledger: &disruption.Ledger{Live: mgr.GetAPIReader(), Client: mgr.GetClient()}}).Registration(),
		(&kubeadmupdater.Updater{Client: mgr.GetClient(), Clusters: workloads, NodeImage: opts.harvesterNodeImage, PollInterval: opts.pollInterval, Ledger: &disruption.Ledger{Live: mgr.GetAPIReader(), Client: mgr.GetClient()},
			Recorder: mgr.GetEventRecorder("kubeadm-updater")}).Registration(),
		harvester.Registration(),
	}
	for _, reg := range updaters {
		if err := registry.Register(reg); err != nil {
			return err
		}
	}
	ctx := ctrl.SetupSignalHandler()
	controllerOpts := controller.Options{MaxConcurrentReconciles: opts.concurrency}
	nodeUpdates := &nodeupdater.Reconciler{Registry: registry, PollInterval: opts.pollInterval}
	if err := nodeUpdates.SetupWithManager(mgr, controllerOpts); err != nil {
		return fmt.Errorf("set up the NodeUpdate controller: %w", err)
	}
	plans := &upgradeplan.PlanReconciler{
		Env: harvester.PlanEnv(), Checks: upgradeplan.DefaultClusterChecks(workloads),
		Recorder: mgr.GetEventRecorder("harvester-upgradeplan"), PollInterval: opts.pollInterval, ClusterUpgradePollInterval: opts.pollInterval,
		ClusterUpgradeCAPIStableFor: capiStableFor(opts.pollInterval),
	}
	if err := plans.SetupWithManager(mgr, controllerOpts); err != nil {
		return fmt.Errorf("set up the UpgradePlan controller: %w", err)
	}
	// A change of a workload Node a step or a phase may wait for wakes them at once.
	nodeCaches.OnNodeChange = func(cluster types.NamespacedName, node string) {
		nodeUpdates.Wake(cluster, node)
		plans.Wake(cluster, node)
	}
	// One list of preflight checks: the UpgradeTask controller holds nodes with it, and
	// UpgradePreview shows what it would hold.
	// With etcd's own view of a control plane (etcdhealth): control plane nodes only.
	checks := preflight.WithEtcd(registry, &etcdhealth.Views{Reader: mgr.GetAPIReader(), Workload: workloads})
	// Webhook notifications of the tasks, sent in the background (internal/notify).
	notifier := notify.New(mgr.GetAPIReader(), faults.CountWarnings(mgr.GetEventRecorder("upgradetask-notify")), nil)
	notifier.Fetch = opts.fetch.policy()
	if err := mgr.Add(notifier); err != nil {
		return fmt.Errorf("add the notification dispatcher to the manager: %w", err)
	}
	if err := (&upgradetask.Reconciler{Registry: registry, Checks: checks, Workload: nodeCaches, PollInterval: opts.pollInterval, GateInterval: opts.gateInterval, GatePolicy: gatePolicy, Notifier: notifier}).SetupWithManager(ctx, mgr, controllerOpts); err != nil {
		return fmt.Errorf("set up the UpgradeTask controller: %w", err)
	}
	// Every way of asking for an upgrade goes through the one Requester.
	requester := &upgraderequest.Requester{
		Client: mgr.GetClient(), TaskReader: mgr.GetAPIReader(), Registry: registry,
		DefaultUpdater: opts.defaultUpdater, Recorder: faults.CountWarnings(mgr.GetEventRecorder("capi-inplace-requests")),
	}
	// Cluster API's in-place hooks, served below; UpgradePreview asks the same instance.
	inPlaceHooks := &extension.InPlaceHooks{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Requester: requester, Registry: registry, DefaultUpdater: opts.defaultUpdater,
		RetryAfterSeconds: hookRetryAfter(opts.pollInterval), Recorder: mgr.GetEventRecorder("capi-inplace-hooks"),
		// Kept in a Lease of each MachineSets' namespace: the preview (on the leader) reads
		// what any replica's hook server answered, before and after a restart.
		Refusals: &extension.RefusalLog{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()},
	}
	if err := (&preview.Reconciler{
		Workload: nodeCaches, Registry: registry, Checks: checks, Hooks: inPlaceHooks, DefaultUpdater: opts.defaultUpdater,
	}).SetupWithManager(mgr, controllerOpts); err != nil {
		return fmt.Errorf("set up the UpgradePreview controller: %w", err)
	}
	// The in-place-upgrade-to annotations on Clusters, control planes, MachineDeployments and Machines.
	if err := (&cascade.UpgradeCascade{Requester: requester, PollInterval: opts.pollInterval}).SetupWithManager(ctx, mgr, controllerOpts); err != nil {
		return fmt.Errorf("set up the in-place-upgrade-to controllers: %w", err)
	}

	// The index needs the API server's discovery; a manager started while the API server
	// is away (restarted, upgraded) waits for it here instead of exiting.
	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := extension.IndexNodeUpdates(ctx, mgr.GetFieldIndexer()); err != nil {
			log.Info("waiting for the API server to index NodeUpdates by machine", "error", err.Error())
			return false, nil
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("index NodeUpdates by machine: %w", err)
	}
	capiHooks, err := extension.NewCAPIHookServer(extension.ServerOptions{
		Port: opts.webhookPort, CertDir: opts.webhookCertDir, TLSOpts: tlsOpts, Callers: capiCallers,
	}, inPlaceHooks)
	if err != nil {
		return err
	}
	externalHooks, err := extension.NewExternalHookServer(extension.ServerOptions{
		Port: opts.externalHookPort, CertDir: opts.webhookCertDir, TLSOpts: tlsOpts,
		Callers: externalCallers, AllowAnonymous: allowAnonymous,
	}, extension.NewExternalUpgradeHandler(requester))
	if err != nil {
		return err
	}
	if err := mgr.Add(capiHooks); err != nil {
		return fmt.Errorf("add Cluster API hook server: %w", err)
	}
	if err := mgr.Add(externalHooks); err != nil {
		return fmt.Errorf("add external hook server: %w", err)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("capi-hook-server", capiHooks.StartedChecker()); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("external-hook-server", externalHooks.StartedChecker()); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}

	log.Info("starting manager", "version", version, "webhookPort", opts.webhookPort, "externalHookPort", opts.externalHookPort,
		"leaderElect", opts.leaderElect, "defaultUpdater", opts.defaultUpdater, "harvesterNodeImage", opts.harvesterNodeImage)
	return mgr.Start(ctx)
}

// capiStableFor is how long the cluster upgrade Job holds Rancher's Cluster API Cluster
// Provisioned (wait_capi_cluster, fact 40) for a --poll-interval: the release's 30 s
// unless the interval is set (simulated clusters), then six intervals, the release's
// six looks five seconds apart.
func capiStableFor(pollInterval time.Duration) time.Duration {
	if pollInterval <= 0 {
		return 0
	}
	return 6 * pollInterval
}

// hookRetryAfter is the retry interval UpdateMachine answers with for a --poll-interval:
// the interval rounded up to whole seconds (Cluster API's unit), or 0 (the hooks' own
// defaults) when it is not set.
func hookRetryAfter(poll time.Duration) int32 {
	if poll <= 0 {
		return 0
	}
	return int32((poll + time.Second - 1) / time.Second)
}
