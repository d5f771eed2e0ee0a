package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	upgraderconfig "github.com/capi-inplace/capi-inplace/harvesteradapter/config"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	upgraderepo "github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// toolkitRun is how long each part of a real Harvester upgrade took with Harvester's
// upgrade-toolkit (issue #12), which the makespan section plays scaled down. The node's
// disruptive work (about 21 minutes) is split among the three Plans that do it: the
// drain (kubectl drain, after the virtual machines left), the RKE2 upgrade (the kubelet
// restarts) and the OS upgrade with its reboot, the longest.
var toolkitRun = struct {
	isoDownload, repository, metadata, preload, clusterUpgrade time.Duration
	drain, rke2, osUpgrade, cleanup                            time.Duration
}{
	isoDownload: 4*time.Minute + 44*time.Second, repository: 5 * time.Second, metadata: time.Second,
	preload: 10 * time.Minute, clusterUpgrade: 15*time.Minute + 15*time.Second,
	drain: 3 * time.Minute, rke2: 5 * time.Minute, osUpgrade: 13 * time.Minute,
	cleanup: 2*time.Minute + 13*time.Second,
}

// The makespan section's versions: the simulated cluster runs Harvester v1.7.1 and goes
// to v1.8.1 (the release the repository simulator serves).
const (
	makespanFromVersion = "v1.34.3+rke2r3"
	makespanToVersion   = "v1.35.6+rke2r1"
	makespanFromOS      = "Harvester v1.7.1"
	makespanRelease     = "v1.8.1"
	makespanReleaseYAML = `harvester: v1.8.1
harvesterChart: 1.8.1
os: Harvester v1.8.1
kubernetes: v1.35.6+rke2r1
rancher: v2.14.2
minUpgradableVersion: v1.7.0
`
	// makespanNodeImage is the manager's node image the Plans run (main.go's default
	// --harvester-node-image at a release version the SUC simulator's registry serves).
	makespanNodeImage = upgraderconfig.DefaultNodeImageRepository + ":v0.4.0"
	// makespanManagement is how many management nodes a Harvester cluster has (the rest
	// are workers).
	makespanManagement = 3
	makespanCluster    = "harvester"
)

// scaledDurations are toolkitRun's durations divided by the scale.
type scaledDurations struct {
	setup, preload, clusterUpgrade, drain, rke2, osUpgrade, cleanup time.Duration
}

func scaleDurations(scale float64) scaledDurations {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) / scale) }
	t := toolkitRun
	return scaledDurations{
		setup: s(t.isoDownload + t.repository + t.metadata), preload: s(t.preload), clusterUpgrade: s(t.clusterUpgrade),
		drain: s(t.drain), rke2: s(t.rke2), osUpgrade: s(t.osUpgrade), cleanup: s(t.cleanup),
	}
}

// node is one node's disruptive work.
func (d scaledDurations) node() time.Duration { return d.drain + d.rke2 + d.osUpgrade }

// bound is the critical path of n nodes upgraded one at a time with the cluster-wide
// preload: nothing can be shorter.
func (d scaledDurations) bound(n int) time.Duration {
	return d.setup + d.preload + d.clusterUpgrade + time.Duration(n)*d.node() + d.cleanup
}

// makespanPhase is a phase of the UpgradePlan with when the bench first saw the plan in it.
type makespanPhase struct {
	phase harvesterv1.UpgradePlanPhase
	at    time.Duration
}

// makespanResult is one simulated upgrade.
type makespanResult struct {
	nodes int
	// perNodePreload is the variant with imagePreload.concurrency -1: each node preloads
	// in its own turn.
	perNodePreload bool
	finished       bool
	// makespan is from the first NodeUpdate seen (which creates the UpgradePlan) to the
	// plan seen Succeeded; firstNode from the first UpgradeTask's creation to that
	// NodeUpdate (the task's first look at the workload cluster, off the upgrade's path).
	makespan  time.Duration
	bound     time.Duration
	firstNode time.Duration
	// planSeen is when the UpgradePlan was first seen, from the first NodeUpdate.
	planSeen time.Duration
	// trace is the run's timeline, for --makespan-trace.
	trace  []string
	phases []makespanPhase
	// nodeTime is, per node in the order they went, from the NodeUpdate's first step
	// after ClusterUpgrade to its success; handoff from one node's success to the next
	// NodeUpdate's creation.
	nodeTime []time.Duration
	handoff  []time.Duration
	// steps is the mean time of each node step, from when it was first seen as the
	// NodeUpdate's current step to when the next one was.
	steps map[string]time.Duration
	// clusterPreloads counts the runs of the UpgradePlan's preload Plan (one per node
	// when the plan preloads, none when each node preloads in its turn).
	clusterPreloads int
	// sucChain is the total of System Upgrade Controller's chains around the work of the
	// nodes' own Plans (sim.PlanRun: from the Plan seen to the pod started, from the
	// Job's completion to the node's label), which lie on the critical path one after
	// the other; sucChains counts them.
	sucChain  time.Duration
	sucChains int
}

func (r makespanResult) ratio() float64 { return ratioOf(r.makespan, r.bound) }

// sucChainMean is the mean of the nodes' SUC chains; 0 when none was seen.
func (r makespanResult) sucChainMean() time.Duration {
	if r.sucChains == 0 {
		return 0
	}
	return r.sucChain / time.Duration(r.sucChains)
}

// phaseTime is how long the plan was seen in phase p; 0 when not seen.
func (r makespanResult) phaseTime(p harvesterv1.UpgradePlanPhase) time.Duration {
	for i, ph := range r.phases {
		if ph.phase == p && i+1 < len(r.phases) {
			return r.phases[i+1].at - ph.at
		}
	}
	return 0
}

// setupTime is from the first NodeUpdate to the plan past its setup (initializing, the
// repository, the metadata): ImagePreloading, or the phase after it when it was skipped
// within one reconcile.
func (r makespanResult) setupTime() time.Duration {
	for _, ph := range r.phases {
		switch ph.phase {
		case harvesterv1.UpgradePlanInitializing, harvesterv1.UpgradePlanRepoCreating, harvesterv1.UpgradePlanMetadataPopulating:
		default:
			return ph.at
		}
	}
	return 0
}

// phaseAt is when the plan was first seen in phase p; -1 when not seen.
func (r makespanResult) phaseAt(p harvesterv1.UpgradePlanPhase) time.Duration {
	for _, ph := range r.phases {
		if ph.phase == p {
			return ph.at
		}
	}
	return -1
}

// runMakespanBench runs every size, with the cluster-wide preload and with each node's own.
func runMakespanBench(ctx context.Context, b *bench) ([]makespanResult, error) {
	d := scaleDurations(b.cfg.makespanScale)
	b.printf("  %.0f× faster than Harvester's real run: setup %s, preload %s, cluster upgrade %s, per node %s (drain %s, RKE2 %s, OS and reboot %s), cleanup %s; poll interval %s\n",
		b.cfg.makespanScale, secs(d.setup), secs(d.preload), secs(d.clusterUpgrade), secs(d.node()), secs(d.drain), secs(d.rke2), secs(d.osUpgrade), secs(d.cleanup), b.cfg.makespanPoll)
	var out []makespanResult
	for _, n := range b.cfg.makespanSizes {
		for _, perNode := range []bool{false, true} {
			r, err := runMakespan(ctx, b, n, perNode, d)
			if err != nil {
				return out, fmt.Errorf("%d nodes (per-node preload %v): %w", n, perNode, err)
			}
			how := "cluster-wide preload"
			if perNode {
				how = "per-node preload   "
			}
			b.printf("  %2d nodes, %s: makespan %s, bound %s, ratio %.3f; System Upgrade Controller's chains around the nodes' Plans %s (%d, %s ms each)\n",
				n, how, secs(r.makespan), secs(r.bound), r.ratio(), secs(r.sucChain), r.sucChains, ms(r.sucChainMean()))
			var phases []string
			for _, ph := range r.phases {
				phases = append(phases, fmt.Sprintf("%s %.2f", ph.phase, ph.at.Seconds()))
			}
			b.printf("      first NodeUpdate %.2f s after the first UpgradeTask; from it, plan seen after %.2f s; phases entered at (s): %s\n", r.firstNode.Seconds(), r.planSeen.Seconds(), strings.Join(phases, ", "))
			if b.cfg.makespanTrace {
				for _, line := range r.trace {
					b.printf("      %s\n", line)
				}
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no makespan size configured")
	}
	return out, nil
}

// runMakespan upgrades a Harvester cluster of n nodes (up to three management nodes, the
// rest workers) from v1.7.1 to v1.8.1 on a workload API server of its own, with the
// simulators' durations d, through the real UpgradeTask controller, NodeUpdate reconciler,
// Harvester updater and UpgradePlan controller, wired as main.go wires them with
// --poll-interval makespanPoll, one node at a time.
func runMakespan(ctx context.Context, b *bench, n int, perNodePreload bool, d scaledDurations) (makespanResult, error) {
	res := makespanResult{nodes: n, perNodePreload: perNodePreload, bound: d.bound(n)}
	poll := b.cfg.makespanPoll
	wl, err := testenv.Start()
	if err != nil {
		return res, err
	}
	defer func() { _ = wl.Stop() }()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	mc, wc := b.client, wl.Client
	if err := warmUp(ctx, wl); err != nil {
		return res, err
	}
	ns, err := fixtures.Namespace(ctx, mc, "bench-makespan")
	if err != nil {
		return res, err
	}
	nodes, err := createMakespanCluster(ctx, mc, wl, ns, n)
	if err != nil {
		return res, err
	}

	// The simulators, each playing its part of the real run's durations.
	if err := sim.Seed(ctx, wc, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}); err != nil {
		return res, fmt.Errorf("seed Rancher's objects: %w", err)
	}
	rec := sim.NewRecord()
	kubelet := &sim.Kubelet{Client: wc, Record: rec, OSImage: makespanFromOS, Labels: sim.HarvesterNodeLabels(nil)}
	for _, node := range nodes {
		labels := map[string]string{"node-role.kubernetes.io/worker": "true"}
		if node.management {
			labels = map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"}
		}
		if _, err := kubelet.CreateNode(ctx, node.name, makespanFromVersion, labels); err != nil {
			return res, err
		}
	}
	defer kubelet.Close()
	// The simulators read and react through informers (their Cache), as the controllers
	// they stand for do.
	informers, err := wl.StartCache(runCtx)
	if err != nil {
		return res, err
	}
	defer informers.Stop()
	suc := &sim.SUC{Client: wc, Cache: informers, Namespace: "cattle-system", Kubelet: kubelet, Record: rec, Interval: poll, Work: sucWork(d, n)}
	repository := &sim.Repository{Client: wc, Cache: informers, Namespace: upgraderepo.Namespace, Release: makespanReleaseYAML, Delay: d.setup}
	longhorn := &sim.Longhorn{Client: wc, Namespace: longhorn.Namespace, Interval: poll}
	repository.Start(runCtx)
	(&sim.Rancher{Client: wc, Cache: informers}).Start(runCtx)
	(&sim.ClusterUpgradeJobs{Client: wc, Kubeconfig: wl.Kubeconfig, Cache: informers, MinDuration: d.clusterUpgrade}).Start(runCtx)
	var sims sync.WaitGroup
	sims.Add(2)
	go func() { defer sims.Done(); _ = suc.Run(runCtx) }()
	go func() { defer sims.Done(); longhorn.Run(runCtx) }()
	defer sims.Wait()
	defer cancel()

	hu := &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns},
		Spec: harvesterv1.HarvesterUpgraderSpec{
			Release: harvesterv1.Release{Version: makespanRelease, ISOURL: "https://releases.example/harvester-v1.8.1-amd64.iso", ISOChecksum: strings.Repeat("0", 127) + "1"},
		},
	}
	if perNodePreload {
		hu.Spec.ImagePreload.Concurrency = ptr.To[int32](-1)
	}
	if err := mc.Create(ctx, hu); err != nil {
		return res, fmt.Errorf("create HarvesterUpgrader: %w", err)
	}

	stop, err := startMakespanManager(ctx, b, ns, poll, repository)
	if err != nil {
		return res, err
	}
	defer stop()

	obs, err := observeMakespan(runCtx, b, ns)
	if err != nil {
		return res, err
	}
	defer obs.stop()

	timeout := 3*res.bound + 2*time.Minute
	t0 := time.Now()
	if err := createMakespanTask(ctx, mc, ns, "cp", &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}, nil); err != nil {
		return res, err
	}
	if n > makespanManagement {
		// As the annotation cascade does: the workers once the control plane is done.
		if err := waitMakespanTask(ctx, b.watchClient, ns, "cp", t0.Add(timeout)); err != nil {
			return res, err
		}
		if err := createMakespanTask(ctx, mc, ns, "workers", nil, &inplacev1.MachineDeploymentReference{Name: "workers"}); err != nil {
			return res, err
		}
	}
	select {
	case <-obs.done:
		res.finished = true
	case <-time.After(time.Until(t0.Add(timeout))):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	obs.fill(&res, t0, rec.Runs())
	clusterPreload := "capi-inplace-preload-" + strings.NewReplacer(".", "-", "+", "-").Replace(makespanRelease) + "-"
	for _, r := range rec.Runs() {
		if strings.HasPrefix(r.Plan, clusterPreload) {
			res.clusterPreloads++
		}
	}
	if !res.finished {
		plan := &harvesterv1.UpgradePlan{}
		_ = mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: upgradeplan.Name(makespanCluster, makespanRelease)}, plan)
		return res, fmt.Errorf("the UpgradePlan did not succeed within %s: phase %s: %s", timeout, plan.Status.Phase, plan.Status.Message)
	}
	if got := rec.MaxDown(); got != 1 {
		return res, fmt.Errorf("%d nodes down at once, want 1", got)
	}
	return res, nil
}

// warmUp lists, once, every kind whose CRD the workload API server serves. A fresh test
// API server answers the first request for each custom kind only after about a second
// (measured: 1.0 s for each of Longhorn's and KubeVirt's kinds, whichever client asks;
// the next request takes milliseconds), which would be charged to the first node's
// evacuation and Longhorn steps. A real Harvester cluster's controllers (KubeVirt's,
// Longhorn's, Rancher's) have listed and watched their kinds long before an upgrade.
func warmUp(ctx context.Context, wl *testenv.Environment) error {
	for _, crd := range wl.CRDs() {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.ListKind})
			if err := wl.Client.List(ctx, list, client.Limit(1)); err != nil {
				return fmt.Errorf("list %s: %w", crd.Name, err)
			}
			break
		}
	}
	return nil
}

// sucWork is how long each SUC Plan's Job works on a node: the plan kinds the Harvester
// updater labels its Plans with. The image cleanup runs one node at a time; the real
// run's cleanup is shared among the nodes so that it adds up to the same at every size.
func sucWork(d scaledDurations, n int) func(*sucv1.Plan) time.Duration {
	return func(p *sucv1.Plan) time.Duration {
		switch p.Labels[suc.LabelPlanKind] {
		case "preload":
			return d.preload
		case "drain":
			return d.drain
		case "rke2":
			return d.rke2
		case "os":
			return d.osUpgrade
		case "image-cleanup":
			return d.cleanup / time.Duration(n)
		}
		return 0
	}
}

// makespanNode is a machine of the simulated cluster and its node.
type makespanNode struct {
	name       string
	management bool
}

// createMakespanCluster creates the CAPI objects of an n-node Harvester cluster and the
// kubeconfig Secret that reaches wl.
func createMakespanCluster(ctx context.Context, mc client.Client, wl *testenv.Environment, ns string, n int) ([]makespanNode, error) {
	for _, name := range []string{"cattle-system", upgraderepo.Namespace, longhorn.Namespace} {
		if err := wl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	if err := wl.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "system-upgrade-controller", Namespace: "cattle-system"}}); err != nil {
		return nil, err
	}
	if _, err := fixtures.Cluster(ctx, mc, ns, makespanCluster, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"}); err != nil {
		return nil, err
	}
	_, cp, err := fixtures.ControlPlane(ctx, mc, ns, makespanCluster, "cp", makespanFromVersion, min(n, makespanManagement), false)
	if err != nil {
		return nil, err
	}
	var out []makespanNode
	for _, m := range cp {
		out = append(out, makespanNode{name: m.Status.NodeRef.Name, management: true})
	}
	if n > makespanManagement {
		_, workers, err := fixtures.MachineDeployment(ctx, mc, ns, makespanCluster, "workers", makespanFromVersion, n-makespanManagement)
		if err != nil {
			return nil, err
		}
		for _, m := range workers {
			out = append(out, makespanNode{name: m.Status.NodeRef.Name})
		}
	}
	// The fixtures create each Node beside its Machine; here Nodes live on the workload
	// cluster only.
	for _, node := range out {
		if err := client.IgnoreNotFound(mc.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.name}})); err != nil {
			return nil, err
		}
	}
	kubeconfig, err := wl.Kubeconfig()
	if err != nil {
		return nil, err
	}
	return out, mc.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: workloadcluster.KubeconfigSecretName(makespanCluster)},
		Data:       map[string][]byte{workloadcluster.KubeconfigSecretKey: kubeconfig},
	})
}

// startMakespanManager runs the controllers of main.go that a Harvester upgrade goes
// through, on namespace ns, with --poll-interval poll: the UpgradeTask controller, the
// NodeUpdate reconciler with the Harvester updater, and the UpgradePlan controller
// (without its preflight checks: the simulated kubelets serve no disk statistics). The
// manager reads the release metadata from the repository simulator's server, which
// stands for the repository's in-cluster Service.
func startMakespanManager(ctx context.Context, b *bench, ns string, poll time.Duration, repository *sim.Repository) (func(), error) {
	mgr, err := ctrl.NewManager(managerRESTConfig(b.env.Config), ctrl.Options{
		Scheme:                 b.env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}, DefaultTransform: cache.TransformStripManagedFields()},
	})
	if err != nil {
		return nil, err
	}
	workloads := &workloadcluster.Clients{Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Recheck: workloadcluster.SecretRecheck}
	nodeCaches := &workloadcluster.NodeCaches{Clients: workloads}
	if err := mgr.Add(nodeCaches); err != nil {
		return nil, err
	}
	harvester := &harvesteradapter.Updater{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Workloads: nodeCaches, Releases: upgraderepo.HTTPReleaseReader{},
		RepositoryURL: func(string) string { return repository.URL() },
		PollInterval:  poll, NodeImage: makespanNodeImage, Version: "v0.4.0", Recorder: mgr.GetEventRecorder("harvester-updater"),
	}
	registry := nodeupdater.NewRegistry()
	if err := registry.Register(harvester.Registration()); err != nil {
		return nil, err
	}
	opts := controller.Options{MaxConcurrentReconciles: managerConcurrency}
	nodeUpdates := &nodeupdater.Reconciler{Registry: registry, PollInterval: poll}
	if err := nodeUpdates.SetupWithManager(mgr, opts); err != nil {
		return nil, err
	}
	plans := &upgradeplan.PlanReconciler{
		Env: harvester.PlanEnv(), Recorder: mgr.GetEventRecorder("harvester-upgradeplan"), PollInterval: poll, ClusterUpgradePollInterval: poll, ClusterUpgradeCAPIStableFor: 6 * poll,
	}
	if err := plans.SetupWithManager(mgr, opts); err != nil {
		return nil, err
	}
	// A change of a workload Node a step or a phase may wait for wakes them at once.
	nodeCaches.OnNodeChange = func(cluster types.NamespacedName, node string) {
		nodeUpdates.Wake(cluster, node)
		plans.Wake(cluster, node)
	}
	if err := (&upgradetask.Reconciler{Registry: registry, Workload: nodeCaches, PollInterval: poll}).SetupWithManager(ctx, mgr, opts); err != nil {
		return nil, err
	}
	return startManager(ctx, mgr)
}

// createMakespanTask asks for the upgrade of the control plane or the MachineDeployment,
// one node at a time, as an UpgradeTask (what ExternalUpgradeRequest and the annotation
// cascade create).
func createMakespanTask(ctx context.Context, c client.Client, ns, name string, cp *inplacev1.ControlPlaneReference, md *inplacev1.MachineDeploymentReference) error {
	task := &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName: makespanCluster, Version: makespanToVersion, ControlPlaneRef: cp, MachineDeploymentRef: md,
			UpdaterRef:     inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
		},
	}
	if err := c.Create(ctx, task); err != nil {
		return fmt.Errorf("create UpgradeTask %s: %w", name, err)
	}
	return nil
}

// waitMakespanTask waits on a watch of the task, as the annotation cascade acts on the
// task's events, until it completed; it fails when the task failed or the deadline passed.
func waitMakespanTask(ctx context.Context, c client.WithWatch, ns, name string, deadline time.Time) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for ctx.Err() == nil {
		// A watch from no resourceVersion starts with the task as it is.
		w, err := c.Watch(ctx, &inplacev1.UpgradeTaskList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": name})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			task, ok := ev.Object.(*inplacev1.UpgradeTask)
			if !ok {
				continue
			}
			switch task.Status.Phase {
			case inplacev1.TaskPhaseCompleted:
				w.Stop()
				return nil
			case inplacev1.TaskPhaseFailed:
				w.Stop()
				return fmt.Errorf("UpgradeTask %s failed: %+v", name, task.Status.Machines)
			}
		}
		w.Stop() // the watch ended (a timeout of the API server): watch again
	}
	return fmt.Errorf("UpgradeTask %s did not complete in time", name)
}

// makespanObserver is the bench's own clock on the upgrade: watches of the namespace's
// UpgradePlans and NodeUpdates that stamp when each phase, each node's step and each
// node's success was first seen.
type makespanObserver struct {
	mu        sync.Mutex
	planSeen  time.Time
	phases    []observedPhase
	created   map[string]time.Time
	stepSeen  map[string]map[string]time.Time
	succeeded map[string]time.Time
	stops     []func()
	// done is closed when the plan is first seen Succeeded.
	done      chan struct{}
	closeOnce sync.Once
}

type observedPhase struct {
	phase harvesterv1.UpgradePlanPhase
	at    time.Time
}

func observeMakespan(ctx context.Context, b *bench, ns string) (*makespanObserver, error) {
	o := &makespanObserver{created: map[string]time.Time{}, stepSeen: map[string]map[string]time.Time{}, succeeded: map[string]time.Time{}, done: make(chan struct{})}
	plans, err := b.watchClient.Watch(ctx, &harvesterv1.UpgradePlanList{}, client.InNamespace(ns))
	if err != nil {
		return nil, fmt.Errorf("watch UpgradePlans: %w", err)
	}
	nus, err := b.watchClient.Watch(ctx, &inplacev1.NodeUpdateList{}, client.InNamespace(ns))
	if err != nil {
		plans.Stop()
		return nil, fmt.Errorf("watch NodeUpdates: %w", err)
	}
	o.stops = []func(){plans.Stop, nus.Stop}
	go o.follow(plans, func(now time.Time, obj any) {
		plan, ok := obj.(*harvesterv1.UpgradePlan)
		if !ok {
			return
		}
		if o.planSeen.IsZero() {
			o.planSeen = now
		}
		if p := plan.Status.Phase; p != "" && (len(o.phases) == 0 || o.phases[len(o.phases)-1].phase != p) {
			o.phases = append(o.phases, observedPhase{phase: p, at: now})
			if p == harvesterv1.UpgradePlanSucceeded {
				o.closeOnce.Do(func() { close(o.done) })
			}
		}
	})
	go o.follow(nus, func(now time.Time, obj any) {
		nu, ok := obj.(*inplacev1.NodeUpdate)
		if !ok {
			return
		}
		name := nu.Spec.NodeName
		if _, seen := o.created[name]; !seen {
			o.created[name] = now
			o.stepSeen[name] = map[string]time.Time{}
		}
		if s := nu.Status.CurrentStep; s != "" {
			if _, seen := o.stepSeen[name][s]; !seen {
				o.stepSeen[name][s] = now
			}
		}
		if _, seen := o.succeeded[name]; !seen && nu.Status.Phase == inplacev1.NodeUpdatePhaseSucceeded {
			o.succeeded[name] = now
		}
	})
	return o, nil
}

// follow stamps each added or modified object of w with the time it arrived.
func (o *makespanObserver) follow(w watch.Interface, stamp func(time.Time, any)) {
	for ev := range w.ResultChan() {
		now := time.Now()
		if ev.Type != watch.Added && ev.Type != watch.Modified {
			continue
		}
		o.mu.Lock()
		stamp(now, ev.Object)
		o.mu.Unlock()
	}
}

func (o *makespanObserver) stop() {
	for _, s := range o.stops {
		s()
	}
}

// fill writes what was observed into r, with times from the first NodeUpdate seen; t0 is
// when the first UpgradeTask was created, runs what SUC ran.
func (o *makespanObserver) fill(r *makespanResult, t0 time.Time, runs []sim.PlanRun) {
	o.mu.Lock()
	defer o.mu.Unlock()
	// The nodes in the order they went.
	names := make([]string, 0, len(o.created))
	for name := range o.created {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return o.created[a].Compare(o.created[b]) })
	if len(names) == 0 {
		return
	}
	origin := o.created[names[0]]
	rel := func(t time.Time) time.Duration { return t.Sub(origin) }
	r.firstNode = origin.Sub(t0)
	for _, ph := range o.phases {
		r.phases = append(r.phases, makespanPhase{phase: ph.phase, at: rel(ph.at)})
	}
	if !o.planSeen.IsZero() {
		r.planSeen = rel(o.planSeen)
	}
	if at := r.phaseAt(harvesterv1.UpgradePlanSucceeded); at >= 0 {
		r.makespan = at
	}
	// A node's own time starts when it may go: at its NodeUpdate's creation, or when the
	// plan let the nodes go, whichever is later.
	var nodesFrom time.Time
	if at := r.phaseAt(harvesterv1.UpgradePlanNodeUpgrading); at >= 0 {
		nodesFrom = origin.Add(at)
	}
	type seen struct {
		step string
		at   time.Time
	}
	sums, counts := map[string]time.Duration{}, map[string]int{}
	for i, name := range names {
		var steps []seen
		for step, at := range o.stepSeen[name] {
			steps = append(steps, seen{step, at})
		}
		slices.SortFunc(steps, func(a, b seen) int { return a.at.Compare(b.at) })
		line := fmt.Sprintf("node %s: created %.3f", name, rel(o.created[name]).Seconds())
		for _, st := range steps {
			line += fmt.Sprintf(", %s %.3f", st.step, rel(st.at).Seconds())
		}
		done, ok := o.succeeded[name]
		if ok {
			line += fmt.Sprintf(", Succeeded %.3f", rel(done).Seconds())
		}
		r.trace = append(r.trace, line)
		if !ok {
			continue
		}
		from := o.created[name]
		if from.Before(nodesFrom) {
			from = nodesFrom
		}
		r.nodeTime = append(r.nodeTime, done.Sub(from))
		for j, st := range steps {
			end := done
			if j+1 < len(steps) {
				end = steps[j+1].at
			}
			// A node that waited for the plan's cluster phases has no step time of its own there.
			if st.step == harvesteradapter.StepClusterUpgrade && st.at.Before(nodesFrom) {
				continue
			}
			sums[st.step] += end.Sub(st.at)
			counts[st.step]++
		}
		if i+1 < len(names) {
			r.handoff = append(r.handoff, max(o.created[names[i+1]].Sub(done), 0))
		}
	}
	r.steps = map[string]time.Duration{}
	for step, sum := range sums {
		r.steps[step] = sum / time.Duration(counts[step])
	}
	for _, run := range runs {
		r.trace = append(r.trace, fmt.Sprintf("SUC run %s on %s: Plan seen %.3f, pod %.3f to %.3f, node labelled %.3f",
			run.Plan, run.Node, rel(run.PlanSeen).Seconds(), rel(run.Start).Seconds(), rel(run.End).Seconds(), rel(run.Labelled).Seconds()))
		// A node's own Plan is named after its node; the plan's cluster-wide ones are not.
		if strings.Contains(run.Plan, run.Node) && !run.PlanSeen.IsZero() && !run.Labelled.IsZero() {
			r.sucChain += run.Start.Sub(run.PlanSeen) + run.Labelled.Sub(run.End)
			r.sucChains++
		}
	}
}
