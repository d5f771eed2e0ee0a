package upgraderequest

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// HandOver adds a machine that Cluster API chose to an externally paced task's
// spec.machines, so that the task controller upgrades it, and returns the task as last
// read. A machine already listed changes nothing. A conflict with a concurrent writer (the
// task controller, another machine's hand-over) is resolved by reading the task again.
func (r *Requester) HandOver(ctx context.Context, namespace, taskName, machine string) (*inplacev1.UpgradeTask, error) {
	task := &inplacev1.UpgradeTask{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := r.taskReader().Get(ctx, client.ObjectKey{Namespace: namespace, Name: taskName}, task); err != nil {
			return err
		}
		if task.Spec.Pacing != inplacev1.PacingExternal {
			return fmt.Errorf("the UpgradeTask %s/%s is paced by capi-inplace (spec.pacing %s); machines are handed only to externally paced tasks", namespace, taskName, task.Spec.Pacing)
		}
		if slices.Contains(task.Spec.Machines, machine) {
			return nil
		}
		task.Spec.Machines = append(task.Spec.Machines, machine)
		slices.Sort(task.Spec.Machines)
		// Update, not a merge patch: the resourceVersion makes a concurrent hand-over
		// conflict instead of overwriting the other machine.
		return r.Client.Update(ctx, task)
	})
	if err != nil {
		return nil, fmt.Errorf("hand machine %s to UpgradeTask %s/%s: %w", machine, namespace, taskName, err)
	}
	ctrl.LoggerFrom(ctx).V(2).Info("machine handed over", "upgradeTask", taskName, "machine", machine)
	return task, nil
}
