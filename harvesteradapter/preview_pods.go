package harvesteradapter

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
)

// labelLonghornComponent is the label Longhorn puts on its pods; an instance manager's
// pod carries instance-manager (longhorn-manager types.GetInstanceManagerLabels).
const labelLonghornComponent = "longhorn.io/component"

// previewPods are the pods of node that the drain would evict (drainEvicts, the rules of
// the drain Plan's kubectl drain) and whose eviction the API server refuses now because
// of a PodDisruptionBudget (evictionRefusal). The node's virt-launcher pods are left out:
// EvacuateVMs empties the node of its VMIs before the drain (a live-migrated or stopped
// VMI's launcher pod ends). lost are the volumes previewVolumes found would lose their
// last healthy replica, which keep a Longhorn instance manager's budget (fact 31).
func previewPods(ctx context.Context, wc client.Client, node string, drain harvesterv1.Drain, lost []inplacev1.PreviewVolume) ([]inplacev1.PreviewPod, error) {
	blocking, err := blockingPods(ctx, wc, node, drain, lost)
	out := make([]inplacev1.PreviewPod, 0, len(blocking))
	for _, p := range blocking {
		out = append(out, p.PreviewPod)
	}
	return out, err
}

// blockingPod is a pod whose eviction a PodDisruptionBudget refuses, and whether it is
// Longhorn's (in Longhorn's namespace, or carrying its component label): drainPolicy
// Evict never deletes those.
type blockingPod struct {
	inplacev1.PreviewPod
	longhorn bool
}

// blockingPods is previewPods with each pod's owner told.
func blockingPods(ctx context.Context, wc client.Client, node string, drain harvesterv1.Drain, lost []inplacev1.PreviewVolume) ([]blockingPod, error) {
	pods := &corev1.PodList{}
	if err := wc.List(ctx, pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	budgets := map[string][]policyv1.PodDisruptionBudget{}
	var out []blockingPod
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Labels[kubevirtv1.AppLabel] == "virt-launcher" {
			continue
		}
		if evicts, _ := drainEvicts(pod, drain); !evicts {
			continue
		}
		if _, read := budgets[pod.Namespace]; !read {
			list := &policyv1.PodDisruptionBudgetList{}
			if err := wc.List(ctx, list, client.InNamespace(pod.Namespace)); err != nil {
				return nil, fmt.Errorf("list the PodDisruptionBudgets of namespace %s: %w", pod.Namespace, err)
			}
			budgets[pod.Namespace] = list.Items
		}
		pdb, why := evictionRefusal(pod, budgets[pod.Namespace])
		if why == "" {
			continue
		}
		if pod.Labels[labelLonghornComponent] == "instance-manager" {
			why += instanceManagerNote(lost)
		}
		out = append(out, blockingPod{
			PreviewPod: inplacev1.PreviewPod{Namespace: pod.Namespace, Name: pod.Name, PodDisruptionBudget: pdb, Reason: why},
			longhorn:   pod.Namespace == longhorn.Namespace || pod.Labels[labelLonghornComponent] != "",
		})
	}
	return out, nil
}

// evictionRefusal says whether the API server's pods/eviction refuses to evict pod now
// because of the budgets of its namespace, and why, as kubernetes v1.36.3
// pkg/registry/core/pod/storage/eviction.go decides: a pod that is finished, Pending or
// being deleted is evicted whatever the budgets (canIgnorePDB); a pod that more than one
// budget selects is refused; an unready pod is evicted when its budget's
// unhealthyPodEvictionPolicy is AlwaysAllow, or the budget has its desired healthy pods;
// otherwise the budget must have observed its generation and allow a disruption
// (checkAndDecrement: disruptionsAllowed 0 or less refuses).
func evictionRefusal(pod *corev1.Pod, budgets []policyv1.PodDisruptionBudget) (pdb, why string) {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodPending || !pod.DeletionTimestamp.IsZero() {
		return "", ""
	}
	var matching []*policyv1.PodDisruptionBudget
	for i := range budgets {
		sel, err := metav1.LabelSelectorAsSelector(budgets[i].Spec.Selector)
		if err == nil && sel.Matches(labels.Set(pod.Labels)) {
			matching = append(matching, &budgets[i])
		}
	}
	switch len(matching) {
	case 0:
		return "", ""
	case 1:
	default:
		names := make([]string, 0, len(matching))
		for _, b := range matching {
			names = append(names, b.Name)
		}
		return strings.Join(names, ","), "more than one PodDisruptionBudget selects the pod (" + strings.Join(names, ", ") + "), which the eviction API refuses"
	}
	b := matching[0]
	if !podReady(pod) && unhealthyEvictable(b) {
		return "", ""
	}
	switch {
	case b.Status.ObservedGeneration < b.Generation:
		return b.Name, fmt.Sprintf("the disruption controller has not processed PodDisruptionBudget %s yet, and the eviction API refuses until it has", b.Name)
	case b.Status.DisruptionsAllowed <= 0:
		return b.Name, fmt.Sprintf("PodDisruptionBudget %s allows no disruption now (disruptionsAllowed %d; %d healthy, %d desired): the drain's eviction would be refused and retried until drain.timeout",
			b.Name, b.Status.DisruptionsAllowed, b.Status.CurrentHealthy, b.Status.DesiredHealthy)
	}
	return "", ""
}

// unhealthyEvictable: an unready pod is evicted without using the budget when its policy
// is AlwaysAllow, or (IfHealthyBudget, the default) the budget has its desired healthy
// pods.
func unhealthyEvictable(b *policyv1.PodDisruptionBudget) bool {
	if p := b.Spec.UnhealthyPodEvictionPolicy; p != nil && *p == policyv1.AlwaysAllow {
		return true
	}
	return b.Status.CurrentHealthy >= b.Status.DesiredHealthy && b.Status.DesiredHealthy > 0
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// instanceManagerNote says whether Longhorn would lift its instance manager's budget in
// time: Longhorn deletes it once the node is cordoned, when no volume is attached there
// any more and every replica on the node has a healthy copy on another schedulable node
// (shared/facts/longhorn-v2-live-upgrade.md, fact 31). A volume that would lose its last
// healthy replica keeps it; otherwise the evacuation and the drain should free it, which
// this preview does not judge volume by volume (a volume attached with no pod using it
// keeps it too: harvester-release-steps.md fact 39).
func instanceManagerNote(lost []inplacev1.PreviewVolume) string {
	if len(lost) > 0 {
		names := make([]string, 0, len(lost))
		for _, v := range lost {
			names = append(names, v.Name)
		}
		return "; Longhorn keeps this instance manager's budget while a replica on the node has no healthy copy elsewhere, as " + strings.Join(names, ", ") + " would (fact 31)"
	}
	return "; Longhorn deletes this instance manager's budget once the node is cordoned, if no volume stays attached there and every replica on it has a healthy copy elsewhere (fact 31)"
}
