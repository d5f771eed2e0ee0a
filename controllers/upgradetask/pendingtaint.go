package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// errTaintWritesInFlight says that a task cannot end yet: the taint writer still writes a
// hand-over of its taints, and asks for the task again once it is done (trySettle).
var errTaintWritesInFlight = errors.New("upgrade-pending taint writes of the task are still in flight")

// pendingTaint is the taint a task puts on the nodes it has still to upgrade: its value
// names the task, <namespace>.<name> (shortened with a digest past 63 characters), so
// that a task only ever removes its own, even where tasks of the same name in two
// namespaces reach one API server (a task lists every Node of its workload cluster).
func pendingTaint(task *inplacev1.UpgradeTask) corev1.Taint {
	return corev1.Taint{Key: inplacev1.UpgradePendingTaint, Value: upgraderequest.LabelValue(task.Namespace + "." + task.Name), Effect: corev1.TaintEffectPreferNoSchedule}
}

// stillToGo says whether a member's node carries the task's pending taint: the task
// runs and is not a dry run, and the machine is the task's, not being deleted, and
// waits or runs (a node keeps the taint until its NodeUpdate ends, so that nothing new
// is scheduled there in the moments before its cordon).
func stillToGo(s *taskScope, mem *member, phase inplacev1.TaskPhase) bool {
	if s.task.Spec.DryRun || phase.IsFinal() || phase == inplacev1.TaskPhaseAborting || s.task.Spec.Phase == inplacev1.TaskActionAbort {
		return false
	}
	if mem.claimedBy != "" || mem.removed || mem.atTarget || (mem.nu != nil && mem.nu.Status.Phase.IsFinal()) {
		return false
	}
	return mem.picked || mem.state == inplacev1.MachineStateWaiting || mem.state == inplacev1.MachineStateInProgress
}

// reconcilePendingTaints puts the task's PreferNoSchedule taint on the nodes of the
// machines it has still to upgrade and takes it off every other node of the workload
// cluster: kube-scheduler then prefers the nodes that stay (or are done) for new pods,
// and a VM evacuated off one node (its migration target pod is scheduled like any pod)
// is steered away from the next node to go, to be moved again; a preference that a VM's
// own preferred node or pod affinities can outweigh in kube-scheduler's sum of weighted
// scores. The Harvester updater makes it a rule for the VMs it evacuates: it confines
// their migrations to nodes without this taint (harvesteradapter/evacuate_landing.go;
// docs/upgradetask.md#vms-move-once). It runs before the task's
// status is written, so that a task that ended has no taint left on any node.
func (r *Reconciler) reconcilePendingTaints(ctx context.Context, s *taskScope, phase inplacev1.TaskPhase) error {
	want := map[string]bool{}
	for _, mem := range s.members {
		if mem.nodeName != "" && stillToGo(s, mem, phase) {
			want[mem.nodeName] = true
		}
	}
	key := client.ObjectKeyFromObject(s.task)
	cluster := types.NamespacedName{Namespace: s.task.Namespace, Name: s.task.Spec.ClusterName}
	if !phase.IsFinal() {
		// Off the reconcile's path: the next hand-off waits for no taint (taintWriter).
		if len(s.nodes) > 0 {
			stray, err := r.strayPendingTaints(ctx, pendingTaint(s.task), s.nodes)
			if err != nil {
				return err
			}
			r.taints.submit(key, cluster, pendingTaint(s.task), s.nodes, want, stray)
		}
		return nil
	}
	// Even without a node left to look at: a hand-over of an earlier reconcile must not
	// be written after the task ended.
	written, settled := r.taints.trySettle(key)
	if !settled {
		return errTaintWritesInFlight
	}
	if len(s.nodes) == 0 {
		r.taints.forget(key)
		return nil
	}
	wc, err := r.Workload.Client(ctx, cluster)
	if err != nil {
		return fmt.Errorf("reach the workload cluster of Cluster %s/%s to set the upgrade-pending taints: %w", s.task.Namespace, s.task.Spec.ClusterName, err)
	}
	for _, node := range s.nodes {
		// A task that ends waits for its taints to be gone: a conflict is an error, and
		// the reconcile reads the node again.
		if err := setPendingTaintNow(ctx, wc, written, node, pendingTaint(s.task), want[node.Name], r.workloadWriteTimeout()); err != nil {
			return err
		}
	}
	// Nothing more is written for a task that ended: what the writer wrote is not needed.
	r.taints.forget(key)
	return nil
}

// strayPendingTaints are the values of the upgrade-pending taints on nodes that no task
// that has not ended carries (every namespace, from the cache): left by a task deleted
// while its workload cluster could not be reached, or by a put of the taint that its
// workload cluster carried out after the task ended and that a restarted manager could
// not fence (fenceNode). A running task takes them off the nodes of its workload cluster:
// nothing else would, and the Harvester updater keeps evacuated VMs off every node that
// carries the key. A task ends only once its own taints are off, so a value of a task
// that ended is stray. nil when every value of the key on the nodes is this task's.
func (r *Reconciler) strayPendingTaints(ctx context.Context, own corev1.Taint, nodes map[string]*corev1.Node) (map[string]bool, error) {
	var stray map[string]bool
	for _, n := range nodes {
		for _, t := range n.Spec.Taints {
			if t.Key == own.Key && t.Effect == own.Effect && t.Value != own.Value {
				if stray == nil {
					stray = map[string]bool{}
				}
				stray[t.Value] = true
			}
		}
	}
	if stray == nil {
		return nil, nil
	}
	tasks := &inplacev1.UpgradeTaskList{}
	if err := r.Client.List(ctx, tasks, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list UpgradeTasks to find upgrade-pending taints of tasks that ended: %w", err)
	}
	for i := range tasks.Items {
		if t := &tasks.Items[i]; !t.Status.Phase.IsFinal() {
			delete(stray, pendingTaint(t).Value)
		}
	}
	if len(stray) == 0 {
		return nil, nil
	}
	return stray, nil
}

// removePendingTaints takes the task's taint off every node of its workload cluster,
// for a deleted task. An unreachable workload cluster does not keep the task: the taint
// only makes the scheduler prefer other nodes, and a later task's first reconcile
// rewrites the taints of the nodes it still has to upgrade.
func (r *Reconciler) removePendingTaints(ctx context.Context, task *inplacev1.UpgradeTask) error {
	written, settled := r.taints.trySettle(client.ObjectKeyFromObject(task))
	if !settled {
		return errTaintWritesInFlight
	}
	cluster := types.NamespacedName{Namespace: task.Namespace, Name: task.Spec.ClusterName}
	wc, err := r.Workload.Client(ctx, cluster)
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("cannot reach the workload cluster to remove the upgrade-pending taints of a deleted task; left to the next task", "error", err.Error())
		return nil
	}
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes); err != nil {
		ctrl.LoggerFrom(ctx).Info("cannot list the workload cluster's Nodes to remove the upgrade-pending taints of a deleted task; left to the next task", "error", err.Error())
		return nil
	}
	for i := range nodes.Items {
		if err := setPendingTaintNow(ctx, wc, written, &nodes.Items[i], pendingTaint(task), false, r.workloadWriteTimeout()); err != nil {
			return err
		}
	}
	r.taints.forget(client.ObjectKeyFromObject(task))
	return nil
}

// DefaultWorkloadWriteTimeout is how long a write to a workload cluster may go unanswered
// when the Reconciler's WorkloadWriteTimeout is zero: half of kube-apiserver's own
// request timeout (60s), so that a write the server still serves is not cut short.
const DefaultWorkloadWriteTimeout = 30 * time.Second

func (r *Reconciler) workloadWriteTimeout() time.Duration {
	if r.WorkloadWriteTimeout > 0 {
		return r.WorkloadWriteTimeout
	}
	return DefaultWorkloadWriteTimeout
}

// setPendingTaint adds the taint to node, or removes it, when the node is not that way
// yet. The patch carries the resourceVersion read (spec.taints has no merge key: a merge
// patch replaces the whole list), so a taint someone else changed since is never lost:
// the patch conflicts, and the next reconcile reads the node again. A node that carries
// the key with another task's value is left alone (key and effect are unique on a node).
//
// The patch is given up after timeout: a workload API server (or a proxy in front of it)
// that took the request and never answers would otherwise hold the write, and with it the
// task's end, for as long as the connection lives. A write given up is an error like any
// refused one: it is made again at a later reconcile, on a new request.
//
// The taints of the key with a stray value (strayPendingTaints) are taken off in the same
// patch.
func setPendingTaint(ctx context.Context, wc client.Client, node *corev1.Node, taint corev1.Taint, want bool, stray map[string]bool, timeout time.Duration) error {
	taints, changed := wantedTaints(node, taint, want, stray)
	if !changed {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	patched := node.DeepCopy()
	patched.Spec.Taints = taints
	if err := wc.Patch(ctx, patched, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		verb := "remove the upgrade-pending taint from"
		if want {
			verb = "put the upgrade-pending taint on"
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return fmt.Errorf("%s node %s: the workload cluster did not answer within %s; written again at a later reconcile: %w", verb, node.Name, timeout, err)
		}
		return fmt.Errorf("%s node %s: %w", verb, node.Name, err)
	}
	ctrl.LoggerFrom(ctx).V(1).Info("upgrade-pending taint", "node", node.Name, "set", want)
	node.Spec.Taints, node.ResourceVersion = patched.Spec.Taints, patched.ResourceVersion
	return nil
}
