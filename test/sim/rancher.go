package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/rkev1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

// Rancher plays Rancher and Fleet on a workload cluster for the Harvester cluster upgrade
// (harvesteradapter/clusterupgrade; shared/facts/harvester-node-upgrade.md, facts 41 and
// 42), on the objects Seed creates:
//   - a ManagedChart in fleet-local whose generation changes is reconciled by Fleet after
//     ChartDelay: observedGeneration, and a bundle summary of one ready deployment with the
//     Ready condition True; or, for a chart named in FailChart, one deployment in
//     ErrApplied with Ready False and Fleet's message (fleet@3b2c622
//     pkg/apis/fleet.cattle.io/v1alpha1/bundle_types.go BundleSummary, BundleStatus, which
//     Rancher copies into the ManagedChart, rancher@59bd052
//     pkg/apis/management.cattle.io/v3/managed_chart.go). A paused chart is observed but
//     not deployed: its summary stays as it was;
//   - a ClusterRepo whose spec.forceUpdate is later than its status.downloadTime
//     downloads its index after DownloadDelay: downloadTime now, Downloaded True (fact
//     41.11; rancher@59bd052 pkg/apis/catalog.cattle.io/v1/types.go RepoSpec.ForceUpdate);
//   - a Deployment in cattle-system is rolled out by the Deployment controller after
//     RolloutDelay (see rollOut; pods a required anti-affinity cannot place stay
//     pending), and one annotated scale-available is scaled by Rancher (scaleAvailable);
//   - once the rancher Deployment has rolled out, Rancher runs at its image's tag and
//     writes it into the server-version Setting (fact 41.8: the script waits for that);
//   - the provisioning Cluster fleet-local/local stays ready and provisioned at its
//     generation (fact 47: Harvester requires it; fact 41.8 waits for it);
//   - the Cluster API Cluster fleet-local/local Rancher generates from it is Provisioned
//     at its generation; Rancher starting at a new version writes it again, its
//     generation advancing when Rancher came from an embedded Cluster API (before
//     v2.14), and Cluster API observes a new generation after CAPIReconcileDelay;
//     SetCAPIInfrastructureProvisioned(false) makes it Provisioning (capicluster.go;
//     harvester-release-steps.md facts 16.3, 16.14, 40);
//   - a deploy of the harvester chart whose KubeVirt (KubeVirtVersionOfChart) is not the
//     one deployed makes virt-operator roll it out: the KubeVirt CR
//     harvester-system/kubevirt goes Deploying with it as target, and after RolloutDelay
//     Deployed with it as observed version (virtoperator.go; harvester-release-steps.md
//     fact 23.5);
//   - a deploy of the harvester chart renders its Longhorn (LonghornOfChart) into the
//     longhorn-manager DaemonSet, which is rolled out after RolloutDelay, its new managers
//     writing Longhorn's default-instance-manager-image (longhornmanager.go; fact 25).
//
// Time is real time; the simulator looks at the cluster every Interval, or, with Cache, on
// the events of the kinds above and when a delay is due (passLoop).
type Rancher struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Cache, when set, is a started cache of the workload cluster whose events of
	// ManagedCharts, ClusterRepos, Deployments, Settings and provisioning Clusters start
	// the simulator's passes, as they start Rancher's and Fleet's controllers. Reads still
	// go to Client.
	Cache ctrlcache.Cache
	// ChartDelay is how long Fleet takes to deploy a chart's new generation. Default 100ms.
	ChartDelay time.Duration
	// DownloadDelay is how long an index download takes. Default 50ms.
	DownloadDelay time.Duration
	// RolloutDelay is how long a Deployment's rollout takes. Default 50ms.
	RolloutDelay time.Duration
	// LonghornRolloutDelay is how long the longhorn-manager DaemonSet's rollout of a new
	// generation takes (the DaemonSet controller replacing the managers node by node).
	// Default RolloutDelay.
	LonghornRolloutDelay time.Duration
	// Interval is how often the cluster is looked at: without Cache, default 20ms; with
	// it, when no event came, default 1s.
	Interval time.Duration
	// OnDeployed, when set, is told of each generation of a ManagedChart that Fleet
	// deployed (not paused, not failing), with the chart as it was deployed: what the
	// chart's objects then do on the cluster (KubeVirt.ApplyHarvesterChart) is played
	// there. Its error is the pass's; the chart counts as deployed all the same.
	OnDeployed func(ctx context.Context, mc *managementv3.ManagedChart) error
	// PlannerOwnsLocalCluster leaves the status of fleet-local/local to a RancherPlanner
	// simulator running alongside (its Updated condition says whether the nodes are
	// settled); otherwise this simulator keeps the Cluster ready at its generation.
	PlannerOwnsLocalCluster bool
	// Dependencies are the versions of its system charts a Rancher version pins (see
	// rancherdeps.go); default DefaultRancherDependencies.
	Dependencies func(rancherVersion string) releases.RancherDependencies
	// SystemChartDelay is how long Rancher takes to deploy a system chart's new
	// revision. Default 100ms.
	SystemChartDelay time.Duration
	// CAPIReconcileDelay is how long Cluster API takes to reconcile a new generation of
	// the Cluster API Cluster fleet-local/local, or a change of its infrastructure.
	// Default 100ms.
	CAPIReconcileDelay time.Duration

	loop  passLoop
	mu    sync.Mutex
	fails map[string]chartFailure
	// seen is when a generation (of a chart, a Deployment) or a forceUpdate was first seen.
	seen map[string]time.Time
	// systemChartDeployed and chartVersionSeen record when a system chart was deployed
	// and a ManagedChart first asked for a version (name@version).
	systemChartDeployed, chartVersionSeen map[string]time.Time
	// systemChartsSettledAt is the Rancher version whose system charts are deployed.
	systemChartsSettledAt string
	// agentRedeploys are the local fleet-agent's deploys (fleet.go).
	agentRedeploys []FleetAgentRedeploy
	// capiInfrastructureDown makes the Cluster API Cluster Provisioning, capiRendered
	// are the generations Rancher gave it and capiObserved when Cluster API observed
	// each (capicluster.go).
	capiInfrastructureDown bool
	capiRendered           []int64
	capiObserved           map[int64]time.Time
	// startedAt is the Rancher version the simulated Rancher last started at
	// (rancherdeps.go, its chart repositories).
	startedAt string
}

// FailChart makes Fleet fail to apply the ManagedChart name (in fleet-local) with message,
// as a Helm error would, from its next generation on and until ClearChartFailure.
func (r *Rancher) FailChart(name, message string) {
	r.FailChartVersion(name, "", message)
}

// chartFailure is a Helm error a chart's deploys meet: of every version, or of one.
type chartFailure struct{ version, message string }

// FailChartVersion is FailChart for the deploys of one chart version only (every version
// when version is empty): a Helm error comes with what a chart version renders, so a
// deploy of the same chart at its old version (a values change, KubeVirt's workload
// update methods emptied before the upgrade, fact 13) still goes through.
func (r *Rancher) FailChartVersion(name, version, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fails == nil {
		r.fails = map[string]chartFailure{}
	}
	r.fails[name] = chartFailure{version: version, message: message}
	r.loop.wake()
}

// ClearChartFailure lets the chart's deploys succeed again.
// SetDownloadDelay changes DownloadDelay while the simulator runs; a download asked for
// longer ago than the new delay ends at the next look.
func (r *Rancher) SetDownloadDelay(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.DownloadDelay = d
	r.loop.wake()
}

func (r *Rancher) downloadDelay() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return orDefault(r.DownloadDelay, 50*time.Millisecond)
}

func (r *Rancher) ClearChartFailure(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.fails, name)
	r.loop.wake()
}

func (r *Rancher) failure(mc *managementv3.ManagedChart) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.fails[mc.Name]
	if !ok || f.version != "" && f.version != mc.Spec.Version {
		return "", false
	}
	return f.message, true
}

// due says whether what key names, first seen now or earlier, has waited delay.
func (r *Rancher) due(key string, delay time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]time.Time{}
	}
	first, ok := r.seen[key]
	if !ok {
		first = time.Now()
		r.seen[key] = first
	}
	if time.Since(first) >= delay {
		return true
	}
	r.loop.dueAt(first.Add(delay))
	return false
}

// Start plays Rancher until ctx ends.
func (r *Rancher) Start(ctx context.Context) {
	kinds := []client.Object{&managementv3.ManagedChart{}, &catalogv1.ClusterRepo{}, &appsv1.Deployment{}, &managementv3.Setting{}, &provisioningv1.Cluster{}, &appsv1.DaemonSet{}, &corev1.Node{}, &fleetv1alpha1.Cluster{}, &clusterv1.Cluster{}}
	go r.loop.run(ctx, r.Interval, r.Cache, kinds, func(ctx context.Context) { _ = r.pass(ctx) })
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (r *Rancher) pass(ctx context.Context) error {
	return errors.Join(r.charts(ctx), r.fleetAgent(ctx), r.repos(ctx), r.deployments(ctx), r.localCluster(ctx), r.capiClusterStatus(ctx), r.kubevirtRollout(ctx), r.longhornManagerRollout(ctx))
}

func (r *Rancher) charts(ctx context.Context) error {
	list := &managementv3.ManagedChartList{}
	if err := r.Client.List(ctx, list, client.InNamespace(rancher.FleetLocal)); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		mc := &list.Items[i]
		r.noteChartVersion(mc.Name, mc.Spec.Version)
		message, fail := r.failure(mc)
		failed := mc.Status.Summary.ErrApplied > 0
		if mc.Status.ObservedGeneration == mc.Generation && (!failed || fail) {
			continue // settled, or failing as told
		}
		if mc.Name == rancher.HarvesterChart && !mc.Spec.Paused {
			// The new harvester pod starts: Harvester's controller writes the cluster's
			// API server into fleet-controller's configuration (fleet.go).
			if err := r.harvesterRestoresFleetConfig(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if !r.due(fmt.Sprintf("chart/%s/%d/%t", mc.UID, mc.Generation, fail), orDefault(r.ChartDelay, 100*time.Millisecond)) {
			continue
		}
		var deployed *managementv3.ManagedChart
		err := r.updateChartStatus(ctx, client.ObjectKeyFromObject(mc), func(cur *managementv3.ManagedChart) {
			cur.Status.ObservedGeneration = cur.Generation
			deployed = nil
			if cur.Spec.Paused {
				return
			}
			SettleChart(cur, message, fail)
			if !fail {
				deployed = cur.DeepCopy()
			}
		})
		if err == nil && deployed != nil {
			err = errors.Join(startKubeVirtDeploy(ctx, r.Client, deployed), applyLonghornChart(ctx, r.Client, deployed))
		}
		if err == nil && deployed != nil && r.OnDeployed != nil {
			err = r.OnDeployed(ctx, deployed)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SettleChart sets a ManagedChart's status as Fleet reports a bundle deployed on the one
// local cluster: ready, or (failed) in ErrApplied with Ready False and Fleet's message
// "ErrApplied(1) [Cluster fleet-local/local: <message>]".
func SettleChart(mc *managementv3.ManagedChart, message string, failed bool) {
	now := time.Now().UTC().Format(time.RFC3339)
	mc.Status.ObservedGeneration = mc.Generation
	ready := genericcondition.GenericCondition{Type: "Ready", Status: corev1.ConditionTrue, LastUpdateTime: now}
	if failed {
		mc.Status.Summary = managementv3.BundleSummary{ErrApplied: 1, DesiredReady: 1}
		mc.Status.Unavailable = 1
		ready.Status = corev1.ConditionFalse
		ready.Message = fmt.Sprintf("ErrApplied(1) [Cluster %s/%s: %s]", rancher.FleetLocal, rancher.LocalCluster, message)
	} else {
		mc.Status.Summary = managementv3.BundleSummary{Ready: 1, DesiredReady: 1}
		mc.Status.Unavailable = 0
	}
	mc.Status.Conditions = []genericcondition.GenericCondition{ready}
}

func (r *Rancher) updateChartStatus(ctx context.Context, key client.ObjectKey, mutate func(*managementv3.ManagedChart)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &managementv3.ManagedChart{}
		if err := r.Client.Get(ctx, key, cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		mutate(cur)
		return r.Client.Status().Update(ctx, cur)
	})
}

func (r *Rancher) repos(ctx context.Context) error {
	list := &catalogv1.ClusterRepoList{}
	if err := r.Client.List(ctx, list); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		repo := &list.Items[i]
		forced := repo.Spec.ForceUpdate
		if forced == nil || !repo.Status.DownloadTime.Before(forced) {
			continue
		}
		if !r.due(fmt.Sprintf("repo/%s/%s", repo.UID, forced.UTC().Format(time.RFC3339)), r.downloadDelay()) {
			continue
		}
		errs = append(errs, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &catalogv1.ClusterRepo{}
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(repo), cur); err != nil {
				return client.IgnoreNotFound(err)
			}
			now := metav1.Now()
			if cur.Spec.ForceUpdate != nil && now.Before(cur.Spec.ForceUpdate) {
				now = *cur.Spec.ForceUpdate // a forceUpdate set ahead of this clock
			}
			cur.Status.DownloadTime = now
			cur.Status.ObservedGeneration = cur.Generation
			cur.Status.Conditions = []genericcondition.GenericCondition{{Type: "Downloaded", Status: corev1.ConditionTrue, LastUpdateTime: now.UTC().Format(time.RFC3339)}}
			return r.Client.Status().Update(ctx, cur)
		}))
	}
	return errors.Join(errs...)
}

func (r *Rancher) deployments(ctx context.Context) error {
	list := &appsv1.DeploymentList{}
	if err := r.Client.List(ctx, list, client.InNamespace(rancher.CattleSystem)); err != nil {
		return err
	}
	fleet := &appsv1.DeploymentList{}
	if err := r.Client.List(ctx, fleet, client.InNamespace(rancher.FleetNamespace)); err != nil {
		return err
	}
	list.Items = append(list.Items, fleet.Items...)
	agents := &appsv1.DeploymentList{}
	if err := r.Client.List(ctx, agents, client.InNamespace(rancher.FleetLocalAgentNamespace)); err != nil {
		return err
	}
	list.Items = append(list.Items, agents.Items...)
	var errs []error
	runs := rancherRuns(list.Items)
	for i := range list.Items {
		dep := &list.Items[i]
		if scaled, err := r.scaleAvailable(ctx, dep, runs); scaled || err != nil {
			errs = append(errs, err)
			continue // the next pass sees the new generation
		}
		if !rolledOut(dep) {
			if !r.due(fmt.Sprintf("deployment/%s/%d", dep.UID, dep.Generation), orDefault(r.RolloutDelay, 50*time.Millisecond)) {
				continue
			}
			if err := rollOut(ctx, r.Client, client.ObjectKeyFromObject(dep)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if dep.Name == rancher.RancherDeployment {
			errs = append(errs, r.serverVersion(ctx, dep))
		}
	}
	return errors.Join(errs...)
}

// serverVersion writes the tag of the running rancher container into server-version, as
// Rancher does when it starts, and then upgrades Rancher's system charts to the versions
// that tag pins (rancherdeps.go).
func (r *Rancher) serverVersion(ctx context.Context, dep *appsv1.Deployment) error {
	var image string
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "rancher" {
			image = c.Image
		}
	}
	_, tag, ok := strings.Cut(strings.TrimPrefix(image, imageRepository(image)), ":")
	if !ok || tag == "" {
		return nil
	}
	s := &managementv3.Setting{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: rancher.ServerVersionSetting}, s); err != nil {
		return client.IgnoreNotFound(err)
	}
	if s.Value != tag {
		s.Value = tag
		if err := r.Client.Update(ctx, s); err != nil {
			return err
		}
	}
	if err := r.renderCAPICluster(ctx, tag); err != nil {
		return err
	}
	return r.upgradeSystemCharts(ctx, tag)
}

func (r *Rancher) localCluster(ctx context.Context) error {
	if r.PlannerOwnsLocalCluster {
		return nil
	}
	cl := &provisioningv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}, cl); err != nil {
		return client.IgnoreNotFound(err)
	}
	if cl.Status.Ready && cl.Status.ObservedGeneration == cl.Generation {
		return nil
	}
	markLocalClusterReady(cl)
	return r.Client.Status().Update(ctx, cl)
}

func markLocalClusterReady(cl *provisioningv1.Cluster) {
	now := time.Now().UTC().Format(time.RFC3339)
	cl.Status.Ready = true
	cl.Status.ObservedGeneration = cl.Generation
	cl.Status.ClusterName = rancher.LocalCluster
	cl.Status.Conditions = []genericcondition.GenericCondition{
		{Type: "Provisioned", Status: corev1.ConditionTrue, LastUpdateTime: now},
		{Type: "Ready", Status: corev1.ConditionTrue, LastUpdateTime: now},
	}
}

// rolledOut says whether the Deployment controller has finished dep's rollout (what
// rollOut writes).
func rolledOut(dep *appsv1.Deployment) bool {
	want := ptr.Deref(dep.Spec.Replicas, 1)
	st := dep.Status
	return st.ObservedGeneration >= dep.Generation && st.UpdatedReplicas == want && st.Replicas == want && st.AvailableReplicas == want
}

// rollOut writes the status the Deployment controller writes once a rollout is complete:
// every replica of the current template updated, ready and available, at the observed
// generation (what `kubectl rollout status` reads). Pods the scheduler cannot place
// (schedulablePods) stay pending: updated, not ready nor available, and the rollout
// does not complete.
func rollOut(ctx context.Context, c client.Client, key client.ObjectKey) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &appsv1.Deployment{}
		if err := c.Get(ctx, key, cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		replicas := ptr.Deref(cur.Spec.Replicas, 1)
		running := replicas
		fit, err := schedulablePods(ctx, c, cur)
		if err != nil {
			return err
		}
		if fit >= 0 && fit < running {
			running = fit
		}
		cur.Status.Replicas, cur.Status.ReadyReplicas, cur.Status.AvailableReplicas, cur.Status.UpdatedReplicas = replicas, running, running, replicas
		cur.Status.ObservedGeneration = cur.Generation
		return c.Status().Update(ctx, cur)
	})
}

// HarvesterRelease is what Seed installs: a Harvester release and the versions it ships.
type HarvesterRelease struct {
	// Version is the Harvester release, such as v1.7.1.
	Version string
	// Chart is the version of its harvester and harvester-crd charts; default Version
	// without its v.
	Chart string
	// Rancher is its Rancher version, such as v2.13.1.
	Rancher string
	// Kubernetes is its RKE2 version; default v1.34.3+rke2r3.
	Kubernetes string
	// MonitoringChart and LoggingChart are the versions of its rancher-monitoring and
	// rancher-logging charts; default 105.1.2+up61.3.2 and 105.2.0+up4.10.0 (test values:
	// the facts do not name each release's).
	MonitoringChart, LoggingChart string
	// Dependencies are the versions of Rancher's system charts the cluster runs; default
	// DefaultRancherDependencies(Rancher).
	Dependencies *releases.RancherDependencies
	// RancherdDefaults installs Rancher with the values rancherd adds of its own under
	// Harvester's, replicas -3 and antiAffinity required (rancher/rancherd
	// pkg/rancher/run.go at ca0b7df, defaultValues; Harvester's rancherd configuration,
	// harvester-installer config.yaml.d/50-defaults.yaml, sets neither): the Deployment
	// then has the scale-available annotation "3" and no replicas of its own (Rancher
	// scales it, scaleAvailable), and a required anti-affinity, one Rancher pod per node.
	// Without it, replicas 3 and Rancher's chart default, a preferred anti-affinity, as
	// the specs written before modelled the installed Rancher.
	RancherdDefaults bool
}

// Seed creates (or re-creates) the Rancher objects of a Harvester cluster at release rel,
// settled, as Rancher and Fleet would leave them: the provisioning Cluster
// fleet-local/local (ready, not yet labelled with its management cluster nor given a
// Fleet workspace in its status: fact 41.9 does that) and the Cluster API Cluster
// Rancher generates from it (Provisioned at its generation, capicluster.go), the ManagedCharts harvester-crd,
// harvester, rancher-monitoring-crd and rancher-logging-crd (fact 41.4) at the release's
// chart, deployed and ready, the ClusterRepo harvester-charts downloaded, the Deployments
// rancher and harvester-cluster-repo of the release rolled out (fact 41.11), and the
// Setting server-version; and Harvester's own: the overcommit-config Setting with the
// release's default and no value (OvercommitConfigDefault, as Harvester writes it at
// start), and the KubeVirt CR harvester-system/kubevirt deployed at the KubeVirt of the
// release's chart (virtoperator.go), and the longhorn-manager DaemonSet of the Longhorn
// of its chart, rolled out (longhornmanager.go), and the Ingress rancher-expose, without an
// ingress class as on a cluster installed before Harvester named one (fact 21); Rancher
// runs with the release's features (fact 42), and its system charts (fleet, fleet-crd,
// rancher-webhook) are deployed at Dependencies with their Deployments rolled out
// (rancherdeps.go). Namespaces are created when missing. Stop a running Rancher
// simulator before seeding again.
func Seed(ctx context.Context, c client.Client, rel HarvesterRelease) error {
	if rel.Chart == "" {
		rel.Chart = strings.TrimPrefix(rel.Version, "v")
	}
	if rel.Kubernetes == "" {
		rel.Kubernetes = "v1.34.3+rke2r3"
	}
	if rel.MonitoringChart == "" {
		rel.MonitoringChart = "105.1.2+up61.3.2"
	}
	if rel.LoggingChart == "" {
		rel.LoggingChart = "105.2.0+up4.10.0"
	}
	for _, ns := range []string{rancher.FleetLocal, rancher.CattleSystem, "harvester-system"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	cluster := &provisioningv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster},
		Spec:       provisioningv1.ClusterSpec{KubernetesVersion: rel.Kubernetes, RKEConfig: &provisioningv1.RKEConfig{}},
	}
	charts := []*managementv3.ManagedChart{
		seedChart(rancher.HarvesterCRDChart, rel.Chart, "harvester-system", nil),
		seedChart(rancher.HarvesterChart, rel.Chart, "harvester-system", &apiextensionsv1.JSON{Raw: []byte(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":["LiveMigrate"]}}}}`)}),
		seedChart(rancher.MonitoringCRDChart, rel.MonitoringChart, "cattle-monitoring-system", nil),
		seedChart(rancher.LoggingCRDChart, rel.LoggingChart, "cattle-logging-system", nil),
	}
	repo := &catalogv1.ClusterRepo{
		ObjectMeta: metav1.ObjectMeta{Name: rancher.HarvesterChartsRepo},
		Spec:       catalogv1.RepoSpec{URL: "http://harvester-cluster-repo.cattle-system/charts"},
	}
	// Rancher's own chart repository, which Rancher creates and downloads when it starts
	// (upgrade_rancher force-refreshes it from v1.7.2 and v1.8.1 on, fact 16.10).
	rancherRepo := &catalogv1.ClusterRepo{
		ObjectMeta: metav1.ObjectMeta{Name: rancher.RancherChartsRepo},
		Spec:       catalogv1.RepoSpec{URL: "https://git.rancher.io/charts"},
	}
	rancherDep := seedDeployment(rancher.RancherDeployment, "rancher", "rancher/rancher:"+rel.Rancher, 3)
	installValues := map[string]any{"replicas": 3}
	if rel.RancherdDefaults {
		installValues = map[string]any{"replicas": -3, "antiAffinity": "required"}
		// What the chart renders of them (rancher-chart/templates/deployment.yaml).
		rancherDep.Spec.Replicas = nil
		rancherDep.Annotations = map[string]string{ScaleAvailableAnnotation: "3"}
		rancherDep.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"rancher"}}}},
				TopologyKey:   corev1.LabelHostname,
			}},
		}}
	}
	// Rancher's chart renders its features value into CATTLE_FEATURES; each release sets
	// its own list (harvester-release-steps.md fact 42).
	features, err := releases.RancherFeatures(rel.Version)
	if err == nil {
		rancherDep.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CATTLE_FEATURES", Value: features}}
	}
	// Installed through Helm, as rancherd installs it; the release upgrades it with helm.
	if err := seedRancherRelease(ctx, c, rel.Rancher, features, installValues, rancherDep); err != nil {
		return err
	}
	deps := []*appsv1.Deployment{
		rancherDep,
		seedDeployment(rancher.ClusterRepoDeployment, rancher.ClusterRepoDeployment, "rancher/harvester-cluster-repo:"+rel.Version, 1),
	}
	setting := &managementv3.Setting{ObjectMeta: metav1.ObjectMeta{Name: rancher.ServerVersionSetting}, Value: rel.Rancher, Source: "env"}

	// The local cluster's RKE2 state, of the type Rancher v2.7 and later require (fact
	// 18).
	state := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: rancher.LocalRKEStateSecret},
		Type:       rancher.RKEClusterStateType,
		Data:       map[string][]byte{"serverToken": []byte("server-token"), "agentToken": []byte("agent-token")},
	}
	// No kube-ovn chart yet: the release's upgrade creates it (manage_kubeovn, fact 29).
	kubeOVN := &managementv3.ManagedChart{ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: "kubeovn-operator-crd"}}
	if err := c.Delete(ctx, kubeOVN); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ManagedChart %s: %w", client.ObjectKeyFromObject(kubeOVN), err)
	}
	// The RKEControlPlane Rancher generates from the provisioning Cluster, whose planner
	// rolls the machine plans (RancherPlanner), not paused.
	controlPlane := &unstructured.Unstructured{}
	controlPlane.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	controlPlane.SetNamespace(rancher.FleetLocal)
	controlPlane.SetName(rancher.LocalCluster)
	_ = unstructured.SetNestedField(controlPlane.Object, rel.Kubernetes, "spec", "kubernetesVersion")
	objs := []client.Object{cluster, controlPlane, repo, rancherRepo, setting, state}
	for _, mc := range charts {
		objs = append(objs, mc)
	}
	for _, d := range deps {
		objs = append(objs, d)
	}
	for _, o := range objs {
		if err := recreate(ctx, c, o); err != nil {
			return err
		}
	}
	if err := seedHarvesterObjects(ctx, c, rel); err != nil {
		return err
	}
	if err := seedLonghornManagerObjects(ctx, c, rel); err != nil {
		return err
	}
	if err := recreate(ctx, c, seedRancherExpose()); err != nil {
		return err
	}
	systemDeps := DefaultRancherDependencies(rel.Rancher)
	if rel.Dependencies != nil {
		systemDeps = *rel.Dependencies
	}
	if err := seedSystemCharts(ctx, c, systemDeps); err != nil {
		return err
	}
	if err := seedFleet(ctx, c); err != nil {
		return err
	}
	if err := seedCAPICluster(ctx, c, rel.Rancher); err != nil {
		return err
	}
	// Status as Rancher, Fleet and the Deployment controller leave it.
	markLocalClusterReady(cluster)
	errs := []error{c.Status().Update(ctx, cluster)}
	for _, mc := range charts {
		SettleChart(mc, "", false)
		errs = append(errs, c.Status().Update(ctx, mc))
	}
	for _, r := range []*catalogv1.ClusterRepo{repo, rancherRepo} {
		r.Status.DownloadTime = metav1.Now()
		r.Status.Conditions = []genericcondition.GenericCondition{{Type: "Downloaded", Status: corev1.ConditionTrue}}
		if r == rancherRepo {
			r.Status.Commit = BundledChartsCommit(rel.Rancher) // as the Rancher that created it indexed it
		}
		errs = append(errs, c.Status().Update(ctx, r))
	}
	// Rancher's other repositories and its default branch, as it created them.
	errs = append(errs, recreate(ctx, c, &managementv3.Setting{ObjectMeta: metav1.ObjectMeta{Name: rancher.ChartDefaultBranchSetting}, Value: chartDefaultBranch(rel.Rancher)}),
		ensureRancherChartRepos(ctx, c, rel.Rancher))
	for _, d := range deps {
		errs = append(errs, rollOut(ctx, c, client.ObjectKeyFromObject(d)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("seed the status of the Rancher objects: %w", err)
	}
	return nil
}

func seedChart(name, version, namespace string, values *apiextensionsv1.JSON) *managementv3.ManagedChart {
	return &managementv3.ManagedChart{
		ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: name},
		Spec: managementv3.ManagedChartSpec{
			Chart: name, RepoName: rancher.HarvesterChartsRepo, ReleaseName: name, Version: version,
			TimeoutSeconds: 600, DefaultNamespace: namespace, Values: values,
		},
	}
}

func seedDeployment(name, container, image string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: rancher.CattleSystem, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: container, Image: image}}},
			},
		},
	}
}

// recreate deletes o if it exists (none of these objects has a finalizer on a test API
// server) and creates it.
func recreate(ctx context.Context, c client.Client, o client.Object) error {
	if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %T %s: %w", o, client.ObjectKeyFromObject(o), err)
	}
	o.SetResourceVersion("")
	o.SetUID(types.UID(""))
	if err := c.Create(ctx, o); err != nil {
		return fmt.Errorf("create %T %s: %w", o, client.ObjectKeyFromObject(o), err)
	}
	return nil
}

// seedRancherExpose is the Ingress cattle-system/rancher-expose through which Harvester
// exposes Rancher, without an ingress class.
func seedRancherExpose() *networkingv1.Ingress {
	prefix := networkingv1.PathTypePrefix
	return &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: clusterupgrade.RancherExposeKey.Namespace, Name: clusterupgrade.RancherExposeKey.Name},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
			Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &prefix, Backend: networkingv1.IngressBackend{
				Service: &networkingv1.IngressServiceBackend{Name: "rancher", Port: networkingv1.ServiceBackendPort{Number: 80}},
			}}},
		}}}}},
	}
}
