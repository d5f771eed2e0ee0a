package sim

import (
	"context"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// ScaleAvailableAnnotation is Rancher's: a Deployment annotated with N is kept by Rancher
// at N replicas, or at as many as there are nodes its pods may select, whichever is fewer
// (rancher pkg/controllers/dashboard/scaleavailable/scale.go). Rancher's chart writes it
// for a negative replicas value -N (chart/templates/deployment.yaml); Harvester's
// witness promotion sets it to 2 on the rancher Deployment (harvester
// deploy/charts/harvester/templates/configmap.yaml at v1.8.2, promote.sh, for an
// etcd-only node).
const ScaleAvailableAnnotation = "management.cattle.io/scale-available"

// scaleAvailable plays Rancher's scale-available controller on dep: replicas = min(N,
// nodes matching the pod template's nodeSelector), and 1 when that is 0 (scale.go: the
// node list is filtered by the nodeSelector only). It runs in Rancher, so not while the
// rancher Deployment is scaled to 0 (update_local_rke_state_secret does that, fact 18).
// It says whether it changed dep.
func (r *Rancher) scaleAvailable(ctx context.Context, dep *appsv1.Deployment, rancherRuns bool) (bool, error) {
	n, err := strconv.Atoi(dep.Annotations[ScaleAvailableAnnotation])
	if err != nil || !rancherRuns {
		return false, nil
	}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(dep.Spec.Template.Spec.NodeSelector)}); err != nil {
		return false, err
	}
	n = min(n, len(nodes.Items))
	if n == 0 {
		n = 1
	}
	if dep.Spec.Replicas != nil && *dep.Spec.Replicas == int32(n) {
		return false, nil
	}
	return true, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &appsv1.Deployment{}
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(dep), cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		if cur.Annotations[ScaleAvailableAnnotation] != dep.Annotations[ScaleAvailableAnnotation] {
			return nil // changed meanwhile: the next pass looks again
		}
		cur.Spec.Replicas = ptr.To(int32(n))
		return r.Client.Update(ctx, cur)
	})
}

// rancherRuns says whether Rancher runs: its Deployment exists and is not scaled to 0.
func rancherRuns(deps []appsv1.Deployment) bool {
	for i := range deps {
		if deps[i].Namespace == rancher.CattleSystem && deps[i].Name == rancher.RancherDeployment {
			return ptr.Deref(deps[i].Spec.Replicas, 1) > 0
		}
	}
	return false
}

// schedulablePods is how many of dep's pods the scheduler can place, when its template
// requires one pod per node (a required pod anti-affinity on kubernetes.io/hostname, as
// Rancher's chart renders for antiAffinity required): the Ready, schedulable nodes whose
// NoSchedule and NoExecute taints its tolerations tolerate (a witness carries
// node-role.kubernetes.io/etcd=true:NoExecute, harvester promote.sh at v1.8.2, which
// Rancher's pods do not tolerate). -1 when the template sets no such limit.
func schedulablePods(ctx context.Context, c client.Client, dep *appsv1.Deployment) (int32, error) {
	spec := dep.Spec.Template.Spec
	onePerNode := false
	if spec.Affinity != nil && spec.Affinity.PodAntiAffinity != nil {
		for _, t := range spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			onePerNode = onePerNode || t.TopologyKey == corev1.LabelHostname
		}
	}
	if !onePerNode {
		return -1, nil
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes, client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(spec.NodeSelector)}); err != nil {
		return 0, err
	}
	var fit int32
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			continue
		}
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}
		tolerated := ready
		for _, taint := range n.Spec.Taints {
			if taint.Effect == corev1.TaintEffectPreferNoSchedule {
				continue
			}
			if ready && (taint.Key == corev1.TaintNodeNotReady || taint.Key == corev1.TaintNodeUnreachable) {
				// The API server's TaintNodesByCondition put it on the new node; no node
				// lifecycle controller runs here to take it off the Ready node.
				continue
			}
			ok := false
			for _, tol := range spec.Tolerations {
				ok = ok || tol.ToleratesTaint(klog.Background(), &taint, false)
			}
			tolerated = tolerated && ok
		}
		if tolerated {
			fit++
		}
	}
	return fit, nil
}
