// Package scenario builds the whole product on one machine: a management and a workload
// API server (test/testenv), a Cluster API cluster of simulated Harvester nodes on them
// (test/fixtures for the CAPI objects, test/sim for the kubelets, System Upgrade
// Controller, Longhorn and the upgrade repository), and the real manager binary running
// as a separate process against them (test/manager). `make demo` runs one; the e2e suite
// can run many.
//
// The workload cluster is reached by the manager only through the Cluster's
// <cluster>-kubeconfig Secret, as in production. The simulators record what they did, so
// Invariants can check safety afterwards (never more nodes down than maxUnavailable,
// control plane before workers, every node upgraded exactly once, no Plan left behind).
package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// The release the sample cluster is upgraded from and to.
const (
	// FromVersion is the Kubernetes (RKE2) version the nodes start at.
	FromVersion = "v1.34.3+rke2r3"
	// ToVersion is the Kubernetes version of HarvesterRelease.
	ToVersion = "v1.35.6+rke2r1"
	// FromOSImage is the operating system the nodes start on.
	FromOSImage = "Harvester " + FromRelease
	// FromRelease is the Harvester release the cluster runs at first, and FromRancher its
	// Rancher.
	FromRelease = "v1.7.1"
	FromRancher = "v2.13.1"
	// HarvesterRelease is the Harvester release the nodes are upgraded to.
	HarvesterRelease = "v1.8.1"
	// ToOSImage is what a node reports once its OS upgrade to HarvesterRelease rebooted it.
	ToOSImage = "Harvester " + HarvesterRelease

	// SUCNamespace is where SUC runs on a Harvester cluster (the HarvesterUpgrader default).
	SUCNamespace = "cattle-system"
	// UpdaterName is the name of the sample HarvesterUpgrader.
	UpdaterName = "default"
	// ControlPlaneName is the name of the KubeadmControlPlane.
	ControlPlaneName = "cp"
	// MachineDeploymentName is the name of the workers' MachineDeployment.
	MachineDeploymentName = "workers"
	// VMNamespace holds the sample virtual machines on the workload cluster.
	VMNamespace = "vms"
	// V2VolumeName is the Longhorn v2 volume with a replica on every worker (see
	// Options.LonghornV2).
	V2VolumeName = "pvc-v2-demo"
	// LonghornIMImage is the image of every node's v2 instance manager at the start, and
	// LonghornIMTargetImage the one Longhorn's live upgrade rolls them to (see
	// Options.LonghornV2).
	LonghornIMImage       = "longhornio/longhorn-instance-manager:v1.12.2"
	LonghornIMTargetImage = "longhornio/longhorn-instance-manager:v1.13.0"
)

// ReleaseMetadata is the harvester-release.yaml the repository simulator serves.
var ReleaseMetadata = `harvester: v1.8.1
harvesterChart: 1.8.1
os: Harvester v1.8.1
kubernetes: v1.35.6+rke2r1
rancher: v2.14.2
# the KubeVirt the simulators take chart 1.8.1 to carry (sim.KubeVirtVersionOfChart)
kubevirt: v-harvester-1.8.1
` + sim.RancherDependenciesYAML("v2.14.2") + `minUpgradableVersion: v1.7.0
`

// Options say what to build.
type Options struct {
	// Namespace of the CAPI objects on the management cluster; default "demo".
	Namespace string
	// ClusterName is the Cluster's name; default "harvester".
	ClusterName string
	// ControlPlaneMachines is the number of control plane machines; default 3.
	ControlPlaneMachines int
	// Workers is the number of machines of the MachineDeployment; default 3.
	Workers int
	// WorkerMaxUnavailable is the MachineDeployment's rollout maxUnavailable; default 1.
	WorkerMaxUnavailable int
	// StepDelay is how long each simulated step takes (a SUC Plan's Job on a node, a
	// state of Longhorn's live upgrade of a node's v2 instance manager); default 1s.
	StepDelay time.Duration
	// LonghornV2 adds a Longhorn v2 volume with a replica on every worker and Longhorn's
	// live upgrade of v2 instance managers, running from the start (createLonghornV2), so
	// the nodes go through the LonghornDataEngine step while Longhorn's roll runs.
	LonghornV2 bool
	// SUCOwnsRKE2 leaves the nodes' RKE2 to no provisioner: no machine-plan Secrets and no
	// RancherPlanner, so the updater upgrades RKE2 with SUC rke2-upgrade Plans, as on a
	// cluster Rancher does not provision. By default Rancher provisions every node, as on
	// a real Harvester cluster (harvester-release-steps.md section E), and the
	// RancherPlanner simulator plays it.
	SUCOwnsRKE2 bool
	// WorkDir receives the kubeconfigs, serving certificates and the manager's log.
	// Required.
	WorkDir string
	// ManagerBinary is the manager to run; empty builds it from the checkout into WorkDir.
	ManagerBinary string
	// ManagerArgs are extra flags of the manager.
	ManagerArgs []string
	// Progress, when set, is told what is being done while the scenario starts.
	Progress func(stage string)
	// Hop is the release the cluster starts at and the one it is upgraded to; default
	// DefaultHop.
	Hop Hop
}

func (o *Options) setDefaults() {
	if o.Namespace == "" {
		o.Namespace = "demo"
	}
	if o.ClusterName == "" {
		o.ClusterName = "harvester"
	}
	if o.ControlPlaneMachines == 0 {
		o.ControlPlaneMachines = 3
	}
	if o.Workers == 0 {
		o.Workers = 3
	}
	if o.WorkerMaxUnavailable == 0 {
		o.WorkerMaxUnavailable = 1
	}
	if o.StepDelay == 0 {
		o.StepDelay = time.Second
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if o.Hop == (Hop{}) {
		o.Hop = DefaultHop
	}
}

// Node is one machine of the sample cluster and its Node on the workload cluster.
type Node struct {
	// Machine is the CAPI Machine's name.
	Machine string
	// Name is the Node's name on the workload cluster.
	Name string
	// ControlPlane is true for a control plane machine.
	ControlPlane bool
}

// Scenario is a running sample cluster, its simulators and its manager.
type Scenario struct {
	// Options are the options it was built with, defaults filled in.
	Options Options
	// Management holds the CAPI objects, UpgradeTasks, NodeUpdates, the HarvesterUpgrader
	// and the kubeconfig Secret; the manager runs against it.
	Management *testenv.Environment
	// Workload is the Harvester cluster: Nodes, SUC Plans and Jobs, Longhorn.
	Workload *testenv.Environment

	// Cluster, ControlPlane and MachineDeployment are the CAPI objects as created.
	Cluster           *clusterv1.Cluster
	ControlPlane      *controlplanev1.KubeadmControlPlane
	MachineDeployment *clusterv1.MachineDeployment
	// Nodes are the control plane machines then the workers, in creation order.
	Nodes []Node

	// Record is what the kubelet and SUC simulators did.
	Record     *sim.Record
	Kubelet    *sim.Kubelet
	SUC        *sim.SUC
	Repository *sim.Repository
	Longhorn   *sim.Longhorn
	// KubeVirt plays the virtual machines of VMNamespace (see createVMs).
	KubeVirt *sim.KubeVirt
	// Rancher plays Rancher and Fleet (the objects the cluster upgrade drives, seeded at
	// FromRelease), and ClusterUpgradeJobs runs the UpgradePlan's cluster upgrade Job.
	Rancher            *sim.Rancher
	ClusterUpgradeJobs *sim.ClusterUpgradeJobs
	// Planner plays Rancher's provisioning of the nodes' RKE2 (nil with SUCOwnsRKE2).
	Planner *sim.RancherPlanner
	// Settings follows the settings the upgrade changes for the nodes and gives back
	// (settings.go), from the start of the simulators.
	Settings *SettingsWatch
	// Multus plays RKE2's deploy controller and helm-controller for the rke2-multus chart
	// on the server nodes, the VM networks (MultusNetworks) on it; rke2-multus.yaml.skip
	// is the SUC simulator's record of it (fact 34).
	Multus *sim.Multus

	// Manager is the manager process; Certs its serving certificates.
	Manager *manager.Process
	Certs   *manager.ServingCerts
	// ManagementKubeconfig, WorkloadKubeconfig and ManagerLog are files in WorkDir.
	ManagementKubeconfig string
	WorkloadKubeconfig   string
	ManagerLog           string

	stopSims context.CancelFunc
	simsDone sync.WaitGroup
}

// Start builds the scenario. On error, whatever was started is stopped again.
func Start(ctx context.Context, opts Options) (_ *Scenario, reterr error) {
	opts.setDefaults()
	if opts.WorkDir == "" {
		return nil, errors.New("scenario: Options.WorkDir is required")
	}
	s := &Scenario{Options: opts, Record: sim.NewRecord()}
	defer func() {
		if reterr != nil {
			_ = s.Stop()
		}
	}()

	if err := s.startServersAndBuild(ctx); err != nil {
		return nil, err
	}
	opts.Progress(fmt.Sprintf("creating Cluster %s/%s: %d control plane machines, MachineDeployment %s of %d, their Nodes on the workload cluster",
		opts.Namespace, opts.ClusterName, opts.ControlPlaneMachines, MachineDeploymentName, opts.Workers))
	if err := s.createWorkload(ctx); err != nil {
		return nil, err
	}
	if err := s.createCluster(ctx); err != nil {
		return nil, err
	}
	opts.Progress("starting the simulators: kubelets, System Upgrade Controller, Longhorn, upgrade repository, Rancher")
	// A client whose discovery predates the CRDs' being served answers "no matches" for a
	// moment: look again, briefly.
	seed := func() error {
		return sim.Seed(ctx, s.Workload.Client, sim.HarvesterRelease{Version: opts.Hop.FromRelease, Rancher: opts.Hop.FromRancher, Kubernetes: opts.Hop.FromKubernetes})
	}
	err := seed()
	for i := 0; i < 50 && meta.IsNoMatchError(err); i++ {
		time.Sleep(200 * time.Millisecond)
		err = seed()
	}
	if err != nil {
		return nil, fmt.Errorf("seed Rancher's objects on the workload cluster: %w", err)
	}
	if err := s.startSimulators(ctx); err != nil {
		return nil, err
	}
	if err := s.createVMs(ctx); err != nil {
		return nil, err
	}
	if err := s.createUpdater(ctx); err != nil {
		return nil, err
	}
	opts.Progress("starting the manager as a separate process")
	if err := s.startManager(); err != nil {
		return nil, err
	}
	return s, nil
}

// startServersAndBuild starts both API servers and builds the manager at the same time.
func (s *Scenario) startServersAndBuild(ctx context.Context) error {
	opts := s.Options
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	opts.Progress("starting the management and workload API servers (kube-apiserver and etcd from bin/k8s) and installing the CRDs")
	if opts.ManagerBinary == "" {
		opts.Progress("building the manager binary from this checkout")
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(3)
	go func() { defer wg.Done(); s.Management, errs[0] = testenv.Start() }()
	go func() { defer wg.Done(); s.Workload, errs[1] = testenv.Start() }()
	go func() {
		defer wg.Done()
		if opts.ManagerBinary != "" {
			return
		}
		s.Options.ManagerBinary, errs[2] = manager.Build(ctx, root, opts.WorkDir)
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.ManagementKubeconfig = filepath.Join(opts.WorkDir, "management.kubeconfig")
	s.WorkloadKubeconfig = filepath.Join(opts.WorkDir, "workload.kubeconfig")
	s.ManagerLog = filepath.Join(opts.WorkDir, "manager.log")
	if err := s.Management.WriteKubeconfig(s.ManagementKubeconfig); err != nil {
		return err
	}
	return s.Workload.WriteKubeconfig(s.WorkloadKubeconfig)
}

// createWorkload prepares the Harvester cluster: SUC's namespace and service account,
// the repository and Longhorn namespaces, and one Ready Node per machine.
func (s *Scenario) createWorkload(ctx context.Context) error {
	wc := s.Workload.Client
	for _, ns := range []string{SUCNamespace, repository.Namespace, longhorn.Namespace} {
		if err := wc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fmt.Errorf("create namespace %s on the workload cluster: %w", ns, err)
		}
	}
	if err := wc.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "system-upgrade-controller", Namespace: SUCNamespace}}); err != nil {
		return fmt.Errorf("create SUC's service account: %w", err)
	}
	ns := s.Options.Namespace
	for i := 1; i <= s.Options.ControlPlaneMachines; i++ {
		m := fmt.Sprintf("%s-%d", ControlPlaneName, i)
		s.Nodes = append(s.Nodes, Node{Machine: m, Name: fixtures.NodeName(ns, m), ControlPlane: true})
	}
	for i := 1; i <= s.Options.Workers; i++ {
		m := fmt.Sprintf("%s-%d", MachineDeploymentName, i)
		s.Nodes = append(s.Nodes, Node{Machine: m, Name: fixtures.NodeName(ns, m)})
	}
	// The kubelets serve /stats/summary and /configz, which the UpgradePlan's disk space
	// check reads through the API server's node proxy.
	addr, err := sim.NonLoopbackIPv4()
	if err != nil {
		return fmt.Errorf("an address for the simulated kubelets: %w", err)
	}
	s.Kubelet = &sim.Kubelet{Client: wc, Record: s.Record, OSImage: s.Options.Hop.FromOSImage(), ServeAddress: addr, Labels: sim.HarvesterNodeLabels(nil)}
	for _, n := range s.Nodes {
		labels := map[string]string{"node-role.kubernetes.io/worker": "true"}
		if n.ControlPlane {
			labels = map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"}
		}
		if _, err := s.Kubelet.CreateNode(ctx, n.Name, s.Options.Hop.FromKubernetes, labels); err != nil {
			return err
		}
	}
	if s.Options.LonghornV2 {
		return s.createLonghornV2(ctx)
	}
	return nil
}

// createLonghornV2 gives the workload cluster a Longhorn that serves the live upgrade of
// v2 instance managers, with the setting that allows it on and every node's v2
// instance manager on an older image than the one the simulator rolls to
// (LonghornIMImage, LonghornIMTargetImage): Longhorn's own roll runs while the nodes are
// upgraded, and the updater must pause it and not take a node down while it runs. It
// also creates an attached, healthy v2 volume with a replica on every worker, as
// Longhorn would report it.
func (s *Scenario) createLonghornV2(ctx context.Context) error {
	if err := installCRDs(s.Workload, filepath.Join(s.Workload.RepoRoot, "test", "crds", "longhorn-liveupgrade")); err != nil {
		return err
	}
	wc := s.Workload.Client
	var workers []string
	for _, n := range s.Nodes {
		if err := sim.CreateLonghornV2InstanceManager(ctx, wc, longhorn.Namespace, n.Name, LonghornIMImage); err != nil {
			return err
		}
		if !n.ControlPlane {
			workers = append(workers, n.Name)
		}
	}
	if err := sim.SetLonghornSetting(ctx, wc, longhorn.Namespace, longhorn.SettingV2AutomaticUpgrade, "true"); err != nil {
		return fmt.Errorf("allow Longhorn's live upgrade: %w", err)
	}
	return sim.CreateLonghornV2Volume(ctx, wc, longhorn.Namespace, sim.LonghornV2Volume{Name: V2VolumeName, ReplicaNodes: workers})
}

func installCRDs(env *testenv.Environment, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			return fmt.Errorf("read CRD %s: %w", e.Name(), err)
		}
		crds = append(crds, crd)
	}
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
		return fmt.Errorf("install the CRDs of %s: %w", dir, err)
	}
	return nil
}

// createCluster creates the CAPI objects on the management cluster and the kubeconfig
// Secret that reaches the workload cluster.
func (s *Scenario) createCluster(ctx context.Context) error {
	mc := s.Management.Client
	opts := s.Options
	if err := mc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.Namespace}}); err != nil {
		return fmt.Errorf("create namespace %s: %w", opts.Namespace, err)
	}
	var err error
	s.Cluster, err = fixtures.Cluster(ctx, mc, opts.Namespace, opts.ClusterName, ControlPlaneName,
		map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/" + UpdaterName})
	if err != nil {
		return err
	}
	// Control plane machines go oldest first, then by name: created within the same
	// second, they go in name order, and no time is spent spacing them.
	s.ControlPlane, _, err = fixtures.ControlPlane(ctx, mc, opts.Namespace, opts.ClusterName, ControlPlaneName, opts.Hop.FromKubernetes, opts.ControlPlaneMachines, false)
	if err != nil {
		return err
	}
	s.MachineDeployment, _, err = fixtures.MachineDeployment(ctx, mc, opts.Namespace, opts.ClusterName, MachineDeploymentName, opts.Hop.FromKubernetes, opts.Workers)
	if err != nil {
		return err
	}
	patch := client.MergeFrom(s.MachineDeployment.DeepCopy())
	s.MachineDeployment.Spec.Rollout.Strategy = clusterv1.MachineDeploymentRolloutStrategy{
		Type: clusterv1.RollingUpdateMachineDeploymentStrategyType,
		RollingUpdate: clusterv1.MachineDeploymentRolloutStrategyRollingUpdate{
			MaxUnavailable: ptrTo(intstr.FromInt32(int32(opts.WorkerMaxUnavailable))),
			MaxSurge:       ptrTo(intstr.FromInt32(0)),
		},
	}
	if err := mc.Patch(ctx, s.MachineDeployment, patch); err != nil {
		return fmt.Errorf("set the rollout strategy of MachineDeployment %s: %w", MachineDeploymentName, err)
	}
	// The fixtures also create a Node next to each Machine, for tests on one API server;
	// here the Nodes live on the workload cluster only.
	for _, n := range s.Nodes {
		if err := client.IgnoreNotFound(mc.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})); err != nil {
			return fmt.Errorf("remove the management copy of Node %s: %w", n.Name, err)
		}
	}
	kubeconfig, err := s.Workload.Kubeconfig()
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: workloadcluster.KubeconfigSecretName(opts.ClusterName), Namespace: opts.Namespace,
			Labels: map[string]string{clusterv1.ClusterNameLabel: opts.ClusterName},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{workloadcluster.KubeconfigSecretKey: kubeconfig},
	}
	if err := mc.Create(ctx, secret); err != nil {
		return fmt.Errorf("create the workload cluster's kubeconfig Secret: %w", err)
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// startSimulators runs SUC, Longhorn, KubeVirt, the repository, Rancher and, unless
// SUCOwnsRKE2, Rancher's provisioning of the nodes on the workload cluster until Stop.
func (s *Scenario) startSimulators(ctx0 context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopSims = cancel
	wc := s.Workload.Client
	delay := s.Options.StepDelay
	// SUC, Rancher, its planner, the repository and the Job controller read from informers
	// and run on their events, as the controllers they stand for do (test/sim passLoop):
	// listing every few milliseconds instead would load the machine's two cores with
	// requests that find nothing to do.
	informers, err := s.Workload.StartCache(ctx)
	if err != nil {
		cancel()
		return err
	}
	s.SUC = &sim.SUC{Client: wc, Cache: informers, Namespace: SUCNamespace, Kubelet: s.Kubelet, Record: s.Record, JobDuration: delay}
	if err := s.startMultus(ctx0); err != nil {
		cancel()
		return err
	}
	s.Repository = &sim.Repository{Client: wc, Cache: informers, Namespace: repository.Namespace, Release: s.Options.Hop.Metadata, Delay: delay}
	s.Longhorn = &sim.Longhorn{Client: wc, Cache: informers, Namespace: longhorn.Namespace, StateDuration: delay, Interval: 50 * time.Millisecond}
	if s.Options.LonghornV2 {
		s.Longhorn.SetTargetImage(LonghornIMTargetImage)
	}
	s.KubeVirt = &sim.KubeVirt{Client: wc, Cache: informers, Namespace: VMNamespace, MigrationDelay: delay / 2, Interval: 50 * time.Millisecond}
	s.Repository.Start(ctx)
	s.Rancher = &sim.Rancher{Client: wc, Cache: informers, ChartDelay: delay, DownloadDelay: delay / 4, RolloutDelay: delay / 2,
		PlannerOwnsLocalCluster: !s.Options.SUCOwnsRKE2}
	s.Rancher.Start(ctx)
	if !s.Options.SUCOwnsRKE2 {
		// The restart guard is host state SUC's Jobs leave (the node program's
		// rke2-restart-guard): the SUC simulator's record of it (fact 12).
		s.Planner = &sim.RancherPlanner{Client: wc, Cache: informers, Kubelet: s.Kubelet,
			InstallDuration: delay / 4, RestartDuration: delay, RetryDelay: delay, Guarded: s.SUC.Guarded, Multus: s.Multus}
		if err := s.Planner.SeedMachines(ctx0); err != nil {
			cancel()
			return fmt.Errorf("seed Rancher's machine-plan Secrets: %w", err)
		}
		s.simsDone.Add(1)
		go func() { defer s.simsDone.Done(); _ = s.Planner.Run(ctx) }()
	}
	// Harvester has its descheduler add-on from v1.7.0 on (fact 36).
	from, err := version.ParseSemantic(s.Options.Hop.FromRelease)
	if err != nil {
		cancel()
		return fmt.Errorf("the scenario's release %q: %w", s.Options.Hop.FromRelease, err)
	}
	if err := s.seedRollSettings(ctx0, from.AtLeast(version.MustParseSemantic("v1.7.0"))); err != nil {
		cancel()
		return err
	}
	if err := s.startSettingsWatch(ctx, informers); err != nil {
		cancel()
		return err
	}
	s.ClusterUpgradeJobs = &sim.ClusterUpgradeJobs{Client: wc, Kubeconfig: s.Workload.Kubeconfig, Cache: informers}
	s.ClusterUpgradeJobs.Start(ctx)
	s.simsDone.Add(3)
	go func() { defer s.simsDone.Done(); _ = s.SUC.Run(ctx) }()
	go func() { defer s.simsDone.Done(); s.Longhorn.Run(ctx) }()
	go func() { defer s.simsDone.Done(); s.KubeVirt.Run(ctx) }()
	return nil
}

// MultusNetworks are the NetworkAttachmentDefinitions (VM networks) of VMNamespace that
// startMultus creates on the rke2-multus chart.
var MultusNetworks = []string{"vlan10", "storage"}

// startMultus installs the rke2-multus chart at the hop's FromKubernetes, as RKE2's first start did,
// creates MultusNetworks, and wires the Multus simulator to SUC (an rke2-upgrade Plan's
// restart, a removed skip file) before SUC runs; startSimulators gives it to the
// RancherPlanner. Whether a node has rke2-multus.yaml.skip is the SUC simulator's record
// (fact 34).
func (s *Scenario) startMultus(ctx context.Context) error {
	wc := s.Workload.Client
	s.Multus = &sim.Multus{Client: wc, Skipped: s.SUC.ManifestSkipped}
	s.SUC.Multus = s.Multus
	if err := s.Multus.RKE2Restarted(ctx, s.Nodes[0].Name, s.Options.Hop.FromKubernetes); err != nil {
		return fmt.Errorf("install the rke2-multus chart: %w", err)
	}
	if err := wc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: VMNamespace}}); err != nil {
		return fmt.Errorf("create namespace %s on the workload cluster: %w", VMNamespace, err)
	}
	for _, name := range MultusNetworks {
		nad := &unstructured.Unstructured{}
		nad.SetGroupVersionKind(sim.NADGVK)
		nad.SetNamespace(VMNamespace)
		nad.SetName(name)
		if err := unstructured.SetNestedField(nad.Object, `{"cniVersion":"0.3.1","type":"bridge"}`, "spec", "config"); err != nil {
			return err
		}
		if err := wc.Create(ctx, nad); err != nil {
			return fmt.Errorf("create NetworkAttachmentDefinition %s/%s: %w", VMNamespace, name, err)
		}
	}
	return nil
}

// createVMs puts a few virtual machines on the workers: one that can be live-migrated on
// each of the first two workers, and one with a PCI host device on the last, which
// cannot (Harvester's rule, harvester-node-upgrade.md fact 31): its node's upgrade stops
// it and starts it again. It waits until KubeVirt runs them all.
func (s *Scenario) createVMs(ctx context.Context) error {
	wc := s.Workload.Client
	var workers []string
	for _, n := range s.Nodes {
		if !n.ControlPlane {
			workers = append(workers, n.Name)
		}
	}
	if len(workers) == 0 {
		return nil
	}
	strategy := kubevirtv1.RunStrategyRerunOnFailure
	var names []string
	for i, node := range workers {
		name := fmt.Sprintf("web-%d", i+1)
		spec := kubevirtv1.VirtualMachineInstanceSpec{}
		if i == len(workers)-1 {
			name = "gpu-1"
			spec.Domain.Devices.HostDevices = []kubevirtv1.HostDevice{{Name: "gpu0", DeviceName: "nvidia.com/GA102GL_A10"}}
		} else if i >= 2 {
			continue
		}
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: VMNamespace},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &strategy, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: spec}},
		}
		s.KubeVirt.PlaceOn(VMNamespace, name, node)
		if err := wc.Create(ctx, vm); err != nil {
			return fmt.Errorf("create VirtualMachine %s: %w", name, err)
		}
		names = append(names, VMNamespace+"/"+name)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, key := range names {
		for s.KubeVirt.NodeOf(key) == "" {
			if time.Now().After(deadline) {
				return fmt.Errorf("KubeVirt did not start VirtualMachine %s", key)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// VMJourneys says, one line per sample virtual machine, where it ran: started on a node,
// live-migrated to another, stopped and started again.
func (s *Scenario) VMJourneys() []string {
	if s.KubeVirt == nil {
		return nil
	}
	steps := map[string][]string{}
	var order []string
	last := map[string]sim.VMIPlacement{}
	for _, p := range s.KubeVirt.History() {
		if _, seen := steps[p.VMI]; !seen {
			order = append(order, p.VMI)
		}
		prev, had := last[p.VMI]
		switch {
		case !had:
			steps[p.VMI] = append(steps[p.VMI], "started on "+p.Node)
		case p.How == "migrated":
			steps[p.VMI] = append(steps[p.VMI], "live-migrated to "+p.Node)
		default:
			steps[p.VMI] = append(steps[p.VMI], fmt.Sprintf("stopped on %s, started again on %s", prev.Node, p.Node))
		}
		last[p.VMI] = p
	}
	var out []string
	for _, vmi := range order {
		line := vmi + ": " + strings.Join(steps[vmi], ", ")
		if last[vmi].End.IsZero() {
			line += " (running)"
		} else {
			line += fmt.Sprintf(", stopped on %s (not running)", last[vmi].Node)
		}
		out = append(out, line)
	}
	return out
}

// NodeJourneys says, per node that ran anything, what ran on it, in order: from the SUC
// simulator's record each Plan's pod as the commands of its containers (the node
// program's subcommands by name, kubectl's verb, else the image) and each reboot, with
// when the node went down and how long it stayed down; from Rancher's planner, where it
// is played, each RKE2 restart. The names of the node program's subcommands say which of
// the release's node steps ran (rke2-settings at pre-drain and post-drain, os-upgrade's
// install and boot settings); the reboot is the one os-upgrade arms after its Job
// completed (node sheet fact 28).
func (s *Scenario) NodeJourneys() []string {
	if s.Record == nil {
		return nil
	}
	type event struct {
		at   time.Time
		text string
	}
	byNode := map[string][]event{}
	for _, r := range s.Record.Runs() {
		commands := make([]string, len(r.Commands))
		for i, c := range r.Commands {
			commands[i] = describeCommand(c, r.Images, i)
		}
		text := strings.Join(commands, " + ")
		if r.Failed {
			text += " (failed)"
		}
		byNode[r.Node] = append(byNode[r.Node], event{r.Start, text})
	}
	if s.Planner != nil {
		// Rancher's planner restarting RKE2 at the declared version, between the node's
		// drain hooks (fact 60).
		for _, a := range s.Planner.Restarts() {
			byNode[a.Node] = append(byNode[a.Node], event{a.Start, fmt.Sprintf("Rancher restarts RKE2 at %s", a.To)})
		}
	}
	nodes := make([]string, 0, len(byNode))
	for node := range byNode {
		nodes = append(nodes, node)
		for _, rb := range s.Record.Reboots(node) {
			text := "reboot at " + rb.Start.Format("15:04:05")
			if rb.End.IsZero() {
				text += " (still down)"
			} else {
				text += fmt.Sprintf(", back after %s", rb.End.Sub(rb.Start).Round(100*time.Millisecond))
			}
			byNode[node] = append(byNode[node], event{rb.Start, text})
		}
	}
	sort.Strings(nodes)
	out := make([]string, 0, len(nodes))
	for _, node := range nodes {
		events := byNode[node]
		sort.SliceStable(events, func(i, j int) bool { return events[i].at.Before(events[j].at) })
		texts := make([]string, 0, len(events))
		for _, e := range events {
			texts = append(texts, e.text)
		}
		out = append(out, node+": "+strings.Join(texts, " → "))
	}
	return out
}

// describeCommand is a command of a Plan's pod as NodeJourneys shows it: the node
// program's os-upgrade with the image it ran in (images[i], the pod's containers in the
// order of its commands) and the node migrations it runs before the OS install, named
// by the node program for the --previous-version the Plan gives it
// (nodeprogram.HopMigrations), and the libraries bound for the release's elemental when
// the Plan says they are the container's (--glibc-libraries=container: the GLIBC bind of
// the v1.6 to v1.7 hop, fact 54.4); any other command as it is.
func describeCommand(command string, images []string, i int) string {
	fields := strings.Fields(command)
	if len(fields) == 0 || fields[0] != "os-upgrade" {
		return command
	}
	previous, libraries := "", ""
	for _, f := range fields[1:] {
		if v, ok := strings.CutPrefix(f, "--previous-version="); ok {
			previous = v
		}
		if v, ok := strings.CutPrefix(f, "--glibc-libraries="); ok {
			libraries = v
		}
	}
	out := command
	if i < len(images) {
		out += " in " + images[i]
	}
	var notes []string
	if migrations := nodeprogram.HopMigrations(previous); len(migrations) > 0 {
		notes = append(notes, "node migrations: "+strings.Join(migrations, ", "))
	} else if previous != "" {
		notes = append(notes, "no node migrations from "+previous)
	}
	if libraries == "container" {
		notes = append(notes, "elemental with the container's /lib64 (GLIBC)")
	}
	if len(notes) > 0 {
		out += " [" + strings.Join(notes, "; ") + "]"
	}
	return out
}

// createUpdater creates the HarvesterUpgrader; its repositoryURL is the repository
// simulator's, which serves the release metadata.
func (s *Scenario) createUpdater(ctx context.Context) error {
	hu := &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Name: UpdaterName, Namespace: s.Options.Namespace},
		Spec: harvesterv1.HarvesterUpgraderSpec{
			Release: harvesterv1.Release{Version: s.Options.Hop.ToRelease, RepositoryURL: s.Repository.URL()},
		},
	}
	if err := s.Management.Client.Create(ctx, hu); err != nil {
		return fmt.Errorf("create HarvesterUpgrader %s: %w", UpdaterName, err)
	}
	// The cluster's UpgradePlan, created ahead of the nodes as an operator may (otherwise
	// the first node creates it): the test API server's serving certificate lives 168
	// hours (envtest's), which the APIServerCertificates check would refuse with its
	// default of 7 days, so the plan asks for 1.
	plan := &harvesterv1.UpgradePlan{
		ObjectMeta: metav1.ObjectMeta{
			Name: upgradeplan.Name(s.Options.ClusterName, s.Options.Hop.ToRelease), Namespace: s.Options.Namespace,
			Annotations: map[string]string{clusterchecks.AnnotationMinCertsExpirationDays: "1"},
		},
		Spec: harvesterv1.UpgradePlanSpec{ClusterName: s.Options.ClusterName, UpgraderName: UpdaterName, Version: s.Options.Hop.ToRelease},
	}
	if err := s.Management.Client.Create(ctx, plan); err != nil {
		return fmt.Errorf("create UpgradePlan %s: %w", plan.Name, err)
	}
	return nil
}

func (s *Scenario) startManager() error {
	var err error
	s.Certs, err = manager.NewServingCerts(filepath.Join(s.Options.WorkDir, "certs"))
	if err != nil {
		return err
	}
	s.Manager, err = manager.StartReady(manager.Options{
		Binary: s.Options.ManagerBinary, Kubeconfig: s.ManagementKubeconfig, CertDir: s.Certs.Dir,
		LogFile: s.ManagerLog, ExtraArgs: s.Options.ManagerArgs,
	}, time.Minute)
	if err != nil {
		return fmt.Errorf("%w (manager log: %s)", err, s.ManagerLog)
	}
	return nil
}

// FailNode makes the OS upgrade of node fail with message, as a failing
// `elemental upgrade` in the OS Plan's Job would. node is a Node or Machine name.
func (s *Scenario) FailNode(node, message string) error {
	n, ok := s.Node(node)
	if !ok {
		return fmt.Errorf("no node or machine named %q; the nodes are %s", node, strings.Join(s.NodeNames(), ", "))
	}
	// The OS Plan's name carries the NodeUpdate, which does not exist yet: the Plan is
	// found by the kind the updater labels it with.
	s.SUC.FailNodeLabelled(map[string]string{suc.LabelPlanKind: "os"}, n.Name, message)
	return nil
}

// Node finds a node by its Node or Machine name.
func (s *Scenario) Node(name string) (Node, bool) {
	for _, n := range s.Nodes {
		if n.Name == name || n.Machine == name {
			return n, true
		}
	}
	return Node{}, false
}

// NodeNames lists the Node names, control plane first.
func (s *Scenario) NodeNames() []string {
	out := make([]string, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// Stop stops the manager, the simulators and both API servers.
func (s *Scenario) Stop() error {
	var errs []error
	if s.Manager != nil {
		if err := s.Manager.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop manager: %w", err))
		}
		s.Manager = nil
	}
	if s.stopSims != nil {
		s.stopSims()
		s.simsDone.Wait()
		s.stopSims = nil
	}
	if s.Kubelet != nil {
		s.Kubelet.Close()
	}
	for _, env := range []**testenv.Environment{&s.Workload, &s.Management} {
		if *env != nil {
			if err := (*env).Stop(); err != nil {
				errs = append(errs, err)
			}
			*env = nil
		}
	}
	return errors.Join(errs...)
}
