package harvesteradapter

import (
	"context"
	"fmt"
	"slices"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/config"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// +kubebuilder:rbac:groups=harvester.inplace.cluster.x-k8s.io,resources=harvesterupgraders,verbs=get;list;watch

// Updater is the Harvester updater: it upgrades one node per NodeUpdate through the
// steps above, on the workload cluster, as configured by the HarvesterUpgrader the
// NodeUpdate's updaterRef names.
type Updater struct {
	// Client reads HarvesterUpgraders on the management cluster.
	Client client.Client
	// APIReader reads the management cluster from its API server, never from a cache:
	// the Cluster's disruption ledger and the NodeUpdates it names (freshBudget). Nil
	// uses Client.
	APIReader client.Reader
	// Workloads gives clients of the workload clusters.
	Workloads kube.WorkloadClients
	// Releases reads release metadata from repositories.
	Releases repository.ReleaseReader
	// RepositoryURL, when set, maps the in-cluster URL of a deployed repository to a URL
	// the manager reaches; nil uses the in-cluster URL as it is.
	RepositoryURL func(inClusterURL string) string
	// PollInterval is how often a running step is looked at again. Default 5s.
	PollInterval time.Duration
	// NoJobAfter is how long a node's SUC Plan may go without a Job of System Upgrade
	// Controller before its step says SUC is silent (suc.NoJob). Default 2m.
	NoJobAfter time.Duration
	// RebootWait is how long an ending waits, from its start, for the reboot a node's OS
	// upgrade armed before it ends with the node held (rebootHold). Default 15m.
	RebootWait time.Duration
	// PlannerSettle is how long an ending of a node Rancher has not taken yet holds, from
	// its start, with Rancher's planner paused, before it ends: a planner pass that read
	// the planner let go for the node before the pause still takes it afterwards
	// (rancherAbortReady). Default 5s.
	PlannerSettle time.Duration
	// AgentSilentAfter is how long rancher-system-agent may go without applying or
	// failing the plan Rancher delivered after the pre-drain answer before the
	// KubernetesUpgrade step names it (agentQuiet). Default 2m.
	AgentSilentAfter time.Duration
	// Recorder records events on NodeUpdates for what the updater does to virtual
	// machines (migrations, shutdowns, restores, holds); nil records none.
	Recorder events.EventRecorder
	// NodeImage is the manager's own node image, fully tagged (the manager's
	// --harvester-node-image): what a HarvesterUpgrader without images.node runs on the
	// nodes.
	NodeImage string
	// Version is the manager's version, the tag an untagged images.node gets.
	Version string
}

var _ nodeupdater.Updater = &Updater{}

// Registration is the Harvester updater's entry for the nodeupdater registry.
func (u *Updater) Registration() nodeupdater.Registration {
	return nodeupdater.Registration{GroupKind: config.GroupKind, NewConfig: func() client.Object { return &harvesterv1.HarvesterUpgrader{} }, Updater: u}
}

// nodeRun is what one reconcile of one NodeUpdate works with.
type nodeRun struct {
	nu  *inplacev1.NodeUpdate
	cfg *harvesterv1.HarvesterUpgrader
	// wc reaches the workload cluster; it answers a read it already made in this
	// reconcile from what it read (readOnce).
	wc    client.Client
	repo  string
	plans map[suc.PlanKind]*sucv1.Plan
	// plan is the cluster's UpgradePlan for the release, nil until the ClusterUpgrade
	// step created it.
	plan *harvesterv1.UpgradePlan
	// owner is the node's owner when Rancher provisions its RKE2 (rancherOwner), read
	// once per reconcile.
	owner     *rancher.Owner
	ownerRead bool
	// hold, set by an ending, says why the node stays cordoned when the NodeUpdate ends
	// (rebootHold): cleanup then leaves the cordon, marked AnnotationHeld.
	hold string
}

// Reconcile advances the node through its steps as far as it can now.
func (u *Updater) Reconcile(ctx context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	r, err := u.prepare(ctx, nu, true)
	if err != nil {
		return nodeupdater.Result{}, err
	}
	nodeupdater.DeclareSteps(nu, stepNames()...)
	for _, s := range pipeline {
		if nodeupdater.StepDone(nu, s.name) {
			continue
		}
		if s.skip != nil {
			why, err := s.skip(u, ctx, r)
			if err != nil {
				return nodeupdater.Result{}, fmt.Errorf("step %s: %w", s.name, err)
			}
			if why != "" {
				nodeupdater.SkipStep(nu, s.name, why)
				continue
			}
		}
		done, message, err := s.run(u, ctx, r)
		if err != nil {
			if _, permanent := nodeupdater.AsPermanent(err); permanent {
				nodeupdater.FailStep(nu, s.name, err.Error())
			}
			return nodeupdater.Result{}, fmt.Errorf("step %s: %w", s.name, err)
		}
		if done {
			nodeupdater.CompleteStep(nu, s.name, message)
			continue
		}
		nodeupdater.StartStep(nu, s.name, message)
		if st := nodeupdater.Step(nu, s.name); st.StartTime != nil {
			if limit := s.timeout(r.cfg.Spec.Timeouts); time.Since(st.StartTime.Time) > limit {
				err := nodeupdater.Permanentf("StepTimedOut", "step %s did not finish within %s: %s", s.name, limit, message)
				nodeupdater.FailStep(nu, s.name, err.Error())
				return nodeupdater.Result{}, err
			}
		}
		return nodeupdater.Result{RequeueAfter: u.poll()}, nil
	}
	return nodeupdater.Result{Done: true}, nil
}

// NodeTimeout bounds the whole upgrade of a node by the timeouts.node it started with.
func (u *Updater) NodeTimeout(ctx context.Context, nu *inplacev1.NodeUpdate) (time.Duration, error) {
	cfg, err := u.nodeConfig(ctx, nu)
	if err != nil {
		return 0, err
	}
	return harvesterv1.DurationOr(cfg.Spec.Timeouts.Node, harvesterv1.DefaultNodeTimeout), nil
}

func (u *Updater) poll() time.Duration {
	if u.PollInterval > 0 {
		return u.PollInterval
	}
	return 5 * time.Second
}

// nodeConfig is the configuration the node is upgraded with: the snapshot taken when it
// started, or, for a node not started yet, the HarvesterUpgrader as it is now.
// configs reads HarvesterUpgraders as the updater does: images resolved with the
// manager's node image and version.
func (u *Updater) configs() config.Reader {
	return config.Reader{Client: u.Client, NodeImage: u.NodeImage, Version: u.Version}
}

// PlanEnv is what the cluster's UpgradePlan shares with the updater: the management
// client, the workload clients, the release reader and the HarvesterUpgraders as the
// updater reads them.
func (u *Updater) PlanEnv() upgradeplan.Env {
	return upgradeplan.Env{Client: u.Client, Workloads: u.Workloads, Releases: u.Releases, RepositoryURL: u.RepositoryURL, Configs: u.configs()}
}

func (u *Updater) nodeConfig(ctx context.Context, nu *inplacev1.NodeUpdate) (*harvesterv1.HarvesterUpgrader, error) {
	if cfg, ok, err := config.ReadSnapshot(nu); err != nil || ok {
		return cfg, err
	}
	return u.configs().Get(ctx, nu.Namespace, nu.Spec.UpdaterRef.Name)
}

// prepare gathers what one reconcile works with. start records the configuration in the
// NodeUpdate's status when it has none yet (the node starts now); an abort does not.
func (u *Updater) prepare(ctx context.Context, nu *inplacev1.NodeUpdate, start bool) (*nodeRun, error) {
	cfg, err := u.nodeConfig(ctx, nu)
	if err != nil {
		return nil, err
	}
	if start {
		if cfg, err = config.Take(nu, cfg); err != nil {
			return nil, err
		}
	}
	wc, err := u.Workloads.Client(ctx, types.NamespacedName{Namespace: nu.Namespace, Name: nu.Spec.ClusterName})
	if err != nil {
		return nil, fmt.Errorf("reach the workload cluster %s: %w", nu.Spec.ClusterName, err)
	}
	r := &nodeRun{nu: nu, cfg: cfg, wc: newReadOnce(wc), plans: map[suc.PlanKind]*sucv1.Plan{}}
	r.repo = cfg.Spec.Release.RepositoryURL
	if r.repo == "" {
		r.repo = repository.ServiceURL(cfg.Spec.Release.Version)
	}
	plan := &harvesterv1.UpgradePlan{}
	switch err := u.Client.Get(ctx, client.ObjectKey{Namespace: nu.Namespace, Name: upgradeplan.Name(nu.Spec.ClusterName, cfg.Spec.Release.Version)}, plan); {
	case err == nil:
		r.plan = plan
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get the UpgradePlan of cluster %s: %w", nu.Spec.ClusterName, err)
	}
	return r, nil
}

func (u *Updater) node(ctx context.Context, r *nodeRun) (*corev1.Node, error) {
	node := &corev1.Node{}
	if err := r.wc.Get(ctx, client.ObjectKey{Name: r.nu.Spec.NodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nodeupdater.Permanentf("NodeNotFound", "node %s does not exist in the workload cluster %s", r.nu.Spec.NodeName, r.nu.Spec.ClusterName)
		}
		return nil, fmt.Errorf("get node %s: %w", r.nu.Spec.NodeName, err)
	}
	return node, nil
}

// applyPlan creates (or updates) the node's Plan of a kind and reports its progress as
// SUC signals it: done when the node carries plan.upgrade.cattle.io/<plan> equal to the
// Plan's latest hash; a failed Job of the Plan on this node is a permanent error with the
// Job's reason.
func (u *Updater) applyPlan(ctx context.Context, r *nodeRun, kind suc.PlanKind) (bool, string, error) {
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	want := suc.NodePlan(r.cfg, r.nu, kind, r.repo)
	// What the UpgradePlan gives a node's Plan is read from the Plan once it exists: the
	// UpgradePlan can be deleted (allow-deletion) or made again while the node goes on,
	// and a Plan whose spec changes is a new hash to SUC, which deletes the Job that runs
	// and runs the Plan again (shared/facts/suc.md, facts 43 and 48), an OS install or
	// preload included (rancher soak seed 192).
	existing := &sucv1.Plan{}
	switch err := r.wc.Get(ctx, client.ObjectKeyFromObject(want), existing); {
	case apierrors.IsNotFound(err):
		existing = nil
	case err != nil:
		return false, "", fmt.Errorf("get SUC plan %s: %w", want.Name, err)
	}
	if kind == suc.PlanPreload {
		// The plan's minimum validity of RKE2's certificates, as its own preload has it.
		want.Spec.Upgrade = suc.NodeProgram(want.Spec.Upgrade.Image, upgradeplan.PreloadArgs(r.plan), r.repo, r.cfg.Spec.Release.Version, want.Spec.Upgrade.SecurityContext)
		if existing != nil && existing.Spec.Upgrade != nil {
			want.Spec.Upgrade.Args = slices.Clone(existing.Spec.Upgrade.Args)
		}
	}
	if existing == nil {
		if step := disruptivePlanStep(r, kind); step != "" {
			if held, err := u.freshBudget(ctx, r, node, step); err != nil || held != "" {
				return false, held, err
			}
		}
	}
	if kind == suc.PlanOS {
		want.Annotations[suc.AnnotationBootID] = node.Status.NodeInfo.BootID
		previous := ""
		if r.plan != nil {
			previous = r.plan.Status.PreviousVersion
		}
		if existing != nil {
			previous = suc.PreviousVersionOf(existing)
		}
		suc.WithPreviousVersion(want, previous, r.cfg.Spec.Images.Upgrade)
	}
	current, message, err := suc.Sync(ctx, r.wc, want, "node "+r.nu.Spec.NodeName)
	if current == nil || err != nil {
		return false, message, err
	}
	if suc.DoneOn(current, node) {
		return true, fmt.Sprintf("SUC plan %s completed on node %s", current.Name, node.Name), nil
	}
	if err := suc.FailedJob(ctx, r.wc, current, node.Name, u.logTail(r)); err != nil {
		return false, "", err
	}
	after := u.NoJobAfter
	if after == 0 {
		after = 2 * time.Minute
	}
	if silent, err := suc.NoJob(ctx, r.wc, current, node.Name, after, time.Now()); err != nil || silent != "" {
		return false, silent, err
	}
	return false, fmt.Sprintf("System Upgrade Controller is applying plan %s on node %s", current.Name, node.Name), nil
}

// Abort stops the node's upgrade at a safe point: it waits until no Job of this node's
// Plans is running (an RKE2 or OS upgrade interrupted half-way could leave the node
// unusable), then removes the Plans, gives back the node's pause of Longhorn's live upgrade
// and lifts the updater's own cordon. A failed Job has ended: SUC keeps it until its TTL
// and starts no other until the Plan changes (shared/facts/suc.md, facts 45 and 48), so
// the Plans go at once. The drain's Job is not waited for: kubectl drain is evictions
// one at a time and leaves nothing half-done, and a drain that a PodDisruptionBudget
// blocks (drainPolicy Skip, or Hold without a drain timeout) would never end by itself;
// its Plan goes, and the abort ends once SUC and the garbage collector have deleted the
// Job (facts 27, 42), so that nothing of the node's upgrade runs after the NodeUpdate
// ended. On a node that is gone nothing can be interrupted: its Plans go without waiting.
func (u *Updater) Abort(ctx context.Context, nu *inplacev1.NodeUpdate) (bool, error) {
	r, err := u.prepare(ctx, nu, false)
	if err != nil {
		if _, permanent := nodeupdater.AsPermanent(err); permanent {
			// No configuration: no Plan of ours can exist. The landing label of an
			// evacuation needs only the workload cluster to go; one that cannot be
			// reached does not keep the NodeUpdate.
			if wc, werr := u.Workloads.Client(ctx, types.NamespacedName{Namespace: nu.Namespace, Name: nu.Spec.ClusterName}); werr == nil {
				if err := kubevirt.RemoveLanding(ctx, wc, kubevirt.LandingLabel(nu.UID)); err != nil {
					return false, err
				}
			}
			return true, nil
		}
		return false, err
	}
	plans := &sucv1.PlanList{}
	if err := r.wc.List(ctx, plans, client.InNamespace(r.cfg.Spec.SystemUpgradeController.Namespace), client.MatchingLabels{suc.LabelNodeUpdate: string(nu.UID)}); err != nil {
		return false, fmt.Errorf("list the Plans of node %s: %w", nu.Spec.NodeName, err)
	}
	nodeGone := apierrors.IsNotFound(r.wc.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, &corev1.Node{}))
	if !nodeGone {
		running, err := suc.JobRunning(ctx, r.wc, nu.Spec.NodeName, notDrain(plans.Items))
		if err != nil || running {
			return false, err
		}
		if pending, err := u.rebootPending(ctx, r, plans.Items); err != nil {
			return false, err
		} else if pending {
			if r.hold = u.rebootHold(ctx, r); r.hold == "" {
				return false, nil
			}
		}
		if ready, err := u.rancherAbortReady(ctx, r); err != nil || !ready {
			return false, err
		}
		if stopped, err := u.stopDrain(ctx, r, plans.Items); err != nil || !stopped {
			return false, err
		}
	}
	if err := u.cleanup(ctx, r); err != nil {
		if _, permanent := nodeupdater.AsPermanent(err); permanent {
			return true, nil
		}
		return false, err
	}
	return true, nil
}

// stopDrain deletes the node's drain Plan and reports whether no Job of the NodeUpdate
// runs any more: SUC and the garbage collector delete the drain's Job once its Plan is
// gone (facts 27, 42). The drain is stopped before the node is uncordoned, so that no
// eviction and no cordon of kubectl drain comes after the put-back. The other Plans'
// Jobs have ended when it is called, so a running Job is the drain's; the Plan is gone
// on a later call, so the Jobs are found by their NodeUpdate label.
func (u *Updater) stopDrain(ctx context.Context, r *nodeRun, plans []sucv1.Plan) (bool, error) {
	for i := range plans {
		if plans[i].Labels[suc.LabelPlanKind] != string(suc.PlanDrain) {
			continue
		}
		if err := r.wc.Delete(ctx, &plans[i]); err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("delete the drain Plan %s of node %s: %w", plans[i].Name, r.nu.Spec.NodeName, err)
		}
	}
	running, err := suc.NodeUpdateJobRunning(ctx, r.wc, r.cfg.Spec.SystemUpgradeController.Namespace, r.nu.UID)
	return !running, err
}

// notDrain returns the Plans other than the drain's: a drain Job may be stopped at any
// point, the others are waited for.
func notDrain(plans []sucv1.Plan) []sucv1.Plan {
	var out []sucv1.Plan
	for _, p := range plans {
		if p.Labels[suc.LabelPlanKind] != string(suc.PlanDrain) {
			out = append(out, p)
		}
	}
	return out
}

// logTail reads the end of a container's log in the node's workload cluster through the
// API server's pods/log, for the words of a failed Job's pod (suc.PodLogTail); nil when
// the workload clients give no REST configuration.
func (u *Updater) logTail(r *nodeRun) suc.LogTail {
	configs, ok := u.Workloads.(suc.RESTConfigs)
	if !ok {
		return nil
	}
	return suc.PodLogTail(configs, types.NamespacedName{Namespace: r.nu.Namespace, Name: r.nu.Spec.ClusterName})
}
