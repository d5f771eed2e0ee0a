package extension

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// The CanUpdate hooks and UpdateMachine share one judge: the request UpdateMachine makes
// for a machine (handOverRequest), judged by upgraderequest.Requester.Judge, the very
// checks Requester.Request runs before it creates a task. A CanUpdate hook that is about
// to let Cluster API update machines in place asks it first, and answers Failure with its
// decline, so that what UpdateMachine would decline is refused at the first question.
//
// This matters because Cluster API acts on a yes at once and cannot take it back: the
// MachineDeployment planner moves the machines to the new MachineSet and the MachineSet
// controller marks them for an in-place update (cluster-api v1.14.2,
// core/reconcilers/machinedeployment/machinedeployment_rollout_rollingupdate.go:
// reconcileInPlaceUpdateIntent), and the MachineSet preflight checks, which hold a
// rollout on a control plane that is not at the version yet, cover the creation of new
// machines only (core/reconcilers/machineset/machineset_preflight.go:
// runPreflightChecks, called from syncReplicas' scale up), not a move. A decline from
// UpdateMachine then leaves each machine marked, Updating and unavailable, until someone
// reverts the MachineDeployment. A Failure from CanUpdateMachineSet is not cached
// (internal/runtime/client/client.go: CallExtension returns it as an error, and
// canUpdateMachineSetInPlace caches only answers), so Cluster API asks again on its next
// reconcile and moves nothing until the judge accepts.

// handOverRequest is the request UpdateMachine makes to hand a machine of target over:
// paced by Cluster API, every machine of the target at once (Cluster API paces them), a
// control plane one node at a time, and a running node of another path waited for.
func handOverRequest(namespace, clusterName string, target upgraderequest.Target, version string, updaterRef *inplacev1.UpdaterReference) upgraderequest.Request {
	maxUnavailable := intstr.FromString("100%")
	if target.IsControlPlane() {
		maxUnavailable = intstr.FromInt32(1)
	}
	return upgraderequest.Request{
		Namespace:        namespace,
		ClusterName:      clusterName,
		Target:           target,
		Version:          version,
		UpdaterRef:       updaterRef,
		Pacing:           inplacev1.PacingExternal,
		MaxUnavailable:   &maxUnavailable,
		KeepRunningNodes: true,
	}
}

// judge is the Requester that judges: the hooks' own, or (for InPlaceHooks built without
// one, as UpgradePreview's may be) one that reads through the hooks' client. Judge only
// reads.
func (h *InPlaceHooks) judge() *upgraderequest.Requester {
	if h.Requester != nil {
		return h.Requester
	}
	return &upgraderequest.Requester{Client: h.Client, Registry: h.Registry, DefaultUpdater: h.DefaultUpdater}
}

// judgeHandOver asks the judge whether UpdateMachine would accept the machines a
// CanUpdate hook is about to let Cluster API update in place. It returns an error with
// the decline's reason when it would not.
func (h *InPlaceHooks) judgeHandOver(ctx context.Context, in canUpdateInput, cluster *clusterv1.Cluster) error {
	target, err := in.target(ctx, h, cluster)
	if err != nil || (target.ControlPlaneRef == nil && target.MachineDeploymentRef == nil) {
		return err
	}
	updaterRef, err := updaterFromSettings(in.settings)
	if err != nil {
		return withReason(upgraderequest.ReasonInvalidUpdater, err)
	}
	d, err := h.judge().Judge(ctx, handOverRequest(in.namespace, cluster.Name, target, in.desiredVersion, updaterRef))
	if err != nil {
		return withReason(HookReasonAPIError, fmt.Errorf("judge the in-place update of %s %s/%s: %w", in.object, in.namespace, in.name, err))
	}
	if d == nil {
		return nil
	}
	err = withReason(d.Reason, failuref("capi-inplace refuses to update the machines of %s in place (%s): %s. UpdateMachine would decline them, so this answer stops Cluster API before it moves or marks any machine; it asks again and goes on once this is resolved",
		target, d.Reason, d.Message))
	h.recordRefusal(cluster, in.hook, err.Error())
	return err
}

// machineSetTarget is the MachineDeployment a CanUpdateMachineSet request's MachineSet
// belongs to: the deployment-name label Cluster API puts on its MachineSets
// (computeDesiredMS), else the MachineSet's owner as the cache shows it.
func machineSetTarget(ctx context.Context, h *InPlaceHooks, in canUpdateInput, labels map[string]string) (upgraderequest.Target, error) {
	if name := labels[clusterv1.MachineDeploymentNameLabel]; name != "" {
		return upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: name}}, nil
	}
	ms := &clusterv1.MachineSet{}
	if err := h.Client.Get(ctx, client.ObjectKey{Namespace: in.namespace, Name: in.name}, ms); err != nil {
		return upgraderequest.Target{}, withReason(HookReasonUnknownOwner, fmt.Errorf("MachineSet %s/%s has no %s label and cannot be read, so capi-inplace cannot tell which MachineDeployment it belongs to: %w", in.namespace, in.name, clusterv1.MachineDeploymentNameLabel, err))
	}
	for _, ref := range ms.OwnerReferences {
		if ref.Kind == "MachineDeployment" && groupOf(ref.APIVersion) == clusterv1.GroupVersion.Group {
			return upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: ref.Name}}, nil
		}
	}
	return upgraderequest.Target{}, withReason(HookReasonUnknownOwner, failuref("MachineSet %s/%s belongs to no MachineDeployment: capi-inplace upgrades machines of a control plane or a MachineDeployment", in.namespace, in.name))
}

// controlPlaneTarget is the Cluster's control plane: only KubeadmControlPlane calls
// CanUpdateMachine, for its own machines. A Cluster without spec.controlPlaneRef (not
// one KubeadmControlPlane asks about) names no target, and there is nothing to judge.
func controlPlaneTarget(cluster *clusterv1.Cluster) (upgraderequest.Target, error) {
	cp := cluster.Spec.ControlPlaneRef
	if !cp.IsDefined() {
		return upgraderequest.Target{}, nil
	}
	return upgraderequest.Target{ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: cp.APIGroup, Kind: cp.Kind, Name: cp.Name}}, nil
}
