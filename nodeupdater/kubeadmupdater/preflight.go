package kubeadmupdater

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// KubeadmVersionSkewCheck is the name of the preflight check of kubeadm's version rules.
const KubeadmVersionSkewCheck = "KubeadmVersionSkew"

// Preflight refuses, before anything moves, what kubeadm itself would refuse: a target
// that is not a released version, a downgrade, a jump of more than one minor (with the
// words kubeadm at the target says of a control plane that far below it,
// cmd/kubeadm/app/util/config/common.go, NormalizeKubernetesVersion), and on a worker a
// kubelet newer than the control plane (cmd/kubeadm/app/preflight/checks.go,
// KubeletVersionCheck; the control plane's version is the oldest kubelet of its nodes,
// which kubeadm upgrades together with their static pods). etcd's health is judged for
// control plane nodes of every updater by the preflight check EtcdHealthy.
func (u *Updater) Preflight(ctx context.Context, target nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return []nodeupdater.CheckResult{u.versionSkew(ctx, target)}
}

func (u *Updater) versionSkew(ctx context.Context, target nodeupdater.PreflightTarget) nodeupdater.CheckResult {
	held := func(format string, args ...any) nodeupdater.CheckResult {
		return nodeupdater.CheckResult{Name: KubeadmVersionSkewCheck, Message: fmt.Sprintf(format, args...)}
	}
	if !releasedVersion.MatchString(target.Version) {
		return held("version %q is not a released Kubernetes version (vMAJOR.MINOR.PATCH): kubeadm and its packages have no other", target.Version)
	}
	want, err := version.ParseSemantic(target.Version)
	if err != nil {
		return held("version %q: %v", target.Version, err)
	}
	wc, err := u.Clusters.Client(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.ClusterName})
	if err != nil {
		return held("cannot reach workload cluster %s to read its versions: %v", target.ClusterName, err)
	}
	node := &corev1.Node{}
	if err := wc.Get(ctx, client.ObjectKey{Name: target.NodeName}, node); err != nil {
		return held("cannot read node %s to read its kubelet version: %v", target.NodeName, err)
	}
	have, err := kubeversion.ParseSemantic(node.Status.NodeInfo.KubeletVersion)
	if err != nil {
		return held("node %s reports kubelet version %q, which is not a version: %v", node.Name, node.Status.NodeInfo.KubeletVersion, err)
	}
	switch order, err := kubeversion.Compare(want, have); {
	case err != nil:
		return held("cannot order %s against node %s's kubelet %s: %v", target.Version, node.Name, have, err)
	case order < 0:
		return held("node %s runs kubelet %s: %s would be a downgrade, which capi-inplace never does in place", node.Name, have, target.Version)
	}
	if want.Major() != have.Major() || want.Minor() > have.Minor()+1 {
		return held("node %s runs kubelet %s, more than one minor below %s: kubeadm upgrades one minor version at a time; kubeadm %s would refuse with: %s",
			node.Name, have, target.Version, target.Version,
			nodeprogram.KubeadmMinimumVersionRefusal(int(want.Major()), int(want.Minor()), fmt.Sprintf("v%d.%d.%d", have.Major(), have.Minor(), have.Patch())))
	}
	_, controlPlane := node.Labels[ControlPlaneLabel]
	if controlPlane || target.ControlPlane {
		return nodeupdater.CheckResult{Name: KubeadmVersionSkewCheck, Passed: true}
	}
	cp, err := controlPlaneVersion(ctx, wc)
	if err != nil {
		return held("%v", err)
	}
	if want.GreaterThan(cp) {
		return held("the control plane is not at %s yet: the kubelet version is higher than the control plane version. This is not a supported version skew and may lead to a malfunctional cluster. Kubelet version: %q Control plane version: %q",
			target.Version, want.String(), cp.String())
	}
	return nodeupdater.CheckResult{Name: KubeadmVersionSkewCheck, Passed: true}
}

// controlPlaneVersion is the oldest kubelet version of the control plane nodes: the
// version every API server of the cluster runs at least, once kubeadm upgraded them.
func controlPlaneVersion(ctx context.Context, wc client.Client) (*version.Version, error) {
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes, client.HasLabels{ControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("cannot list the control plane nodes to read their version: %w", err)
	}
	var oldest *version.Version
	for _, n := range nodes.Items {
		v, err := kubeversion.ParseSemantic(n.Status.NodeInfo.KubeletVersion)
		if err != nil {
			return nil, fmt.Errorf("control plane node %s reports kubelet version %q, which is not a version: %w", n.Name, n.Status.NodeInfo.KubeletVersion, err)
		}
		if oldest == nil || v.LessThan(oldest) {
			oldest = v
		}
	}
	if oldest == nil {
		return nil, fmt.Errorf("no node of the workload cluster has the label %s: the control plane's version is unknown", ControlPlaneLabel)
	}
	return oldest, nil
}
