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

	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// blockage is what keeps a node from being emptied, for the drain policy: the pods a
// PodDisruptionBudget keeps on it (the drain) or the virtual machines that cannot leave
// it (the evacuation).
type blockage struct {
	// of is what is blocked: "the drain" or "the evacuation".
	of string
	// what names the blockers.
	what string
	// evict acts on the blockers under drainPolicy Evict, once the grace period has
	// passed, and says what it did; it says "" when it can do nothing about them, and the
	// node then holds as under Hold. Nil: nothing it may act on, the node holds at once.
	evict func(blockedFor, grace time.Duration) (string, error)
	// evicts says what evict will do, for the message before the grace period ends.
	evicts string
	// evicted is the DrainBlocked condition's reason once evict acted.
	evicted string
	// cannotEvict says, when evict can do nothing, why: what the operator must do.
	cannotEvict string
}

// applyDrainPolicy judges, while the drain Plan runs, whether the node's drain is
// blocked: a pod the drain evicts whose eviction the API server refuses now because of a
// PodDisruptionBudget (previewPods, the rules kubectl drain and the eviction API follow),
// and applies the NodeUpdate's drain policy to it (applyBlockPolicy). Under Evict the
// blocking pods are deleted (a delete, not an eviction: the budgets are not asked), one
// Warning event per pod; kubectl drain's next retry finds them gone and the drain ends.
// Longhorn's pods are never deleted (longhornHold): Longhorn keeps an instance manager's
// budget exactly while deleting its pod would crash attached volumes or lose the only
// good copy of a volume's data, so the node holds, with Longhorn's reason, as under Hold.
//
// It returns what the drain step's message should add, empty when nothing blocks.
func (u *Updater) applyDrainPolicy(ctx context.Context, r *nodeRun) (string, error) {
	node := r.nu.Spec.NodeName
	blocking, err := blockingPods(ctx, r.wc, node, r.cfg.Spec.Drain, nil)
	if err != nil {
		return "", err
	}
	if len(blocking) == 0 {
		return u.applyBlockPolicy(r, nil)
	}
	names := make([]string, 0, len(blocking))
	var deletable []blockingPod
	var kept []string
	for _, p := range blocking {
		names = append(names, fmt.Sprintf("pod %s/%s (PodDisruptionBudget %s)", p.Namespace, p.Name, p.PodDisruptionBudget))
		if p.longhorn {
			kept = append(kept, p.Namespace+"/"+p.Name)
		} else {
			deletable = append(deletable, p)
		}
	}
	b := &blockage{of: "the drain", what: strings.Join(names, ", "), evicts: "they are deleted, their budgets ignored",
		evicted: inplacev1.BlockingPodsDeletedReason}
	if len(kept) > 0 {
		if b.cannotEvict, err = longhornHold(ctx, r.wc, node, kept); err != nil {
			return "", err
		}
		b.evicts = "the pods other than Longhorn's are deleted, their budgets ignored (Longhorn's never are)"
	}
	if len(deletable) == 0 {
		return u.applyBlockPolicy(r, b) // nothing Evict may delete: the node holds at once
	}
	b.evict = func(blockedFor, grace time.Duration) (string, error) {
		var deleted []string
		for _, p := range deletable {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
			if err := r.wc.Delete(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
				return "", fmt.Errorf("delete pod %s/%s, which blocks the drain of node %s (drainPolicy Evict): %w", p.Namespace, p.Name, node, err)
			}
			deleted = append(deleted, p.Namespace+"/"+p.Name)
			u.event(r, corev1.EventTypeWarning, inplacev1.BlockingPodsDeletedReason, "DeletePod",
				fmt.Sprintf("deleted pod %s/%s on node %s, ignoring PodDisruptionBudget %s: the drain was blocked for %s, more than the grace period %s of drainPolicy Evict (%s)",
					p.Namespace, p.Name, node, p.PodDisruptionBudget, blockedFor.Round(time.Second), grace, p.Reason))
		}
		did := fmt.Sprintf("drainPolicy Evict deleted %s, ignoring PodDisruptionBudgets: the drain of node %s was blocked for more than %s", strings.Join(deleted, ", "), node, grace)
		if len(kept) > 0 {
			did += "; " + b.cannotEvict
		}
		return did, nil
	}
	return u.applyBlockPolicy(r, b)
}

// longhornHold says why drainPolicy Evict leaves Longhorn's blocking pods kept on node,
// with Longhorn's own reason for its budgets there (longhorn.State.BudgetKeptBy), and
// what lifts the hold.
func longhornHold(ctx context.Context, wc client.Client, node string, kept []string) (string, error) {
	why := ""
	state, err := longhorn.Read(ctx, wc)
	switch {
	case err == nil:
		if reasons := state.BudgetKeptBy(node); len(reasons) > 0 {
			why = "; Longhorn keeps them now because " + strings.Join(reasons, ", ")
		}
	case !meta.IsNoMatchError(err):
		return "", err
	}
	return fmt.Sprintf("drainPolicy Evict never deletes Longhorn's pods (%s): Longhorn keeps an instance manager's PodDisruptionBudget while a volume is attached with its engine on the node or has its only healthy replicas there, and deleting the pod would crash those volumes or lose that data (longhorn-manager syncInstanceManagerPDB, canDeleteInstanceManagerPDB)%s; once those volumes are detached or their replicas rebuilt on other nodes, Longhorn deletes the budget and the drain goes on",
		strings.Join(kept, ", "), why), nil
}

// applyBlockPolicy keeps the NodeUpdate's DrainBlocked condition, whose last transition
// to True is when the block was first seen, and applies the NodeUpdate's drain policy to
// b (nil when nothing blocks the node):
//   - Hold (the default) waits: the step holds until the blockers go or its timeout ends
//     the node;
//   - Skip, once the node has been blocked for the policy's grace period, puts the node
//     back: it returns a nodeupdater.SkipError naming the blockers, and the reconciler
//     has Abort stop the drain, uncordon the node and restore what its earlier steps
//     stopped (cleanup), then ends the NodeUpdate Skipped;
//   - Evict, once the node has been blocked for the policy's grace period, has b.evict
//     act on the blockers; where it cannot, the node holds as under Hold, with why.
//
// The condition spans the node's evacuation and its drain: a node whose VMs could not
// leave and then whose pods cannot be evicted has been blocked since the first.
//
// It returns what the step's message should add, empty when nothing blocks.
func (u *Updater) applyBlockPolicy(r *nodeRun, b *blockage) (string, error) {
	nu := r.nu
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
		message := fmt.Sprintf("drainPolicy Skip: %s of node %s was blocked for more than %s by %s; the node is put back (drain stopped, uncordoned, what was stopped restored) without being upgraded",
			b.of, node, grace, b.what)
		meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue,
			Reason: inplacev1.NodeSkippedReason, ObservedGeneration: nu.Generation, Message: message, LastTransitionTime: metav1.NewTime(since)})
		return "", nodeupdater.Skipf("%s", message)
	}
	reason := inplacev1.DrainHeldReason
	message := fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Hold: the node waits until they go or the step times out", b.of, node, b.what)
	switch mode {
	case inplacev1.DrainModeEvict:
		if b.evict == nil || due {
			did := ""
			if b.evict != nil {
				var err error
				if did, err = b.evict(now.Sub(since), grace); err != nil {
					return "", err
				}
			}
			if did != "" {
				meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionFalse,
					Reason: b.evicted, ObservedGeneration: nu.Generation, Message: did})
				return did, nil
			}
			message = fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Evict cannot act on it: %s; the node waits until it goes or the step times out",
				b.of, node, b.what, b.cannotEvict)
			break
		}
		reason = inplacev1.EvictionPendingReason
		message = fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Evict: %s at %s (gracePeriod %s after the block was seen)",
			b.of, node, b.what, b.evicts, since.Add(grace).UTC().Format(time.RFC3339), grace)
	case inplacev1.DrainModeSkip:
		reason = inplacev1.SkipPendingReason
		message = fmt.Sprintf("%s of node %s is blocked by %s; drainPolicy Skip: unless they go by %s (gracePeriod %s after the block was seen), the node is put back and skipped",
			b.of, node, b.what, since.Add(grace).UTC().Format(time.RFC3339), grace)
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
