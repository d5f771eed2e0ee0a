package upgradetask

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/faults"
)

// reportingErrors is the reconciler the controller runs: r, whose returned errors (a
// NodeUpdate of another owner in the way, a write the API server refuses) become a
// Warning event ReconcileError on the task and its Ready condition, not only a log line.
func (r *Reconciler) reportingErrors() reconcile.Reconciler {
	return faults.ErrorReporter{
		Reconciler: r,
		Client:     r.Client,
		Reader:     r.APIReader,
		NewObject:  func() client.Object { return &inplacev1.UpgradeTask{} },
		Recorder:   r.Recorder,
		Conditions: func(obj client.Object) *[]metav1.Condition {
			task, ok := obj.(*inplacev1.UpgradeTask)
			if !ok || (task.Status.Phase.IsFinal() && task.Status.Phase != inplacev1.TaskPhasePlanned) {
				return nil
			}
			return &task.Status.Conditions
		},
	}
}
