package harvesteradapter

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/controllers/disruption"
)

// AnnotationCordonedBy is set on a node the updater cordoned, to the UID of the
// NodeUpdate that cordoned it. Only that NodeUpdate lifts the cordon (at Finish or on
// abort); a cordon without it is someone else's and is never undone.
const AnnotationCordonedBy = "harvester.inplace.cluster.x-k8s.io/cordoned-by"

// runDrain takes the node out of service once, before its first disruptive step: the
// updater cordons it itself and records that the cordon is its own, then the drain Plan
// evacuates the virtual machines and drains it. The later Plans neither cordon nor
// drain, so SUC never uncordons the node between them (shared/facts/suc.md, fact 46);
// the node stays cordoned until Finish. A node cordoned by someone else, or in Harvester
// maintenance mode, is held: the operator is doing something with it (the same rule as
// the NodeSchedulable preflight check, which keeps such a node from being picked).
func (u *Updater) runDrain(ctx context.Context, r *nodeRun) (bool, string, error) {
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	ours := node.Annotations[AnnotationCordonedBy] == string(r.nu.UID)
	if !ours {
		if status := node.Annotations[disruption.HarvesterMaintainStatusAnnotation]; status != "" {
			return false, fmt.Sprintf("holding: node %s is in Harvester maintenance mode (%s=%s); take it out of maintenance mode to let it be upgraded",
				node.Name, disruption.HarvesterMaintainStatusAnnotation, status), nil
		}
		if node.Spec.Unschedulable {
			return false, fmt.Sprintf("holding: node %s is cordoned by someone else; uncordon it to let it be upgraded", node.Name), nil
		}
		// The optimistic lock keeps a cordon set meanwhile by someone else from being
		// taken over as ours.
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		node.Annotations[AnnotationCordonedBy] = string(r.nu.UID)
		node.Spec.Unschedulable = true
		if err := r.wc.Patch(ctx, node, patch); err != nil {
			return false, "", fmt.Errorf("cordon node %s: %w", node.Name, err)
		}
	}
	done, message, err := u.applyPlan(ctx, r, planDrain)
	if err != nil || !done {
		return done, message, err
	}
	if drainArgs(r.cfg.Spec.Drain, node.Name) == nil {
		return true, fmt.Sprintf("node %s is cordoned and its virtual machines evacuated (drain is off)", node.Name), nil
	}
	return true, fmt.Sprintf("node %s is cordoned, its virtual machines evacuated and its pods drained", node.Name), nil
}

// uncordonIfOurs lifts the cordon of the node if this NodeUpdate set it, and removes the
// record of it. A cordon someone else set, before or during the upgrade (Harvester
// maintenance mode included), stays. A node that is gone has nothing to restore.
func (u *Updater) uncordonIfOurs(ctx context.Context, r *nodeRun) error {
	node := &corev1.Node{}
	if err := r.wc.Get(ctx, client.ObjectKey{Name: r.nu.Spec.NodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get node %s: %w", r.nu.Spec.NodeName, err)
	}
	if node.Annotations[AnnotationCordonedBy] != string(r.nu.UID) {
		return nil
	}
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(node.Annotations, AnnotationCordonedBy)
	// Harvester maintenance mode entered meanwhile keeps the node cordoned.
	if node.Annotations[disruption.HarvesterMaintainStatusAnnotation] == "" {
		node.Spec.Unschedulable = false
	}
	if err := r.wc.Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("uncordon node %s: %w", node.Name, err)
	}
	return nil
}
