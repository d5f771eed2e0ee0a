package sim

import (
	"context"
	"fmt"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// This file plays what happens to a Longhorn volume's attachment when what uses it leaves
// a node, which no test API server does. What uses a volume is what Longhorn reports:
// status.kubernetesStatus.workloadsStatus, one entry per pod that mounts its PVC, with the
// pod's first owner as workloadName and workloadType (longhorn-manager v1.10.0
// controller/kubernetes_pv_controller.go, setWorkloads and detectWorkload); a VM's disk is
// used by its virt-launcher pod, whose owner is the VirtualMachineInstance. The virt-launcher
// pods themselves are not played (the KubeVirt simulator has none): a VirtualMachineInstance
// user is there while its VMI is.
//
//   - A VM's live migration moves its volumes' attachment to the target node: "VM live
//     migration moves the attachment" (shared/facts/longhorn-v2-live-upgrade.md, LH
//     fact 38). Longhorn does it with a second engine on the target that takes over when
//     the migration completes; the simulator rewrites the engine's spec.nodeID and the
//     volume's node at the migration's end, the simplification longhorn.go makes for every
//     engine move (v1.10.0 has no volume.spec.engineNodeID).
//   - A pod or VMI that goes away takes its volumes' attachment with it once nothing else
//     uses them: the kubelet unmounts, Kubernetes' attach-detach controller deletes the
//     VolumeAttachment, the CSI external-attacher calls Longhorn's
//     ControllerUnpublishVolume, which removes the node's attachment ticket
//     (csi/controller_server.go), and Longhorn detaches the volume (DetachLonghornVolume).
//     Longhorn's PV controller keeps the last workloads and stamps lastPodRefAt when no
//     pod uses the PVC any more (setWorkloads); the simulator does the same. Only volumes
//     whose users Longhorn reported are touched: a volume attached by hand (no
//     workloadsStatus) stays attached, as it does on a real cluster.

// volumeUser is one workload Longhorn reports on a volume.
type volumeUser struct {
	namespace, pod, workloadName, workloadType string
}

func (u volumeUser) isVMI(namespace, name string) bool {
	return u.workloadType == "VirtualMachineInstance" && u.namespace == namespace && u.workloadName == name
}

// longhornVolumes lists the Longhorn Volumes of every namespace, none when the cluster
// does not serve the kind.
func longhornVolumes(ctx context.Context, c client.Client) ([]unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(longhornv1.SchemeGroupVersion.String())
	list.SetKind("VolumeList")
	if err := c.List(ctx, list); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list Longhorn volumes: %w", err)
	}
	return list.Items, nil
}

// usersOf are the users Longhorn reports on an attached volume whose PVC some pod still
// mounts (lastPodRefAt empty); none otherwise.
func usersOf(v *unstructured.Unstructured) []volumeUser {
	if state, _, _ := unstructured.NestedString(v.Object, "status", "state"); state == string(longhornv1.VolumeStateDetached) || state == "" {
		return nil
	}
	if last, _, _ := unstructured.NestedString(v.Object, "status", "kubernetesStatus", "lastPodRefAt"); last != "" {
		return nil
	}
	ns, _, _ := unstructured.NestedString(v.Object, "status", "kubernetesStatus", "namespace")
	workloads, _, _ := unstructured.NestedSlice(v.Object, "status", "kubernetesStatus", "workloadsStatus")
	var out []volumeUser
	for _, w := range workloads {
		m, ok := w.(map[string]any)
		if !ok {
			continue
		}
		str := func(k string) string { s, _ := m[k].(string); return s }
		out = append(out, volumeUser{namespace: ns, pod: str("podName"), workloadName: str("workloadName"), workloadType: str("workloadType")})
	}
	return out
}

// MoveVolumeAttachments moves the attachment of every attached Longhorn volume that the
// VMI namespace/vmi uses to node target, as the VMI's live migration does (LH fact 38).
func MoveVolumeAttachments(ctx context.Context, c client.Client, namespace, vmi, target string) error {
	volumes, err := longhornVolumes(ctx, c)
	if err != nil {
		return err
	}
	for i := range volumes {
		v := &volumes[i]
		if !usedBy(v, func(u volumeUser) bool { return u.isVMI(namespace, vmi) }) {
			continue
		}
		key := client.ObjectKeyFromObject(v)
		if err := MoveLonghornEngine(ctx, c, key.Namespace, key.Name, target); err != nil {
			return err
		}
		if err := patchLonghorn(ctx, c, "Volume", key, false, map[string]any{"spec": map[string]any{"nodeID": target}}); err != nil {
			return fmt.Errorf("move Longhorn volume %s to %s: %w", key.Name, target, err)
		}
		if err := patchLonghorn(ctx, c, "Volume", key, true, map[string]any{"status": map[string]any{"currentNodeID": target}}); err != nil {
			return fmt.Errorf("move Longhorn volume %s to %s: %w", key.Name, target, err)
		}
	}
	return nil
}

func usedBy(v *unstructured.Unstructured, match func(volumeUser) bool) bool {
	for _, u := range usersOf(v) {
		if match(u) {
			return true
		}
	}
	return false
}

// ReleaseVolumes detaches every attached Longhorn volume that a user matching left used,
// once none of its users is there any more (a pod gone or being deleted, a VMI gone), and
// stamps lastPodRefAt as Longhorn's PV controller does.
func ReleaseVolumes(ctx context.Context, c client.Client, left func(namespace, pod, workloadName, workloadType string) bool) error {
	volumes, err := longhornVolumes(ctx, c)
	if err != nil {
		return err
	}
	for i := range volumes {
		v := &volumes[i]
		if !usedBy(v, func(u volumeUser) bool { return left(u.namespace, u.pod, u.workloadName, u.workloadType) }) {
			continue
		}
		inUse := false
		for _, u := range usersOf(v) {
			there, err := userThere(ctx, c, u)
			if err != nil {
				return err
			}
			inUse = inUse || there
		}
		if inUse {
			continue
		}
		key := client.ObjectKeyFromObject(v)
		if err := patchLonghorn(ctx, c, "Volume", key, true, map[string]any{"status": map[string]any{"kubernetesStatus": map[string]any{"lastPodRefAt": time.Now().UTC().Format(time.RFC3339)}}}); err != nil {
			return fmt.Errorf("release Longhorn volume %s: %w", key.Name, err)
		}
		if err := DetachLonghornVolume(ctx, c, key.Namespace, key.Name); err != nil {
			return err
		}
	}
	return nil
}

// userThere says whether a volume's user still uses it: its VMI exists (for a
// VirtualMachineInstance user), else its pod exists and is not being deleted.
func userThere(ctx context.Context, c client.Client, u volumeUser) (bool, error) {
	var obj client.Object = &corev1.Pod{}
	name := u.pod
	if u.workloadType == "VirtualMachineInstance" {
		obj, name = &kubevirtv1.VirtualMachineInstance{}, u.workloadName
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: u.namespace, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return false, nil
		}
		return false, err
	}
	return obj.GetDeletionTimestamp().IsZero(), nil
}

// LonghornVolumeState is what a test reads of a Longhorn volume: its state and node,
// since when no pod uses it, and its engine's node and state.
type LonghornVolumeState struct {
	State, Node, LastPodRefAt, EngineNode, EngineState string
}

// ReadLonghornVolume reads a Longhorn volume and its (first) engine.
func ReadLonghornVolume(ctx context.Context, c client.Client, namespace, name string) (*LonghornVolumeState, error) {
	v := &longhornv1.Volume{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, v); err != nil {
		return nil, err
	}
	st := &LonghornVolumeState{State: string(v.Status.State), Node: v.Status.CurrentNodeID, LastPodRefAt: v.Status.KubernetesStatus.LastPodRefAt}
	engines := &longhornv1.EngineList{}
	if err := c.List(ctx, engines, client.InNamespace(namespace), client.MatchingLabels{"longhornvolume": name}); err != nil {
		return nil, err
	}
	if len(engines.Items) > 0 {
		st.EngineNode, st.EngineState = engines.Items[0].Spec.NodeID, string(engines.Items[0].Status.CurrentState)
	}
	return st, nil
}
