package harvesteradapter

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// AnnotationCordonedBy is set on a node the updater cordoned, to the UID of the
// NodeUpdate that cordoned it. Only that NodeUpdate lifts the cordon (at Finish or on
// abort); a cordon without it is someone else's and is never undone.
const AnnotationCordonedBy = "harvester.inplace.cluster.x-k8s.io/cordoned-by"

// AnnotationHeld is set on a node that an ended NodeUpdate left cordoned on purpose, to
// why (rebootHold): nobody lifts that cordon but the operator, and the next NodeUpdate
// of the node names it while it is there.
const AnnotationHeld = "harvester.inplace.cluster.x-k8s.io/held"

// cordonAsOurs cordons the node and records the cordon as this NodeUpdate's, unless it is
// ours already. A node cordoned by someone else or in maintenance mode is not touched:
// held says why. The write carries the node's resourceVersion, so that a cordon set
// meanwhile by someone else is never taken over as ours; a conflict (the kubelet writes
// the node all the time) is read again and judged again.
func (u *Updater) cordonAsOurs(ctx context.Context, r *nodeRun) (held string, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := u.node(ctx, r)
		if err != nil {
			return err
		}
		if node.Annotations[AnnotationCordonedBy] == string(r.nu.UID) {
			held = ""
			return nil
		}
		if status := node.Annotations[disruption.HarvesterMaintainStatusAnnotation]; status != "" {
			held = fmt.Sprintf("holding: node %s is in Harvester maintenance mode (%s=%s); take it out of maintenance mode to let it be upgraded",
				node.Name, disruption.HarvesterMaintainStatusAnnotation, status)
			return nil
		}
		// Rancher cordons a node before it asks for its pre-drain hook: once this
		// NodeUpdate saw it ask (RancherPreDrain), the cordon is the turn's, as the
		// plan's UpgradeTurnAnnotation will say on its next pass.
		rancherTurn := nodeupdater.StepState(r.nu, StepRancherPreDrain) == inplacev1.StepStateSucceeded
		if why := node.Annotations[AnnotationHeld]; node.Spec.Unschedulable && why != "" {
			held = fmt.Sprintf("holding: node %s is held cordoned by an earlier update: %s", node.Name, why)
			return nil
		}
		if node.Spec.Unschedulable && node.Annotations[inplacev1.UpgradeTurnAnnotation] == "" && !rancherTurn {
			held = fmt.Sprintf("holding: node %s is cordoned by someone else; uncordon it to let it be upgraded", node.Name)
			return nil
		}
		held = ""
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		node.Annotations[AnnotationCordonedBy] = string(r.nu.UID)
		delete(node.Annotations, AnnotationHeld) // the operator lifted that hold
		node.Spec.Unschedulable = true
		return r.wc.Patch(ctx, node, patch)
	})
	if err != nil {
		return "", fmt.Errorf("cordon node %s: %w", r.nu.Spec.NodeName, err)
	}
	return held, nil
}

// uncordonIfOurs lifts the cordon of the node if this NodeUpdate set it, and removes the
// record of it. A cordon someone else set, before or during the upgrade (Harvester
// maintenance mode included), stays. A node that is gone has nothing to restore.
func (u *Updater) uncordonIfOurs(ctx context.Context, r *nodeRun) error {
	_, err := u.endOurCordon(ctx, r, func(node *corev1.Node) {
		// Harvester maintenance mode entered meanwhile keeps the node cordoned.
		if node.Annotations[disruption.HarvesterMaintainStatusAnnotation] == "" {
			node.Spec.Unschedulable = false
		}
	})
	if err != nil {
		return fmt.Errorf("uncordon node %s: %w", r.nu.Spec.NodeName, err)
	}
	return nil
}

// holdIfOurs leaves the node cordoned at the NodeUpdate's end, for why: the cordon stops
// being this NodeUpdate's (AnnotationCordonedBy removed) and says why it stays
// (AnnotationHeld), and an event on the NodeUpdate says it too.
func (u *Updater) holdIfOurs(ctx context.Context, r *nodeRun, why string) error {
	held, err := u.endOurCordon(ctx, r, func(node *corev1.Node) { node.Annotations[AnnotationHeld] = why })
	if err != nil {
		return fmt.Errorf("hold node %s: %w", r.nu.Spec.NodeName, err)
	}
	if held {
		u.event(r, corev1.EventTypeWarning, "NodeHeld", "Hold", why)
	}
	return nil
}

// endOurCordon removes the record that this NodeUpdate cordoned the node and applies end
// to the node in the same write, when the cordon is this NodeUpdate's; it says whether it
// was. The write carries the node's resourceVersion; a conflict is read again.
func (u *Updater) endOurCordon(ctx context.Context, r *nodeRun, end func(*corev1.Node)) (bool, error) {
	ours := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ours = false
		node := &corev1.Node{}
		if err := r.wc.Get(ctx, client.ObjectKey{Name: r.nu.Spec.NodeName}, node); err != nil {
			return client.IgnoreNotFound(err)
		}
		if node.Annotations[AnnotationCordonedBy] != string(r.nu.UID) {
			return nil
		}
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		delete(node.Annotations, AnnotationCordonedBy)
		end(node)
		if err := r.wc.Patch(ctx, node, patch); err != nil {
			return err
		}
		ours = true
		return nil
	})
	return ours, err
}
