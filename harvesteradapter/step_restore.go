package harvesteradapter

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
)

// restoreStep starts again the virtual machines EvacuateVMs stopped, once the node runs
// the release.
var restoreStep = step{
	name:    StepRestoreVMs,
	timeout: func(harvesterv1.Timeouts) time.Duration { return 10 * time.Minute },
	skip:    (*Updater).skipRestore,
	run:     (*Updater).runRestore,
}

// restoresVMs reports whether the VMs stopped on the node are started again: restoreVM
// (default true), never on a witness node (harvester-node-upgrade.md, fact 34).
func restoresVMs(r *nodeRun, node *corev1.Node) (bool, string) {
	if r.cfg.Spec.RestoreVM != nil && !*r.cfg.Spec.RestoreVM {
		return false, "restoreVM is false in the HarvesterUpgrader"
	}
	if node != nil && kubevirt.IsWitness(node) {
		return false, fmt.Sprintf("node %s is a witness node", node.Name)
	}
	return true, ""
}

func (u *Updater) skipRestore(ctx context.Context, r *nodeRun) (string, error) {
	node, err := u.node(ctx, r)
	if err != nil {
		return "", err
	}
	if ok, why := restoresVMs(r, node); !ok {
		vms, err := kubevirt.StoppedVMs(ctx, r.wc, r.nu.UID, "node "+r.nu.Spec.NodeName)
		if err != nil {
			return "", err
		}
		for i := range vms {
			u.event(r, corev1.EventTypeNormal, EventVMLeftStopped, "Restore",
				fmt.Sprintf("leaving VM %s stopped: %s", kubevirt.VMKey(&vms[i]), why))
		}
		return why + ": the virtual machines stopped on the node stay stopped", nil
	}
	return "", nil
}

// runRestore gives each VM the updater stopped its run strategy back; KubeVirt then
// starts it. The step does not wait for the VMs to run, as Harvester's restore-vm does
// not (fact 34): the node is still cordoned until Finish, right after, and a VM bound to
// it by a nodeSelector or a host device can only start once it is schedulable again.
// The node is Ready on the release here: KubernetesUpgrade and OSUpgrade wait for it.
func (u *Updater) runRestore(ctx context.Context, r *nodeRun) (bool, string, error) {
	started, err := u.restoreStoppedVMs(ctx, r)
	if err != nil {
		return false, "", err
	}
	if len(started) == 0 {
		return true, fmt.Sprintf("no virtual machine was stopped on node %s", r.nu.Spec.NodeName), nil
	}
	return true, fmt.Sprintf("started %s again; they run once node %s is back in service", strings.Join(started, ", "), r.nu.Spec.NodeName), nil
}

// restoreStoppedVMs starts every VM this NodeUpdate stopped and still has on record, and
// returns the ones it started. Used by RestoreVMs and by cleanup (Finish and abort).
func (u *Updater) restoreStoppedVMs(ctx context.Context, r *nodeRun) ([]string, error) {
	vms, err := kubevirt.StoppedVMs(ctx, r.wc, r.nu.UID, "node "+r.nu.Spec.NodeName)
	if err != nil {
		return nil, err
	}
	var started []string
	for i := range vms {
		vm := &vms[i]
		ok, err := kubevirt.RestoreVM(ctx, r.wc, vm)
		if err != nil {
			return started, err
		}
		if ok {
			started = append(started, kubevirt.VMKey(vm))
			u.event(r, corev1.EventTypeNormal, EventVMStarted, "Restore",
				fmt.Sprintf("starting VM %s again (runStrategy %s) after the upgrade of node %s", kubevirt.VMKey(vm), kubevirt.RunStrategyOf(vm), r.nu.Spec.NodeName))
		}
	}
	return started, nil
}
