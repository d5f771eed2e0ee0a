package cascade

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// Control planes are read and annotated through unstructured access, whatever their kind.
// Other control plane kinds need get and patch granted by a ClusterRole of your own
// (docs/install.md, docs/annotations.md).
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=kubeadmcontrolplanes;rke2controlplanes,verbs=get;list;watch;patch

// controlPlaneUpgradeReconciler carries out in-place-upgrade-to on control planes: one
// UpgradeTask upgrades the machines the control plane owns. Its requests are Clusters: a
// Cluster has exactly one control plane, of any kind, named by spec.controlPlaneRef, and
// the control plane's kind would not fit in a request.
type controlPlaneUpgradeReconciler struct {
	upgrader *targetUpgrader
}

func (r *controlPlaneUpgradeReconciler) SetupWithManager(mgr ctrl.Manager, options controller.Options, controlPlaneKinds []schema.GroupVersionKind) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Cluster{}, builder.WithPredicates(predicate.Or(predicate.AnnotationChangedPredicate{}, predicate.GenerationChangedPredicate{}))).
		Watches(&inplacev1.UpgradeTask{}, handler.EnqueueRequestsFromMapFunc(taskToControlPlaneCluster))
	for _, gvk := range controlPlaneKinds {
		b = b.WatchesMetadata(metadataOf(gvk), handler.EnqueueRequestsFromMapFunc(clustersOfControlPlane(mgr.GetClient(), gvk.GroupKind())),
			builder.WithPredicates(asksInPlaceUpgrade()))
	}
	return b.WithOptions(ctrlqueue.Options(options)).Named("inplaceupgrade-controlplane").
		Complete(reportingErrors(r, r.upgrader.Client, r.upgrader.Recorder, func() client.Object { return &clusterv1.Cluster{} }))
}

// Reconcile implements reconcile.Reconciler for the control plane of the Cluster req names.
func (r *controlPlaneUpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cluster := &clusterv1.Cluster{}
	if err := r.upgrader.Client.Get(ctx, req.NamespacedName, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("read Cluster %s: %w", req, err)
	}
	obj, err := readControlPlane(ctx, r.upgrader.Client, cluster)
	if err != nil || obj == nil {
		return ctrl.Result{}, err
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KObj(cluster)))
	return r.upgrader.reconcile(ctx, controlPlaneSubject(cluster, obj))
}

// readControlPlane reads the Cluster's control plane, of whatever kind, as unstructured (a
// live read: unstructured objects are not cached). It returns nil when the Cluster has no
// control plane, or its kind is not served, or it does not exist: the Requester says so
// when an upgrade is asked for it.
func readControlPlane(ctx context.Context, c client.Client, cluster *clusterv1.Cluster) (*unstructured.Unstructured, error) {
	ref := cluster.Spec.ControlPlaneRef
	if !ref.IsDefined() {
		return nil, nil
	}
	mapping, err := c.RESTMapper().RESTMapping(ref.GroupKind())
	if err != nil {
		if meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("find the API of control plane kind %s: %w", ref.GroupKind(), err)
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: ref.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s %s/%s: %w", ref.Kind, cluster.Namespace, ref.Name, err)
	}
	return obj, nil
}

// controlPlaneSubject is the upgrade of every machine of the Cluster's control plane. obj
// may be nil when the control plane could not be read. The Cluster's cascade asks with
// the very same request, so both find the same task.
func controlPlaneSubject(cluster *clusterv1.Cluster, obj *unstructured.Unstructured) *upgradeSubject {
	ref := cluster.Spec.ControlPlaneRef
	s := &upgradeSubject{
		name: ref.Kind + " " + ref.Name,
		request: upgraderequest.Request{
			Namespace:   cluster.Namespace,
			ClusterName: cluster.Name,
			Target: upgraderequest.Target{ControlPlaneRef: &inplacev1.ControlPlaneReference{
				APIGroup: ref.APIGroup, Kind: ref.Kind, Name: ref.Name,
			}},
		},
	}
	if obj != nil {
		s.obj = obj
	}
	return s
}

func metadataOf(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(gvk)
	return obj
}

// clustersOfControlPlane maps a control plane of kind gk to the Clusters whose
// spec.controlPlaneRef names it.
func clustersOfControlPlane(c client.Client, gk schema.GroupKind) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		clusters := &clusterv1.ClusterList{}
		if err := c.List(ctx, clusters, client.InNamespace(obj.GetNamespace())); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "list Clusters to map a control plane to its Cluster", "controlPlane", klog.KObj(obj))
			return nil
		}
		var out []reconcile.Request
		for i := range clusters.Items {
			ref := clusters.Items[i].Spec.ControlPlaneRef
			if ref.APIGroup == gk.Group && ref.Kind == gk.Kind && ref.Name == obj.GetName() {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&clusters.Items[i])})
			}
		}
		return out
	}
}

// taskToControlPlaneCluster maps a control plane's UpgradeTask to its Cluster.
func taskToControlPlaneCluster(_ context.Context, obj client.Object) []reconcile.Request {
	task, ok := obj.(*inplacev1.UpgradeTask)
	if !ok || task.Spec.ControlPlaneRef == nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: task.Namespace, Name: task.Spec.ClusterName}}}
}
