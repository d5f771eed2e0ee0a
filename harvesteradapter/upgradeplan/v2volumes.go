package upgradeplan

import (
	"context"
	"fmt"
	"sort"
	"strings"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
)

// attachedV2Volume is a Longhorn v2 volume that is not detached, and what uses it.
type attachedV2Volume struct {
	// describe names the volume, its state and its users, for messages.
	describe string
	// vmis are the VirtualMachineInstances (namespace/name) whose pods use it.
	vmis []client.ObjectKey
	// others says that something else than a virtual machine uses it (a pod of its own),
	// or that Longhorn names no user at all: nothing the plan could stop.
	others bool
}

// attachedV2Volumes lists the v2 volumes that keep Longhorn's upgrade from completing,
// none when nothing does. The cluster upgrade upgrades Longhorn with Harvester's chart
// (every Harvester minor ships the next Longhorn minor, harvester-release-steps.md fact
// 74). A Longhorn without the live upgrade of v2 instance managers (every release up to
// 1.12.1, fact 68) keeps a node's old v2 instance manager while any v2 engine or replica
// runs there, and does not start the new one beside it (facts 69 and 70): with a v2
// volume attached, Longhorn's upgrade never completes on its nodes, and Harvester's own
// cluster step would wait for it for ever (fact 71). Where Longhorn serves the live
// upgrade, the node steps take care of v2 volumes instead; a cluster without Longhorn has
// none.
func attachedV2Volumes(ctx context.Context, wc client.Client) ([]attachedV2Volume, error) {
	served, err := kube.KindServed(wc, schema.GroupKind{Group: longhornv1.SchemeGroupVersion.Group, Kind: "Volume"}, longhornv1.SchemeGroupVersion.Version)
	if err != nil || !served {
		return nil, err
	}
	if live, err := longhorn.LiveUpgradeServed(wc); err != nil || live {
		return nil, err
	}
	volumes := &longhornv1.VolumeList{}
	if err := wc.List(ctx, volumes, client.InNamespace(longhorn.Namespace)); err != nil {
		return nil, fmt.Errorf("list Longhorn volumes: %w", err)
	}
	var attached []attachedV2Volume
	for i := range volumes.Items {
		v := &volumes.Items[i]
		if v.Spec.DataEngine != longhornv1.DataEngineTypeV2 || v.Status.State == longhornv1.VolumeStateDetached || v.Status.State == "" {
			continue
		}
		a := attachedV2Volume{describe: describeUser(v)}
		k := v.Status.KubernetesStatus
		for _, w := range k.WorkloadsStatus {
			// A VM's disk is used by its virt-launcher pod, whose owner Longhorn reports:
			// the VirtualMachineInstance, named as its VirtualMachine.
			if w.WorkloadType == "VirtualMachineInstance" && w.WorkloadName != "" {
				a.vmis = append(a.vmis, client.ObjectKey{Namespace: k.Namespace, Name: w.WorkloadName})
			} else {
				a.others = true
			}
		}
		a.others = a.others || len(a.vmis) == 0
		attached = append(attached, a)
	}
	sort.Slice(attached, func(i, j int) bool { return attached[i].describe < attached[j].describe })
	return attached, nil
}

// clearV2Volumes says whether the cluster upgrade may start as far as Longhorn's v2
// volumes go (attachedV2Volumes), and otherwise what it waits for. With the
// HarvesterUpgrader's clusterUpgrade.attachedV2Volumes Hold (the default) the plan holds,
// naming each attached v2 volume and what uses it, until they are detached (their VMs
// stopped by their owners). With StopVirtualMachines it stops the virtual machines that
// use them, as Harvester shuts such VMs down for its own upgrades (fact 71, its v2 docs):
// each is recorded on itself with the plan's UID and the run strategy it had (as the
// node steps record what they stop, kubevirt.StopVM), and started again once the cluster
// upgrade is done (startStoppedVMs) or the plan ends otherwise (removeClusterObjects). A
// volume that no stop can free (a pod's own, or a VM KubeVirt would not start again)
// still holds the plan, named.
func (r *PlanReconciler) clearV2Volumes(ctx context.Context, pr *PlanRun) (bool, string, error) {
	attached, err := attachedV2Volumes(ctx, pr.Workload)
	if err != nil || len(attached) == 0 {
		return err == nil, "", err
	}
	const why = "Longhorn serves no live upgrade of v2 instance managers, so its upgrade with Harvester's chart cannot complete on a node while a v2 volume is attached there"
	if pr.Config.Spec.ClusterUpgrade.AttachedV2Volumes != harvesterv1.AttachedV2VolumesStopVirtualMachines {
		described := make([]string, 0, len(attached))
		for _, a := range attached {
			described = append(described, a.describe)
		}
		return false, "", heldf("%s: stop the virtual machines that use these v2 volumes (they cannot be live-migrated; Harvester stops them for its own upgrades too), or set the HarvesterUpgrader's clusterUpgrade.attachedV2Volumes to StopVirtualMachines, and the cluster upgrade starts: %s",
			why, strings.Join(described, "; "))
	}
	var stopping, held []string
	for _, a := range attached {
		if a.others {
			held = append(held, a.describe+": not a virtual machine's alone, stop what uses it")
		}
		for _, key := range a.vmis {
			vm, why, err := r.stopVMOf(ctx, pr, key)
			if err != nil {
				return false, "", err
			}
			switch {
			case why != "":
				held = append(held, why)
			case vm != "":
				stopping = append(stopping, vm)
			}
		}
	}
	sort.Strings(stopping)
	if len(held) > 0 {
		return false, "", heldf("%s, and the plan cannot free these by stopping their virtual machines: %s", why, strings.Join(held, "; "))
	}
	described := make([]string, 0, len(attached))
	for _, a := range attached {
		described = append(described, a.describe)
	}
	stopped := "their virtual machines are stopped"
	if len(stopping) > 0 {
		stopped = "stopped the virtual machines " + strings.Join(stopping, ", ")
	}
	return false, fmt.Sprintf("%s for the cluster upgrade (clusterUpgrade.attachedV2Volumes StopVirtualMachines; they start again when it is done); waiting for the v2 volumes to detach: %s",
		stopped, strings.Join(described, "; ")), nil
}

// stopVMOf stops the VirtualMachine of the VirtualMachineInstance at key for the plan
// (kubevirt.StopVM, recorded with the plan's UID), and names it; held says why it cannot
// be stopped and started again. A VMI or VM that is gone has nothing to stop.
func (r *PlanReconciler) stopVMOf(ctx context.Context, pr *PlanRun, key client.ObjectKey) (vm, held string, err error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := pr.Workload.Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) || kubevirt.Absent(err) {
			return "", "", nil
		}
		return "", "", fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
	}
	owner := kubevirt.VMIOwnerVM(vmi)
	if owner == "" {
		return "", fmt.Sprintf("VirtualMachineInstance %s belongs to no VirtualMachine: stop it yourself", key), nil
	}
	stopped, held, err := kubevirt.StopVM(ctx, pr.Workload, pr.Plan.UID, "", key.Namespace, owner, true)
	if err != nil || held != "" {
		return "", held, err
	}
	if stopped {
		r.event(pr.Plan, corev1.EventTypeNormal, "VirtualMachineStopped", "Stop",
			"stopped VirtualMachine %s/%s for the cluster upgrade: its Longhorn v2 volume keeps Longhorn's upgrade from completing (clusterUpgrade.attachedV2Volumes StopVirtualMachines)", key.Namespace, owner)
	}
	return key.Namespace + "/" + owner, "", nil
}

// startStoppedVMs starts again the virtual machines the plan stopped for the cluster
// upgrade (clearV2Volumes), unless the HarvesterUpgrader's restoreVM is false (they then
// stay stopped, found by their stopped-by label), and says which, for the phase's
// message. A VM whose user changed its run strategy meanwhile is left as the user set it
// (kubevirt.RestoreVM).
func startStoppedVMs(ctx context.Context, pr *PlanRun) (string, error) {
	if v := pr.Config.Spec.RestoreVM; v != nil && !*v {
		return "", nil
	}
	vms, err := kubevirt.StoppedVMs(ctx, pr.Workload, pr.Plan.UID, "the cluster upgrade")
	if err != nil || len(vms) == 0 {
		return "", err
	}
	var started []string
	for i := range vms {
		ok, err := kubevirt.RestoreVM(ctx, pr.Workload, &vms[i])
		if err != nil {
			return "", err
		}
		if ok {
			started = append(started, kubevirt.VMKey(&vms[i]))
		}
	}
	if len(started) == 0 {
		return "", nil
	}
	return "; started again the virtual machines stopped for it: " + strings.Join(started, ", "), nil
}

// describeUser names a volume and what Longhorn last saw using it: the workloads of its
// pods (for a VM, its VirtualMachineInstance), else its PVC.
func describeUser(v *longhornv1.Volume) string {
	k := v.Status.KubernetesStatus
	var users []string
	for _, w := range k.WorkloadsStatus {
		switch {
		case w.WorkloadName != "":
			users = append(users, fmt.Sprintf("%s %s/%s", w.WorkloadType, k.Namespace, w.WorkloadName))
		case w.PodName != "":
			users = append(users, fmt.Sprintf("pod %s/%s", k.Namespace, w.PodName))
		}
	}
	if len(users) == 0 && k.PVCName != "" {
		users = append(users, fmt.Sprintf("PVC %s/%s", k.Namespace, k.PVCName))
	}
	if len(users) == 0 {
		return fmt.Sprintf("volume %s (%s)", v.Name, v.Status.State)
	}
	return fmt.Sprintf("volume %s (%s) used by %s", v.Name, v.Status.State, strings.Join(users, ", "))
}
