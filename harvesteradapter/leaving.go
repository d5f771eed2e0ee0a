package harvesteradapter

import (
	"context"
	"fmt"
	"slices"
	"strings"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// nodeLeaving is the longhorn.Leaving of node's own steps, judged before they run: which
// attached volumes with their engine on the node lose it there before the node goes
// down. What uses a volume is what Longhorn reports on it
// (status.kubernetesStatus.workloadsStatus: each pod mounting its PVC, with the pod's
// owner; longhorn-manager controller/kubernetes_pv_controller.go). A volume leaves when
// every user does:
//   - a VirtualMachineInstance's virt-launcher pod, when the VMI runs on the node:
//     EvacuateVMs live-migrates every VMI off the node, which moves its volumes'
//     attachment with it (LH fact 38), or stops it, which detaches them;
//   - any other pod on the node that the drain evicts (drainEvicts): a volume no pod uses
//     any more is detached (CSI ControllerUnpublishVolume).
//
// A volume with no user reported (attached by hand, by a backup, or no pod since
// lastPodRefAt) stays, and so does one any user of which stays. LonghornDataEngine, after
// the drain, checks what actually happened.
func nodeLeaving(ctx context.Context, wc client.Client, node string, drain harvesterv1.Drain) longhorn.Leaving {
	return func(v *longhornv1.Volume) (bool, string) {
		k := v.Status.KubernetesStatus
		if k.LastPodRefAt != "" || len(k.WorkloadsStatus) == 0 {
			return false, "attached with no pod using it"
		}
		for _, w := range k.WorkloadsStatus {
			if leaves, why := userLeaves(ctx, wc, node, drain, k.Namespace, w); !leaves {
				return false, why
			}
		}
		return true, ""
	}
}

// userLeaves says whether one user of a volume leaves node in the node's own steps, and
// why not otherwise.
func userLeaves(ctx context.Context, wc client.Client, node string, drain harvesterv1.Drain, namespace string, w longhornv1.WorkloadStatus) (bool, string) {
	if w.WorkloadType == "VirtualMachineInstance" && w.WorkloadName != "" {
		what := fmt.Sprintf("used by VirtualMachineInstance %s/%s", namespace, w.WorkloadName)
		vmi := &kubevirtv1.VirtualMachineInstance{}
		if err := wc.Get(ctx, client.ObjectKey{Namespace: namespace, Name: w.WorkloadName}, vmi); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return false, what + ", which does not exist"
			}
			return false, fmt.Sprintf("%s, which cannot be read: %v", what, err)
		}
		if vmi.Status.NodeName != node {
			return false, fmt.Sprintf("%s, which runs on node %q", what, vmi.Status.NodeName)
		}
		return true, ""
	}
	what := fmt.Sprintf("used by pod %s/%s", namespace, w.PodName)
	pod := &corev1.Pod{}
	if err := wc.Get(ctx, client.ObjectKey{Namespace: namespace, Name: w.PodName}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return false, what + ", which does not exist"
		}
		return false, fmt.Sprintf("%s, which cannot be read: %v", what, err)
	}
	if pod.Spec.NodeName != node {
		return false, fmt.Sprintf("%s, which runs on node %q", what, pod.Spec.NodeName)
	}
	if evicts, why := drainEvicts(pod, drain); !evicts {
		return false, what + ", " + why
	}
	return true, ""
}

// drainEvicts says whether the drain the HarvesterUpgrader configures (suc.DrainArgs:
// kubectl drain with its pod selector and flags) removes pod, and why not otherwise, as
// kubectl drain documents its rules: it leaves DaemonSet pods (with --ignore-daemonsets;
// without it, it refuses to drain), mirror pods and the pods its selector leaves out, and
// refuses pods with emptyDir volumes (without --delete-emptydir-data) and pods with no
// controller (without --force); finished pods are always removed.
func drainEvicts(pod *corev1.Pod, d harvesterv1.Drain) (bool, string) {
	switch {
	case d.Enabled != nil && !*d.Enabled:
		return false, "which stays: the HarvesterUpgrader's drain.enabled is false"
	case hasLabel(pod, suc.LabelSUCController):
		return false, "which the drain's pod selector leaves out"
	case pod.Annotations[corev1.MirrorPodAnnotationKey] != "":
		return false, "a static pod, which the drain leaves on the node"
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return true, ""
	}
	owner := metav1.GetControllerOf(pod)
	switch {
	case owner != nil && owner.Kind == "DaemonSet" && strings.HasPrefix(owner.APIVersion, "apps/"):
		return false, "which the drain leaves on the node (a DaemonSet's pod)"
	case (d.DeleteEmptyDirData != nil && !*d.DeleteEmptyDirData) && slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.EmptyDir != nil }):
		return false, "which the drain refuses to delete: it has an emptyDir volume and drain.deleteEmptyDirData is false"
	case owner == nil && !d.Force:
		return false, "which the drain refuses to delete: it declares no controller and drain.force is false"
	}
	return true, ""
}

func hasLabel(o metav1.Object, key string) bool {
	_, ok := o.GetLabels()[key]
	return ok
}
