package cascade

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinedeployments,verbs=get;list;watch;patch

// machineDeploymentUpgradeReconciler carries out in-place-upgrade-to on MachineDeployments:
// one UpgradeTask upgrades the machines of the MachineDeployment's MachineSets.
type machineDeploymentUpgradeReconciler struct {
	upgrader *targetUpgrader
}

func (r *machineDeploymentUpgradeReconciler) SetupWithManager(mgr ctrl.Manager, options controller.Options) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.MachineDeployment{}, builder.WithPredicates(asksInPlaceUpgrade())).
		Watches(&inplacev1.UpgradeTask{}, handler.EnqueueRequestsFromMapFunc(taskToMachineDeployment)).
		WithOptions(ctrlqueue.Options(options)).
		Named("inplaceupgrade-machinedeployment").
		Complete(reportingErrors(r, r.upgrader.Client, r.upgrader.Recorder, func() client.Object { return &clusterv1.MachineDeployment{} }))
}

// Reconcile implements reconcile.Reconciler.
func (r *machineDeploymentUpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	md := &clusterv1.MachineDeployment{}
	if err := r.upgrader.Client.Get(ctx, req.NamespacedName, md); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("read MachineDeployment %s: %w", req, err)
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KRef(md.Namespace, md.Spec.ClusterName)))
	return r.upgrader.reconcile(ctx, machineDeploymentSubject(md))
}

// machineDeploymentSubject is the upgrade of every machine of a MachineDeployment. The
// Cluster's cascade asks with the very same request, so both find the same task.
func machineDeploymentSubject(md *clusterv1.MachineDeployment) *upgradeSubject {
	return &upgradeSubject{
		obj:  md,
		name: "MachineDeployment " + md.Name,
		request: upgraderequest.Request{
			Namespace:   md.Namespace,
			ClusterName: md.Spec.ClusterName,
			Target:      upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: md.Name}},
		},
	}
}

// taskToMachineDeployment maps an UpgradeTask to the MachineDeployment it upgrades.
func taskToMachineDeployment(_ context.Context, obj client.Object) []reconcile.Request {
	task, ok := obj.(*inplacev1.UpgradeTask)
	if !ok || task.Spec.MachineDeploymentRef == nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: task.Namespace, Name: task.Spec.MachineDeploymentRef.Name}}}
}

// asksInPlaceUpgrade passes objects that carry in-place-upgrade-to, or whose asked upgrade
// is in progress (so that removing in-place-upgrade-to is seen).
func asksInPlaceUpgrade() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(obj client.Object) bool {
		a := readUpgradeAnnotations(obj)
		return a.version() != "" || a.status == inplacev1.UpgradeStatusInProgress
	})
}
