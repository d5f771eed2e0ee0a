package kubevirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
)

// The updater reaches KubeVirt's objects on the workload cluster with the credentials of
// the Cluster's kubeconfig Secret, like its Plans: no marker of the manager's own
// (management cluster) ClusterRole. docs/harvester.md lists what it needs there.

// What the updater writes on KubeVirt's objects of the workload cluster. A stopped
// virtual machine carries its record on itself, written in the same request that stops
// it, so that no restart of the manager, and no lost status write, can forget a VM the
// updater stopped.
const (
	// LabelStoppedBy is set on a VirtualMachine the updater stopped because it could not
	// be live-migrated off its node: the UID of the NodeUpdate that stopped it. RestoreVMs
	// and the abort find the VMs to start again by it.
	LabelStoppedBy = "harvester.inplace.cluster.x-k8s.io/stopped-by"
	// AnnotationRunStrategyBeforeStop is the run strategy the VirtualMachine had before
	// the updater stopped it (Always or RerunOnFailure), which it gets back.
	AnnotationRunStrategyBeforeStop = "harvester.inplace.cluster.x-k8s.io/run-strategy-before-stop"
	// AnnotationStoppedOnNode names the node whose upgrade stopped the VirtualMachine.
	AnnotationStoppedOnNode = "harvester.inplace.cluster.x-k8s.io/stopped-on-node"
	// LabelWitnessNode marks a Harvester witness node (etcd only, no virtual machines).
	LabelWitnessNode = "node-role.harvesterhci.io/witness"
)

// isWitness reports whether a node is a Harvester witness node.
func IsWitness(node *corev1.Node) bool {
	v, ok := node.Labels[LabelWitnessNode]
	return ok && v != "false"
}

// migrationName is the deterministic name of the migration that evacuates one VMI for one
// NodeUpdate: a restart or a retry finds the migration it created instead of creating a
// second. The hash covers the NodeUpdate's UID and the VMI, the readable part is cut to
// keep the name a valid label value (KubeVirt labels pods with it).
func MigrationName(nu *inplacev1.NodeUpdate, vmi *kubevirtv1.VirtualMachineInstance) string {
	sum := sha256.Sum256([]byte(string(nu.UID) + "/" + vmi.Namespace + "/" + vmi.Name))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	base := "capi-inplace-evacuate-" + vmi.Name
	if len(base)+len(suffix) > 63 {
		base = strings.TrimRight(base[:63-len(suffix)], "-.")
	}
	return base + suffix
}

// evacuationTargets are the nodes a VMI of node could be live-migrated to: every other
// node that is schedulable, Ready and not a witness; and nonWitness is the number of
// non-witness nodes of the cluster.
func EvacuationTargets(nodes []corev1.Node, node string) (targets []*corev1.Node, nonWitness int) {
	for i := range nodes {
		n := &nodes[i]
		if IsWitness(n) {
			continue
		}
		nonWitness++
		if n.Name != node && !n.Spec.Unschedulable && kube.NodeReady(n) {
			targets = append(targets, n)
		}
	}
	return targets, nonWitness
}

// MigrationTargetAnnotation is what Harvester's "migrate" action writes on a VMI, naming
// the target node the user chose. Before v1.7.0 the action also pinned the VMI there
// with spec.nodeSelector kubernetes.io/hostname=<target>, and Harvester's migration
// controller removes both only once that migration completes (harvester@v1.5.1
// pkg/api/vm/handler.go migrate; pkg/controller/master/migration/vmi_controller.go
// resetHarvesterMigrationStateInVMI). A migration that failed leaves the VMI pinned to a
// node it does not run on, and Harvester's upgrade then counts it non-migratable and
// shuts it down (harvester/harvester#8147, #8212). From v1.7.0 the action confines the
// migration itself (addedNodeSelector, harvester/harvester PR #9096), but VMIs started
// before keep what they carry.
const MigrationTargetAnnotation = "harvesterhci.io/migrationTargetNodeName"

// LeftoverMigrationPin returns the node a failed migration of Harvester's "migrate"
// action left the VMI pinned to (MigrationTargetAnnotation), "" when it carries no such
// leftover: the annotation and a spec.nodeSelector kubernetes.io/hostname naming the
// same node, which is not the node it runs on.
func LeftoverMigrationPin(vmi *kubevirtv1.VirtualMachineInstance) string {
	target := vmi.Annotations[MigrationTargetAnnotation]
	if target == "" || vmi.Spec.NodeSelector[corev1.LabelHostname] != target || vmi.Status.NodeName == target {
		return ""
	}
	return target
}

// whyNotMigratable says why a VMI cannot be live-migrated off its node, or "" when it
// can. The rule is Harvester's (shared/facts/harvester-node-upgrade.md, fact 31): every
// VMI when the cluster has one non-witness node; otherwise a VMI with a nodeSelector,
// with host devices (PCI, USB, or a vGPU, which KubeVirt lists as a GPU), or with a
// required node affinity that no other schedulable non-witness node satisfies. KubeVirt's
// own verdict counts too: a LiveMigratable condition False (its migration admission
// refuses such a VMI).
func WhyNotMigratable(vmi *kubevirtv1.VirtualMachineInstance, targets []*corev1.Node, nonWitness int) string {
	if nonWitness <= 1 {
		return "the cluster has no other node to migrate it to"
	}
	if len(vmi.Spec.NodeSelector) > 0 {
		return "it has a nodeSelector"
	}
	if d := vmi.Spec.Domain.Devices; len(d.HostDevices) > 0 || len(d.GPUs) > 0 {
		return "it uses host devices"
	}
	if a := vmi.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		fits := false
		for _, n := range targets {
			if ok, err := corev1helpers.MatchNodeSelectorTerms(n, a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution); err == nil && ok {
				fits = true
				break
			}
		}
		if !fits {
			return "no other schedulable node satisfies its required node affinity"
		}
	}
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstanceIsMigratable && c.Status == corev1.ConditionFalse {
			why := "KubeVirt reports it not live-migratable"
			if c.Reason != "" {
				why += " (" + c.Reason + ")"
			}
			return why
		}
	}
	return ""
}

// vmiPaused reports whether a VMI is paused (KubeVirt's Paused condition).
func VMIPaused(vmi *kubevirtv1.VirtualMachineInstance) bool {
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstancePaused && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// vmiFinished reports whether a VMI has ended: it runs nowhere and holds no node.
func VMIFinished(vmi *kubevirtv1.VirtualMachineInstance) bool {
	return vmi.Status.Phase == kubevirtv1.Succeeded || vmi.Status.Phase == kubevirtv1.Failed
}

// migrationFinished reports whether a migration has ended, well or not.
func MigrationFinished(m *kubevirtv1.VirtualMachineInstanceMigration) bool {
	return m.Status.Phase == kubevirtv1.MigrationSucceeded || m.Status.Phase == kubevirtv1.MigrationFailed
}

// migrationFailure is what KubeVirt says about a failed migration: the failure reason of
// its migration state, else the conditions it set, else its phase.
func MigrationFailure(m *kubevirtv1.VirtualMachineInstanceMigration) string {
	if s := m.Status.MigrationState; s != nil && s.FailureReason != "" {
		return s.FailureReason
	}
	var parts []string
	for _, c := range m.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Reason != "" || c.Message != "") {
			parts = append(parts, strings.TrimSpace(c.Reason+" "+c.Message))
		}
	}
	if len(parts) > 0 {
		return strings.Join(parts, "; ")
	}
	return "the migration is " + string(m.Status.Phase)
}

// vmiOwnerVM returns the name of the VirtualMachine that owns a VMI, "" for a VMI that
// no VirtualMachine owns (it cannot be stopped and started again).
func VMIOwnerVM(vmi *kubevirtv1.VirtualMachineInstance) string {
	for _, o := range vmi.OwnerReferences {
		if o.Kind == "VirtualMachine" && strings.HasPrefix(o.APIVersion, kubevirtv1.GroupVersion.Group+"/") {
			return o.Name
		}
	}
	return ""
}

// stopVM stops a VirtualMachine whose VMI cannot leave the node and records, in the same
// write, that this NodeUpdate stopped it and with which run strategy it ran. A VM that
// uses the deprecated spec.running gets running: false, any other runStrategy: Halted
// (KubeVirt forbids setting both). record false stops without the record, for a paused
// VM, which is not started again (fact 32). held says why the VM cannot be stopped this
// way: KubeVirt starts a Manual or Once VM only on a request to its start subresource,
// so restoring the strategy would not bring it back. by is who stops it (a NodeUpdate's
// UID, or an UpgradePlan's for the cluster upgrade), node the node whose upgrade stops
// it ("" for the cluster upgrade).
func StopVM(ctx context.Context, wc client.Client, by types.UID, node, namespace, name string, record bool) (stopped bool, held string, err error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := wc.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, vm); err != nil {
		if apierrors.IsNotFound(err) {
			return false, "", nil // its VMI goes with it
		}
		return false, "", fmt.Errorf("get VirtualMachine %s/%s: %w", namespace, name, err)
	}
	strategy, halted, held := StopRefusal(vm)
	if halted || held != "" {
		return false, held, nil
	}
	patch := client.MergeFromWithOptions(vm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if vm.Spec.Running != nil {
		vm.Spec.Running = new(bool)
	} else {
		halted := kubevirtv1.RunStrategyHalted
		vm.Spec.RunStrategy = &halted
	}
	if record {
		if vm.Labels == nil {
			vm.Labels = map[string]string{}
		}
		if vm.Annotations == nil {
			vm.Annotations = map[string]string{}
		}
		vm.Labels[LabelStoppedBy] = string(by)
		vm.Annotations[AnnotationRunStrategyBeforeStop] = string(strategy)
		if node != "" {
			vm.Annotations[AnnotationStoppedOnNode] = node
		}
	}
	if err := wc.Patch(ctx, vm, patch); err != nil {
		return false, "", fmt.Errorf("stop VirtualMachine %s/%s: %w", namespace, name, err)
	}
	return true, "", nil
}

// StopRefusal is StopVM's judgement of a VirtualMachine before it writes: halted when it
// is stopping already (by someone else or by us), held when the updater must not stop it
// (its run strategy cannot be read, or is Manual or Once, which KubeVirt starts only on
// a request to the start subresource, so restoring the strategy would not bring it
// back); otherwise the strategy it runs with, which it gets back. The disruption preview
// asks the same, so that it names the VMs the run would refuse to stop.
func StopRefusal(vm *kubevirtv1.VirtualMachine) (strategy kubevirtv1.VirtualMachineRunStrategy, halted bool, held string) {
	strategy, err := vm.RunStrategy()
	switch {
	case err != nil:
		return "", false, fmt.Sprintf("VirtualMachine %s: %v", VMKey(vm), err)
	case strategy == kubevirtv1.RunStrategyHalted:
		return strategy, true, ""
	case strategy != kubevirtv1.RunStrategyAlways && strategy != kubevirtv1.RunStrategyRerunOnFailure:
		return strategy, false, fmt.Sprintf("VirtualMachine %s runs with runStrategy %s, which the updater could stop but not start again: stop it yourself (it then stays stopped) or make it live-migratable", VMKey(vm), strategy)
	}
	return strategy, false, ""
}

// StoppedVMs lists the VirtualMachines that by (StopVM) stopped and has not started
// again; what names by for the error ("node hv-1", "the cluster upgrade").
func StoppedVMs(ctx context.Context, wc client.Client, by types.UID, what string) ([]kubevirtv1.VirtualMachine, error) {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := wc.List(ctx, vms, client.MatchingLabels{LabelStoppedBy: string(by)}); err != nil {
		if Absent(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list the virtual machines stopped for %s: %w", what, err)
	}
	sort.Slice(vms.Items, func(i, j int) bool { return VMKey(&vms.Items[i]) < VMKey(&vms.Items[j]) })
	return vms.Items, nil
}

// restoreVM gives a VirtualMachine the updater stopped its run strategy back, which
// starts it (KubeVirt creates its VMI), and removes the record. A VM whose user changed
// its run strategy meanwhile (started it, or chose another) is left as the user set it:
// only the record goes. started says whether the VM was started.
func RestoreVM(ctx context.Context, wc client.Client, vm *kubevirtv1.VirtualMachine) (started bool, err error) {
	patch := client.MergeFromWithOptions(vm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	before := kubevirtv1.VirtualMachineRunStrategy(vm.Annotations[AnnotationRunStrategyBeforeStop])
	if current, err := vm.RunStrategy(); err == nil && current == kubevirtv1.RunStrategyHalted && before != "" && before != kubevirtv1.RunStrategyHalted {
		if vm.Spec.Running != nil {
			vm.Spec.Running = ptr.To(true)
		} else {
			vm.Spec.RunStrategy = &before
		}
		started = true
	}
	delete(vm.Labels, LabelStoppedBy)
	delete(vm.Annotations, AnnotationRunStrategyBeforeStop)
	delete(vm.Annotations, AnnotationStoppedOnNode)
	if err := wc.Patch(ctx, vm, patch); err != nil {
		return false, fmt.Errorf("start VirtualMachine %s: %w", VMKey(vm), err)
	}
	return started, nil
}

// kubevirtAbsent reports whether an error says the cluster does not serve KubeVirt's
// API: a cluster without KubeVirt has no virtual machines to evacuate.
func Absent(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err)
}

func VMKey(o client.Object) string { return o.GetNamespace() + "/" + o.GetName() }

// runStrategyOf is a VM's run strategy as KubeVirt reads it, for messages.
func RunStrategyOf(vm *kubevirtv1.VirtualMachine) string {
	s, err := vm.RunStrategy()
	if err != nil {
		return err.Error()
	}
	return string(s)
}
