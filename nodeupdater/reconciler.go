package nodeupdater

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
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
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/ctrlqueue"
	"github.com/capi-inplace/capi-inplace/internal/faults"
)

// Defaults of the Reconciler's tuning, used where a field is left zero.
const (
	// DefaultNodeTimeout is how long one node may take when its updater sets no timeout.
	DefaultNodeTimeout = 2 * time.Hour
	// DefaultPollInterval is when the updater is called again when it asks for no time.
	DefaultPollInterval = 30 * time.Second
	// DefaultUpdaterRecheckInterval is how often a missing updater is looked for again.
	DefaultUpdaterRecheckInterval = time.Minute
	// DefaultRetryBaseDelay is the wait after the first retryable error of a step; it
	// doubles after each further one.
	DefaultRetryBaseDelay = 10 * time.Second
	// DefaultRetryMaxDelay caps the wait between two tries of a step.
	DefaultRetryMaxDelay = 5 * time.Minute
	// DefaultMaxAttempts is how many times a step is tried before the NodeUpdate fails
	// with RetriesExhausted.
	DefaultMaxAttempts = 5
	// DefaultExternalAbortTimeout is how long an external updater has to confirm an
	// abort before the NodeUpdate is marked Aborted without it.
	DefaultExternalAbortTimeout = 10 * time.Minute
)

// NodeTimeouter is implemented by an Updater whose configuration says how long the
// update of one node may take. A zero duration means the reconciler's default.
type NodeTimeouter interface {
	NodeTimeout(ctx context.Context, nu *inplacev1.NodeUpdate) (time.Duration, error)
}

// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=nodeupdates,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=nodeupdates/status;nodeupdates/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;update;patch

// Reconciler drives every NodeUpdate through its lifecycle and dispatches the
// node-level work to the Updater registered for its updaterRef kind. Its state lives in
// the NodeUpdate's status only, so a restarted manager carries on where it stopped.
type Reconciler struct {
	// Client reads and writes NodeUpdates and reads updater configurations; the
	// manager's client when nil.
	Client client.Client
	// APIReader reads what must not come from a possibly stale cache: the NodeUpdate
	// itself, at every reconcile, before the updater acts on it, CRDs and external
	// updater configurations. The manager's API reader when nil.
	APIReader client.Reader
	// Registry holds the updaters the manager runs. Required.
	Registry *Registry
	// Recorder records the events of NodeUpdates; the manager's when nil.
	Recorder events.EventRecorder
	// Clock tells the time of status timestamps, timeouts and retries; the real clock
	// when nil.
	Clock clock.PassiveClock

	// DefaultTimeout is how long one node may take when the updater sets no timeout.
	DefaultTimeout time.Duration
	// PollInterval is when the updater is called again when it asks for no time.
	PollInterval time.Duration
	// UpdaterRecheckInterval is how often a missing updater or configuration is looked for again.
	UpdaterRecheckInterval time.Duration
	// RetryBaseDelay is the wait after the first retryable error of a step.
	RetryBaseDelay time.Duration
	// RetryMaxDelay caps the wait between two tries of a step.
	RetryMaxDelay time.Duration
	// MaxAttempts is how many times a step is tried before the NodeUpdate fails.
	MaxAttempts int32
	// ExternalAbortTimeout is how long an external updater has to confirm an abort.
	ExternalAbortTimeout time.Duration

	// wakes carries the NodeUpdates Wake asks to reconcile now.
	wakes chan event.TypedGenericEvent[*inplacev1.NodeUpdate]
	// gauges counts the NodeUpdates in progress and failed.
	gauges gaugeBook
}

// scope is what one reconcile of a NodeUpdate read and decided.
type scope struct {
	nu     *inplacev1.NodeUpdate
	before *inplacev1.NodeUpdate
	now    time.Time

	// reg is the updater the manager runs for the NodeUpdate, when it runs one.
	reg *Registration
	// external is true when a controller outside the manager serves the kind.
	external bool
	// externalConfig is the external updater's configuration object.
	externalConfig map[string]any
	// available is true when the updater runs and its configuration object exists.
	available bool
}

// SetupWithManager fills in the defaults of unset fields and registers the reconciler
// and its metrics with the manager.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if r.Registry == nil {
		return errors.New("nodeupdate reconciler needs a Registry")
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("nodeupdate-controller")
	}
	r.Recorder = faults.CountWarnings(r.Recorder)
	r.setDefaults()
	if err := registerMetrics(); err != nil {
		return fmt.Errorf("register nodeupdate metrics: %w", err)
	}
	// Only changes someone else asks for start a reconcile: the spec (abort), metadata a
	// person may touch, deletion, and the phase an external updater writes. The
	// reconciler's own status writes do not, so the updater is called when it asked to be.
	phaseChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		oldNU, okOld := e.ObjectOld.(*inplacev1.NodeUpdate)
		newNU, okNew := e.ObjectNew.(*inplacev1.NodeUpdate)
		return okOld && okNew && oldNU.Status.Phase != newNU.Status.Phase
	}}
	r.wakes = make(chan event.TypedGenericEvent[*inplacev1.NodeUpdate], wakeBuffer)
	err := ctrl.NewControllerManagedBy(mgr).
		Named("nodeupdate").
		For(&inplacev1.NodeUpdate{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{},
			predicate.AnnotationChangedPredicate{},
			predicate.LabelChangedPredicate{},
			phaseChanged,
		))).
		WatchesRawSource(source.Channel(r.wakes, &handler.TypedEnqueueRequestForObject[*inplacev1.NodeUpdate]{})).
		WithOptions(ctrlqueue.Options(opts)).
		Complete(faults.ErrorReporter{
			Reconciler: r, Client: r.Client, Reader: r.APIReader, Recorder: r.Recorder,
			NewObject: func() client.Object { return &inplacev1.NodeUpdate{} },
			Conditions: func(obj client.Object) *[]metav1.Condition {
				if nu, ok := obj.(*inplacev1.NodeUpdate); ok && !nu.Status.Phase.IsFinal() {
					return &nu.Status.Conditions
				}
				return nil
			},
		})
	if err != nil {
		return fmt.Errorf("create nodeupdate controller: %w", err)
	}
	return nil
}

func (r *Reconciler) setDefaults() {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.DefaultTimeout <= 0 {
		r.DefaultTimeout = DefaultNodeTimeout
	}
	if r.PollInterval <= 0 {
		r.PollInterval = DefaultPollInterval
	}
	if r.UpdaterRecheckInterval <= 0 {
		r.UpdaterRecheckInterval = DefaultUpdaterRecheckInterval
	}
	if r.RetryBaseDelay <= 0 {
		r.RetryBaseDelay = DefaultRetryBaseDelay
	}
	if r.RetryMaxDelay <= 0 {
		r.RetryMaxDelay = DefaultRetryMaxDelay
	}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.ExternalAbortTimeout <= 0 {
		r.ExternalAbortTimeout = DefaultExternalAbortTimeout
	}
}

// read returns the NodeUpdate as the API server holds it (APIReader), never the
// manager's cache: every reconcile may call the updater, which may start a step that
// takes the node down, and a copy the cache holds may miss a write it has not seen yet
// (the task's abort, a deletion, another writer). Even the cache's copy of this
// reconciler's own last write is not enough: another writer may have written after it
// (issue #34: an aborted NodeUpdate took its next step). One read per reconcile of a
// NodeUpdate that has not ended is the price.
func (r *Reconciler) read(ctx context.Context, key types.NamespacedName) (*inplacev1.NodeUpdate, error) {
	nu := &inplacev1.NodeUpdate{}
	if err := r.APIReader.Get(ctx, key, nu); err != nil {
		return nil, err
	}
	return nu, nil
}

// Reconcile advances one NodeUpdate, read as read says; the status is computed and
// patched once, at the end.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	// A NodeUpdate the cache shows ended, not being deleted, has nothing left to do but
	// be counted, and needs no read from the API server: a final phase is never left, and
	// a deletion comes as an event of its own, with the cache showing it. This is the
	// reconcile that follows every node's end (the reconciler's own write of the final
	// phase): one read of the API server less per node.
	cached := &inplacev1.NodeUpdate{}
	if err := r.Client.Get(ctx, req.NamespacedName, cached); err == nil && cached.Status.Phase.IsFinal() &&
		cached.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(cached, inplacev1.NodeUpdateFinalizer) {
		r.gauges.observe(cached)
		return ctrl.Result{}, nil
	}
	nu, err := r.read(ctx, req.NamespacedName)
	if apierrors.IsNotFound(err) {
		r.gauges.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	log := ctrl.LoggerFrom(ctx).WithValues("nodeUpdate", klog.KObj(nu), "node", nu.Spec.NodeName,
		"updaterRef", nu.Spec.UpdaterRef.String())
	ctx = ctrl.LoggerInto(ctx, log)

	r.gauges.observe(nu)
	if !nu.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, nu)
	}
	if !controllerutil.ContainsFinalizer(nu, inplacev1.NodeUpdateFinalizer) {
		if nu.Status.Phase.IsFinal() {
			return ctrl.Result{}, nil
		}
		patch := client.MergeFromWithOptions(nu.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(nu, inplacev1.NodeUpdateFinalizer)
		if err := r.Client.Patch(ctx, nu, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to NodeUpdate %s: %w", klog.KObj(nu), err)
		}
	}
	if nu.Status.Phase.IsFinal() {
		return ctrl.Result{}, nil
	}

	s := &scope{nu: nu, before: nu.DeepCopy(), now: r.Clock.Now()}
	defer func() {
		if err := r.writeStatus(ctx, s); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
			return
		}
		r.gauges.observe(s.nu)
	}()
	return r.reconcileNormal(ctx, s)
}

// reconcileNormal runs the lifecycle of a NodeUpdate that has not ended.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	if s.nu.Status.Phase == "" {
		s.nu.Status.Phase = inplacev1.NodeUpdatePhasePending
	}
	if err := r.resolveUpdater(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case s.nu.Spec.Phase == inplacev1.TaskActionAbort || s.nu.Status.AbortStartTime != nil:
		return r.reconcileAbort(ctx, s)
	case !s.available:
		return r.reconcileUnavailable(ctx, s)
	case s.external:
		return r.reconcileExternal(ctx, s)
	default:
		return r.reconcileUpdater(ctx, s)
	}
}

// reconcileUpdater calls the updater the manager runs, unless the node timed out or a
// retry is not due yet, and records the outcome.
func (r *Reconciler) reconcileUpdater(ctx context.Context, s *scope) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	nu := s.nu
	if nu.Status.StartTime == nil {
		nu.Status.StartTime = ptrTime(s.now)
		nu.Status.Phase = inplacev1.NodeUpdatePhaseInProgress
		nu.Status.Attempts = 1
		log.Info("Starting node update", "version", nu.Spec.Version)
	}

	deadline := nu.Status.StartTime.Add(r.nodeTimeout(ctx, s))
	if !s.now.Before(deadline) {
		r.startTimeout(s, deadline)
		return r.reconcileAbort(ctx, s)
	}
	if nu.Status.NextRetryTime != nil && s.now.Before(nu.Status.NextRetryTime.Time) {
		wait := nu.Status.NextRetryTime.Sub(s.now)
		log.V(4).Info("Waiting for the next retry", "after", wait)
		return ctrl.Result{RequeueAfter: capAt(wait, deadline.Sub(s.now))}, nil
	}

	stepBefore := currentStep(nu)
	res, err := s.reg.Updater.Reconcile(ctx, nu)
	if currentStep(nu) != stepBefore {
		resetAttempts(nu)
	}
	nu.Status.NextRetryTime = nil

	if skip, ok := AsSkip(err); ok {
		log.Info("Node skipped: putting the node back", "message", skip.Message)
		r.startSkip(s, skip.Message)
		return r.reconcileAbort(ctx, s)
	}
	if perm, ok := AsPermanent(err); ok {
		reason := perm.Reason
		if reason == "" {
			reason = inplacev1.StepFailedReason
		}
		log.Info("Node update failed with a permanent error, cleaning up", "reason", reason, "error", err.Error())
		r.startFailure(s, reason, err.Error())
		return r.reconcileAbort(ctx, s)
	}
	if err != nil {
		return r.scheduleRetry(ctx, s, err, deadline)
	}
	if res.Done {
		endRunningSteps(nu, inplacev1.StepStateSucceeded, "")
		nu.Status.Phase = inplacev1.NodeUpdatePhaseSucceeded
		nu.Status.CompletionTime = ptrTime(s.now)
		log.Info("Node update succeeded", "duration", s.now.Sub(nu.Status.StartTime.Time).Round(time.Second))
		return ctrl.Result{}, nil
	}
	after := res.RequeueAfter
	if after <= 0 {
		after = r.PollInterval
	}
	return ctrl.Result{RequeueAfter: capAt(after, deadline.Sub(s.now))}, nil
}

// scheduleRetry records a retryable error of the current step and when it is tried
// again, or fails the NodeUpdate when the step has had all its attempts.
func (r *Reconciler) scheduleRetry(ctx context.Context, s *scope, err error, deadline time.Time) (ctrl.Result, error) {
	nu := s.nu
	step := currentStep(nu)
	if nu.Status.Attempts < 1 {
		nu.Status.Attempts = 1
	}
	nu.Status.LastError = truncate(err.Error(), 10240)
	nu.Status.LastAttemptTime = ptrMicroTime(s.now)
	if IsUnreachable(err) {
		// A cluster that cannot be reached for a while (an API server restarting, a
		// network blip) is waited for until the node's timeout; it is not the step's
		// failure and does not use up its attempts.
		delay := RetryDelay(r.MaxAttempts, r.RetryBaseDelay, r.RetryMaxDelay)
		nu.Status.NextRetryTime = ptrMicroTime(s.now.Add(delay))
		ctrl.LoggerFrom(ctx).Info("Cluster unreachable, trying again later", "step", step, "after", delay, "error", err.Error())
		return ctrl.Result{RequeueAfter: capAt(delay, deadline.Sub(s.now))}, nil
	}
	if nu.Status.Attempts >= r.MaxAttempts {
		ctrl.LoggerFrom(ctx).Info("Node update failed: retries exhausted, cleaning up", "step", step, "attempts", nu.Status.Attempts, "error", err.Error())
		r.startFailure(s, inplacev1.RetriesExhaustedReason,
			fmt.Sprintf("%s failed %d times, last with: %v", stepLabel(step), nu.Status.Attempts, err))
		return r.reconcileAbort(ctx, s)
	}
	delay := RetryDelay(nu.Status.Attempts, r.RetryBaseDelay, r.RetryMaxDelay)
	nu.Status.Attempts++
	nu.Status.NextRetryTime = ptrMicroTime(s.now.Add(delay))
	ctrl.LoggerFrom(ctx).Info("Retryable error, trying again later", "step", step, "attempt", nu.Status.Attempts,
		"after", delay, "error", err.Error())
	return ctrl.Result{RequeueAfter: capAt(delay, deadline.Sub(s.now))}, nil
}

// RetryDelay is the wait after the given failed attempt (1 for the first): base, doubled
// after each further failure, never more than maxDelay.
func RetryDelay(failedAttempt int32, base, maxDelay time.Duration) time.Duration {
	if failedAttempt < 1 {
		failedAttempt = 1
	}
	delay := base
	for i := int32(1); i < failedAttempt; i++ {
		delay *= 2
		if delay >= maxDelay || delay <= 0 {
			return maxDelay
		}
	}
	if delay > maxDelay {
		return maxDelay
	}
	return delay
}

// reconcileExternal keeps the timeout of a NodeUpdate whose steps and result an external
// controller writes.
func (r *Reconciler) reconcileExternal(ctx context.Context, s *scope) (ctrl.Result, error) {
	nu := s.nu
	if nu.Status.StartTime == nil {
		nu.Status.StartTime = ptrTime(s.now)
	}
	deadline := nu.Status.StartTime.Add(r.nodeTimeout(ctx, s))
	if !s.now.Before(deadline) {
		r.startTimeout(s, deadline)
		r.finishAbort(s, "")
		ctrl.LoggerFrom(ctx).Info("External node update timed out")
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: capAt(r.UpdaterRecheckInterval, deadline.Sub(s.now))}, nil
}

// reconcileUnavailable waits for a missing updater or configuration, still enforcing
// the timeout of a node that had started.
func (r *Reconciler) reconcileUnavailable(ctx context.Context, s *scope) (ctrl.Result, error) {
	nu := s.nu
	after := r.UpdaterRecheckInterval
	if nu.Status.StartTime != nil {
		deadline := nu.Status.StartTime.Add(r.DefaultTimeout)
		if s.reg != nil {
			deadline = nu.Status.StartTime.Add(r.nodeTimeout(ctx, s))
		}
		if !s.now.Before(deadline) {
			r.startTimeout(s, deadline)
			return r.reconcileAbort(ctx, s)
		}
		after = capAt(after, deadline.Sub(s.now))
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// startTimeout records that the node ran out of time: the NodeUpdate fails with
// TimedOut once the updater has cleaned up.
func (r *Reconciler) startTimeout(s *scope, deadline time.Time) {
	nu := s.nu
	msg := fmt.Sprintf("node update did not finish within %s (started %s)",
		deadline.Sub(nu.Status.StartTime.Time).Round(time.Second), nu.Status.StartTime.UTC().Format(time.RFC3339))
	if step := currentStep(nu); step != "" {
		msg += "; " + stepLabel(step) + " was still running"
	}
	nu.Status.FailureReason = inplacev1.TimedOutReason
	nu.Status.FailureMessage = msg
	nu.Status.NextRetryTime = nil
	endRunningSteps(nu, inplacev1.StepStateFailed, "timed out: "+msg)
	if nu.Status.AbortStartTime == nil {
		nu.Status.AbortStartTime = ptrMicroTime(s.now)
	}
}

// startFailure records that the node's update failed for good: the running step fails
// with the message, and the updater is asked to stop at its safe point and remove what
// it created before the NodeUpdate is final, so that nothing it left (a SUC Plan, a Job)
// goes on upgrading the node outside every budget. A set failureReason with a set
// abortStartTime is all a restarted manager needs to go on cleaning up.
func (r *Reconciler) startFailure(s *scope, reason, message string) {
	nu := s.nu
	message = truncate(message, 10240)
	endRunningSteps(nu, inplacev1.StepStateFailed, message)
	nu.Status.FailureReason = reason
	nu.Status.FailureMessage = message
	nu.Status.NextRetryTime = nil
	// The step's last error is part of the failure message; from now on lastError is
	// the error of Abort, which the Progressing condition shows.
	nu.Status.LastError = ""
	nu.Status.LastAttemptTime = nil
	if nu.Status.AbortStartTime == nil {
		nu.Status.AbortStartTime = ptrMicroTime(s.now)
	}
}

// startSkip records that the updater puts the node back (drainPolicy Skip): the running
// step ends with the message, and the updater is asked, as after a failure, to stop at
// its safe point and remove what it created; the NodeUpdate then ends Skipped. The
// failureReason NodeSkipped with a set abortStartTime is what a restarted manager goes
// on from.
func (r *Reconciler) startSkip(s *scope, message string) {
	nu := s.nu
	message = truncate(message, 10240)
	endRunningSteps(nu, inplacev1.StepStateAborted, "node skipped: "+message)
	nu.Status.FailureReason = inplacev1.NodeSkippedReason
	nu.Status.FailureMessage = message
	nu.Status.NextRetryTime = nil
	nu.Status.LastError = ""
	nu.Status.LastAttemptTime = nil
	if nu.Status.AbortStartTime == nil {
		nu.Status.AbortStartTime = ptrMicroTime(s.now)
	}
}

// reconcileAbort stops the node's update at a safe point, on request or after a
// failure or timeout: the updater's Abort is called until it reports done.
func (r *Reconciler) reconcileAbort(ctx context.Context, s *scope) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	nu := s.nu
	if nu.Status.AbortStartTime == nil {
		nu.Status.AbortStartTime = ptrMicroTime(s.now)
		nu.Status.NextRetryTime = nil
		log.Info("Aborting node update")
	}
	// The manager's updaters start when they are first called; an external updater
	// starts when it sets the phase InProgress (the start time is the reconciler's).
	started := nu.Status.StartTime != nil
	if s.external {
		started = nu.Status.Phase == inplacev1.NodeUpdatePhaseInProgress
	}
	switch {
	case s.reg != nil && s.available:
		// The manager's own updater is asked even when no start time was recorded:
		// a manager that stopped between the updater's first call and the status write
		// leaves a NodeUpdate with no start time whose updater already holds the node.
		// Abort of an updater that never ran is a no-op that reports done.
		done, err := s.reg.Updater.Abort(ctx, nu)
		if err != nil {
			log.Info("Abort failed, trying again", "error", err.Error())
			recordAbortError(s, err)
			r.event(nu, eventWarning, EventAbortFailed, "Abort",
				fmt.Sprintf("abort on node %s failed, trying again: %v", nu.Spec.NodeName, err))
			return ctrl.Result{RequeueAfter: r.RetryBaseDelay}, nil
		}
		clearAbortError(s)
		if !done {
			return ctrl.Result{RequeueAfter: r.PollInterval}, nil
		}
		r.finishAbort(s, "")
		return ctrl.Result{}, nil
	case !started:
		r.finishAbort(s, "aborted before the updater started on the node")
		return ctrl.Result{}, nil
	case s.reg != nil && !s.external:
		// The configuration went away after the node started. The updater may still stop
		// what it set going from what it recorded when the node started (the Harvester
		// updater's configuration snapshot: an armed reboot, a running Job), so it is
		// asked; the NodeUpdate is final only once it reports done. One that cannot
		// clean up without its configuration says so, and the NodeUpdate ends with that.
		done, err := s.reg.Updater.Abort(ctx, nu)
		if err != nil {
			log.Info("Abort without the updater's configuration failed", "error", err.Error())
			r.event(nu, eventWarning, EventAbortFailed, "Abort",
				fmt.Sprintf("abort on node %s without the updater's configuration failed: %v", nu.Spec.NodeName, err))
			r.finishAbort(s, fmt.Sprintf("the updater's configuration is gone and its abort failed (%v); nothing on the node was cleaned up", err))
			return ctrl.Result{}, nil
		}
		if !done {
			return ctrl.Result{RequeueAfter: r.PollInterval}, nil
		}
		r.finishAbort(s, "")
		return ctrl.Result{}, nil
	case s.external && s.available:
		if waited := s.now.Sub(nu.Status.AbortStartTime.Time); waited < r.ExternalAbortTimeout {
			return ctrl.Result{RequeueAfter: capAt(r.UpdaterRecheckInterval, r.ExternalAbortTimeout-waited)}, nil
		}
		r.finishAbort(s, fmt.Sprintf("the external updater did not confirm the abort within %s", r.ExternalAbortTimeout))
		return ctrl.Result{}, nil
	default:
		r.finishAbort(s, "the updater is not available; nothing on the node was cleaned up")
		return ctrl.Result{}, nil
	}
}

// recordAbortError keeps the error of the updater's Abort in status.lastError, where the
// Progressing condition of an abort shows it until the abort goes on.
func recordAbortError(s *scope, err error) {
	s.nu.Status.LastError = truncate(err.Error(), 10240)
	s.nu.Status.LastAttemptTime = ptrMicroTime(s.now)
}

// clearAbortError forgets the error of an earlier Abort once Abort went through.
func clearAbortError(s *scope) {
	if abortError(&s.nu.Status) != "" {
		s.nu.Status.LastError = ""
	}
}

// finishAbort ends an abort: Skipped when it put a skipped node back, Failed when it
// cleaned up after a failure (a permanent error, exhausted retries, a timeout), else
// Aborted.
func (r *Reconciler) finishAbort(s *scope, note string) {
	nu := s.nu
	switch {
	case nu.Status.FailureReason == inplacev1.NodeSkippedReason:
		nu.Status.Phase = inplacev1.NodeUpdatePhaseSkipped
		if note != "" {
			nu.Status.FailureMessage = truncate(nu.Status.FailureMessage+"; "+note, 10240)
		}
	case nu.Status.FailureReason != "":
		nu.Status.Phase = inplacev1.NodeUpdatePhaseFailed
		if note != "" {
			nu.Status.FailureMessage = truncate(nu.Status.FailureMessage+"; "+note, 10240)
		}
	default:
		why := abortCause(nu)
		if why != "" && note != "" {
			why += "; "
		}
		msg := "aborted"
		if why+note != "" {
			msg += ": " + why + note
		}
		endRunningSteps(nu, inplacev1.StepStateAborted, msg)
		nu.Status.Phase = inplacev1.NodeUpdatePhaseAborted
	}
	nu.Status.NextRetryTime = nil
	nu.Status.CompletionTime = ptrTime(s.now)
}

// abortCause says, for the messages of an aborted NodeUpdate, why the abort was asked:
// spec.abortReason in words an operator reads, with the reason itself to search for.
// Empty when no abort was asked or no reason was given.
func abortCause(nu *inplacev1.NodeUpdate) string {
	reason := nu.Spec.AbortReason
	if reason == "" || nu.Spec.Phase != inplacev1.TaskActionAbort {
		return ""
	}
	var what string
	switch reason {
	case inplacev1.MachineDeletedReason:
		what = "the machine is being deleted"
	case inplacev1.TaskAbortedReason:
		what = "its UpgradeTask was aborted"
	case inplacev1.TaskDeletedReason:
		what = "its UpgradeTask was deleted"
	case inplacev1.SupersededReason:
		what = "a newer request for the same target superseded it"
	default:
		return reason
	}
	return what + " (" + reason + ")"
}

// reconcileDelete lets the updater clean up on the node before the NodeUpdate goes.
func (r *Reconciler) reconcileDelete(ctx context.Context, nu *inplacev1.NodeUpdate) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(nu, inplacev1.NodeUpdateFinalizer) {
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx)
	s := &scope{nu: nu, before: nu.DeepCopy(), now: r.Clock.Now()}
	if err := r.resolveUpdater(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	needsCleanup := s.reg != nil && s.available && nu.Status.StartTime != nil && nu.Status.Phase != inplacev1.NodeUpdatePhaseAborted
	if needsCleanup {
		if !nu.Status.Phase.IsFinal() && nu.Status.AbortStartTime == nil {
			nu.Status.AbortStartTime = ptrMicroTime(s.now)
		}
		done, err := s.reg.Updater.Abort(ctx, nu)
		if err != nil {
			recordAbortError(s, err)
			r.event(nu, eventWarning, EventAbortFailed, "Delete",
				fmt.Sprintf("cleanup of node %s before deletion failed, trying again: %v", nu.Spec.NodeName, err))
			return ctrl.Result{RequeueAfter: r.RetryBaseDelay}, r.writeStatus(ctx, s)
		}
		clearAbortError(s)
		if !done {
			return ctrl.Result{RequeueAfter: r.PollInterval}, r.writeStatus(ctx, s)
		}
		if !nu.Status.Phase.IsFinal() {
			r.finishAbort(s, "the NodeUpdate was deleted")
		}
		if err := r.writeStatus(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	log.Info("Releasing deleted NodeUpdate", "cleanedUp", needsCleanup)
	patch := client.MergeFromWithOptions(nu.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(nu, inplacev1.NodeUpdateFinalizer)
	if err := r.Client.Patch(ctx, nu, patch); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("remove finalizer from NodeUpdate %s: %w", klog.KObj(nu), err)
	}
	return ctrl.Result{}, nil
}

// nodeTimeout is the updater's timeout for this node, else the default.
func (r *Reconciler) nodeTimeout(ctx context.Context, s *scope) time.Duration {
	if s.reg != nil {
		if t, ok := s.reg.Updater.(NodeTimeouter); ok {
			d, err := t.NodeTimeout(ctx, s.nu)
			if err != nil {
				ctrl.LoggerFrom(ctx).Info("Cannot read the updater's node timeout, using the default",
					"default", r.DefaultTimeout, "error", err.Error())
			}
			if err == nil && d > 0 {
				return d
			}
		}
		return r.DefaultTimeout
	}
	if s.externalConfig != nil {
		if d, ok := externalNodeTimeout(s.externalConfig); ok {
			return d
		}
	}
	return r.DefaultTimeout
}

func resetAttempts(nu *inplacev1.NodeUpdate) {
	nu.Status.Attempts = 1
	nu.Status.LastError = ""
	nu.Status.LastAttemptTime = nil
	nu.Status.NextRetryTime = nil
}

// capAt returns d, but not more than limit (and never less than a millisecond, so that
// a due deadline is looked at again at once).
func capAt(d, limit time.Duration) time.Duration {
	if limit < d {
		d = limit
	}
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}

// ptrTime is t as an API timestamp, cut to the second the API stores, so that what the
// reconciler decides from it is the same before and after it was written.
func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

func ptrMicroTime(t time.Time) *metav1.MicroTime {
	mt := metav1.NewMicroTime(t)
	return &mt
}

func stepLabel(step string) string {
	if step == "" {
		return "the node update"
	}
	return "step " + step
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
