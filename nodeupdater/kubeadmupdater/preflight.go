package kubeadmupdater

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
)

// KubeadmVersionSkewCheck is the name of the preflight check of kubeadm's version rules.
const KubeadmVersionSkewCheck = "KubeadmVersionSkew"

// KubeadmControlPlaneVersionCheck is the name of the preflight check that a
// KubeadmControlPlane would not undo the upgrade of a control plane node.
const KubeadmControlPlaneVersionCheck = "KubeadmControlPlaneVersion"

// Preflight refuses, before anything moves, what kubeadm itself would refuse: a target
// that is not a released version, a downgrade, a jump of more than one minor (with the
// words kubeadm at the target says of a control plane that far below it,
// cmd/kubeadm/app/util/config/common.go, NormalizeKubernetesVersion), and on a worker a
// kubelet newer than the control plane (cmd/kubeadm/app/preflight/checks.go,
// KubeletVersionCheck; the control plane's version is the oldest kubelet of its nodes,
// which kubeadm upgrades together with their static pods). It also holds a control plane
// node whose KubeadmControlPlane would undo part of its upgrade (controlPlaneVersion).
// etcd's health is judged for control plane nodes of every updater by the preflight check
// EtcdHealthy.
func (u *Updater) Preflight(ctx context.Context, target nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return []nodeupdater.CheckResult{u.versionSkew(ctx, target), u.controlPlaneVersion(ctx, target)}
}

// controlPlaneVersion holds a control plane node of a KubeadmControlPlane whose
// spec.version is below the target: an upgrade asked by the in-place-upgrade-to
// annotation or an ExternalUpgradeRequest, which never write spec.version. The node's
// `kubeadm upgrade apply` moves the kube-proxy DaemonSet to the target, and
// KubeadmControlPlane puts it back at its own spec.version at its next reconcile
// (controlplane/kubeadm/reconcilers/kubeadmcontrolplane/kubeadmcontrolplane_controller.go calls
// UpdateKubeProxyImageInfo, controlplane/kubeadm/pkg/workload_cluster.go, on every
// reconcile once no machine needs a rollout), unless the KubeadmControlPlane carries
// controlplane.cluster.x-k8s.io/skip-kube-proxy. Through Cluster API's in-place hooks the
// KubeadmControlPlane is at the target before any of its machines is asked.
func (u *Updater) controlPlaneVersion(ctx context.Context, target nodeupdater.PreflightTarget) nodeupdater.CheckResult {
	passed := nodeupdater.CheckResult{Name: KubeadmControlPlaneVersionCheck, Passed: true}
	held := func(format string, args ...any) nodeupdater.CheckResult {
		return nodeupdater.CheckResult{Name: KubeadmControlPlaneVersionCheck, Message: fmt.Sprintf(format, args...)}
	}
	if !target.ControlPlane {
		return passed
	}
	cluster := &clusterv1.Cluster{}
	if err := u.Client.Get(ctx, client.ObjectKey{Namespace: target.Namespace, Name: target.ClusterName}, cluster); err != nil {
		return held("cannot read Cluster %s/%s to find its control plane: %v", target.Namespace, target.ClusterName, err)
	}
	ref := cluster.Spec.ControlPlaneRef
	if ref.Kind != "KubeadmControlPlane" || ref.APIGroup != controlplanev1.GroupVersion.Group {
		return passed
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := u.Client.Get(ctx, client.ObjectKey{Namespace: target.Namespace, Name: ref.Name}, kcp); err != nil {
		return held("cannot read KubeadmControlPlane %s/%s to compare its version: %v", target.Namespace, ref.Name, err)
	}
	if _, skip := kcp.Annotations[controlplanev1.SkipKubeProxyAnnotation]; skip {
		return passed
	}
	want, err := kubeversion.ParseSemantic(target.Version)
	if err != nil {
		return held("version %q: %v", target.Version, err)
	}
	have, err := kubeversion.ParseSemantic(kcp.Spec.Version)
	if err != nil {
		return held("KubeadmControlPlane %s has spec.version %q, which is not a version: %v", kcp.Name, kcp.Spec.Version, err)
	}
	if order, err := kubeversion.Compare(have, want); err != nil || order >= 0 {
		return passed
	}
	return held("KubeadmControlPlane %s is at %s, below %s: Cluster API keeps the kube-proxy DaemonSet at the KubeadmControlPlane's spec.version and would put back "+
		"the kube-proxy that kubeadm upgrade apply moves to %s. Upgrade through Cluster API's in-place hooks (set the Cluster's spec.topology.version or the "+
		"KubeadmControlPlane's spec.version to %s; docs/capi-hooks.md), or annotate the KubeadmControlPlane with %s to keep kube-proxy yourself",
		kcp.Name, kcp.Spec.Version, target.Version, target.Version, target.Version, controlplanev1.SkipKubeProxyAnnotation)
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

var _ nodeupdater.DisruptionPreviewer = &Updater{}

// PreviewDisruption tells, without acting, what upgrading target.NodeName would disrupt:
// the pods its drain could not empty now (nodedrain.Preview, with the KubeadmUpdater's
// drain options as the run uses them; PodDisruptionBudgets judged by the API server's
// eviction code in a dry run). A kubeadm node has no VMs or volumes of its own to report.
// It only reads: it never writes to either cluster.
func (u *Updater) PreviewDisruption(ctx context.Context, target nodeupdater.PreflightTarget) (inplacev1.NodeDisruption, error) {
	var d inplacev1.NodeDisruption
	cfg := &inplacev1.KubeadmUpdater{}
	if err := u.Client.Get(ctx, client.ObjectKey{Namespace: target.Namespace, Name: target.UpdaterRef.Name}, cfg); err != nil {
		return d, fmt.Errorf("read KubeadmUpdater %s/%s: %w", target.Namespace, target.UpdaterRef.Name, err)
	}
	wc, err := u.Clusters.Client(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.ClusterName})
	if err != nil {
		return d, fmt.Errorf("reach the workload cluster %s: %w", target.ClusterName, err)
	}
	d.BlockingPods, err = nodedrain.Preview(ctx, wc, target.NodeName, drainOptions(cfg.Spec.Drain))
	return d, err
}
