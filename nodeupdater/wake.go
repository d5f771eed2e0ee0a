package nodeupdater

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// wakeBuffer is how many wakes wait for the controller before more are dropped (the
// poll finds what a dropped wake would have).
const wakeBuffer = 256

// Wake asks for a reconcile, now, of the running NodeUpdates of a Cluster's workload node:
// something an updater may wait for changed on the node (System Upgrade Controller
// labelled it when a Plan ended, it was cordoned, it became Ready after its reboot), and
// the updater need not wait for its next poll to see it. A retry that is not due yet
// still waits (NextRetryTime). Wake never blocks: it is called from watches, and a wake
// that finds the queue full is dropped. It does nothing before SetupWithManager.
func (r *Reconciler) Wake(cluster types.NamespacedName, node string) {
	if r.wakes == nil {
		return
	}
	list := &inplacev1.NodeUpdateList{}
	if err := r.Client.List(context.Background(), list, client.InNamespace(cluster.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.Log.WithName("nodeupdate").V(4).Info("No wake: listing NodeUpdates failed", "cluster", cluster, "node", node, "error", err.Error())
		return
	}
	for i := range list.Items {
		nu := &list.Items[i]
		if nu.Spec.NodeName != node || nu.Spec.ClusterName != cluster.Name || nu.Status.Phase.IsFinal() {
			continue
		}
		select {
		case r.wakes <- event.TypedGenericEvent[*inplacev1.NodeUpdate]{Object: &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: nu.Namespace, Name: nu.Name}}}:
		default:
		}
	}
}
