package faults

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const (
	// ReconcileErrorReason is the reason of the Warning event, and of the Ready
	// condition of our own kinds, when a reconcile ends with an error: the controller
	// tries again with backoff, and the message is the error.
	ReconcileErrorReason = "ReconcileError"

	// maxNote is the size of an event note the events API accepts.
	maxNote = 1024
	// maxConditionMessage is the size of a condition message the API accepts.
	maxConditionMessage = 32768
)

// ErrorReporter wraps a reconciler: an error it returns is recorded as a Warning event
// ReconcileError on the object reconciled (and so counted in capi_inplace_warnings_total)
// and, for kinds whose conditions are ours, as the Ready condition False with that
// reason, until the next reconcile that succeeds writes the condition again. A conflict
// is not reported: it is resolved by the next reconcile from a fresh read, which is the
// normal course of optimistic concurrency. Nor is a canceled context (the manager stops).
type ErrorReporter struct {
	// Reconciler is the reconciler wrapped.
	Reconciler reconcile.Reconciler
	// Client patches the status of the object reconciled, and reads it when Reader is nil.
	Client client.Client
	// Reader reads the object reconciled; nil means Client.
	Reader client.Reader
	// NewObject returns an empty object of the kind reconciled.
	NewObject func() client.Object
	// Recorder records the event; CountWarnings is applied to it.
	Recorder events.EventRecorder
	// Conditions, when set, returns the conditions of obj that carry the Ready condition,
	// or nil when obj's conditions must not be touched (it ended).
	Conditions func(obj client.Object) *[]metav1.Condition
}

// Reconcile implements reconcile.Reconciler.
func (e ErrorReporter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := e.Reconciler.Reconcile(ctx, req)
	if err == nil || apierrors.IsConflict(err) || errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return res, err
	}
	e.report(ctx, req, err)
	return res, err
}

func (e ErrorReporter) report(ctx context.Context, req reconcile.Request, rerr error) {
	log := ctrl.LoggerFrom(ctx)
	obj := e.NewObject()
	reader := e.Reader
	if reader == nil {
		reader = e.Client
	}
	if err := reader.Get(ctx, req.NamespacedName, obj); err != nil {
		log.V(4).Info("cannot read the object to report a reconcile error on", "error", err.Error())
		return
	}
	msg := fmt.Sprintf("reconcile failed, trying again with backoff: %v", rerr)
	if e.Conditions != nil {
		if conds := e.Conditions(obj); conds != nil {
			if c := meta.FindStatusCondition(*conds, "Ready"); c != nil && c.Reason == ReconcileErrorReason && c.Message == truncate(msg, maxConditionMessage) {
				// Said already; the event recorder aggregates the repeats of its event.
				return
			}
			orig, ok := obj.DeepCopyObject().(client.Object)
			if ok {
				meta.SetStatusCondition(conds, metav1.Condition{
					Type: "Ready", Status: metav1.ConditionFalse, Reason: ReconcileErrorReason,
					Message: truncate(msg, maxConditionMessage), ObservedGeneration: obj.GetGeneration(),
				})
				if err := e.Client.Status().Patch(ctx, obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
					log.V(4).Info("cannot write the Ready condition of a reconcile error", "error", err.Error())
				}
			}
		}
	}
	CountWarnings(e.Recorder).Eventf(obj, nil, corev1.EventTypeWarning, ReconcileErrorReason, "Reconcile", "%s", truncate(msg, maxNote))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
