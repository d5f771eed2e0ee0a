package kubevirt

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// Where an evacuated VM may land. The UpgradeTask's upgrade-pending taint
// (inplacev1.UpgradePendingTaint) is PreferNoSchedule, a weight in kube-scheduler's sum
// that a VM's own preferred affinities can outweigh; the rule is KubeVirt's
// VirtualMachineInstanceMigration.spec.addedNodeSelector (KubeVirt v1.6.0 on), which
// virt-controller copies into the migration target pod's nodeSelector, the VMI's own
// nodeSelector winning a key both name (kubevirt v1.6.0
// pkg/virt-controller/watch/migration/migration.go:852-855, createTargetPod; the field:
// staging/src/kubevirt.io/api/core/v1/types.go:1622-1629). A nodeSelector only matches
// labels, so the nodes a VM may land on carry a label of the evacuation's own.
const (
	// LandingLabelPrefix starts the node label of one NodeUpdate's evacuation,
	// LandingLabelPrefix+<NodeUpdate UID>=true: it is on the nodes that the VMs leaving
	// that node may land on, while its EvacuateVMs step runs, and nowhere once the step
	// is done or the NodeUpdate ends. One key per NodeUpdate, so that two nodes
	// evacuated at once each keep and remove their own.
	LandingLabelPrefix = "harvester.inplace.cluster.x-k8s.io/landing-"
	// AnnotationLandingLabel on a migration the evacuation created names the landing
	// label its addedNodeSelector asked for. When the stored migration has no
	// addedNodeSelector, the API server pruned the field: KubeVirt's CRD is older than
	// v1.6.0 (v1.5.x's schema of spec has vmiName only, unknown fields are dropped).
	AnnotationLandingLabel = "harvester.inplace.cluster.x-k8s.io/landing-label"
	// AnnotationUnconfined on a migration the evacuation created without an
	// addedNodeSelector says why: the VM's target is left to the taint's preference.
	AnnotationUnconfined = "harvester.inplace.cluster.x-k8s.io/unconfined"
)

// LandingLabel is the node label of the evacuation of NodeUpdate nu.
func LandingLabel(nu types.UID) string {
	return LandingLabelPrefix + string(nu)
}

// Pending says whether a node is still to be upgraded by a running roll: it carries an
// UpgradeTask's upgrade-pending taint, whichever task's (the task controller puts it on
// every node a running task has still to upgrade, until that node's NodeUpdate ends).
func Pending(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == inplacev1.UpgradePendingTaint })
}

// Landing are the targets (EvacuationTargets) that no running roll has still to
// upgrade: upgraded already, or in no roll. A VM that lands there is not moved again by
// the rolls running now.
func Landing(targets []*corev1.Node) []*corev1.Node {
	var out []*corev1.Node
	for _, n := range targets {
		if !Pending(n) {
			out = append(out, n)
		}
	}
	return out
}

// AddedSelectorPruned says whether the API server dropped the addedNodeSelector the
// evacuation asked for on migration m: KubeVirt is older than v1.6.0, and its target is
// left to the taint's preference.
func AddedSelectorPruned(m *kubevirtv1.VirtualMachineInstanceMigration) bool {
	key := m.Annotations[AnnotationLandingLabel]
	return key != "" && m.Spec.AddedNodeSelector[key] == ""
}

// LabelLanding puts label=true on the nodes named in want and takes it off every other
// node of nodes. Each write is a merge patch of that one label (metadata.labels merges
// key by key, null deletes one), so no other label, nor a concurrent writer's, is
// touched; a node that is gone is skipped.
func LabelLanding(ctx context.Context, c client.Client, nodes []corev1.Node, label string, want map[string]bool) error {
	for i := range nodes {
		n := &nodes[i]
		_, has := n.Labels[label]
		if has == want[n.Name] {
			continue
		}
		var value any // nil: JSON null, the label's removal
		if want[n.Name] {
			value = "true"
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{label: value}}})
		if err != nil {
			return err
		}
		if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
			verb := "remove the landing label from"
			if want[n.Name] {
				verb = "put the landing label on"
			}
			return fmt.Errorf("%s node %s: %w", verb, n.Name, err)
		}
	}
	return nil
}

// RemoveLanding takes label off every node of the workload cluster.
func RemoveLanding(ctx context.Context, c client.Client, label string) error {
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes, client.HasLabels{label}); err != nil {
		return fmt.Errorf("list nodes to remove the landing label %s: %w", label, err)
	}
	return LabelLanding(ctx, c, nodes.Items, label, nil)
}
