package harvesteradapter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

var (
	_ nodeupdater.DisruptionPreviewer   = &Updater{}
	_ nodeupdater.NodeDurationEstimator = &Updater{}
)

// PreviewDisruption tells, without acting, what upgrading target.NodeName would disrupt
// while it and target.Disrupted (and target.Picked) are down together: the VMs its
// evacuation would live-migrate or stop (judgeVMI and the stop rules of
// kubevirt.StopRefusal, as runEvacuate decides), whether the nodes that stay up have room
// for the migrating ones, the pods its drain would evict (drainEvicts, the drain's own
// rules) whose PodDisruptionBudget refuses the eviction now, and the Longhorn volumes
// left with no healthy replica (longhorn.State.LostVolumes, as the preflight and the
// cordon's storageSettled judge them). It only reads: it never writes to either cluster.
//
// The node is judged as the run would judge it if it started now, with the
// HarvesterUpgrader as it is now (a node not started yet has no snapshot of it).
func (u *Updater) PreviewDisruption(ctx context.Context, target nodeupdater.PreflightTarget) (inplacev1.NodeDisruption, error) {
	var d inplacev1.NodeDisruption
	cfg, err := u.configs().Get(ctx, target.Namespace, target.UpdaterRef.Name)
	if err != nil {
		return d, err
	}
	wc, err := u.workloadClient(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.ClusterName})
	if err != nil {
		return d, fmt.Errorf("reach the workload cluster %s: %w", target.ClusterName, err)
	}
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes); err != nil {
		return d, fmt.Errorf("list nodes: %w", err)
	}
	down := previewDown(target)
	targets, nonWitness := kubevirt.EvacuationTargets(nodes.Items, target.NodeName)
	targets = slices.DeleteFunc(targets, func(n *corev1.Node) bool { return slices.Contains(down, n.Name) })

	migrating, err := previewVMs(ctx, wc, cfg, target.NodeName, targets, nonWitness, &d)
	if err != nil {
		return d, err
	}
	if d.Capacity, err = previewCapacity(ctx, wc, targets, migrating, &d); err != nil {
		return d, err
	}
	if d.DegradedVolumes, err = previewVolumes(ctx, wc, target); err != nil {
		return d, err
	}
	// skipDrain: a cluster of one node is not drained (singleNodeSkip); the run reads it
	// from the UpgradePlan, which counts the same non-witness nodes.
	if nonWitness > 1 {
		d.BlockingPods, err = previewPods(ctx, wc, target.NodeName, cfg.Spec.Drain, d.DegradedVolumes)
	}
	return d, err
}

// previewDown are the nodes down together with the candidate: by the time the candidate's
// evacuation runs, those are cordoned or NotReady, so EvacuationTargets would leave them
// out, and the storage checks count them down (longhorn.DownSet).
func previewDown(target nodeupdater.PreflightTarget) []string {
	down := append([]string{target.NodeName}, target.Disrupted...)
	return append(down, target.Picked...)
}

// previewVMs sorts the node's VMIs as the evacuation would (judgeVMI): the ones it would
// stop go to d.StoppedVMs with the reason, the ones it would live-migrate are returned
// for previewCapacity, which names where they have room. A VMI that is not Running yet
// or is shutting down is waited for by the run and decided on later: it is left out.
func previewVMs(ctx context.Context, wc client.Client, cfg *harvesterv1.HarvesterUpgrader, node string, targets []*corev1.Node, nonWitness int, d *inplacev1.NodeDisruption) ([]*kubevirtv1.VirtualMachineInstance, error) {
	vmis, served, err := vmisOnNode(ctx, wc, node)
	if err != nil || !served {
		return nil, err
	}
	var migrating []*kubevirtv1.VirtualMachineInstance
	for i := range vmis {
		vmi := &vmis[i]
		switch action, why := judgeVMI(vmi, node, targets, nonWitness); action {
		case vmiStop:
			vm, err := previewStop(ctx, wc, cfg, vmi, why)
			if err != nil {
				return nil, err
			}
			d.StoppedVMs = append(d.StoppedVMs, vm)
		case vmiHold:
			d.StoppedVMs = append(d.StoppedVMs, inplacev1.PreviewVM{Namespace: vmi.Namespace, Name: vmi.Name, Reason: "would hold the node: " + why})
		case vmiMigrate:
			migrating = append(migrating, vmi)
		}
	}
	return migrating, nil
}

// previewStop says what the evacuation's stop (stopOnNode, kubevirt.StopVM) would do to
// a VMI that cannot be live-migrated: stop its VirtualMachine and start it again after
// the node (restoreVM), leave a paused one stopped (fact 32), or hold the node where the
// updater could not start it again (no VirtualMachine owns it, runStrategy Manual or
// Once: kubevirt.StopRefusal).
func previewStop(ctx context.Context, wc client.Client, cfg *harvesterv1.HarvesterUpgrader, vmi *kubevirtv1.VirtualMachineInstance, why string) (inplacev1.PreviewVM, error) {
	out := inplacev1.PreviewVM{Namespace: vmi.Namespace, Name: vmi.Name}
	owner := kubevirt.VMIOwnerVM(vmi)
	if owner == "" {
		out.Reason = "would hold the node: " + unownedHold(vmi, why)
		return out, nil
	}
	out.Name = owner
	vm := &kubevirtv1.VirtualMachine{}
	if err := wc.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: owner}, vm); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return out, fmt.Errorf("get VirtualMachine %s/%s: %w", vmi.Namespace, owner, err)
		}
		out.Reason = fmt.Sprintf("stops with its VirtualMachine, which is being deleted: it cannot be live-migrated (%s)", why)
		return out, nil
	}
	_, halted, held := kubevirt.StopRefusal(vm)
	switch {
	case held != "":
		out.Reason = fmt.Sprintf("would hold the node: it cannot be live-migrated (%s), and %s", why, held)
	case halted:
		out.Reason = fmt.Sprintf("stopping already (runStrategy Halted); it cannot be live-migrated (%s)", why)
	case kubevirt.VMIPaused(vmi):
		out.Reason = fmt.Sprintf("stopped: it cannot be live-migrated (%s); paused, so it is not started again after the upgrade, as Harvester does (fact 32)", why)
	case cfg.Spec.RestoreVM != nil && !*cfg.Spec.RestoreVM:
		out.Reason = fmt.Sprintf("stopped: it cannot be live-migrated (%s); left stopped after the upgrade (restoreVM is false)", why)
	default:
		out.Reason = fmt.Sprintf("stopped: it cannot be live-migrated (%s); started again once the node is upgraded", why)
	}
	return out, nil
}

// previewVolumes are the Longhorn volumes that would have no healthy replica outside the
// candidate and the nodes down with it: what the LonghornV1ReplicaElsewhere and
// LonghornV2ReplicaElsewhere checks hold the node for, at pick time and again at its
// cordon (storageSettled). Nothing on a cluster without Longhorn.
func previewVolumes(ctx context.Context, wc client.Client, target nodeupdater.PreflightTarget) ([]inplacev1.PreviewVolume, error) {
	served, err := kube.KindServed(wc, schema.GroupKind{Group: "longhorn.io", Kind: "Volume"}, "v1beta2")
	if err != nil || !served {
		return nil, err
	}
	state, err := longhorn.Read(ctx, wc)
	if err != nil {
		return nil, err
	}
	down := longhorn.DownSet{Candidate: target.NodeName, Disrupted: target.Disrupted, Picked: target.Picked}
	var out []inplacev1.PreviewVolume
	for _, engine := range []longhornv1.DataEngineType{longhornv1.DataEngineTypeV1, longhornv1.DataEngineTypeV2} {
		for _, v := range state.LostVolumes(down, engine) {
			out = append(out, inplacev1.PreviewVolume{Name: v.Name, Reason: fmt.Sprintf(
				"%s volume: its healthy replicas are all on nodes down together (%s), so 0 healthy replicas would be left; the node would be held until one is rebuilt elsewhere",
				v.DataEngine, strings.Join(v.Nodes, ", "))})
		}
	}
	return out, nil
}

// TypicalNodeDuration is a rough default for one Harvester node's upgrade, for a cluster
// with no past NodeUpdates to measure: 45 minutes. It is an estimate, not a measure: the
// node's time is dominated by the OS upgrade and its reboot (elemental upgrade, the
// updater's own timeout for it is 45 minutes, harvesterv1.DefaultOSUpgradeTimeout), RKE2's
// upgrade and the evacuation of its VMs, which depends on how many run there and how much
// memory they live-migrate. The updater's timeouts bound a node at 4 hours
// (DefaultNodeTimeout); the past NodeUpdates of the cluster are the better source.
func (u *Updater) TypicalNodeDuration() time.Duration {
	return typicalNodeDuration
}

const typicalNodeDuration = 45 * time.Minute
