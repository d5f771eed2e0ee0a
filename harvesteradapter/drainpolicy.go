package harvesteradapter

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// applyDrainPolicy judges, while the drain Plan runs, whether the node's drain is
// blocked: a pod the drain evicts whose eviction the API server refuses now because of a
// PodDisruptionBudget (previewPods, the rules kubectl drain and the eviction API follow).
// It keeps the NodeUpdate's DrainBlocked condition, whose last transition to True is when
// the block was first seen, and applies the NodeUpdate's drain policy:
//   - Hold (the default) waits: kubectl drain retries the refused evictions until its
//     --timeout or the drain step's timeout ends the node;
//   - Skip, once the drain has been blocked for the policy's grace period, puts the node
//     back: it returns a nodeupdater.SkipError naming the pods, and the reconciler has
//     Abort stop the drain, uncordon the node and restore what its earlier steps stopped
//     (cleanup), then ends the NodeUpdate Skipped;
//   - Evict, once the drain has been blocked for the policy's grace period, deletes the
//     blocking pods (a delete, not an eviction: the budgets are not asked), one Warning
//     event per pod; kubectl drain's next retry finds them gone and the drain ends.
//
// It returns what the drain step's message should add, empty when nothing blocks.
func (u *Updater) applyDrainPolicy(ctx context.Context, r *nodeRun) (string, error) {
	nu := r.nu
	node := nu.Spec.NodeName
	blocking, err := previewPods(ctx, r.wc, node, r.cfg.Spec.Drain, nil)
	if err != nil {
		return "", err
	}
	policy := nu.Spec.DrainPolicy
	mode, grace := policy.DrainModeOrDefault(), policy.GracePeriodOrDefault()
	cond := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition)
	if len(blocking) == 0 {
		if cond != nil && cond.Status == metav1.ConditionTrue {
			meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionFalse,
				Reason: inplacev1.DrainUnblockedReason, ObservedGeneration: nu.Generation,
				Message: fmt.Sprintf("no pod blocks the drain of node %s any more", node)})
		}
		return "", nil
	}
	names := make([]string, 0, len(blocking))
	for _, p := range blocking {
		names = append(names, fmt.Sprintf("pod %s/%s (PodDisruptionBudget %s)", p.Namespace, p.Name, p.PodDisruptionBudget))
	}
	what := strings.Join(names, ", ")
	now := time.Now()
	since := now
	if cond != nil && cond.Status == metav1.ConditionTrue {
		since = cond.LastTransitionTime.Time
	}
	if mode == inplacev1.DrainModeSkip && now.Sub(since) >= grace {
		message := fmt.Sprintf("drainPolicy Skip: the drain of node %s was blocked for more than %s by %s; the node is put back (drain stopped, uncordoned, what was stopped restored) without being upgraded",
			node, grace, what)
		meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue,
			Reason: inplacev1.NodeSkippedReason, ObservedGeneration: nu.Generation, Message: message, LastTransitionTime: metav1.NewTime(since)})
		return "", nodeupdater.Skipf("%s", message)
	}
	if mode == inplacev1.DrainModeEvict && now.Sub(since) >= grace {
		var deleted []string
		for _, p := range blocking {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
			if err := r.wc.Delete(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
				return "", fmt.Errorf("delete pod %s/%s, which blocks the drain of node %s (drainPolicy Evict): %w", p.Namespace, p.Name, node, err)
			}
			deleted = append(deleted, p.Namespace+"/"+p.Name)
			u.event(r, corev1.EventTypeWarning, inplacev1.BlockingPodsDeletedReason, "DeletePod",
				fmt.Sprintf("deleted pod %s/%s on node %s, ignoring PodDisruptionBudget %s: the drain was blocked for %s, more than the grace period %s of drainPolicy Evict (%s)",
					p.Namespace, p.Name, node, p.PodDisruptionBudget, now.Sub(since).Round(time.Second), grace, p.Reason))
		}
		message := fmt.Sprintf("drainPolicy Evict deleted %s, ignoring PodDisruptionBudgets: the drain of node %s was blocked for more than %s", strings.Join(deleted, ", "), node, grace)
		meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionFalse,
			Reason: inplacev1.BlockingPodsDeletedReason, ObservedGeneration: nu.Generation, Message: message})
		return message, nil
	}
	reason := inplacev1.DrainHeldReason
	message := fmt.Sprintf("the drain of node %s is blocked by %s; drainPolicy Hold: the node waits until they can be evicted or the drain step times out", node, what)
	switch mode {
	case inplacev1.DrainModeEvict:
		reason = inplacev1.EvictionPendingReason
		message = fmt.Sprintf("the drain of node %s is blocked by %s; drainPolicy Evict: they are deleted, their budgets ignored, at %s (gracePeriod %s after the block was seen)",
			node, what, since.Add(grace).UTC().Format(time.RFC3339), grace)
	case inplacev1.DrainModeSkip:
		reason = inplacev1.SkipPendingReason
		message = fmt.Sprintf("the drain of node %s is blocked by %s; drainPolicy Skip: unless they can be evicted by %s (gracePeriod %s after the block was seen), the node is put back and skipped",
			node, what, since.Add(grace).UTC().Format(time.RFC3339), grace)
	}
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != reason || cond.Message != message {
		if cond == nil || cond.Status != metav1.ConditionTrue {
			u.event(r, corev1.EventTypeWarning, inplacev1.DrainBlockedCondition, "Drain", message)
		}
		meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue,
			Reason: reason, ObservedGeneration: nu.Generation, Message: message, LastTransitionTime: metav1.NewTime(since)})
	}
	return message, nil
}
