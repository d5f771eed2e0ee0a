package cascade

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/internal/ctrlqueue"
)

// machineUpgradeReconciler carries out in-place-upgrade-to on single Machines: a
// one-machine UpgradeTask of the machine's MachineDeployment or control plane.
type machineUpgradeReconciler struct {
	upgrader *targetUpgrader
}

func (r *machineUpgradeReconciler) SetupWithManager(mgr ctrl.Manager, options controller.Options) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Machine{}, builder.WithPredicates(asksInPlaceUpgrade())).
		Watches(&inplacev1.UpgradeTask{}, handler.EnqueueRequestsFromMapFunc(taskToMachines)).
		WithOptions(ctrlqueue.Options(options)).
		Named("inplaceupgrade-machine").
		Complete(reportingErrors(r, r.upgrader.Client, r.upgrader.Recorder, func() client.Object { return &clusterv1.Machine{} }))
}

// Reconcile implements reconcile.Reconciler.
func (r *machineUpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	m := &clusterv1.Machine{}
	if err := r.upgrader.Client.Get(ctx, req.NamespacedName, m); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("read Machine %s: %w", req, err)
	}
	cur := readUpgradeAnnotations(m)
	if cur.version() == "" && cur.status != inplacev1.UpgradeStatusInProgress {
		return ctrl.Result{}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KRef(m.Namespace, m.Spec.ClusterName)))
	s, err := r.machineSubject(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.upgrader.reconcile(ctx, s)
}

// machineSubject is the upgrade of one machine, as a one-machine request for its owner:
// the MachineDeployment of its MachineSet, or its control plane.
func (r *machineUpgradeReconciler) machineSubject(ctx context.Context, m *clusterv1.Machine) (*upgradeSubject, error) {
	s := &upgradeSubject{
		obj:     m,
		name:    "Machine " + m.Name,
		request: upgraderequest.Request{Namespace: m.Namespace, ClusterName: m.Spec.ClusterName, Machines: []string{m.Name}},
	}
	owner := metav1.GetControllerOf(m)
	if owner == nil {
		s.problem = fmt.Sprintf("machine %s has no controller: only machines of a control plane or of a MachineDeployment are upgraded in place", m.Name)
		return s, nil
	}
	gv, err := schema.ParseGroupVersion(owner.APIVersion)
	if err != nil {
		s.problem = fmt.Sprintf("machine %s has a controller with an invalid apiVersion %q", m.Name, owner.APIVersion)
		return s, nil
	}
	if owner.Kind != "MachineSet" || gv.Group != clusterv1.GroupVersion.Group {
		// The Requester checks that this is the Cluster's control plane.
		s.request.Target = upgraderequest.Target{ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: gv.Group, Kind: owner.Kind, Name: owner.Name}}
		return s, nil
	}
	ms := &clusterv1.MachineSet{}
	if err := r.upgrader.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: owner.Name}, ms); err != nil {
		if apierrors.IsNotFound(err) {
			s.problem = fmt.Sprintf("machine %s belongs to MachineSet %s, which does not exist", m.Name, owner.Name)
			return s, nil
		}
		return nil, fmt.Errorf("read MachineSet %s/%s of machine %s: %w", m.Namespace, owner.Name, m.Name, err)
	}
	md := metav1.GetControllerOf(ms)
	if md == nil || md.Kind != "MachineDeployment" {
		s.problem = fmt.Sprintf("machine %s belongs to MachineSet %s, which no MachineDeployment owns: only machines of a control plane or of a MachineDeployment are upgraded in place", m.Name, ms.Name)
		return s, nil
	}
	s.request.Target = upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: md.Name}}
	return s, nil
}

// taskToMachines maps a one-machine UpgradeTask to its machine.
func taskToMachines(_ context.Context, obj client.Object) []reconcile.Request {
	task, ok := obj.(*inplacev1.UpgradeTask)
	if !ok || len(task.Spec.Machines) != 1 {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: task.Namespace, Name: task.Spec.Machines[0]}}}
}
