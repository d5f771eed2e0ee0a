package upgradetask

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// gateJobsNotDeletedReason is the reason of the Warning event of an ended task whose gate
// Jobs could not be deleted from its workload cluster.
const gateJobsNotDeletedReason = "GateJobsNotDeleted"

// deleteGateJobs deletes the gate Jobs of a task that ended (Completed, Failed, Aborted)
// or is deleted from its workload cluster, with their pods: the last one is kept while
// the task runs, for its message. (An aborted task's status.gates is emptied: whether it
// had Job gates is read from its spec and its Cluster.) It does so once per task in this manager's life, and
// asks to be called again later when the workload cluster could not be reached. A task
// whose Cluster's kubeconfig Secret is gone has no workload cluster left to clean.
func (r *Reconciler) deleteGateJobs(ctx context.Context, task *inplacev1.UpgradeTask) ctrl.Result {
	if r.gateResults.deletedJobs(task.UID, false) || !r.mayHaveGateJobs(ctx, task) {
		return ctrl.Result{}
	}
	policy := r.GatePolicy
	if policy == nil {
		policy = healthgate.DefaultPolicy()
	}
	ns := policy.Namespace()
	log := ctrl.LoggerFrom(ctx)
	workload, err := r.Workload.Client(ctx, types.NamespacedName{Namespace: task.Namespace, Name: task.Spec.ClusterName})
	var missing *workloadcluster.SecretNotFoundError
	if errors.As(err, &missing) {
		r.gateResults.deletedJobs(task.UID, true)
		return ctrl.Result{}
	}
	deleted := 0
	if err == nil {
		deleted, err = healthgate.DeleteJobs(ctx, workload, ns, task.Namespace, task.Name)
	}
	if err != nil && ctx.Err() != nil {
		return ctrl.Result{} // the manager stops; the next one deletes them
	}
	if err != nil {
		log.Info("the gate Jobs of the ended task could not be deleted from the workload cluster; trying again later", "namespace", ns, "error", err.Error())
		r.Recorder.Eventf(task, nil, corev1.EventTypeWarning, gateJobsNotDeletedReason, "DeleteGateJobs",
			"the gate Jobs of this task could not be deleted from namespace %s of the workload cluster: %v; they are tried again in %s, or delete the Jobs labelled %s=%s there",
			ns, err, healthgate.JobRetryAfter, healthgate.JobTaskLabel, task.Name)
		return ctrl.Result{RequeueAfter: healthgate.JobRetryAfter}
	}
	r.gateResults.deletedJobs(task.UID, true)
	if deleted > 0 {
		log.Info("deleted the gate Jobs of the ended task from the workload cluster", "namespace", ns, "jobs", deleted)
	}
	return ctrl.Result{}
}

// mayHaveGateJobs tells whether the task has, or its Cluster's annotation gives it, a Job
// gate: only then is the workload cluster asked for gate Jobs to delete.
func (r *Reconciler) mayHaveGateJobs(ctx context.Context, task *inplacev1.UpgradeTask) bool {
	for _, g := range task.Spec.Gates {
		if g.Job != nil {
			return true
		}
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: task.Namespace, Name: task.Spec.ClusterName}, cluster); err != nil {
		// A Cluster that is gone leaves no workload cluster to clean; any other error
		// asks the workload cluster.
		return !apierrors.IsNotFound(err)
	}
	gates, _ := healthgate.Merge(nil, cluster)
	for _, g := range gates {
		if g.Job != nil {
			return true
		}
	}
	return false
}
