package harvesteradapter

import "context"

// WIP: replaced in the next commits by the merged cluster upgrade Job (helper branch
// wt-a) and preflight checks (wt-b). Not a product: the phase below does nothing.
func (r *PlanReconciler) upgradeCluster(ctx context.Context, pr *PlanRun) (bool, string, error) {
	return true, "WIP: not implemented in this commit", nil
}
