package cascade

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/internal/ctrlqueue"
)

// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch;patch

// clusterUpgradeReconciler carries out in-place-upgrade-to on Clusters, as a cascade: it
// asks the control plane for the upgrade and waits for it to be done, then asks the
// MachineDeployments, one at a time or all at once, and waits for them.
//
// It asks a control plane or MachineDeployment by admitting its upgrade through the
// Requester first and annotating it only once admitted, so that a version the Requester
// declines leaves every object as it was. The UpgradeTasks it asked for in the current run
// are listed in the Cluster's upgrade-task annotation: that list is what tells an answer
// of this run from one of an earlier run.
type clusterUpgradeReconciler struct {
	// Client reads (from the cache) and writes.
	Client client.Client
	// APIReader reads the run's UpgradeTasks the cache has not seen yet.
	APIReader client.Reader
	// Requester admits the upgrades of the control plane and the MachineDeployments.
	Requester *upgraderequest.Requester
	// Recorder records the InPlaceUpgrade* events on the Cluster.
	Recorder events.EventRecorder
	// PollInterval is how often a running cascade is looked at again without an event.
	PollInterval time.Duration
}

func (r *clusterUpgradeReconciler) SetupWithManager(mgr ctrl.Manager, options controller.Options, controlPlaneKinds []schema.GroupVersionKind) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Cluster{}, builder.WithPredicates(asksInPlaceUpgrade())).
		Watches(&clusterv1.MachineDeployment{}, handler.EnqueueRequestsFromMapFunc(machineDeploymentToCluster),
			builder.WithPredicates(predicate.AnnotationChangedPredicate{}))
	for _, gvk := range controlPlaneKinds {
		b = b.WatchesMetadata(metadataOf(gvk), handler.EnqueueRequestsFromMapFunc(clustersOfControlPlane(mgr.GetClient(), gvk.GroupKind())),
			builder.WithPredicates(predicate.AnnotationChangedPredicate{}))
	}
	return b.WithOptions(ctrlqueue.Options(options)).Named("inplaceupgrade-cluster").
		Complete(reportingErrors(r, r.Client, r.Recorder, func() client.Object { return &clusterv1.Cluster{} }))
}

// Reconcile implements reconcile.Reconciler.
func (r *clusterUpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("read Cluster %s: %w", req, err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	cur := readUpgradeAnnotations(cluster)
	switch {
	case cur.version() != "":
		return r.reconcileAsked(ctx, cluster, cur)
	case cur.status == inplacev1.UpgradeStatusInProgress:
		return ctrl.Result{}, r.reconcileWithdrawn(ctx, cluster, cur)
	}
	return ctrl.Result{}, nil
}

// cascadeChild is the control plane or a MachineDeployment of a Cluster, as the cascade sees it.
type cascadeChild struct {
	upgradeSubject
	// cur are its annotations as read.
	cur upgradeAnnotations
	// runTask is the UpgradeTask the current run asked for it; empty while not asked.
	runTask string
}

// clusterScope is everything one reconcile of a Cluster's cascade reads before it decides.
type clusterScope struct {
	cluster *clusterv1.Cluster
	cur     upgradeAnnotations
	// version is the asked version; empty when in-place-upgrade-to was removed.
	version string
	// allAtOnce: the MachineDeployments are asked together.
	allAtOnce bool
	// problem, when set, is a bad annotation of the Cluster's that stops the cascade.
	problem string
	// controlPlane is nil when the Cluster has no spec.controlPlaneRef; its obj is nil
	// when the control plane cannot be read.
	controlPlane *cascadeChild
	// machineDeployments are the Cluster's MachineDeployments by name.
	machineDeployments []*cascadeChild
	// superseded are the UpgradeTasks the run asked for that do not carry the asked
	// version: in-place-upgrade-to was changed or removed since.
	superseded []*inplacev1.UpgradeTask
}

func (s *clusterScope) children() []*cascadeChild {
	if s.controlPlane == nil {
		return s.machineDeployments
	}
	return append([]*cascadeChild{s.controlPlane}, s.machineDeployments...)
}

// childOf finds the child a task of the cascade upgrades.
func (s *clusterScope) childOf(task *inplacev1.UpgradeTask) *cascadeChild {
	for _, c := range s.children() {
		if c.carries(task, task.Spec.Version) {
			return c
		}
	}
	return nil
}

// runTasks lists the tasks the run asked for, in the cascade's order, for the Cluster's
// upgrade-task annotation.
func (s *clusterScope) runTasks() string {
	var names []string
	for _, c := range s.children() {
		if c.runTask != "" {
			names = append(names, c.runTask)
		}
	}
	return strings.Join(names, ",")
}

// MachineDeploymentsInOrder lists the Cluster's MachineDeployments that are not being
// deleted, in the order the cascade asks them (by name). UpgradePreview shows its order
// from it.
func MachineDeploymentsInOrder(ctx context.Context, c client.Reader, cluster *clusterv1.Cluster) ([]clusterv1.MachineDeployment, error) {
	mds := &clusterv1.MachineDeploymentList{}
	if err := c.List(ctx, mds, client.InNamespace(cluster.Namespace)); err != nil {
		return nil, fmt.Errorf("list MachineDeployments of Cluster %s: %w", klog.KObj(cluster), err)
	}
	slices.SortFunc(mds.Items, func(a, b clusterv1.MachineDeployment) int { return strings.Compare(a.Name, b.Name) })
	out := mds.Items[:0]
	for _, md := range mds.Items {
		if md.Spec.ClusterName == cluster.Name && md.DeletionTimestamp.IsZero() {
			out = append(out, md)
		}
	}
	return out, nil
}

func (r *clusterUpgradeReconciler) readScope(ctx context.Context, cluster *clusterv1.Cluster, cur upgradeAnnotations) (*clusterScope, error) {
	s := &clusterScope{cluster: cluster, cur: cur, version: cur.version()}
	switch v := cluster.Annotations[inplacev1.MachineDeploymentConcurrencyAnnotation]; v {
	case "", inplacev1.MachineDeploymentsOneAtATime:
	case inplacev1.MachineDeploymentsAllAtOnce:
		s.allAtOnce = true
	default:
		s.problem = fmt.Sprintf("the Cluster's %s is %q: use %s (the default) or %s",
			inplacev1.MachineDeploymentConcurrencyAnnotation, v, inplacev1.MachineDeploymentsOneAtATime, inplacev1.MachineDeploymentsAllAtOnce)
	}

	if cluster.Spec.ControlPlaneRef.IsDefined() {
		obj, err := readControlPlane(ctx, r.Client, cluster)
		if err != nil {
			return nil, err
		}
		s.controlPlane = &cascadeChild{upgradeSubject: *controlPlaneSubject(cluster, obj)}
		if obj != nil {
			s.controlPlane.cur = readUpgradeAnnotations(obj)
		}
	}
	mds, err := MachineDeploymentsInOrder(ctx, r.Client, cluster)
	if err != nil {
		return nil, err
	}
	for i := range mds {
		md := &mds[i]
		s.machineDeployments = append(s.machineDeployments, &cascadeChild{upgradeSubject: *machineDeploymentSubject(md), cur: readUpgradeAnnotations(md)})
	}

	// The run's memory: the tasks it asked for, while it is in progress. An answer
	// (done, failed) next to in-place-upgrade-to starts a new run.
	if cur.status != inplacev1.UpgradeStatusInProgress {
		return s, nil
	}
	for _, name := range strings.Split(cur.task, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		task, err := getUpgradeTask(ctx, r.Client, r.APIReader, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, false)
		if err != nil {
			return nil, err
		}
		if task == nil {
			continue
		}
		if c := s.childOf(task); c != nil && task.Spec.Version == s.version {
			c.runTask = task.Name
			continue
		}
		s.superseded = append(s.superseded, task)
	}
	return s, nil
}

// clusterOutcome is where the cascade of a Cluster stands after a reconcile.
type clusterOutcome struct {
	status  string
	message string
	// refused: the failure is a refusal (a bad value), not an upgrade that failed.
	refused bool
}

func inProgress() clusterOutcome { return clusterOutcome{status: inplacev1.UpgradeStatusInProgress} }

func failed(format string, args ...any) clusterOutcome {
	return clusterOutcome{status: inplacev1.UpgradeStatusFailed, message: fmt.Sprintf(format, args...)}
}

func refused(format string, args ...any) clusterOutcome {
	o := failed(format, args...)
	o.refused = true
	return o
}

// reconcileAsked carries the cascade one step on.
func (r *clusterUpgradeReconciler) reconcileAsked(ctx context.Context, cluster *clusterv1.Cluster, cur upgradeAnnotations) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KObj(cluster), "version", cur.version())
	ctx = ctrl.LoggerInto(ctx, log)
	s, err := r.readScope(ctx, cluster, cur)
	if err != nil {
		return ctrl.Result{}, err
	}
	withdrawn, err := r.withdraw(ctx, s, s.superseded)
	if err != nil {
		return ctrl.Result{}, err
	}
	outcome, err := r.cascade(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.writeOutcome(ctx, s, outcome, withdrawn); err != nil {
		return ctrl.Result{}, err
	}
	if outcome.status == inplacev1.UpgradeStatusInProgress {
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	}
	return ctrl.Result{}, nil
}

// cascade decides the Cluster's outcome from its children, asking the next ones when
// their turn came: the control plane first; the MachineDeployments once it is done.
func (r *clusterUpgradeReconciler) cascade(ctx context.Context, s *clusterScope) (clusterOutcome, error) {
	if s.problem != "" {
		return refused("%s", s.problem), nil
	}
	if s.controlPlane == nil && len(s.machineDeployments) == 0 {
		return refused("Cluster %s has neither a control plane (spec.controlPlaneRef) nor MachineDeployments: nothing to upgrade in place", s.cluster.Name), nil
	}

	if cp := s.controlPlane; cp != nil {
		switch state, msg := childState(cp, s.version); state {
		case childNotAsked:
			return r.ask(ctx, s, cp)
		case childRunning:
			return inProgress(), nil
		case childFailed:
			return failed("%s: %s; the MachineDeployments were not touched", cp.name, msg), nil
		}
	}

	running, done := 0, 0
	var waiting []*cascadeChild
	for _, md := range s.machineDeployments {
		switch state, msg := childState(md, s.version); state {
		case childFailed:
			// MachineDeployments already running finish on their own; no other one is asked.
			return failed("%s: %s", md.name, msg), nil
		case childRunning:
			running++
		case childDone:
			done++
		case childNotAsked:
			waiting = append(waiting, md)
		}
	}
	for _, md := range waiting {
		if !s.allAtOnce && running > 0 {
			break
		}
		outcome, err := r.ask(ctx, s, md)
		if err != nil || outcome.status != inplacev1.UpgradeStatusInProgress {
			return outcome, err
		}
		running++
	}
	if done == len(s.machineDeployments) {
		return clusterOutcome{status: inplacev1.UpgradeStatusDone}, nil
	}
	return inProgress(), nil
}

// childProgress is where a child stands in the current run.
type childProgress int

const (
	childNotAsked childProgress = iota
	childRunning
	childDone
	childFailed
)

// childState says where a child stands in the run that asks for version, from its
// annotations and the task the run asked for it; for a failed child also why.
func childState(c *cascadeChild, version string) (childProgress, string) {
	if c.runTask == "" || c.obj == nil {
		return childNotAsked, ""
	}
	a := c.cur
	switch {
	case a.version() == version:
		return childRunning, ""
	case a.version() != "":
		return childFailed, fmt.Sprintf("its %s was changed to %s while the Cluster's upgrade to %s ran", inplacev1.UpgradeToAnnotation, a.version(), version)
	case a.task != c.runTask:
		// Asked, but its annotations were rewritten since: ask again (the same request
		// finds the same task).
		return childNotAsked, ""
	case a.status == inplacev1.UpgradeStatusInProgress:
		// Its in-place-upgrade-to was removed; its controller is aborting the task.
		return childRunning, ""
	case a.status == inplacev1.UpgradeStatusDone && a.release == version:
		return childDone, ""
	case a.status == inplacev1.UpgradeStatusFailed:
		return childFailed, a.message
	case a.message != "":
		return childFailed, a.message
	}
	return childFailed, fmt.Sprintf("its %s was removed, which aborted its upgrade", inplacev1.UpgradeToAnnotation)
}

// ask admits the child's upgrade through the Requester and, once admitted, annotates it
// with in-place-upgrade-to and the task's name (clearing the answer of an earlier ask).
// A declined request leaves the child as it was and fails the Cluster.
func (r *clusterUpgradeReconciler) ask(ctx context.Context, s *clusterScope, c *cascadeChild) (clusterOutcome, error) {
	log := ctrl.LoggerFrom(ctx)
	d, err := r.Requester.Request(ctx, c.requestFor(s.version))
	if err != nil {
		return clusterOutcome{}, fmt.Errorf("ask for the in-place upgrade of %s to %s: %w", c.name, s.version, err)
	}
	if !d.Accepted {
		log.Info("the cascade's request was declined", "child", c.name, "reason", d.Reason, "message", d.Message)
		return refused("%s: the upgrade was declined: %s", c.name, d.Message), nil
	}
	if c.obj == nil {
		return clusterOutcome{}, fmt.Errorf("%s was accepted for an in-place upgrade but could not be read; trying again", c.name)
	}
	want := c.cur
	want.to = s.version
	if want.task != d.TaskName {
		want.task, want.status, want.message, want.progress = d.TaskName, "", "", ""
	}
	changed, err := writeUpgradeAnnotations(ctx, r.Client, c.obj, want)
	if err != nil {
		return clusterOutcome{}, err
	}
	c.cur, c.runTask = want, d.TaskName
	if changed {
		log.Info("asked for the in-place upgrade", "child", c.name, "upgradeTask", d.TaskName)
		// The child as the related object keeps one event per child: events with the same
		// regarding, related, reason and action are merged into one series.
		r.Recorder.Eventf(s.cluster, c.obj, corev1.EventTypeNormal, inplacev1.InPlaceUpgradeInProgressReason, "Ask",
			"asked %s to upgrade in place to %s: UpgradeTask %s", c.name, s.version, d.TaskName)
	}
	return inProgress(), nil
}

// withdraw removes in-place-upgrade-to from the children the given tasks of the run were
// asked for and still carry it: their controllers abort the tasks at their next safe
// point. It returns the names of the children withdrawn.
func (r *clusterUpgradeReconciler) withdraw(ctx context.Context, s *clusterScope, tasks []*inplacev1.UpgradeTask) ([]string, error) {
	var withdrawn []string
	for _, task := range tasks {
		c := s.childOf(task)
		if c == nil || c.obj == nil || c.cur.task != task.Name || c.cur.version() != task.Spec.Version {
			continue
		}
		want := c.cur
		want.to = ""
		if _, err := writeUpgradeAnnotations(ctx, r.Client, c.obj, want); err != nil {
			return withdrawn, err
		}
		c.cur = want
		ctrl.LoggerFrom(ctx).Info("withdrew the asked in-place upgrade", "child", c.name, "upgradeTask", task.Name)
		withdrawn = append(withdrawn, c.name)
	}
	return withdrawn, nil
}

// writeOutcome writes the Cluster's annotations for the outcome and records its events.
func (r *clusterUpgradeReconciler) writeOutcome(ctx context.Context, s *clusterScope, o clusterOutcome, withdrawn []string) error {
	want := s.cur
	want.task = s.runTasks()
	want.status = o.status
	want.message = o.message
	var ev *cascadeEvent
	switch o.status {
	case inplacev1.UpgradeStatusDone:
		want.to, want.release = "", s.version
		var names []string
		for _, c := range s.children() {
			names = append(names, c.name)
		}
		ev = &cascadeEvent{eventType: corev1.EventTypeNormal, reason: inplacev1.InPlaceUpgradeDoneReason, action: "Upgrade",
			note: fmt.Sprintf("upgraded in place to %s: %s", s.version, strings.Join(names, ", "))}
	case inplacev1.UpgradeStatusFailed:
		want.to = ""
		ev = &cascadeEvent{eventType: corev1.EventTypeWarning, reason: inplacev1.InPlaceUpgradeFailedReason, action: "Upgrade", note: o.message}
		if o.refused {
			ev.action = "Refuse"
		}
	}
	changed, err := writeUpgradeAnnotations(ctx, r.Client, s.cluster, want)
	if err != nil || !changed {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("in-place upgrade annotations written", "status", want.status, "release", want.release, "upgradeTasks", want.task, "message", want.message)
	if len(s.superseded) > 0 {
		note := fmt.Sprintf("the in-place upgrade to %s superseded the one to %s: its UpgradeTask(s) %s are aborted", s.version, s.superseded[0].Spec.Version, taskNames(s.superseded))
		if len(withdrawn) > 0 {
			note += fmt.Sprintf(" (withdrew %s)", strings.Join(withdrawn, ", "))
		}
		r.Recorder.Eventf(s.cluster, nil, corev1.EventTypeWarning, inplacev1.InPlaceUpgradeAbortedReason, "Supersede", "%s", note)
	}
	if ev == nil && o.status == inplacev1.UpgradeStatusInProgress && s.cur.status != inplacev1.UpgradeStatusInProgress {
		plan := fmt.Sprintf("%d MachineDeployment(s) one at a time", len(s.machineDeployments))
		if s.allAtOnce {
			plan = fmt.Sprintf("%d MachineDeployment(s) all at once", len(s.machineDeployments))
		}
		if s.controlPlane != nil {
			plan = s.controlPlane.name + " first, then " + plan
		}
		ev = &cascadeEvent{eventType: corev1.EventTypeNormal, reason: inplacev1.InPlaceUpgradeInProgressReason, action: "Start",
			note: fmt.Sprintf("upgrading in place to %s: %s", s.version, plan)}
	}
	recordCascadeEvent(r.Recorder, s.cluster, nil, ev)
	return nil
}

// reconcileWithdrawn aborts the cascade whose in-place-upgrade-to was removed: every child
// still asked by the run has its in-place-upgrade-to removed, which aborts its task.
func (r *clusterUpgradeReconciler) reconcileWithdrawn(ctx context.Context, cluster *clusterv1.Cluster, cur upgradeAnnotations) error {
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KObj(cluster)))
	s, err := r.readScope(ctx, cluster, cur)
	if err != nil {
		return err
	}
	withdrawn, err := r.withdraw(ctx, s, s.superseded)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("the in-place upgrade was aborted: %s was removed from the Cluster", inplacev1.UpgradeToAnnotation)
	if len(s.superseded) > 0 {
		note = fmt.Sprintf("the in-place upgrade to %s was aborted: %s was removed from the Cluster", s.superseded[0].Spec.Version, inplacev1.UpgradeToAnnotation)
	}
	if len(withdrawn) > 0 {
		note += fmt.Sprintf("; withdrew %s, whose UpgradeTasks stop at their next safe point", strings.Join(withdrawn, ", "))
	}
	note += "; machines already upgraded stay upgraded"
	want := cur
	want.status, want.message = "", note
	changed, err := writeUpgradeAnnotations(ctx, r.Client, cluster, want)
	if err != nil || !changed {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("aborted the in-place upgrade cascade", "withdrawn", withdrawn)
	r.Recorder.Eventf(cluster, nil, corev1.EventTypeWarning, inplacev1.InPlaceUpgradeAbortedReason, "Abort", "%s", note)
	return nil
}

func taskNames(tasks []*inplacev1.UpgradeTask) string {
	names := make([]string, 0, len(tasks))
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	return strings.Join(names, ", ")
}

// machineDeploymentToCluster maps a MachineDeployment to its Cluster.
func machineDeploymentToCluster(_ context.Context, obj client.Object) []reconcile.Request {
	md, ok := obj.(*clusterv1.MachineDeployment)
	if !ok || md.Spec.ClusterName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: md.Namespace, Name: md.Spec.ClusterName}}}
}
