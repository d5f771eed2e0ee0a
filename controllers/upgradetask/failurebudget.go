package upgradetask

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
)

// resetSkew is how far in the future a failure-budget-reset time may be and still count:
// the clock of the person who wrote it may run a little ahead of the manager's. A time
// further ahead would lift failures that have not happened yet, so it is refused.
const resetSkew = time.Minute

// maxEventNote is the longest note the events API accepts.
const maxEventNote = 1024

// maxFailuresListed bounds the failed nodes a message names.
const maxFailuresListed = 10

// failedNode is one failure that counts against a Cluster's failure budget.
type failedNode struct {
	machine, node, task, nodeUpdate, message string
	ended                                    time.Time
	// controlPlane is true for a node of the control plane: its failure alone exhausts
	// the budget.
	controlPlane bool
}

// failureBudget is a Cluster's failure budget as read at this reconcile, from the
// Cluster's annotations and its NodeUpdates: nothing of it is kept in memory, so a
// restarted manager sees the same.
type failureBudget struct {
	cluster clusterv1.Cluster
	// limit is how many failed nodes exhaust the budget.
	limit int
	// failed are the failures that count, oldest first.
	failed []failedNode
	// liftedAt is the reset time in use; zero when none.
	liftedAt time.Time
	// problems say which annotation is not usable and what is used instead.
	problems []string
	// before is the task's FailureBudgetExhausted condition as the status had it before
	// this reconcile (computeStatus shares the conditions of the previous status, so they
	// cannot be read back afterwards); nil when it had none.
	before *metav1.Condition
}

// readFailureBudget counts the failures of the Cluster's NodeUpdates against its budget. A
// failure counts when a NodeUpdate controlled by an UpgradeTask ended Failed (timed out, a
// step failed, retries exhausted), after the reset time if one is set, and no later
// NodeUpdate of the same machine succeeded: that node is no longer a failed node. An
// aborted NodeUpdate is not a failure (a person or a removal stopped it). controlPlane
// says which NodeUpdates upgrade a control plane node (nil: none).
func readFailureBudget(cluster *clusterv1.Cluster, nus []inplacev1.NodeUpdate, now time.Time, controlPlane func(*inplacev1.NodeUpdate) bool) *failureBudget {
	b := &failureBudget{limit: 1}
	if cluster != nil {
		b.cluster = *cluster
	}
	annotations := b.cluster.Annotations
	if v, ok := annotations[inplacev1.FailureBudgetAnnotation]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 {
			b.problems = append(b.problems, fmt.Sprintf("annotation %s is %q, not a whole number of at least 1; the budget is 1 until it is fixed",
				inplacev1.FailureBudgetAnnotation, v))
		} else {
			b.limit = n
		}
	}
	if v, ok := annotations[inplacev1.FailureBudgetResetAnnotation]; ok {
		t, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
		switch {
		case err != nil:
			b.problems = append(b.problems, fmt.Sprintf("annotation %s is %q, not an RFC3339 time such as 2026-01-02T15:04:05Z; no failure is lifted until it is fixed",
				inplacev1.FailureBudgetResetAnnotation, v))
		case t.After(now.Add(resetSkew)):
			b.problems = append(b.problems, fmt.Sprintf("annotation %s is %q, in the future: it would lift failures that have not happened yet; no failure is lifted until it is fixed",
				inplacev1.FailureBudgetResetAnnotation, v))
		default:
			b.liftedAt = t
		}
	}

	succeeded := map[string][]time.Time{}
	for i := range nus {
		if nus[i].Status.Phase == inplacev1.NodeUpdatePhaseSucceeded {
			succeeded[nus[i].Spec.MachineName] = append(succeeded[nus[i].Spec.MachineName], nus[i].CreationTimestamp.Time)
		}
	}
	for i := range nus {
		nu := &nus[i]
		task := controllingTask(nu)
		if nu.Status.Phase != inplacev1.NodeUpdatePhaseFailed || task == "" {
			continue
		}
		ended := nu.CreationTimestamp.Time
		if nu.Status.CompletionTime != nil {
			ended = nu.Status.CompletionTime.Time
		}
		if !b.liftedAt.IsZero() && !ended.After(b.liftedAt) {
			continue
		}
		if slices.ContainsFunc(succeeded[nu.Spec.MachineName], func(created time.Time) bool { return !created.Before(ended) }) {
			continue
		}
		msg := nu.Status.FailureMessage
		if msg == "" {
			msg = nu.Status.FailureReason
		}
		if msg == "" {
			msg = "failed without a message"
		}
		b.failed = append(b.failed, failedNode{machine: nu.Spec.MachineName, node: nu.Spec.NodeName, task: task,
			nodeUpdate: nu.Name, message: truncate(msg, 512), ended: ended, controlPlane: controlPlane != nil && controlPlane(nu)})
	}
	slices.SortFunc(b.failed, func(a, c failedNode) int {
		if d := a.ended.Compare(c.ended); d != 0 {
			return d
		}
		return strings.Compare(a.nodeUpdate, c.nodeUpdate)
	})
	return b
}

// controllingTask names the UpgradeTask that controls a NodeUpdate; empty for a hand-made one.
func controllingTask(nu *inplacev1.NodeUpdate) string {
	if ref := metav1.GetControllerOf(nu); ref != nil && ref.Kind == "UpgradeTask" {
		return ref.Name
	}
	return ""
}

// controlPlaneNodeUpdates says which NodeUpdates of the Cluster upgrade a control plane
// node: those of a machine with Cluster API's control plane label, and every NodeUpdate
// of the task when it targets a control plane (its machine may be gone since).
func controlPlaneNodeUpdates(task *inplacev1.UpgradeTask, machines []clusterv1.Machine) func(*inplacev1.NodeUpdate) bool {
	names := map[string]bool{}
	for i := range machines {
		if disruption.IsControlPlane(&machines[i]) {
			names[machines[i].Name] = true
		}
	}
	return func(nu *inplacev1.NodeUpdate) bool {
		return names[nu.Spec.MachineName] || (task.Spec.ControlPlaneRef != nil && metav1IsControlledBy(nu, task))
	}
}

// exhausted reports whether the Cluster's failed nodes reached its budget. A failed
// control plane node exhausts it whatever its size: etcd and the API server may have
// lost a member, and every task of the Cluster depends on them. A person looks at etcd
// before anything more is touched.
func (b *failureBudget) exhausted() bool {
	return b != nil && (len(b.failed) >= b.limit || b.failedControlPlane() != nil)
}

// failedControlPlane is the first failed control plane node that counts; nil when none.
func (b *failureBudget) failedControlPlane() *failedNode {
	for i := range b.failed {
		if b.failed[i].controlPlane {
			return &b.failed[i]
		}
	}
	return nil
}

// counts reports whether the failure of a member's NodeUpdate counts against the budget.
func (b *failureBudget) counts(mem *member) bool {
	if b == nil || mem.nu == nil {
		return false
	}
	return slices.ContainsFunc(b.failed, func(f failedNode) bool { return f.nodeUpdate == mem.nu.Name })
}

// gateMessage is the message of the closed gate when the budget is exhausted; empty otherwise.
func (b *failureBudget) gateMessage() string {
	if !b.exhausted() {
		return ""
	}
	var names []string
	for i, f := range b.failed {
		if i == maxFailuresListed {
			names = append(names, fmt.Sprintf("and %d more", len(b.failed)-maxFailuresListed))
			break
		}
		kind := "machine"
		if f.controlPlane {
			kind = "control plane machine"
		}
		names = append(names, fmt.Sprintf("%s %s (node %s) of UpgradeTask %s failed at %s: %s",
			kind, f.machine, f.node, f.task, f.ended.UTC().Format(time.RFC3339), f.message))
	}
	why, look := "", "once you have looked"
	if cp := b.failedControlPlane(); cp != nil {
		why = fmt.Sprintf(" (a failed control plane node exhausts it whatever its size: control plane machine %s failed and etcd may have lost a member)", cp.machine)
		look = "once etcd is healthy again (every control plane node a started, voting member: etcdctl member list; no alarm: etcdctl alarm list) and the node is looked at"
	}
	msg := fmt.Sprintf("the failure budget of Cluster %s is exhausted%s: %d failed node(s), budget %d (annotation %s): %s; no task of the Cluster starts a new node (nodes in progress finish). "+
		"To lift it %s: kubectl annotate cluster -n %s %s %s=$(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ) --overwrite (failures that ended before that time no longer count; a failed node is not retried)",
		b.cluster.Name, why, len(b.failed), b.limit, inplacev1.FailureBudgetAnnotation, strings.Join(names, "; "),
		look, b.cluster.Namespace, b.cluster.Name, inplacev1.FailureBudgetResetAnnotation)
	if len(b.problems) > 0 {
		msg += "; " + strings.Join(b.problems, "; ")
	}
	return msg
}

// condition is the task's FailureBudgetExhausted condition.
func (b *failureBudget) condition() (status bool, reason, message string) {
	switch {
	case b.exhausted():
		return true, inplacev1.FailureBudgetExhaustedReason, b.gateMessage()
	case len(b.problems) > 0:
		return false, inplacev1.InvalidFailureBudgetReason, strings.Join(b.problems, "; ")
	}
	lifted := ""
	if !b.liftedAt.IsZero() {
		lifted = fmt.Sprintf(" since the reset at %s", b.liftedAt.UTC().Format(time.RFC3339))
	}
	return false, inplacev1.AsExpectedReason, fmt.Sprintf("%d failed node(s)%s of a budget of %d in Cluster %s", len(b.failed), lifted, b.limit, b.cluster.Name)
}

// stoppedBy returns the member whose end stops the task: a node aborted outside the task,
// or a failed node of the task when the Cluster's failure budget is exhausted by the
// failures that count. While the budget has room, a failed node does not stop its task.
func stoppedBy(s *taskScope) *member {
	for _, mem := range s.members {
		if !mem.failedForTask() {
			continue
		}
		if mem.state != inplacev1.MachineStateFailed || (s.failures.exhausted() && s.failures.counts(mem)) {
			return mem
		}
	}
	return nil
}

// setFailureBudgetCondition sets the task's FailureBudgetExhausted condition; a task that
// ended keeps the one of its last reconcile, which says whether the budget stopped it.
func setFailureBudgetCondition(st *inplacev1.UpgradeTaskStatus, s *taskScope) {
	if s.failures == nil {
		return
	}
	if c := meta.FindStatusCondition(st.Conditions, inplacev1.FailureBudgetExhaustedCondition); c != nil {
		s.failures.before = c.DeepCopy()
	}
	ok, reason, msg := s.failures.condition()
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: inplacev1.FailureBudgetExhaustedCondition, Status: status,
		Reason: reason, Message: truncate(msg, 32768), ObservedGeneration: s.task.Generation})
}

// recordFailureBudget records what changed of the failure budget since the last status: a
// Warning on the task when an annotation of the budget became unusable, and, from the task
// whose failure exhausted the budget, one Warning on the Cluster.
func (r *Reconciler) recordFailureBudget(ctx context.Context, s *taskScope) {
	if s.failures == nil {
		return
	}
	before := s.failures.before
	now := meta.FindStatusCondition(s.task.Status.Conditions, inplacev1.FailureBudgetExhaustedCondition)
	if now == nil || (before != nil && before.Reason == now.Reason && before.Message == now.Message) {
		return
	}
	log := ctrl.LoggerFrom(ctx)
	if problems := strings.Join(s.failures.problems, "; "); problems != "" && (before == nil || !strings.Contains(before.Message, problems)) {
		log.Info("an annotation of the Cluster's failure budget is not usable", "problems", s.failures.problems)
		r.Recorder.Eventf(s.task, nil, corev1.EventTypeWarning, inplacev1.InvalidFailureBudgetReason, "FailureBudget", "%s", truncate(problems, maxEventNote))
	}
	if now.Status != metav1.ConditionTrue || (before != nil && before.Status == metav1.ConditionTrue) {
		return
	}
	last := s.failures.failed[len(s.failures.failed)-1]
	log.Info("the Cluster's failure budget is exhausted; no task of the Cluster starts a new node", "failed", len(s.failures.failed), "budget", s.failures.limit)
	if last.task == s.task.Name && s.cluster != nil && s.cluster.UID != "" {
		r.Recorder.Eventf(s.cluster, s.task, corev1.EventTypeWarning, inplacev1.FailureBudgetExhaustedReason, "FailureBudget", "%s", truncate(now.Message, maxEventNote))
	}
}

// clusterToTasks maps a Cluster to its live UpgradeTasks: a change of its failure budget
// (a lift, a new budget) lets them start nodes again, or holds them.
func (r *Reconciler) clusterToTasks(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.liveTasksOf(ctx, obj.GetNamespace(), obj.GetName())
}

// failedNodeUpdateToTasks maps a NodeUpdate that ended Failed to every live UpgradeTask of
// its Cluster: the failure may exhaust the budget that all of them share.
func (r *Reconciler) failedNodeUpdateToTasks(ctx context.Context, obj client.Object) []reconcile.Request {
	nu, ok := obj.(*inplacev1.NodeUpdate)
	if !ok || nu.Status.Phase != inplacev1.NodeUpdatePhaseFailed {
		return nil
	}
	return r.liveTasksOf(ctx, nu.Namespace, nu.Spec.ClusterName)
}

func (r *Reconciler) liveTasksOf(ctx context.Context, namespace, cluster string) []reconcile.Request {
	tasks := &inplacev1.UpgradeTaskList{}
	if err := r.Client.List(ctx, tasks, client.InNamespace(namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range tasks.Items {
		t := &tasks.Items[i]
		if t.Spec.ClusterName == cluster && holdsClaims(t) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(t)})
		}
	}
	return out
}

// failureBudgetChanged passes a Cluster's updates that change its failure budget's annotations.
func failureBudgetChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld == nil || e.ObjectNew == nil {
				return false
			}
			for _, key := range []string{inplacev1.FailureBudgetAnnotation, inplacev1.FailureBudgetResetAnnotation} {
				if e.ObjectOld.GetAnnotations()[key] != e.ObjectNew.GetAnnotations()[key] {
					return true
				}
			}
			return false
		},
	}
}

// nodeUpdateFailed passes a NodeUpdate's updates that end it Failed.
func nodeUpdateFailed() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, ok1 := e.ObjectOld.(*inplacev1.NodeUpdate)
			nu, ok2 := e.ObjectNew.(*inplacev1.NodeUpdate)
			return ok1 && ok2 && old.Status.Phase != inplacev1.NodeUpdatePhaseFailed && nu.Status.Phase == inplacev1.NodeUpdatePhaseFailed
		},
	}
}
