package upgradetask

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/version"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// holdsClaims reports whether a task still holds its machines: it has not ended, or it is a
// dry run's plan (Planned), which a newer request aborts like any running task.
func holdsClaims(t *inplacev1.UpgradeTask) bool {
	return !t.Status.Phase.IsFinal() || t.Status.Phase == inplacev1.TaskPhasePlanned
}

// holds reports whether the live task older keeps task from starting: both are for the
// same target, older was created first, and they are not both externally paced (Cluster
// API paces those itself, and may hand a later machine to a newer version's task while an
// older task finishes a machine it had handed over). A hand-made second task for a target
// waits for the first; a request's new task waits until the task it superseded has
// stopped at its safe point.
func holds(older, task *inplacev1.UpgradeTask) bool {
	if older.Spec.ClusterName != task.Spec.ClusterName || !upgraderequest.TargetOf(older).Same(upgraderequest.TargetOf(task)) {
		return false
	}
	if older.Spec.Pacing == inplacev1.PacingExternal && task.Spec.Pacing == inplacev1.PacingExternal {
		return false
	}
	if !older.CreationTimestamp.Equal(&task.CreationTimestamp) {
		return older.CreationTimestamp.Before(&task.CreationTimestamp)
	}
	return older.Name < task.Name
}

// controlPlaneBehind describes the Cluster's control plane machines that do not run
// target yet, as "machine (version)": a worker must never run a kubelet newer than the
// API server. A machine being deleted counts until it is gone: its API server serves
// until Cluster API has drained it and removed its infrastructure. Cluster API's own
// MachineSet preflight judges skew the same way: against the first of the control
// plane's status.versions, which KubeadmControlPlane aggregates from all its Machines.
func controlPlaneBehind(machines []clusterv1.Machine, target *version.Version) []string {
	var out []string
	for i := range machines {
		m := &machines[i]
		if !disruption.IsControlPlane(m) || !upgraderequest.RequiresUpgrade(m, target) {
			continue
		}
		deleting := ""
		if !m.DeletionTimestamp.IsZero() {
			deleting = ", being deleted"
		}
		out = append(out, fmt.Sprintf("%s (%s%s)", m.Name, upgraderequest.CurrentVersion(m), deleting))
	}
	slices.Sort(out)
	return out
}

// judgement is the updater's word on whether a machine whose kubelet reports the target
// runs it as the updater upgrades it.
type judgement struct {
	at  bool
	why string
}

// judgeAtTarget asks the task's updater about every target machine whose kubelet reports
// the target without the release annotation a NodeUpdate of capi-inplace writes when it
// ends well: a node whose kubelet was upgraded and whose later step failed is not done.
// The kubelet is read from the Machine (Cluster API's copy of the Node) and from the live
// Node of the workload cluster, read at this reconcile (s.nodes): the Machine lags the
// Node by seconds, and a machine whose node an earlier NodeUpdate upgraded before it was
// aborted, failed or deleted would otherwise be started again on the Machine's word
// (issue #34 point 1). So no NodeUpdate is created for a machine whose live node runs the
// target unless the updater, asked now, says it is behind. A live node newer than the
// target is not asked about (a judge answers for the target, and a NodeUpdate there would
// be a downgrade): selection never starts it.
func (r *Reconciler) judgeAtTarget(ctx context.Context, s *taskScope) (map[string]judgement, error) {
	out := map[string]judgement{}
	for i := range s.targetMachines {
		m := &s.targetMachines[i]
		live, known := liveOrder(s, m)
		reported := upgraderequest.ReachedInPlace(m, s.version) || (known && live == 0)
		if !reported || releaseIs(m, s.version) {
			continue
		}
		if nu := s.nodeUpdates[m.Name]; nu != nil && nu.Status.Phase == inplacev1.NodeUpdatePhaseSucceeded {
			continue
		}
		at, why, err := r.Registry.AtTarget(ctx, nodeupdater.PreflightTarget{
			Namespace: s.task.Namespace, ClusterName: s.task.Spec.ClusterName, MachineName: m.Name,
			NodeName: m.Status.NodeRef.Name, Version: s.task.Spec.Version, UpdaterRef: s.task.Spec.UpdaterRef,
			ControlPlane: s.task.Spec.ControlPlaneRef != nil,
		})
		if err != nil {
			return nil, fmt.Errorf("ask updater %s whether machine %s runs %s: %w", s.task.Spec.UpdaterRef, m.Name, s.task.Spec.Version, err)
		}
		out[m.Name] = judgement{at: at, why: why}
	}
	return out, nil
}

// liveOrder compares the kubelet of the machine's live Node (s.nodes, read from the
// workload cluster at this reconcile) with the target (kubeversion.Compare: -1 older, 0
// the target, 1 newer); known is false without a node or an ordered version.
func liveOrder(s *taskScope, m *clusterv1.Machine) (order int, known bool) {
	if m.Status.NodeRef.Name == "" {
		return 0, false
	}
	node := s.nodes[m.Status.NodeRef.Name]
	if node == nil {
		return 0, false
	}
	order, err := kubeversion.CompareStrings(node.Status.NodeInfo.KubeletVersion, s.version.String())
	return order, err == nil
}

// releaseIs reports whether the machine's release annotation records target.
func releaseIs(m *clusterv1.Machine, target *version.Version) bool {
	rel, err := kubeversion.ParseSemantic(m.Annotations[inplacev1.UpgradeReleaseAnnotation])
	return err == nil && kubeversion.SameRelease(rel, target)
}

// atLeast reports whether version v is target or newer (kubeversion.CompareStrings); an
// unparsable or unordered version is not.
func atLeast(v string, target *version.Version) bool {
	order, err := kubeversion.CompareStrings(v, target.String())
	return err == nil && order >= 0
}
