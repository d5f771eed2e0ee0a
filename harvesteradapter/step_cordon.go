package harvesteradapter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
)

// cordonStep takes the node out of scheduling, once, before its virtual machines are
// evacuated and it is drained.
var cordonStep = step{
	name: StepCordon,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.Drain, harvesterv1.DefaultDrainTimeout)
	},
	skip: func(_ *Updater, _ context.Context, r *nodeRun) (string, error) {
		if singleNode(r) {
			return singleNodeSkip, nil
		}
		return "", nil
	},
	run: (*Updater).runCordon,
}

// runCordon cordons the node itself and records that the cordon is its own (cordon.go).
// The Plans neither cordon nor drain, so SUC never uncordons the node between them
// (shared/facts/suc.md, fact 46): the node stays cordoned until Finish. A node cordoned
// by someone else, or in Harvester maintenance mode, is held: the operator is doing
// something with it (the same rule as the NodeSchedulable preflight check, which keeps
// such a node from being picked).
//
// Before the node is touched it is judged again, as it was when it was picked, possibly
// long before (a NodeUpdate waits for its cluster's UpgradePlan to finish the cluster
// step, which upgrades Longhorn): no other upgrader runs on the cluster
// (noOtherUpgrade), and its storage lets it go (storageSettled). Once the node is
// cordoned as ours (a run that resumes), it was judged already.
func (u *Updater) runCordon(ctx context.Context, r *nodeRun) (bool, string, error) {
	if !u.cordonedAsOurs(ctx, r) {
		for _, fresh := range []func(context.Context, *nodeRun) (string, error){u.noOtherUpgrade, u.storageSettled} {
			if held, err := fresh(ctx, r); err != nil || held != "" {
				return false, held, err
			}
		}
	}
	held, err := u.cordonAsOurs(ctx, r)
	if err != nil || held != "" {
		return false, held, err
	}
	return true, fmt.Sprintf("node %s is cordoned", r.nu.Spec.NodeName), nil
}

// cordonedAsOurs reports whether the node carries this NodeUpdate's cordon.
func (u *Updater) cordonedAsOurs(ctx context.Context, r *nodeRun) bool {
	node, err := u.node(ctx, r)
	return err == nil && node.Annotations[AnnotationCordonedBy] == string(r.nu.UID)
}

// noOtherUpgrade says why the node may not be touched while Harvester's own upgrade or
// upgrade-toolkit's runs on the cluster (clusterchecks.OtherUpgrades), "" when none
// does: two upgraders would each take nodes down within their own budget, not within
// one.
func (u *Updater) noOtherUpgrade(ctx context.Context, r *nodeRun) (string, error) {
	others, err := clusterchecks.OtherUpgrades(ctx, r.wc)
	if err != nil {
		return "", err
	}
	if hold := clusterchecks.OtherUpgradeHold(others); hold != "" {
		return fmt.Sprintf("holding node %s before it is cordoned: %s", r.nu.Spec.NodeName, hold), nil
	}
	return "", nil
}

// freshStorageChecks are the Longhorn preflight checks storageSettled asks again: the
// volumes' health and the replicas left outside the nodes down together. The v2 data
// engine's own holds are the LonghornDataEngine step's.
var freshStorageChecks = []string{longhorn.CheckLonghornVolumesHealthy, longhorn.CheckLonghornV1ReplicaElsewhere, longhorn.CheckLonghornV2ReplicaElsewhere}

// storageSettled says why the node may not be touched yet as far as Longhorn goes, ""
// when it may: Harvester's pre-drain waits, right before it evacuates and drains each
// node, until a full pass over the running engines finds every volume healthy
// (wait_longhorn_engines, harvester-release-steps.md fact 45; the node sheet's fact 36),
// and so does this, with the preflight's own Longhorn checks (longhorn.State.Checks) of
// the volumes' health and of the replicas left outside the nodes that are down together:
// this node and every other node of the cluster (the UpgradePlan's nodes) that is not
// Ready or is cordoned now. Nothing to judge on a cluster without Longhorn.
func (u *Updater) storageSettled(ctx context.Context, r *nodeRun) (string, error) {
	served, err := kube.KindServed(r.wc, schema.GroupKind{Group: "longhorn.io", Kind: "Volume"}, "v1beta2")
	if err != nil || !served {
		return "", err
	}
	state, err := longhorn.Read(ctx, r.wc)
	if err != nil {
		return "", err
	}
	// The cluster's nodes, as its UpgradePlan covers them (spec.nodeSelector).
	var opts []client.ListOption
	if r.plan != nil && r.plan.Spec.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(r.plan.Spec.NodeSelector)
		if err != nil {
			return "", fmt.Errorf("the UpgradePlan's spec.nodeSelector: %w", err)
		}
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	nodes := &corev1.NodeList{}
	if err := r.wc.List(ctx, nodes, opts...); err != nil {
		return "", fmt.Errorf("list the nodes: %w", err)
	}
	var down []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Name != r.nu.Spec.NodeName && (n.Spec.Unschedulable || !kube.NodeReady(n)) {
			down = append(down, n.Name)
		}
	}
	var held []string
	for _, c := range state.Checks(longhorn.DownSet{Candidate: r.nu.Spec.NodeName, Disrupted: down}, longhorn.LiveUpgrade{}, true) {
		if !c.Passed && slices.Contains(freshStorageChecks, c.Name) {
			held = append(held, fmt.Sprintf("%s: %s", c.Name, c.Message))
		}
	}
	if len(held) == 0 {
		return "", nil
	}
	return fmt.Sprintf("holding node %s before it is cordoned: Longhorn's volumes are judged again right before each node is taken down, as Harvester's pre-drain does (wait_longhorn_engines): %s",
		r.nu.Spec.NodeName, strings.Join(held, "; ")), nil
}
