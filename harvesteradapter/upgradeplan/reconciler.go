package upgradeplan

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/config"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// +kubebuilder:rbac:groups=harvester.inplace.cluster.x-k8s.io,resources=upgradeplans,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=harvester.inplace.cluster.x-k8s.io,resources=upgradeplans/status;upgradeplans/finalizers,verbs=get;update;patch

// UpgradePlanFinalizer keeps an UpgradePlan until what it created on the workload
// cluster is removed.
const Finalizer = "harvester.inplace.cluster.x-k8s.io/upgradeplan"

// LabelUpgradePlan names, on the workload cluster, the UpgradePlan an object belongs to
// (its name on the management cluster).
const LabelUpgradePlan = "harvester.inplace.cluster.x-k8s.io/upgrade-plan"

// Events of an UpgradePlan, as upgrade-toolkit records them (fact 45).
const (
	EventPhaseTransition = "PhaseTransition"
	EventPhaseCompleted  = "PhaseCompleted"
)

// UpgradePlanName is the name of the UpgradePlan of a cluster and release, the one the
// updater creates and every node of the cluster waits for: <cluster>-<release>, with
// dots and plus signs turned into dashes, shortened with a hash past 63 characters.
func Name(cluster, release string) string {
	name := strings.ToLower(cluster + "-" + strings.NewReplacer(".", "-", "+", "-").Replace(release))
	if len(name) > 63 {
		sum := sha256.Sum256([]byte(cluster + "/" + release))
		name = strings.TrimRight(name[:52], "-.") + "-" + hex.EncodeToString(sum[:])[:10]
	}
	return name
}

// clusterObjectName is the name of an object an UpgradePlan creates on the workload
// cluster: capi-inplace-<what>-<release>-<hash of the plan's UID>, at most 63 characters
// (SUC labels each node with a Plan's name, fact 25). The UID, as for a node's Plans
// (planName): a plan deleted and created again never rewrites the Plan of its
// predecessor, whose running Job SUC would replace (facts 43, 49).
func ObjectName(what string, plan *harvesterv1.UpgradePlan) string {
	sum := sha256.Sum256([]byte(plan.UID))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	name := "capi-inplace-" + what + "-" + strings.NewReplacer(".", "-", "+", "-").Replace(strings.ToLower(plan.Spec.Version))
	if len(name)+len(suffix) > 63 {
		name = strings.TrimRight(name[:63-len(suffix)], "-.")
	}
	return name + suffix
}

// phaseOrder is the order of an UpgradePlan's phases (fact 45's pipeline).
var phaseOrder = []harvesterv1.UpgradePlanPhase{
	harvesterv1.UpgradePlanInitializing,
	harvesterv1.UpgradePlanRepoCreating,
	harvesterv1.UpgradePlanMetadataPopulating,
	harvesterv1.UpgradePlanImagePreloading,
	harvesterv1.UpgradePlanClusterUpgrading,
	harvesterv1.UpgradePlanNodeUpgrading,
	harvesterv1.UpgradePlanImageCleaning,
	harvesterv1.UpgradePlanCleaningUp,
	harvesterv1.UpgradePlanSucceeded,
}

// phaseIndex is a phase's place in phaseOrder; Failed and unknown phases are -1.
func phaseIndex(p harvesterv1.UpgradePlanPhase) int {
	for i, q := range phaseOrder {
		if q == p {
			return i
		}
	}
	return -1
}

// PhaseReached reports whether the plan has entered phase p or a later one (Failed
// reaches none).
func PhaseReached(plan *harvesterv1.UpgradePlan, p harvesterv1.UpgradePlanPhase) bool {
	i := phaseIndex(plan.Status.Phase)
	return i >= 0 && i >= phaseIndex(p)
}

// Env is what an UpgradePlan shares with the Harvester updater: the management cluster's
// client, the workload clusters' clients, the release reader and the HarvesterUpgraders
// as the updater reads them (images resolved).
type Env struct {
	// Client reads and writes UpgradePlans, HarvesterUpgraders and NodeUpdates on the
	// management cluster.
	Client client.Client
	// Workloads gives clients of the workload clusters.
	Workloads kube.WorkloadClients
	// Releases reads release metadata from repositories.
	Releases repository.ReleaseReader
	// RepositoryURL, when set, maps the in-cluster URL of a deployed repository to a URL
	// the manager reaches; nil uses the in-cluster URL as it is.
	RepositoryURL func(inClusterURL string) string
	// Configs reads HarvesterUpgraders.
	Configs config.Reader
}

// ClusterChecks runs the cluster's preflight checks for a plan.
type ClusterChecks func(ctx context.Context, pr *PlanRun) []harvesterv1.PreflightCheck

// PlanReconciler runs UpgradePlans: the cluster-level phases of a Harvester upgrade, in
// order, each resumable, with the nodes' own upgrades (NodeUpdates, which wait for the
// plan) in between.
type PlanReconciler struct {
	// Env is what the plan shares with the Harvester updater
	// (harvesteradapter.Updater.PlanEnv).
	Env Env
	// Checks runs the preflight checks of the Initializing phase; nil runs none.
	Checks ClusterChecks
	// Recorder records the PhaseTransition and PhaseCompleted events; nil records none.
	Recorder events.EventRecorder
	// PollInterval is how often a plan is looked at while it waits. Default 5s.
	PollInterval time.Duration
	// ClusterUpgradePollInterval is how often the cluster upgrade Job looks again at what
	// it waits for; 0 is the Job's default (5s, as Harvester's script).
	ClusterUpgradePollInterval time.Duration
	// ClusterUpgradeCAPIStableFor is how long the cluster upgrade Job holds the Cluster API
	// Cluster fleet-local/local Provisioned before and after Rancher's upgrade, for a
	// target from v1.8.1 on; 0 is the Job's default (30s, as the release's
	// wait_capi_cluster, fact 40). Shorter only for simulated clusters.
	ClusterUpgradeCAPIStableFor time.Duration
	// PlannerSettle is how long a drain of Rancher's that the plan withdrew is watched
	// after, its node uncordoned again should Rancher's machine-drain controller cordon it
	// from a version of the plan Secret older than the withdrawal
	// (rancher.SettleWithdrawn). Default 5s.
	PlannerSettle time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	// wakes carries the UpgradePlans Wake asks to reconcile now.
	wakes chan event.TypedGenericEvent[*harvesterv1.UpgradePlan]
}

// plannerSettle is PlannerSettle or its default.
func (r *PlanReconciler) plannerSettle() time.Duration {
	if r.PlannerSettle > 0 {
		return r.PlannerSettle
	}
	return rancher.DefaultPlannerSettle
}

// PlanRun is what one reconcile of one UpgradePlan works with.
type PlanRun struct {
	Plan *harvesterv1.UpgradePlan
	// Config is the HarvesterUpgrader the plan names, its images resolved.
	Config *harvesterv1.HarvesterUpgrader
	// Workload is a client of the workload cluster.
	Workload client.Client
	// Cluster is the CAPI Cluster.
	Cluster types.NamespacedName
	// repo is the repository's in-cluster base URL.
	repo string
	// logs reads the end of a container's log in the workload cluster, for the words of
	// a failed Job of the plan's own Plans; nil when the workload clients give no REST
	// configuration.
	logs suc.LogTail
}

// SetupWithManager registers the reconciler: UpgradePlans, and the NodeUpdates of their
// clusters (the node phase follows them).
func (r *PlanReconciler) SetupWithManager(mgr manager.Manager, options controller.Options) error {
	r.wakes = make(chan event.TypedGenericEvent[*harvesterv1.UpgradePlan], planWakeBuffer)
	return ctrl.ControllerManagedBy(mgr).
		Named("upgradeplan").
		For(&harvesterv1.UpgradePlan{}).
		Watches(&inplacev1.NodeUpdate{}, handler.EnqueueRequestsFromMapFunc(r.plansOfNodeUpdate)).
		WatchesRawSource(source.Channel(r.wakes, &handler.TypedEnqueueRequestForObject[*harvesterv1.UpgradePlan]{})).
		WithOptions(options).
		Complete(r)
}

// planWakeBuffer is how many wakes wait for the controller before more are dropped (the
// poll finds what a dropped wake would have).
const planWakeBuffer = 64

// Wake asks for a reconcile, now, of a Cluster's UpgradePlans whose phase waits on its
// nodes: the preflight (a node's shape, its schedulability), the preload and the image
// cleanup (System Upgrade Controller labels each node whose Job ended). A node of the
// cluster changed, and the plan need not wait for its next poll to see it. Wake never
// blocks: it is called from watches (workloadcluster.NodeCaches.OnNodeChange), and a
// wake that finds the queue full is dropped. It does nothing before SetupWithManager.
func (r *PlanReconciler) Wake(cluster types.NamespacedName, _ string) {
	if r.wakes == nil {
		return
	}
	plans := &harvesterv1.UpgradePlanList{}
	if err := r.Env.Client.List(context.Background(), plans, client.InNamespace(cluster.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	for i := range plans.Items {
		p := &plans.Items[i]
		if p.Spec.ClusterName != cluster.Name || !waitsOnNodes(p.Status.Phase) {
			continue
		}
		select {
		case r.wakes <- event.TypedGenericEvent[*harvesterv1.UpgradePlan]{Object: &harvesterv1.UpgradePlan{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}}:
		default:
		}
	}
}

// waitsOnNodes tells whether a plan in phase p waits for something its nodes show.
func waitsOnNodes(p harvesterv1.UpgradePlanPhase) bool {
	switch p {
	case harvesterv1.UpgradePlanInitializing, harvesterv1.UpgradePlanImagePreloading, harvesterv1.UpgradePlanImageCleaning:
		return true
	}
	return false
}

// plansOfNodeUpdate maps a NodeUpdate to the UpgradePlans of its cluster.
func (r *PlanReconciler) plansOfNodeUpdate(ctx context.Context, obj client.Object) []reconcile.Request {
	nu, ok := obj.(*inplacev1.NodeUpdate)
	if !ok || nu.Spec.UpdaterRef.Kind != config.GroupKind.Kind {
		return nil
	}
	plans := &harvesterv1.UpgradePlanList{}
	if err := r.Env.Client.List(ctx, plans, client.InNamespace(nu.Namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, p := range plans.Items {
		if p.Spec.ClusterName == nu.Spec.ClusterName {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
		}
	}
	return out
}

func (r *PlanReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *PlanReconciler) poll() time.Duration {
	if r.PollInterval > 0 {
		return r.PollInterval
	}
	return 5 * time.Second
}

// planPhase is the work of one phase: done says the phase is over, message what it did
// or waits for. An error holds the plan (Degraded) and is tried again; a permanent one
// (nodeupdater.Permanent) fails the plan.
type planPhase func(r *PlanReconciler, ctx context.Context, pr *PlanRun) (done bool, message string, err error)

var planPhases = map[harvesterv1.UpgradePlanPhase]planPhase{
	harvesterv1.UpgradePlanInitializing:       (*PlanReconciler).initialize,
	harvesterv1.UpgradePlanRepoCreating:       (*PlanReconciler).createRepository,
	harvesterv1.UpgradePlanMetadataPopulating: (*PlanReconciler).populateMetadata,
	harvesterv1.UpgradePlanImagePreloading:    (*PlanReconciler).preloadImages,
	harvesterv1.UpgradePlanClusterUpgrading:   (*PlanReconciler).upgradeCluster,
	harvesterv1.UpgradePlanNodeUpgrading:      (*PlanReconciler).upgradeNodes,
	harvesterv1.UpgradePlanImageCleaning:      (*PlanReconciler).cleanImages,
	harvesterv1.UpgradePlanCleaningUp:         (*PlanReconciler).cleanUp,
}

// errHeld is a phase's "not now" that is not a failure of the plan but must show:
// a preflight check that fails, an ineligible release. The plan stays Degraded in its
// phase and is looked at again.
type errHeld struct{ msg string }

func (e *errHeld) Error() string { return e.msg }

func heldf(format string, args ...any) error { return &errHeld{msg: fmt.Sprintf(format, args...)} }

// Reconcile advances a plan through as many phases as are done now.
func (r *PlanReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	plan := &harvesterv1.UpgradePlan{}
	if err := r.Env.Client.Get(ctx, req.NamespacedName, plan); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !plan.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, plan)
	}
	if !controllerutil.ContainsFinalizer(plan, Finalizer) {
		controllerutil.AddFinalizer(plan, Finalizer)
		if err := r.Env.Client.Update(ctx, plan); err != nil {
			return reconcile.Result{}, err
		}
	}
	before := plan.Status.DeepCopy()
	var result reconcile.Result
	var runErr error
	switch {
	case plan.Status.Phase == "":
		// Shown at once, before the preflight runs.
		r.enter(plan, harvesterv1.UpgradePlanInitializing)
		result.RequeueAfter = time.Millisecond
	case plan.Status.Phase == harvesterv1.UpgradePlanFailed && meta.IsStatusConditionFalse(plan.Status.Conditions, ConditionCleanedUp):
		if !r.cleanUpFailed(ctx, plan) {
			result.RequeueAfter = r.poll()
		}
	case !terminal(plan.Status.Phase):
		// One phase per reconcile, its status written before the next begins, so that
		// every phase shows (kubectl get, watches) however fast it goes.
		pr, err := r.prepare(ctx, plan)
		if err != nil {
			runErr = err
			break
		}
		phase := plan.Status.Phase
		if phaseIndex(phase) < phaseIndex(harvesterv1.UpgradePlanCleaningUp) {
			if err := ensureGuard(ctx, pr); err != nil {
				runErr = err
				break
			}
		}
		done, message, err := planPhases[phase](r, ctx, pr)
		if err != nil {
			runErr = err
			break
		}
		plan.Status.Message = message
		if done {
			r.event(plan, corev1.EventTypeNormal, EventPhaseCompleted, "Complete", "phase %s completed: %s", phase, message)
			r.enter(plan, phaseOrder[phaseIndex(phase)+1])
			result.RequeueAfter = time.Millisecond
		}
	}
	degraded := ""
	if runErr != nil {
		var held *errHeld
		if reason, permanent := nodeupdater.AsPermanent(runErr); permanent {
			r.fail(ctx, plan, reason.Reason, runErr.Error())
			if meta.IsStatusConditionFalse(plan.Status.Conditions, ConditionCleanedUp) {
				result.RequeueAfter = r.poll()
			}
		} else if errors.As(runErr, &held) {
			degraded = held.msg
			plan.Status.Message = held.msg
		} else {
			degraded = runErr.Error()
			plan.Status.Message = runErr.Error()
		}
	}
	if failed := nodeFailures(plan); degraded == "" && failed != "" {
		degraded = failed
	}
	setPlanConditions(plan, degraded)
	plan.Status.ObservedGeneration = plan.Generation
	if !equality.Semantic.DeepEqual(before, &plan.Status) {
		if err := r.Env.Client.Status().Update(ctx, plan); err != nil {
			return reconcile.Result{}, err
		}
	}
	if !terminal(plan.Status.Phase) && result.RequeueAfter == 0 {
		result.RequeueAfter = r.poll()
	}
	return result, nil
}

func terminal(p harvesterv1.UpgradePlanPhase) bool {
	return p == harvesterv1.UpgradePlanSucceeded || p == harvesterv1.UpgradePlanFailed
}

// enter moves the plan to phase p, stamping the time and recording the event.
func (r *PlanReconciler) enter(plan *harvesterv1.UpgradePlan, p harvesterv1.UpgradePlanPhase) {
	from := plan.Status.Phase
	plan.Status.Phase = p
	plan.Status.PhaseTransitionTimestamps = append(plan.Status.PhaseTransitionTimestamps,
		harvesterv1.PhaseTransition{Phase: p, Time: metav1.NewTime(r.now())})
	if from == "" {
		from = "(new)"
	}
	r.event(plan, corev1.EventTypeNormal, EventPhaseTransition, "Transition", "%s -> %s", from, p)
}

// fail ends the plan as Failed, after removing what it created on the workload cluster
// (a failed cleanup is retried when the plan is deleted, by its finalizer). The Plan
// removing rke2-multus.yaml.skip is created and left to SUC: the failed plan is not
// looked at again, and its finalizer waits for that Plan when it is deleted (fact 34).
func (r *PlanReconciler) fail(ctx context.Context, plan *harvesterv1.UpgradePlan, reason, message string) {
	plan.Status.Message = fmt.Sprintf("%s: %s; delete the UpgradePlan to start again", reason, message)
	r.event(plan, corev1.EventTypeWarning, reason, "Fail", "%s", message)
	r.enter(plan, harvesterv1.UpgradePlanFailed)
	r.cleanUpFailed(ctx, plan)
}

// ConditionCleanedUp, on a Failed UpgradePlan, says whether what the plan changed on the
// workload cluster is given back: False, with what it waits for, while the end goes on
// (Rancher's roll handed back, the restart guard placed, the multus skip file removed).
const ConditionCleanedUp = "CleanedUp"

// cleanUpFailed removes what a Failed plan created and gives back what it changed
// (removeClusterObjects), and records in ConditionCleanedUp whether that is done: a
// Failed plan is looked at again until it is (Reconcile), so that an end that must wait
// (Rancher restarting a node's RKE2, the restart guard being placed) still ends settled.
func (r *PlanReconciler) cleanUpFailed(ctx context.Context, plan *harvesterv1.UpgradePlan) bool {
	waiting := ""
	pr, err := r.prepare(ctx, plan)
	if err == nil {
		waiting, err = r.removeClusterObjects(ctx, pr)
	}
	c := metav1.Condition{Type: ConditionCleanedUp, Status: metav1.ConditionTrue, Reason: "CleanedUp",
		Message: "what the plan changed on the workload cluster is given back", ObservedGeneration: plan.Generation}
	switch {
	case err != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "CleanUpFailed", "giving back what the plan changed failed, trying again: "+err.Error()
	case waiting != "":
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "CleaningUp", waiting
	}
	meta.SetStatusCondition(&plan.Status.Conditions, c)
	return c.Status == metav1.ConditionTrue
}

func (r *PlanReconciler) event(plan *harvesterv1.UpgradePlan, kind, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(plan, nil, kind, reason, action, format, args...)
	}
}

// setPlanConditions derives Available, Progressing and Degraded from the phase and what
// holds the plan.
func setPlanConditions(plan *harvesterv1.UpgradePlan, degraded string) {
	set := func(t string, ok bool, reason, message string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&plan.Status.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: message, ObservedGeneration: plan.Generation})
	}
	phase := string(plan.Status.Phase)
	switch plan.Status.Phase {
	case harvesterv1.UpgradePlanSucceeded:
		set(harvesterv1.UpgradePlanAvailable, true, phase, "Harvester "+plan.Spec.Version+" is installed on every node")
		set(harvesterv1.UpgradePlanProgressing, false, phase, "the plan has ended")
		set(harvesterv1.UpgradePlanDegraded, false, phase, "")
	case harvesterv1.UpgradePlanFailed:
		set(harvesterv1.UpgradePlanAvailable, false, phase, "the plan failed")
		set(harvesterv1.UpgradePlanProgressing, false, phase, "the plan has ended")
		set(harvesterv1.UpgradePlanDegraded, true, phase, plan.Status.Message)
	default:
		set(harvesterv1.UpgradePlanAvailable, false, phase, "the plan runs")
		set(harvesterv1.UpgradePlanProgressing, true, phase, plan.Status.Message)
		if degraded != "" {
			set(harvesterv1.UpgradePlanDegraded, true, "Held", degraded)
		} else {
			set(harvesterv1.UpgradePlanDegraded, false, phase, "")
		}
	}
}

// nodeFailures names the nodes whose NodeUpdate failed, for Degraded.
func nodeFailures(plan *harvesterv1.UpgradePlan) string {
	var failed []string
	for _, n := range plan.Status.Nodes {
		if n.State == string(inplacev1.NodeUpdatePhaseFailed) {
			failed = append(failed, fmt.Sprintf("node %s failed: %s", n.Name, n.Message))
		}
	}
	return strings.Join(failed, "; ")
}

// prepare reads the plan's configuration (its snapshot, or, for a plan not started, the
// HarvesterUpgrader, which it then records) and reaches the workload cluster.
func (r *PlanReconciler) prepare(ctx context.Context, plan *harvesterv1.UpgradePlan) (*PlanRun, error) {
	cfg, err := r.planConfig(ctx, plan)
	if err != nil {
		return nil, err
	}
	cluster := types.NamespacedName{Namespace: plan.Namespace, Name: plan.Spec.ClusterName}
	wc, err := r.Env.Workloads.Client(ctx, cluster)
	if err != nil {
		return nil, fmt.Errorf("reach the workload cluster %s: %w", plan.Spec.ClusterName, err)
	}
	pr := &PlanRun{Plan: plan, Config: cfg, Workload: wc, Cluster: cluster, repo: cfg.Spec.Release.RepositoryURL, logs: r.logTail(cluster)}
	if pr.repo == "" {
		pr.repo = repository.ServiceURL(cfg.Spec.Release.Version)
	}
	return pr, nil
}

// planConfig is the configuration the plan runs with: the snapshot in its status, or the
// HarvesterUpgrader as it is now, recorded into the status (written at the end of the
// reconcile) when its release is the plan's.
func (r *PlanReconciler) planConfig(ctx context.Context, plan *harvesterv1.UpgradePlan) (*harvesterv1.HarvesterUpgrader, error) {
	if raw := plan.Status.UpgraderConfig; raw != nil && len(raw.Raw) > 0 {
		snap := config.Snapshot{}
		if err := json.Unmarshal(raw.Raw, &snap); err != nil || snap.Kind != config.GroupKind.Kind {
			return nil, nodeupdater.Permanentf("InvalidUpgraderConfig", "status.upgraderConfig of UpgradePlan %s/%s is not a HarvesterUpgrader snapshot (%v)", plan.Namespace, plan.Name, err)
		}
		cfg := &harvesterv1.HarvesterUpgrader{Spec: snap.Spec}
		cfg.Name, cfg.Namespace, cfg.Generation = snap.Name, plan.Namespace, snap.Generation
		return cfg, nil
	}
	cfg, err := r.Env.Configs.Get(ctx, plan.Namespace, plan.Spec.UpgraderName)
	if err != nil {
		if _, permanent := nodeupdater.AsPermanent(err); permanent {
			return nil, heldf("%v", err)
		}
		return nil, err
	}
	if !releases.SameVersion(cfg.Spec.Release.Version, plan.Spec.Version) {
		return nil, heldf("HarvesterUpgrader %s installs Harvester %s, but this plan is for %s: set its release.version to %s, or create an UpgradePlan for %s",
			cfg.Name, cfg.Spec.Release.Version, plan.Spec.Version, plan.Spec.Version, cfg.Spec.Release.Version)
	}
	if err := config.Check(cfg); err != nil {
		return nil, heldf("%v", err)
	}
	raw, err := json.Marshal(config.Snapshot{Kind: config.GroupKind.Kind, Name: cfg.Name, Generation: cfg.Generation, Spec: cfg.Spec})
	if err != nil {
		return nil, err
	}
	plan.Status.UpgraderConfig = &runtime.RawExtension{Raw: raw}
	return cfg, nil
}

// clusterNode is a node of the workload cluster with its role.
type clusterNode struct {
	node *corev1.Node
	role harvesterv1.NodeRole
}

// nodeRole is a node's part in a Harvester cluster: a witness (etcd only, Harvester's
// label), a management node (control plane), or a worker.
func nodeRole(n *corev1.Node) harvesterv1.NodeRole {
	switch {
	case kubevirt.IsWitness(n):
		return harvesterv1.NodeRoleWitness
	case n.Labels["node-role.kubernetes.io/control-plane"] == "true" || n.Labels["node-role.kubernetes.io/master"] == "true":
		return harvesterv1.NodeRoleManagement
	}
	return harvesterv1.NodeRoleWorker
}

// RoleRank orders roles as the nodes are upgraded: management, witness, worker.
func RoleRank(role harvesterv1.NodeRole) int {
	switch role {
	case harvesterv1.NodeRoleManagement:
		return 0
	case harvesterv1.NodeRoleWitness:
		return 1
	}
	return 2
}

// clusterNodes lists the nodes the plan covers (spec.nodeSelector, default all),
// management first, then witness, then workers, each by name.
func clusterNodes(ctx context.Context, pr *PlanRun) ([]clusterNode, error) {
	list := &corev1.NodeList{}
	opts := []client.ListOption{}
	if sel := pr.Plan.Spec.NodeSelector; sel != nil {
		selector, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return nil, nodeupdater.Permanentf("InvalidNodeSelector", "spec.nodeSelector: %v", err)
		}
		opts = append(opts, client.MatchingLabelsSelector{Selector: selector})
	}
	if err := pr.Workload.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	out := make([]clusterNode, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, clusterNode{node: &list.Items[i], role: nodeRole(&list.Items[i])})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if a, b := RoleRank(out[i].role), RoleRank(out[j].role); a != b {
			return a < b
		}
		return out[i].node.Name < out[j].node.Name
	})
	return out, nil
}

// finalize removes what the plan created on the workload cluster, then the finalizer,
// once rke2-multus.yaml.skip is off every node (fact 34; looked at again every poll
// until then). A cluster that cannot be reached because it is gone (its kubeconfig
// Secret deleted) holds nothing to remove.
func (r *PlanReconciler) finalize(ctx context.Context, plan *harvesterv1.UpgradePlan) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(plan, Finalizer) {
		return reconcile.Result{}, nil
	}
	pr, err := r.prepare(ctx, plan)
	switch {
	case err == nil:
		waiting, err := r.removeClusterObjects(ctx, pr)
		if err != nil {
			return reconcile.Result{}, err
		}
		if waiting != "" {
			return reconcile.Result{RequeueAfter: r.poll()}, nil
		}
	case r.clusterGone(ctx, plan):
	default:
		var held *errHeld
		if !errors.As(err, &held) {
			return reconcile.Result{}, err
		}
		// No usable HarvesterUpgrader: remove by label what can be found.
		cluster := types.NamespacedName{Namespace: plan.Namespace, Name: plan.Spec.ClusterName}
		wc, werr := r.Env.Workloads.Client(ctx, cluster)
		if werr != nil {
			return reconcile.Result{}, werr
		}
		stopping, err := stopClusterUpgrade(ctx, wc, plan.Name, r.now())
		if err != nil {
			return reconcile.Result{}, err
		}
		if stopping != "" {
			return reconcile.Result{RequeueAfter: r.poll()}, nil
		}
		if err := removeLabelled(ctx, wc, plan.Name); err != nil {
			return reconcile.Result{}, err
		}
	}
	controllerutil.RemoveFinalizer(plan, Finalizer)
	return reconcile.Result{}, r.Env.Client.Update(ctx, plan)
}

// clusterGone reports whether the plan's cluster no longer has a kubeconfig Secret.
func (r *PlanReconciler) clusterGone(ctx context.Context, plan *harvesterv1.UpgradePlan) bool {
	s := &corev1.Secret{}
	err := r.Env.Client.Get(ctx, client.ObjectKey{Namespace: plan.Namespace, Name: workloadcluster.KubeconfigSecretName(plan.Spec.ClusterName)}, s)
	return apierrors.IsNotFound(err)
}
