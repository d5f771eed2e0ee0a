package harvesteradapter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
)

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
	b := &nodedrain.Blockage{Of: "the drain", What: strings.Join(names, ", "), Evicts: "they are deleted, their budgets ignored",
		Evicted: inplacev1.BlockingPodsDeletedReason}
	if len(kept) > 0 {
		if b.CannotEvict, err = longhornHold(ctx, r.wc, node, kept); err != nil {
			return "", err
		}
		b.Evicts = "the pods other than Longhorn's are deleted, their budgets ignored (Longhorn's never are)"
	}
	if len(deletable) == 0 {
		return u.applyBlockPolicy(r, b) // nothing Evict may delete: the node holds at once
	}
	b.Evict = func(blockedFor, grace time.Duration) (string, error) {
		pods := make([]inplacev1.PreviewPod, len(deletable))
		for i, p := range deletable {
			pods[i] = p.PreviewPod
		}
		did, err := nodedrain.DeleteBlocking(ctx, r.wc, node, pods, blockedFor, grace,
			func(eventType, reason, action, note string) { u.event(r, eventType, reason, action, note) })
		if err != nil {
			return "", err
		}
		if len(kept) > 0 {
			did += "; " + b.CannotEvict
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

// applyBlockPolicy applies the NodeUpdate's drain policy to b (nil when nothing blocks
// the node), as every updater that drains does (nodedrain.ApplyPolicy: Hold waits, Skip
// puts the node back once blocked for the grace period, Evict acts on the blockers then).
// The DrainBlocked condition spans the node's evacuation and its drain: a node whose VMs
// could not leave and then whose pods cannot be evicted has been blocked since the first.
//
// It returns what the step's message should add, empty when nothing blocks.
func (u *Updater) applyBlockPolicy(r *nodeRun, b *nodedrain.Blockage) (string, error) {
	return nodedrain.ApplyPolicy(r.nu, b, func(eventType, reason, action, note string) { u.event(r, eventType, reason, action, note) })
}
