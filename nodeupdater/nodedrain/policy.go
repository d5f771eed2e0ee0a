package nodedrain

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Blockage is what keeps a node from being emptied, for the NodeUpdate's drain policy:
// the pods a PodDisruptionBudget keeps on it (a drain) or, for the Harvester updater, the
// virtual machines that cannot leave it (its evacuation).
type Blockage struct {
	// Of is what is blocked: "the drain" or "the evacuation".
	Of string
	// What names the blockers.
	What string
	// Evict acts on the blockers under drainPolicy Evict, once the grace period has
	// passed, and says what it did; it says "" when it can do nothing about them, and the
	// node then holds as under Hold. Nil: nothing it may act on, the node holds at once.
	Evict func(blockedFor, grace time.Duration) (string, error)
	// Evicts says what Evict will do, for the message before the grace period ends.
	Evicts string
	// Evicted is the DrainBlocked condition's reason once Evict acted.
	Evicted string
	// CannotEvict says, when Evict can do nothing, why: what the operator must do.
	CannotEvict string
	// PutBack says how drainPolicy Skip leaves the node; empty: "the node is put back
	// (drain stopped, uncordoned, what was stopped restored) without being upgraded".
	PutBack string
}

// EventFunc records an event on the NodeUpdate.
type EventFunc func(eventType, reason, action, note string)

// ApplyPolicy keeps the NodeUpdate's DrainBlocked condition, whose last transition to
// True is when the block was first seen, and applies the NodeUpdate's drain policy to b
// (nil when nothing blocks the node):
//   - Hold (the default) waits: the step holds until the blockers go or its timeout ends
//     the node;
//   - Skip, once the node has been blocked for the policy's grace period, puts the node
//     back: it returns a nodeupdater.SkipError naming the blockers, and the reconciler
//     has the updater's Abort stop the drain and uncordon the node (and restore what its
//     earlier steps stopped), then ends the NodeUpdate Skipped;
//   - Evict, once the node has been blocked for the policy's grace period, has b.Evict
//     act on the blockers; where it cannot, the node holds as under Hold, with why.
//
// A Warning event is recorded when a block is first seen. It returns what the step's
// message should add, empty when nothing blocks.
func ApplyPolicy(nu *inplacev1.NodeUpdate, b *Blockage, event EventFunc) (string, error) {
	node := nu.Spec.NodeName
	cond := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition)
	if b == nil {
		if cond != nil && cond.Status == metav1.ConditionTrue {
			meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionFalse,
				Reason: inplacev1.DrainUnblockedReason, ObservedGeneration: nu.Generation,
				Message: fmt.Sprintf("nothing blocks the emptying of node %s any more", node)})
		}
		return "", nil
	}
	policy := nu.Spec.DrainPolicy
	mode, grace := policy.DrainModeOrDefault(), policy.GracePeriodOrDefault()
	now := time.Now()
	since := now
	if cond != nil && cond.Status == metav1.ConditionTrue {
		since = cond.LastTransitionTime.Time
	}
	due := now.Sub(since) >= grace
	if mode == inplacev1.DrainModeSkip && due {
		putBack := b.PutBack
		if putBack == "" {
			putBack = "the node is put back (drain stopped, uncordoned, what was stopped restored) without being upgraded"
		}
		message := fmt.Sprintf("drainPolicy Skip: %s of node %s was blocked for more than %s by %s; %s", b.Of, node, grace, b.What, putBack)
		meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue,
			Reason: inplacev1.NodeSkippedReason, ObservedGeneration: nu.Generation, Message: message, LastTransitionTime: metav1.NewTime(since)})
		return "", nodeupdater.Skipf("%s", message)
	}
	reason := inplacev1.DrainHeldReason
	message := fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Hold: the node waits until they go or the step times out", b.Of, node, b.What)
	switch mode {
	case inplacev1.DrainModeEvict:
		if b.Evict == nil || due {
			did := ""
			if b.Evict != nil {
				var err error
				if did, err = b.Evict(now.Sub(since), grace); err != nil {
					return "", err
				}
			}
			if did != "" {
				meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionFalse,
					Reason: b.Evicted, ObservedGeneration: nu.Generation, Message: did})
				return did, nil
			}
			message = fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Evict cannot act on it: %s; the node waits until it goes or the step times out",
				b.Of, node, b.What, b.CannotEvict)
			break
		}
		reason = inplacev1.EvictionPendingReason
		message = fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Evict: %s at %s (gracePeriod %s after the block was seen)",
			b.Of, node, b.What, b.Evicts, since.Add(grace).UTC().Format(time.RFC3339), grace)
	case inplacev1.DrainModeSkip:
		reason = inplacev1.SkipPendingReason
		message = fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Skip: unless they go by %s (gracePeriod %s after the block was seen), the node is put back and skipped",
			b.Of, node, b.What, since.Add(grace).UTC().Format(time.RFC3339), grace)
	}
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != reason || cond.Message != message {
		if (cond == nil || cond.Status != metav1.ConditionTrue) && event != nil {
			event(corev1.EventTypeWarning, inplacev1.DrainBlockedCondition, "Drain", message)
		}
		meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue,
			Reason: reason, ObservedGeneration: nu.Generation, Message: message, LastTransitionTime: metav1.NewTime(since)})
	}
	return message, nil
}

// DeleteBlocking is drainPolicy Evict acting on a drain blocked for blockedFor, more than
// grace: it deletes pods (a delete, not an eviction: their budgets are not asked), one
// Warning event each, and says what it did. The caller leaves out the pods that must never
// be deleted (Longhorn's).
func DeleteBlocking(ctx context.Context, c client.Client, node string, pods []inplacev1.PreviewPod, blockedFor, grace time.Duration, event EventFunc) (string, error) {
	var deleted []string
	for _, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		if err := c.Delete(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("delete pod %s/%s, which blocks the drain of node %s (drainPolicy Evict): %w", p.Namespace, p.Name, node, err)
		}
		deleted = append(deleted, p.Namespace+"/"+p.Name)
		budget := "its PodDisruptionBudget"
		if p.PodDisruptionBudget != "" {
			budget = "PodDisruptionBudget " + p.PodDisruptionBudget
		}
		if event != nil {
			event(corev1.EventTypeWarning, inplacev1.BlockingPodsDeletedReason, "DeletePod",
				fmt.Sprintf("deleted pod %s/%s on node %s, ignoring %s: the drain was blocked for %s, more than the grace period %s of drainPolicy Evict (%s)",
					p.Namespace, p.Name, node, budget, blockedFor.Round(time.Second), grace, p.Reason))
		}
	}
	return fmt.Sprintf("drainPolicy Evict deleted %s, ignoring PodDisruptionBudgets: the drain of node %s was blocked for more than %s", strings.Join(deleted, ", "), node, grace), nil
}
