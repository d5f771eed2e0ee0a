package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// machineWant is what the task wants a Machine to carry.
type machineWant struct {
	// claim: the machine carries the task's claim label.
	claim bool
	// condition, when set, is our InPlaceUpgradeUpToDate condition.
	condition *metav1.Condition
	// removeCondition removes our condition.
	removeCondition bool
	// release, when set, is the in-place-upgrade-release annotation.
	release string
	// failed, when set, is the InPlaceUpgradeFailed condition; otherwise it is removed.
	failed *metav1.Condition
	// skipRemediation keeps a MachineHealthCheck off the machine while its NodeUpdate
	// runs; when false, a skip-remediation capi-inplace set is removed.
	skipRemediation bool
}

// desiredMachine says what a member's Machine carries in the task's phase: claimed and
// Waiting or InProgress while the task runs; on success the release annotation, Done and
// no claim; on failure Failed; at the end of a task every claim released and the
// condition of machines never started removed.
func desiredMachine(s *taskScope, mem *member, phase inplacev1.TaskPhase, mayClaim bool) machineWant {
	final := phase.IsFinal()
	claimed := mem.machine.Labels[inplacev1.UpgradeTaskLabel] == upgraderequest.LabelValue(s.task.Name)
	keepClaim := !final && (mayClaim || claimed)
	state := mem.state
	if mem.picked {
		state = inplacev1.MachineStateInProgress
	}
	switch state {
	case inplacev1.MachineStateUpgraded:
		return machineWant{
			condition: machineCondition(metav1.ConditionTrue, inplacev1.DoneReason,
				fmt.Sprintf("upgraded in place to %s by UpgradeTask %s", s.task.Spec.Version, s.task.Name)),
			release: s.task.Spec.Version,
		}
	case inplacev1.MachineStateInProgress:
		msg := fmt.Sprintf("being upgraded in place to %s by UpgradeTask %s", s.task.Spec.Version, s.task.Name)
		if mem.nu != nil {
			msg += ", NodeUpdate " + mem.nu.Name
		}
		if mem.message != "" {
			msg += " (" + mem.message + ")"
		}
		return machineWant{claim: true, skipRemediation: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.InProgressReason, msg)}
	case inplacev1.MachineStateFailed:
		msg := fmt.Sprintf("in-place upgrade to %s failed: %s", s.task.Spec.Version, mem.message)
		return machineWant{claim: keepClaim, condition: machineCondition(metav1.ConditionFalse, inplacev1.FailedReason, msg),
			failed: &metav1.Condition{Type: inplacev1.InPlaceUpgradeFailedCondition, Status: metav1.ConditionTrue, Reason: inplacev1.FailedReason, Message: msg}}
	case inplacev1.MachineStateAborted:
		return machineWant{claim: keepClaim, condition: machineCondition(metav1.ConditionFalse, inplacev1.AbortedReason,
			fmt.Sprintf("in-place upgrade to %s was aborted; the node may be partly upgraded", s.task.Spec.Version))}
	case inplacev1.MachineStateSkipped:
		msg := fmt.Sprintf("in-place upgrade to %s by UpgradeTask %s was skipped, the node put back (%s); it is tried once more when every other machine is done", s.task.Spec.Version, s.task.Name, mem.message)
		if final {
			msg = fmt.Sprintf("in-place upgrade to %s by UpgradeTask %s was skipped, the node put back (%s); the task ended before it was tried again", s.task.Spec.Version, s.task.Name, mem.message)
		}
		return machineWant{claim: keepClaim, condition: machineCondition(metav1.ConditionFalse, inplacev1.NodeSkippedReason, msg)}
	}
	// Waiting.
	if final || !keepClaim {
		return machineWant{removeCondition: true}
	}
	msg := mem.message
	switch {
	case msg == "":
		msg = "queued"
	case strings.HasPrefix(msg, queueHoldPrefix):
		// The queue under maxUnavailable names the nodes taking the room, which change with
		// every node that starts or ends: on every waiting Machine that would be one write
		// per waiting Machine per node (quadratic). The task's status names them.
		msg = fmt.Sprintf("%s maxUnavailable (%d) node(s) of the target are unavailable; the UpgradeTask's status names them", queueHoldPrefix, s.maxUnavailable)
	}
	return machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.WaitingReason,
		fmt.Sprintf("waiting for the in-place upgrade to %s by UpgradeTask %s: %s", s.task.Spec.Version, s.task.Name, msg))}
}

func machineCondition(status metav1.ConditionStatus, reason, message string) *metav1.Condition {
	return &metav1.Condition{Type: inplacev1.InPlaceUpgradeUpToDateCondition, Status: status, Reason: reason, Message: message}
}

// isDone reports whether a machine carries our condition True (upgraded in place).
func isDone(m *clusterv1.Machine) bool {
	return meta.IsStatusConditionTrue(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
}

// writeMachine brings a Machine to what the task wants, patching only what differs. Both
// patches carry the resourceVersion read: a claim must never be taken from a Machine that
// another task claimed in the meantime.
func (r *Reconciler) writeMachine(ctx context.Context, m *clusterv1.Machine, want machineWant, task *inplacev1.UpgradeTask) error {
	claimValue := upgraderequest.LabelValue(task.Name)
	if machineUpToDate(m, want, claimValue) {
		return nil
	}
	orig := m.DeepCopy()
	// What this write replaces: the next reconcile reads the Machine as written even if its
	// cache does not show the write yet.
	defer func() {
		if m.ResourceVersion != orig.ResourceVersion {
			r.writtenMachines.add(m, orig.ResourceVersion, claimValue, time.Now())
		}
	}()
	hasClaim := m.Labels[inplacev1.UpgradeTaskLabel] == claimValue
	switch {
	case want.claim && !hasClaim:
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels[inplacev1.UpgradeTaskLabel] = claimValue
	case !want.claim && hasClaim:
		delete(m.Labels, inplacev1.UpgradeTaskLabel)
	}
	if want.release != "" && m.Annotations[inplacev1.UpgradeReleaseAnnotation] != want.release {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[inplacev1.UpgradeReleaseAnnotation] = want.release
	}
	setSkipRemediation(m, want.skipRemediation, claimValue)
	if m.Labels[inplacev1.UpgradeTaskLabel] != orig.Labels[inplacev1.UpgradeTaskLabel] ||
		m.Annotations[inplacev1.UpgradeReleaseAnnotation] != orig.Annotations[inplacev1.UpgradeReleaseAnnotation] ||
		!skipRemediationAs(m, orig) {
		if err := r.Client.Patch(ctx, m, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("update claim of machine %s for UpgradeTask %s: %w", klog.KObj(m), task.Name, err)
		}
		if want.claim && !hasClaim {
			ctrl.LoggerFrom(ctx).Info("claimed machine", "machine", klog.KObj(m))
		}
	}

	origStatus := m.DeepCopy()
	if origStatus.ResourceVersion != orig.ResourceVersion {
		r.writtenMachines.add(m, orig.ResourceVersion, claimValue, time.Now())
		orig = origStatus // the deferred add records what the status write replaces
	}
	changed := false
	switch {
	case want.condition != nil:
		changed = meta.SetStatusCondition(&m.Status.Conditions, *want.condition)
	case want.removeCondition:
		changed = meta.RemoveStatusCondition(&m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
	}
	if want.failed != nil {
		changed = meta.SetStatusCondition(&m.Status.Conditions, *want.failed) || changed
	} else {
		changed = meta.RemoveStatusCondition(&m.Status.Conditions, inplacev1.InPlaceUpgradeFailedCondition) || changed
	}
	if changed {
		if err := r.Client.Status().Patch(ctx, m, client.MergeFromWithOptions(origStatus, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("set condition %s of machine %s: %w", inplacev1.InPlaceUpgradeUpToDateCondition, klog.KObj(m), err)
		}
	}
	return nil
}

// machineUpToDate reports whether a Machine already carries what the task wants, so
// that a reconcile of a task of hundreds of machines writes only those that changed.
func machineUpToDate(m *clusterv1.Machine, want machineWant, claimValue string) bool {
	if (m.Labels[inplacev1.UpgradeTaskLabel] == claimValue) != want.claim {
		return false
	}
	if want.release != "" && m.Annotations[inplacev1.UpgradeReleaseAnnotation] != want.release {
		return false
	}
	if hasSkipRemediationOf(m, claimValue) != want.skipRemediation {
		return false
	}
	failedCond := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeFailedCondition)
	switch {
	case want.failed == nil && failedCond != nil:
		return false
	case want.failed != nil && (failedCond == nil || failedCond.Status != want.failed.Status || failedCond.Message != want.failed.Message):
		return false
	}
	cond := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
	switch {
	case want.condition != nil:
		return cond != nil && cond.Status == want.condition.Status && cond.Reason == want.condition.Reason && cond.Message == want.condition.Message
	case want.removeCondition:
		return cond == nil
	}
	return true
}

// hasSkipRemediationOf reports whether capi-inplace set skip-remediation on the machine
// for the task whose claim is claimValue.
func hasSkipRemediationOf(m *clusterv1.Machine, claimValue string) bool {
	_, skip := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]
	return skip && m.Annotations[inplacev1.SkipRemediationSetByAnnotation] == claimValue
}

// setSkipRemediation sets Cluster API's skip-remediation on the machine for the task, or
// removes it when the task set it. A skip-remediation someone else set stays as it is:
// capi-inplace neither takes it over nor removes it.
func setSkipRemediation(m *clusterv1.Machine, want bool, claimValue string) {
	_, present := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]
	ours := m.Annotations[inplacev1.SkipRemediationSetByAnnotation]
	switch {
	case want && !present:
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.MachineSkipRemediationAnnotation] = ""
		m.Annotations[inplacev1.SkipRemediationSetByAnnotation] = claimValue
	case want && ours != "" && ours != claimValue:
		// Set by an earlier task of capi-inplace: this task owns it now.
		m.Annotations[inplacev1.SkipRemediationSetByAnnotation] = claimValue
	case !want && ours == claimValue:
		delete(m.Annotations, clusterv1.MachineSkipRemediationAnnotation)
		delete(m.Annotations, inplacev1.SkipRemediationSetByAnnotation)
	}
}

// skipRemediationAs reports whether two versions of a machine carry the same
// skip-remediation annotations.
func skipRemediationAs(a, b *clusterv1.Machine) bool {
	_, sa := a.Annotations[clusterv1.MachineSkipRemediationAnnotation]
	_, sb := b.Annotations[clusterv1.MachineSkipRemediationAnnotation]
	return sa == sb && a.Annotations[inplacev1.SkipRemediationSetByAnnotation] == b.Annotations[inplacev1.SkipRemediationSetByAnnotation]
}

// startNodeUpdate creates the machine's NodeUpdate under its deterministic name. When it
// already exists (a restart after the create, before the status), the existing one is used.
func (r *Reconciler) startNodeUpdate(ctx context.Context, s *taskScope, mem *member) (*inplacev1.NodeUpdate, error) {
	task := s.task
	nu := &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{
			Name:      nodeUpdateName(task, mem),
			Namespace: task.Namespace,
			Labels: map[string]string{
				inplacev1.UpgradeTaskLabel: upgraderequest.LabelValue(task.Name),
				inplacev1.ClusterNameLabel: task.Spec.ClusterName,
			},
			// What the Cluster's disruption ledger judges the node's disruptive steps by
			// (disruption.Admit): its target and the task's maxUnavailable over it.
			Annotations: map[string]string{
				disruption.TargetAnnotation:         disruption.TaskTarget(task),
				disruption.MaxUnavailableAnnotation: strconv.Itoa(s.maxUnavailable),
			},
			// Set at creation, where the NodeUpdate controller would add it on its first
			// reconcile: one write less per node, and no moment without it.
			Finalizers: []string{inplacev1.NodeUpdateFinalizer},
		},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName:    task.Spec.ClusterName,
			MachineName:    mem.name,
			NodeName:       mem.nodeName,
			Version:        task.Spec.Version,
			DesiredMachine: task.Spec.DesiredMachine,
			UpdaterRef:     task.Spec.UpdaterRef,
			Phase:          inplacev1.TaskActionOngoing,
			DrainPolicy:    s.drainPolicy.DeepCopy(),
		},
	}
	if err := controllerutil.SetControllerReference(task, nu, r.Client.Scheme()); err != nil {
		return nil, fmt.Errorf("own NodeUpdate %s: %w", nu.Name, err)
	}
	cluster := types.NamespacedName{Namespace: task.Namespace, Name: task.Spec.ClusterName}
	err := r.Client.Create(ctx, nu)
	if err == nil {
		r.created.add(cluster, nu, time.Now())
		return nu, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create NodeUpdate %s/%s for machine %s: %w", nu.Namespace, nu.Name, mem.name, err)
	}
	existing := &inplacev1.NodeUpdate{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(nu), existing); err != nil {
		return nil, fmt.Errorf("read existing NodeUpdate %s/%s: %w", nu.Namespace, nu.Name, err)
	}
	if !metav1IsControlledBy(existing, task) {
		return nil, fmt.Errorf("NodeUpdate %s/%s exists and belongs to another owner; delete it to let UpgradeTask %s start machine %s", nu.Namespace, nu.Name, task.Name, mem.name)
	}
	if existing.Spec.MachineName != mem.name {
		return nil, fmt.Errorf("NodeUpdate %s/%s of UpgradeTask %s is machine %s's, not machine %s's; delete it to let the task start machine %s", nu.Namespace, nu.Name, task.Name, existing.Spec.MachineName, mem.name, mem.name)
	}
	r.created.add(cluster, existing, time.Now())
	return existing, nil
}

// settleMembers waits for the background writes of the members' Machines, drops those
// pending, and goes on from copies of the Machines as the task last wrote them: the
// reconcile writes them itself.
func (r *Reconciler) settleMembers(ctx context.Context, task *inplacev1.UpgradeTask, members []*member) error {
	var machines []*clusterv1.Machine
	var with []*member
	for _, mem := range members {
		if mem.machine != nil {
			machines = append(machines, mem.machine)
			with = append(with, mem)
		}
	}
	if len(machines) == 0 {
		return nil
	}
	latest, err := r.machines.settle(ctx, task, machines)
	if err != nil {
		return fmt.Errorf("wait for the Machine writes of UpgradeTask %s: %w", klog.KObj(task), err)
	}
	for i, mem := range with {
		if latest[i] == mem.machine {
			// The reconcile's Machines share their maps with the cache (TargetMachinesOf):
			// the reconcile writes its own copy.
			latest[i] = mem.machine.DeepCopy()
		}
		mem.machine = latest[i]
	}
	return nil
}

// writeMachinesNow writes the members' Machines before it returns, after every write the
// task handed to the background (of its members or of machines that are no longer), and
// records the machines it claimed.
func (r *Reconciler) writeMachinesNow(ctx context.Context, task *inplacev1.UpgradeTask, members []*member, want func(*member) machineWant) error {
	if err := r.machines.settleTask(ctx, task.UID); err != nil {
		return fmt.Errorf("wait for the Machine writes of UpgradeTask %s: %w", klog.KObj(task), err)
	}
	if err := r.settleMembers(ctx, task, members); err != nil {
		return err
	}
	var claimedMu sync.Mutex
	var claimed []string
	err := forEachConcurrently(members, EndWriteConcurrency, func(mem *member) error {
		wasClaimed := mem.isClaimed(task)
		if err := r.writeMachine(ctx, mem.machine, want(mem), task); err != nil {
			return err
		}
		if !wasClaimed && mem.isClaimed(task) {
			claimedMu.Lock()
			claimed = append(claimed, mem.name)
			claimedMu.Unlock()
		}
		return nil
	})
	r.recordClaims(task, claimed)
	return err
}

// isClaimed reports whether the member's Machine carries the task's claim label.
func (m *member) isClaimed(task *inplacev1.UpgradeTask) bool {
	return m.machine != nil && m.machine.Labels[inplacev1.UpgradeTaskLabel] == upgraderequest.LabelValue(task.Name)
}

// maxClaimsNamed bounds the machines one MachineClaimed event names.
const maxClaimsNamed = 20

// recordClaims records one event on the task for the machines one reconcile claimed: a
// task of hundreds of machines claims them in one go, and an event per Machine would be
// as many writes (each Machine's InPlaceUpgradeUpToDate condition says it waits).
func (r *Reconciler) recordClaims(task *inplacev1.UpgradeTask, names []string) {
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	listed := strings.Join(names, ", ")
	if len(names) > maxClaimsNamed {
		listed = fmt.Sprintf("%s and %d more", strings.Join(names[:maxClaimsNamed], ", "), len(names)-maxClaimsNamed)
	}
	r.Recorder.Eventf(task, nil, corev1.EventTypeNormal, inplacev1.MachineClaimedReason, "Claim",
		"claimed %d machine(s) for the in-place upgrade to %s: %s", len(names), task.Spec.Version, listed)
}

// forEachConcurrently calls fn for every item, at most limit at a time, and returns
// every error it returned. fn must touch only its own item.
func forEachConcurrently[T any](items []T, limit int, fn func(T) error) error {
	if len(items) == 0 {
		return nil
	}
	if len(items) == 1 {
		return fn(items[0])
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, limit)
	)
	for _, item := range items {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(item); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
