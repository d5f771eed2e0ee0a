package sim

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// The Cluster API Cluster fleet-local/local that Rancher generates for the local cluster
// from the provisioning Cluster (harvester-release-steps.md facts 64 to 66; rancher
// pkg/controllers/provisioningv2/provisioningcluster/template.go capiCluster: the
// control plane an RKEControlPlane, the infrastructure an RKECluster, both
// rke.cattle.io, owned by the provisioning Cluster), and what Cluster API's cluster
// controller, embedded in Rancher up to v2.13 and Rancher Turtles' from v2.14 on, writes
// in its status (sigs.k8s.io/cluster-api core/reconcilers/cluster: setPhase in
// cluster_controller_status.go, Provisioned once the infrastructure is provisioned and
// the control plane endpoint is set, else Provisioning; status.observedGeneration set
// to the generation after a reconcile that succeeded, cluster_controller.go Reconcile).
// The release's wait_capi_cluster waits on it (facts 16.3, 16.14 and 40).

// CAPIRenderedByAnnotation records, on the simulated Cluster API Cluster, the Rancher
// version whose generating handler last wrote its spec: the simulator's own bookkeeping,
// standing for wrangler's objectset annotations that Rancher's apply writes.
const CAPIRenderedByAnnotation = "sim.inplace.cluster.x-k8s.io/rendered-by-rancher"

// capiClusterKey is the Cluster API Cluster Rancher generates for the local cluster.
var capiClusterKey = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}

// seedCAPICluster creates the Cluster API Cluster fleet-local/local as Rancher at
// rancherVersion generated it and Cluster API left it: Provisioned at its generation.
func seedCAPICluster(ctx context.Context, c client.Client, rancherVersion string) error {
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: capiClusterKey.Namespace, Name: capiClusterKey.Name,
			Annotations: map[string]string{CAPIRenderedByAnnotation: rancherVersion},
		},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: "rke.cattle.io", Kind: "RKEControlPlane", Name: rancher.LocalCluster},
			InfrastructureRef:    clusterv1.ContractVersionedObjectReference{APIGroup: "rke.cattle.io", Kind: "RKECluster", Name: rancher.LocalCluster},
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "127.0.0.1", Port: 6443},
		},
	}
	if err := recreate(ctx, c, cl); err != nil {
		return err
	}
	reconcileCAPIClusterStatus(cl, true)
	if err := c.Status().Update(ctx, cl); err != nil {
		return fmt.Errorf("seed the status of the Cluster API Cluster %s: %w", capiClusterKey, err)
	}
	return nil
}

// reconcileCAPIClusterStatus writes what Cluster API's cluster controller writes after a
// reconcile that succeeded: the phase from the infrastructure (setPhase) and the
// generation it saw.
func reconcileCAPIClusterStatus(cl *clusterv1.Cluster, infrastructureProvisioned bool) {
	cl.Status.Initialization.InfrastructureProvisioned = ptr.To(infrastructureProvisioned)
	cl.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	cl.Status.Phase = string(clusterv1.ClusterPhaseProvisioning)
	if infrastructureProvisioned && cl.Spec.ControlPlaneEndpoint.IsValid() {
		cl.Status.Phase = string(clusterv1.ClusterPhaseProvisioned)
	}
	cl.Status.ObservedGeneration = cl.Generation
}

// rendersNewCAPISpec says whether Rancher starting at to, after from wrote the Cluster
// API Cluster, writes it with a spec that differs, so that its generation advances:
// *(inferred)* from Harvester's scripts before v1.8.1, whose wait_capi_cluster after
// Rancher's upgrade waits for status.observedGeneration to pass the one seen before it
// (umanif.sh@v1.7.3, @v1.8.0) and which shipped with Rancher up to v2.14.0 (embedded
// Cluster API up to v2.13, the takeover by Rancher Turtles at v2.14), and from harvester
// PR #10672 (issue #10719): once Rancher Turtles owns Cluster API (Rancher v2.14, Harvester
// v1.8.0), a Rancher upgrade "legitimately does not mutate" the Cluster and the old wait
// hangs. What exactly differs in the spec was not established: the simulator stands for it
// with spec.clusterNetwork.serviceDomain (see renderCAPICluster).
func rendersNewCAPISpec(from, to string) bool {
	if from == to {
		return false
	}
	f, err := version.ParseGeneric(from)
	if err != nil {
		return true
	}
	return f.LessThan(version.MajorMinor(2, 14))
}

// SetCAPIInfrastructureProvisioned makes the local cluster's infrastructure (Rancher's
// RKECluster) provisioned or not, as Cluster API's cluster controller reads it: while not,
// the Cluster API Cluster is Provisioning (setPhase).
func (r *Rancher) SetCAPIInfrastructureProvisioned(provisioned bool) {
	r.mu.Lock()
	r.capiInfrastructureDown = !provisioned
	r.mu.Unlock()
	r.loop.wake()
}

// CAPIGenerations are the generations the simulated Rancher gave the Cluster API Cluster
// when it wrote its spec again, in order.
func (r *Rancher) CAPIGenerations() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.capiRendered...)
}

// renderCAPICluster is Rancher running at rancherVersion applying the Cluster API Cluster
// it generates: when that Rancher writes another spec than the one that wrote it last
// (rendersNewCAPISpec), the spec changes and the generation advances; Cluster API then
// observes it after CAPIReconcileDelay (capiClusterStatus).
func (r *Rancher) renderCAPICluster(ctx context.Context, rancherVersion string) error {
	cl := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, capiClusterKey, cl); err != nil {
		return ignoreMissing(err)
	}
	from := cl.Annotations[CAPIRenderedByAnnotation]
	if from == rancherVersion {
		return nil
	}
	patched := cl.DeepCopy()
	if patched.Annotations == nil {
		patched.Annotations = map[string]string{}
	}
	patched.Annotations[CAPIRenderedByAnnotation] = rancherVersion
	if rendersNewCAPISpec(from, rancherVersion) {
		// The stand-in for what the new Rancher's template changes (see rendersNewCAPISpec).
		if patched.Spec.ClusterNetwork.ServiceDomain == "" {
			patched.Spec.ClusterNetwork.ServiceDomain = "cluster.local"
		} else {
			patched.Spec.ClusterNetwork.ServiceDomain = ""
		}
	}
	if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(cl, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(err)
	}
	if patched.Generation != cl.Generation {
		r.mu.Lock()
		r.capiRendered = append(r.capiRendered, patched.Generation)
		r.mu.Unlock()
	}
	return nil
}

// capiClusterStatus is Cluster API's cluster controller: a generation it has not
// observed, or an infrastructure whose state changed, is reconciled after
// CAPIReconcileDelay, the phase following the infrastructure (setPhase).
func (r *Rancher) capiClusterStatus(ctx context.Context) error {
	cl := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, capiClusterKey, cl); err != nil {
		return ignoreMissing(err)
	}
	r.mu.Lock()
	provisioned := !r.capiInfrastructureDown
	r.mu.Unlock()
	want := cl.DeepCopy()
	reconcileCAPIClusterStatus(want, provisioned)
	if want.Status.Phase == cl.Status.Phase && want.Status.ObservedGeneration == cl.Status.ObservedGeneration {
		return nil
	}
	if !r.due(fmt.Sprintf("capicluster/%s/%d/%t", cl.UID, cl.Generation, provisioned), orDefault(r.CAPIReconcileDelay, 100*time.Millisecond)) {
		return nil
	}
	if err := r.Client.Status().Update(ctx, want); err != nil {
		return client.IgnoreNotFound(err)
	}
	if want.Status.ObservedGeneration != cl.Status.ObservedGeneration {
		r.mu.Lock()
		if r.capiObserved == nil {
			r.capiObserved = map[int64]time.Time{}
		}
		r.capiObserved[want.Status.ObservedGeneration] = time.Now()
		r.mu.Unlock()
	}
	return nil
}

// CAPIObservedAt is when Cluster API observed the generation of the Cluster API Cluster,
// zero if it has not (since the simulator started).
func (r *Rancher) CAPIObservedAt(generation int64) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.capiObserved[generation]
}

// ignoreMissing ignores a missing object and a missing kind (a workload cluster without
// Cluster API's CRDs).
func ignoreMissing(err error) error {
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	return err
}
