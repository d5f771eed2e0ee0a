// Package upgradetask holds the UpgradeTask controller, which upgrades the machines of a
// control plane or MachineDeployment node by node under maxUnavailable and preflight
// checks, handing each node to a NodeUpdate.
package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/internal/ctrlqueue"
	"github.com/capi-inplace/capi-inplace/internal/faults"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/internal/notify"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// DefaultPollInterval is how often an unfinished task is looked at again when nothing it
// watches changed: Nodes of the workload cluster are not watched.
const DefaultPollInterval = 15 * time.Second

// Reconciler carries out extension-paced and externally paced UpgradeTasks:
// it claims the target's machines, starts their NodeUpdates under maxUnavailable once
// every preflight check passes, follows them, and stops on a failure or an abort.
type Reconciler struct {
	// Client reads (from the cache) and writes objects of the management cluster.
	Client client.Client
	// APIReader reads from the API server what the cache may not show yet: a task before
	// its status is known to this manager, and NodeUpdates when the cache lags behind
	// creates for long.
	APIReader client.Reader
	// Workload reads the Nodes of workload clusters.
	Workload WorkloadClusters
	// Registry holds the updaters the manager runs, for their preflight checks.
	Registry *nodeupdater.Registry
	// Recorder records events on tasks and machines.
	Recorder events.EventRecorder
	// Checks are the node preflight checks; nil means preflight.Default(Registry).
	Checks []preflight.Check
	// Clock tells the time (maintenance window, soak delay); nil means the real clock.
	Clock clock.PassiveClock
	// PollInterval is how often an unfinished task is looked at again; zero means DefaultPollInterval.
	PollInterval time.Duration
	// Metrics records Prometheus metrics; nil means NewMetrics on controller-runtime's registry.
	Metrics *Metrics
	// GateInterval is how often a task's health gates are evaluated again; zero means
	// DefaultGateInterval. A node ending evaluates them at once.
	GateInterval time.Duration
	// GatePolicy is what the operator allows health gates to do; nil means
	// healthgate.DefaultPolicy().
	GatePolicy *healthgate.Policy
	// WorkloadWriteTimeout is how long one write to a workload cluster (a Node's
	// upgrade-pending taint) may go unanswered before it is given up, to be written again
	// at a later reconcile; zero means DefaultWorkloadWriteTimeout.
	WorkloadWriteTimeout time.Duration
	// Notifier queues the notifications of the tasks' webhooks (spec.notify, the
	// Cluster's notify-secret annotation); nil means none is sent.
	Notifier *notify.Dispatcher

	// status writes the tasks' statuses in the background; set by SetupWithManager.
	status *statusWriter
	// machines writes the bookkeeping of the tasks' Machines in the background; set by
	// SetupWithManager.
	machines *machineWriter
	// taints writes the upgrade-pending taints of running tasks in the background; set by
	// SetupWithManager.
	taints *taintWriter
	// created holds the NodeUpdates created that the cache may not show yet.
	created createdNodeUpdates
	// writtenMachines holds the Machines written that the cache may not show as written.
	writtenMachines writtenMachines
	// clusters serializes the reconciles of the tasks of one Cluster (clusterLocks).
	clusters clusterLocks
	// gateResults holds the last results of each task's health gates.
	gateResults gateResults
	// notified remembers what each task's webhook was told (notifiedTasks).
	notified notifiedTasks
}

// clusterLocks holds one lock per Cluster. The tasks of a Cluster share one disruption
// budget: two reconciles of different tasks that read it at the same moment would each
// start a node without seeing the other's (two control plane nodes, or both holders of a
// volume's replicas, down at once). Holding the Cluster's lock from reading the budget
// until the round's NodeUpdates exist (and are known to the create-expectations) makes
// the second reconcile see the first one's nodes.
type clusterLocks struct {
	mu    sync.Mutex
	locks map[types.NamespacedName]*sync.Mutex
}

// lock locks the Cluster's lock and returns its unlock.
func (c *clusterLocks) lock(cluster types.NamespacedName) (unlock func()) {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[types.NamespacedName]*sync.Mutex{}
	}
	l := c.locks[cluster]
	if l == nil {
		l = &sync.Mutex{}
		c.locks[cluster] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=upgradetasks,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=upgradetasks/status;upgradetasks/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=nodeupdates,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines;machines/status,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machinesets;machinedeployments,verbs=get;list;watch
// Control planes of the kinds capi-inplace knows are read to check a request's target; grant
// get on other control plane kinds with a ClusterRole of your own (docs/install.md).
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=kubeadmcontrolplanes;rke2controlplanes,verbs=get;list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// Nodes are read and tainted on the workload clusters, through their kubeconfig Secrets:
// the manager needs no right on the management cluster's Nodes.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// SetupWithManager registers the controller with the manager and fills defaults of unset fields.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("upgradetask-controller")
	}
	r.Recorder = faults.CountWarnings(r.Recorder)
	if r.Workload == nil {
		return fmt.Errorf("Reconciler needs Workload to read the Nodes of workload clusters")
	}
	r.defaults()
	// A task whose status or Machine could not be written is reconciled again at once, not
	// at its next poll.
	retry := make(chan event.TypedGenericEvent[*inplacev1.UpgradeTask], 128)
	sendRetry := func(key types.NamespacedName) {
		select {
		case retry <- event.TypedGenericEvent[*inplacev1.UpgradeTask]{Object: &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
		default: // full: the task's poll comes soon enough
		}
	}
	r.status = newStatusWriter(r.Client, sendRetry)
	if err := mgr.Add(r.status); err != nil {
		return fmt.Errorf("add the UpgradeTask status writer to the manager: %w", err)
	}
	r.machines = newMachineWriter(r.writeMachine,
		func(m *clusterv1.Machine, task *inplacev1.UpgradeTask) *clusterv1.Machine {
			return r.writtenMachines.latest(m, upgraderequest.LabelValue(task.Name), time.Now())
		},
		r.recordClaims, sendRetry)
	if err := mgr.Add(r.machines); err != nil {
		return fmt.Errorf("add the UpgradeTask Machine writer to the manager: %w", err)
	}
	r.taints = newTaintWriter(r.Workload.Client, r.workloadWriteTimeout(), func(key types.NamespacedName) {
		// After a poll interval: a workload cluster that refused a write is asked again
		// at the pace of the task's polls, not in a loop.
		time.AfterFunc(r.PollInterval, func() { sendRetry(key) })
	}, sendRetry)
	if err := mgr.Add(r.taints); err != nil {
		return fmt.Errorf("add the UpgradeTask taint writer to the manager: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&inplacev1.UpgradeTask{}).
		Owns(&inplacev1.NodeUpdate{}, builder.WithPredicates(notCreateEvents())).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.machineToTask), builder.WithPredicates(machineChangedBeyondBookkeeping())).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.clusterToTasks), builder.WithPredicates(failureBudgetChanged())).
		Watches(&inplacev1.NodeUpdate{}, handler.EnqueueRequestsFromMapFunc(r.failedNodeUpdateToTasks), builder.WithPredicates(nodeUpdateFailed())).
		WatchesRawSource(source.Channel(retry, &handler.TypedEnqueueRequestForObject[*inplacev1.UpgradeTask]{})).
		WithOptions(ctrlqueue.Options(options)).
		Named("upgradetask").
		Complete(r.reportingErrors())
}

func (r *Reconciler) defaults() {
	if r.Checks == nil {
		r.Checks = preflight.Default(r.Registry)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.PollInterval <= 0 {
		r.PollInterval = DefaultPollInterval
	}
	if r.Metrics == nil {
		r.Metrics = NewMetrics(nil)
	}
}

// machineToTask maps a claimed Machine to the task that claims it.
func (r *Reconciler) machineToTask(ctx context.Context, obj client.Object) []reconcile.Request {
	claim := obj.GetLabels()[inplacev1.UpgradeTaskLabel]
	if claim == "" {
		return nil
	}
	tasks := &inplacev1.UpgradeTaskList{}
	if err := r.Client.List(ctx, tasks, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, t := range tasks.Items {
		if upgraderequest.LabelValue(t.Name) == claim {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&t)})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	r.defaults()
	defer func() {
		if retErr != nil {
			// The error is reported on the task's conditions by another writer: the next
			// reconcile starts from the task as the API server has it.
			r.status.forget(ctx, req.NamespacedName)
		}
	}()
	if err := r.status.takeError(req.NamespacedName); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.machines.takeError(req.NamespacedName); err != nil {
		return ctrl.Result{}, err
	}
	task, err := r.readTask(ctx, req.NamespacedName)
	if err != nil || task == nil {
		return ctrl.Result{}, err
	}
	log := ctrl.LoggerFrom(ctx).WithValues("upgradeTask", klog.KObj(task), "cluster", klog.KRef(task.Namespace, task.Spec.ClusterName))
	ctx = ctrl.LoggerInto(ctx, log)

	if !task.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, task)
	}
	if !controllerutil.ContainsFinalizer(task, inplacev1.UpgradeTaskFinalizer) {
		orig := task.DeepCopy()
		controllerutil.AddFinalizer(task, inplacev1.UpgradeTaskFinalizer)
		// With the resourceVersion read: a merge patch replaces the whole finalizer list,
		// and would drop a finalizer another controller added since.
		if err := r.Client.Patch(ctx, task, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to UpgradeTask %s: %w", req, err)
		}
		// Go on from the task as the API server has it now.
		r.status.forget(ctx, req.NamespacedName)
		if task, err = r.readTask(ctx, req.NamespacedName); err != nil || task == nil {
			return ctrl.Result{}, err
		}
	}
	// A dry run's plan is refreshed, and a plan is carried out once dryRun is turned off;
	// every other final phase is the end.
	if task.Status.Phase.IsFinal() && task.Status.Phase != inplacev1.TaskPhasePlanned {
		r.Metrics.observeTask(task)
		r.status.forget(ctx, req.NamespacedName)
		return r.deleteGateJobs(ctx, task), nil
	}

	defer r.clusters.lock(types.NamespacedName{Namespace: task.Namespace, Name: task.Spec.ClusterName})()
	s, err := r.readScope(ctx, task)
	if err != nil {
		return ctrl.Result{}, err
	}
	if s.problem != "" {
		// A task that cannot be carried out as written (its Cluster is gone, its version
		// does not parse): say so in status and wait for the spec or the world to change.
		return ctrl.Result{RequeueAfter: r.PollInterval}, r.writeProblem(ctx, task, s.problem)
	}

	if task.Spec.Phase == inplacev1.TaskActionAbort {
		return r.reconcileAbort(ctx, s)
	}
	return r.reconcileOngoing(ctx, s)
}

// readTask reads a task from the cache, with the status last handed to the status
// writer; when none is kept for it, from the API server, as a cached task can predate the
// status written last (deciding from it would repeat events and metrics, and conflict on
// Machines). It returns nil when the task is gone.
func (r *Reconciler) readTask(ctx context.Context, key types.NamespacedName) (*inplacev1.UpgradeTask, error) {
	task := &inplacev1.UpgradeTask{}
	err := r.Client.Get(ctx, key, task)
	if err == nil && r.status.overlay(task) {
		return task, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("read UpgradeTask %s: %w", key, err)
	}
	task = &inplacev1.UpgradeTask{}
	if err := r.APIReader.Get(ctx, key, task); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.forgetTask(key.Namespace, key.Name)
			r.status.forget(ctx, key)
			r.notified.forget(key)
			r.taints.forget(key)
			return nil, nil
		}
		return nil, fmt.Errorf("read UpgradeTask %s: %w", key, err)
	}
	r.status.track(task)
	return task, nil
}

// taskScope is everything one reconcile of a task reads, before it decides anything.
type taskScope struct {
	task    *inplacev1.UpgradeTask
	cluster *clusterv1.Cluster
	now     time.Time
	// drainPolicy is what the task's new NodeUpdates carry (drainPolicy).
	drainPolicy *inplacev1.DrainPolicy
	version     *version.Version
	// targetMachines are every machine of the target, at the version or not.
	targetMachines []clusterv1.Machine
	// nodes are the workload cluster's Nodes by name.
	nodes map[string]*corev1.Node
	// nodeUpdates are this task's NodeUpdates by machine name: the retry of a skipped
	// machine when there is one.
	nodeUpdates map[string]*inplacev1.NodeUpdate
	// skippedFirst are, by machine name, the first NodeUpdates of machines the task
	// tried again after they were skipped (drainPolicy Skip).
	skippedFirst map[string]*inplacev1.NodeUpdate
	// upgradedBy names, by machine, a NodeUpdate of another task (or a hand-made one)
	// that Succeeded on it at the target or newer: its node is there whatever the cached
	// Machine says yet.
	upgradedBy map[string]string
	// budget is what is disrupted in the whole Cluster now, for every task and path.
	budget *disruption.Budget
	// controlPlaneBehind describes, for a MachineDeployment's task, the control plane
	// machines that do not run the target yet.
	controlPlaneBehind []string
	// liveClaims maps the claim label value of every other live task to its name.
	liveClaims map[string]string
	// heldBy names an older live task of the same target that this task waits for.
	heldBy string
	// atTarget says, for a machine whose kubelet reports the target, whether its updater
	// agrees it is there (nodeupdater.TargetJudge), and when not, why.
	atTarget map[string]judgement
	// members are the task's machines, with their derived state, in the planned order.
	members []*member
	// pendingHandover counts target machines that require the upgrade but that Cluster
	// API has not handed to an externally paced task yet.
	pendingHandover int
	// maxUnavailable is spec.maxUnavailable resolved against the target's size.
	maxUnavailable int
	// problem, when set, says why the task cannot be carried out as written.
	problem string
	// failures is the Cluster's failure budget and the failures that count against it.
	failures *failureBudget
	// goesOnAfterFailure is true when no member stops the task (stoppedBy): a failed node
	// within the failure budget leaves the task running while other nodes wait.
	goesOnAfterFailure bool
	// gates are the results of the health gates, for status.gates.
	gates []inplacev1.HealthGateStatus
}

func (r *Reconciler) readScope(ctx context.Context, task *inplacev1.UpgradeTask) (*taskScope, error) {
	s := &taskScope{task: task, now: r.Clock.Now()}
	v, err := kubeversion.ParseSemantic(task.Spec.Version)
	if err != nil {
		s.problem = fmt.Sprintf("spec.version %q is not a semantic version: %v", task.Spec.Version, err)
		return s, nil
	}
	s.version = v

	s.cluster = &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: task.Namespace, Name: task.Spec.ClusterName}, s.cluster); err != nil {
		if apierrors.IsNotFound(err) && task.Spec.Phase != inplacev1.TaskActionAbort {
			s.problem = fmt.Sprintf("Cluster %s/%s not found", task.Namespace, task.Spec.ClusterName)
			return s, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read Cluster %s/%s: %w", task.Namespace, task.Spec.ClusterName, err)
		}
		s.cluster.Namespace, s.cluster.Name = task.Namespace, task.Spec.ClusterName
	}

	clusterMachines, err := upgraderequest.ClusterMachines(ctx, r.Client, task.Namespace, task.Spec.ClusterName)
	if err != nil {
		return nil, err
	}
	// Not copied: the reconcile reads them, and copies a Machine before it writes it
	// (settleMembers).
	if s.targetMachines, err = upgraderequest.TargetMachinesOf(ctx, r.Client, task.Namespace, task.Spec.ClusterName, clusterMachines, upgraderequest.TargetOf(task)); err != nil {
		return nil, err
	}
	r.writtenMachines.overlay(s.targetMachines, time.Now())
	if s.maxUnavailable, err = preflight.ResolveMaxUnavailable(task.Spec.MaxUnavailable, len(s.targetMachines)); err != nil {
		s.problem = err.Error()
		return s, nil
	}
	if task.Spec.ControlPlaneRef != nil {
		// One control plane node at a time keeps etcd and the API server's quorum,
		// whatever maxUnavailable or pacing says.
		s.maxUnavailable = 1
	}
	// Every NodeUpdate of the Cluster, this task's and others': a node another task (or a
	// hand-made NodeUpdate) is upgrading is unavailable too.
	nus, err := r.listNodeUpdates(ctx, client.ObjectKeyFromObject(s.cluster))
	if err != nil {
		return nil, err
	}
	s.failures = readFailureBudget(s.cluster, nus, s.now, controlPlaneNodeUpdates(task, clusterMachines))
	s.nodeUpdates = map[string]*inplacev1.NodeUpdate{}
	s.skippedFirst = map[string]*inplacev1.NodeUpdate{}
	s.upgradedBy = map[string]string{}
	for i := range nus {
		nu := &nus[i]
		switch {
		case metav1IsControlledBy(nu, task):
			s.addNodeUpdate(nu)
		case nu.Status.Phase == inplacev1.NodeUpdatePhaseSucceeded && atLeast(nu.Spec.Version, v):
			s.upgradedBy[nu.Spec.MachineName] = nu.Name
		}
	}

	tasks := &inplacev1.UpgradeTaskList{}
	if err := r.Client.List(ctx, tasks, client.InNamespace(task.Namespace)); err != nil {
		return nil, fmt.Errorf("list UpgradeTasks in namespace %s: %w", task.Namespace, err)
	}
	s.liveClaims = map[string]string{}
	for i := range tasks.Items {
		t := &tasks.Items[i]
		if t.Name == task.Name || !holdsClaims(t) {
			continue
		}
		s.liveClaims[upgraderequest.LabelValue(t.Name)] = t.Name
		if holds(t, task) && (s.heldBy == "" || t.Name < s.heldBy) {
			s.heldBy = t.Name
		}
	}

	s.nodes = map[string]*corev1.Node{}
	if len(s.targetMachines) > 0 {
		key := client.ObjectKeyFromObject(s.cluster)
		// An unreachable workload cluster (its kubeconfig Secret missing or invalid, its
		// API server down) holds the task, visibly, without failing it: NodeUpdates
		// already running go on by themselves, and the task resumes once it is reachable.
		workload, err := r.Workload.Client(ctx, key)
		if err != nil {
			s.problem = fmt.Sprintf("cannot reach the workload cluster of Cluster %s: %v; no node is started until it is reachable", key, err)
			return s, nil
		}
		// The cached Nodes themselves, not copies: a reconcile only reads them (the
		// taints are written to copies), and a copy of every Node of a big cluster at
		// every reconcile was a tenth of the manager's CPU time (issue #55).
		nodes := &corev1.NodeList{}
		if err := workload.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
			s.problem = fmt.Sprintf("cannot list the Nodes of the workload cluster of Cluster %s: %v; no node is started until it is reachable", key, err)
			return s, nil
		}
		for i := range nodes.Items {
			s.nodes[nodes.Items[i].Name] = &nodes.Items[i]
		}
	}
	s.budget = disruption.Compute(clusterMachines, s.nodes, nus)
	if task.Spec.MachineDeploymentRef != nil {
		s.controlPlaneBehind = controlPlaneBehind(clusterMachines, s.version)
	}
	if s.atTarget, err = r.judgeAtTarget(ctx, s); err != nil {
		return nil, err
	}

	s.members, s.pendingHandover = collectMembers(s)
	orderMembers(s.members, task.Spec.NodeOrder, task.Spec.ControlPlaneRef != nil)
	retrySkipped(s)
	return s, nil
}

// listNodeUpdates lists the NodeUpdates of a Cluster from the cache, with those this
// manager created that the cache does not show yet; from the API server when the cache
// lags too far behind.
func (r *Reconciler) listNodeUpdates(ctx context.Context, cluster types.NamespacedName) ([]inplacev1.NodeUpdate, error) {
	now := time.Now() // not r.Clock: how long the cache lags is real time
	// Every NodeUpdate of the namespace, kept by spec.clusterName rather than by label: a
	// hand-made NodeUpdate without the cluster label still holds its node.
	opts := []client.ListOption{client.InNamespace(cluster.Namespace)}
	nus := &inplacev1.NodeUpdateList{}
	if err := r.Client.List(ctx, nus, opts...); err != nil {
		return nil, fmt.Errorf("list NodeUpdates of Cluster %s: %w", cluster, err)
	}
	if items, ok := r.created.merge(cluster, ofCluster(nus.Items, cluster.Name), now, false); ok {
		return items, nil
	}
	ctrl.LoggerFrom(ctx).V(1).Info("the cache does not show a NodeUpdate created a while ago; listing the API server")
	nus = &inplacev1.NodeUpdateList{}
	if err := r.APIReader.List(ctx, nus, opts...); err != nil {
		return nil, fmt.Errorf("list NodeUpdates of Cluster %s: %w", cluster, err)
	}
	items, _ := r.created.merge(cluster, ofCluster(nus.Items, cluster.Name), now, true)
	return items, nil
}

// ofCluster keeps the NodeUpdates of one Cluster.
func ofCluster(nus []inplacev1.NodeUpdate, clusterName string) []inplacev1.NodeUpdate {
	out := nus[:0]
	for i := range nus {
		if nus[i].Spec.ClusterName == clusterName {
			out = append(out, nus[i])
		}
	}
	return out
}

func metav1IsControlledBy(obj client.Object, owner client.Object) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.UID == owner.GetUID() {
			return true
		}
	}
	return false
}

// reconcileDelete stops the task's nodes at their safe points and, once none of its
// NodeUpdates runs, releases its claims before the task goes away: a deleted task never
// leaves a node being upgraded that no task holds.
func (r *Reconciler) reconcileDelete(ctx context.Context, task *inplacev1.UpgradeTask) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(task, inplacev1.UpgradeTaskFinalizer) {
		return ctrl.Result{}, nil
	}
	nus, err := r.listNodeUpdates(ctx, types.NamespacedName{Namespace: task.Namespace, Name: task.Spec.ClusterName})
	if err != nil {
		return ctrl.Result{}, err
	}
	var running []string
	for i := range nus {
		nu := &nus[i]
		if !metav1IsControlledBy(nu, task) || nu.Status.Phase.IsFinal() {
			continue
		}
		running = append(running, nu.Name)
		mem := &member{name: nu.Spec.MachineName, nodeName: nu.Spec.NodeName, nu: nu}
		if err := r.abortNodeUpdate(ctx, task, mem, inplacev1.TaskDeletedReason); err != nil {
			return ctrl.Result{}, err
		}
	}
	if len(running) > 0 {
		ctrl.LoggerFrom(ctx).Info("deleted UpgradeTask keeps its claims until its NodeUpdates stop", "running", running)
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	}
	// Once the writes the task handed to the background ended (none of them claims a
	// machine after this), its claims as the API server has them: the cache may not show
	// the last claims yet.
	if err := r.machines.settleTask(ctx, task.UID); err != nil {
		return ctrl.Result{}, fmt.Errorf("wait for the Machine writes of UpgradeTask %s: %w", klog.KObj(task), err)
	}
	machines := &clusterv1.MachineList{}
	if err := r.APIReader.List(ctx, machines, client.InNamespace(task.Namespace),
		client.MatchingLabels{inplacev1.UpgradeTaskLabel: upgraderequest.LabelValue(task.Name)}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list machines claimed by UpgradeTask %s: %w", klog.KObj(task), err)
	}
	for i := range machines.Items {
		m := &machines.Items[i]
		if err := r.writeMachine(ctx, m, machineWant{claim: false, removeCondition: !isDone(m)}, task); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.removePendingTaints(ctx, task); errors.Is(err, errTaintWritesInFlight) {
		// The writer asks for the task again once they are written.
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	// Once, whatever it gives: an unreachable workload cluster does not hold the deletion.
	r.deleteGateJobs(ctx, task)
	orig := task.DeepCopy()
	controllerutil.RemoveFinalizer(task, inplacev1.UpgradeTaskFinalizer)
	if err := r.Client.Patch(ctx, task, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("remove finalizer of UpgradeTask %s: %w", klog.KObj(task), err)
	}
	r.Metrics.forgetTask(task.Namespace, task.Name)
	r.status.forget(ctx, client.ObjectKeyFromObject(task))
	ctrl.LoggerFrom(ctx).Info("released the claims of a deleted UpgradeTask", "machines", len(machines.Items))
	return ctrl.Result{}, nil
}

func (r *Reconciler) writeProblem(ctx context.Context, task *inplacev1.UpgradeTask, problem string) error {
	if cond := meta.FindStatusCondition(task.Status.Conditions, inplacev1.ProgressingCondition); cond == nil || cond.Message != problem {
		r.Recorder.Eventf(task, nil, corev1.EventTypeWarning, inplacev1.WaitingReason, "Hold", "%s", problem)
		ctrl.LoggerFrom(ctx).Info("task cannot proceed", "problem", problem)
	}
	setCondition(task, inplacev1.ReadyCondition, false, inplacev1.WaitingReason, problem)
	setCondition(task, inplacev1.ProgressingCondition, false, inplacev1.WaitingReason, problem)
	if task.Status.Phase == "" {
		task.Status.Phase = inplacev1.TaskPhasePending
	}
	r.status.submit(task)
	return nil
}
