// Package preview holds the UpgradePreview controller: it shows, before anything changes,
// what an in-place upgrade of a Cluster would do, per machine, by calling the code the
// run decides with (the version checks of upgraderequest, Cluster API's CanUpdate hooks
// of the extension, the UpgradeTask's order and preflight checks, the updaters'
// disruption previews) without acting. The only object it writes is the preview's status.
package preview

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Reconciler computes UpgradePreviews. Its dependencies are the ones the run uses, set in
// main.go from the same instances: the preflight checks of the UpgradeTask controller,
// the updater registry, and the InPlaceHooks the hook server answers Cluster API with.
type Reconciler struct {
	// Client reads (from the cache) the Cluster, its machines and NodeUpdates, and writes
	// the previews' status.
	Client client.Client
	// Workload reads the Nodes of workload clusters, as the UpgradeTask controller does.
	Workload upgradetask.WorkloadClusters
	// Registry holds the updaters the manager runs.
	Registry *nodeupdater.Registry
	// Checks are the UpgradeTask controller's preflight checks; nil means
	// preflight.Default(Registry), the task's default too.
	Checks []preflight.Check
	// Hooks answers Cluster API's CanUpdate hooks; the preview calls it as Cluster API would.
	Hooks *extension.InPlaceHooks
	// DefaultUpdater is the manager's --default-updater, in Kind/name form; empty for none.
	DefaultUpdater string
	// Clock tells computedTime; nil means the real clock.
	Clock clock.PassiveClock
}

// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=upgradepreviews,verbs=get;list;watch
// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=upgradepreviews/status,verbs=get;update;patch

// SetupWithManager registers the controller. It watches UpgradePreviews only: a preview is
// a snapshot computed on request (a new spec or a new refresh annotation), not kept live.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Workload == nil || r.Hooks == nil {
		return fmt.Errorf("the UpgradePreview Reconciler needs Workload (to read Nodes) and Hooks (to ask Cluster API's CanUpdate hooks)")
	}
	r.defaults()
	return ctrl.NewControllerManagedBy(mgr).
		For(&inplacev1.UpgradePreview{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WithOptions(options).
		Named("upgradepreview").
		Complete(r)
}

func (r *Reconciler) defaults() {
	if r.Checks == nil {
		r.Checks = preflight.Default(r.Registry)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
}

// Reconcile computes a preview once per spec generation and refresh value.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.defaults()
	p := &inplacev1.UpgradePreview{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if upToDate(p) {
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("upgradePreview", klog.KObj(p), "cluster", klog.KRef(p.Namespace, p.Spec.ClusterName))
	ctx = ctrl.LoggerInto(ctx, log)

	if p.Status.Phase != inplacev1.PreviewPhaseComputing {
		orig := p.DeepCopy()
		p.Status.Phase = inplacev1.PreviewPhaseComputing
		setReady(p, metav1.ConditionFalse, "Computing", "the preview is being computed")
		if err := r.Client.Status().Patch(ctx, p, client.MergeFrom(orig)); err != nil {
			return ctrl.Result{}, fmt.Errorf("mark UpgradePreview %s Computing: %w", klog.KObj(p), err)
		}
	}
	start := time.Now()
	status, err := r.compute(ctx, p)
	if err != nil {
		// An error reading the management cluster: computed again with backoff.
		return ctrl.Result{}, fmt.Errorf("compute UpgradePreview %s: %w", klog.KObj(p), err)
	}
	orig := p.DeepCopy()
	status.Conditions = p.Status.Conditions
	p.Status = status
	p.Status.ObservedGeneration = p.Generation
	p.Status.ObservedRefresh = p.Annotations[inplacev1.RefreshAnnotation]
	p.Status.ComputedTime = &metav1.Time{Time: r.Clock.Now()}
	if p.Status.Phase == inplacev1.PreviewPhaseFailed {
		setReady(p, metav1.ConditionFalse, "Failed", p.Status.Message)
	} else {
		setReady(p, metav1.ConditionTrue, "Computed", p.Status.Summary)
	}
	if err := r.Client.Status().Patch(ctx, p, client.MergeFrom(orig)); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("write UpgradePreview %s: %w", klog.KObj(p), err)
	}
	log.Info("computed the preview", "phase", p.Status.Phase, "summary", p.Status.Summary, "message", p.Status.Message, "took", time.Since(start))
	return ctrl.Result{}, nil
}

// Compute computes a preview's status from the cluster as it is now, without writing
// anything: the benchmark times it.
func (r *Reconciler) Compute(ctx context.Context, p *inplacev1.UpgradePreview) (inplacev1.UpgradePreviewStatus, error) {
	r.defaults()
	return r.compute(ctx, p)
}

// upToDate reports whether the preview was computed for its spec and refresh value.
func upToDate(p *inplacev1.UpgradePreview) bool {
	final := p.Status.Phase == inplacev1.PreviewPhaseReady || p.Status.Phase == inplacev1.PreviewPhaseFailed
	return final && p.Status.ObservedGeneration == p.Generation && p.Status.ObservedRefresh == p.Annotations[inplacev1.RefreshAnnotation]
}

func setReady(p *inplacev1.UpgradePreview, status metav1.ConditionStatus, reason, message string) {
	if len(message) > 32768 {
		message = message[:32768]
	}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: inplacev1.ReadyCondition, Status: status, Reason: reason, Message: message, ObservedGeneration: p.Generation,
	})
}
