package cascade

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// upgradeSubject is one object whose asked upgrade one UpgradeTask carries out: a control
// plane, a MachineDeployment, or a single Machine.
type upgradeSubject struct {
	// obj carries the annotations.
	obj client.Object
	// name names it in messages: "KubeadmControlPlane cp", "Machine workers-1".
	name string
	// request asks for its upgrade; the version comes from in-place-upgrade-to.
	request upgraderequest.Request
	// problem, when set, says why obj cannot be upgraded in place; it is the answer to
	// any version asked.
	problem string
}

// requestFor returns the subject's request for version.
func (s *upgradeSubject) requestFor(version string) upgraderequest.Request {
	req := s.request
	req.Version = version
	req.Pacing = inplacev1.PacingExtension
	return req
}

// carries reports whether task is the one that carries out the subject's upgrade to version.
func (s *upgradeSubject) carries(task *inplacev1.UpgradeTask, version string) bool {
	machines := slices.Clone(task.Spec.Machines)
	slices.Sort(machines)
	want := slices.Clone(s.request.Machines)
	slices.Sort(want)
	return task.Spec.ClusterName == s.request.ClusterName &&
		upgraderequest.TargetOf(task).Same(s.request.Target) &&
		task.Spec.Version == version &&
		slices.Equal(machines, want)
}

// targetUpgrader carries out in-place-upgrade-to on one subject: it asks the Requester for
// the upgrade, follows the UpgradeTask, and mirrors the task in the subject's annotations
// until it answers done or failed, removing in-place-upgrade-to. Removing
// in-place-upgrade-to while the task runs aborts the task.
type targetUpgrader struct {
	// Client reads (from the cache) and writes.
	Client client.Client
	// APIReader reads UpgradeTasks straight from the API server, to see one the Requester
	// has just created and to abort only a task that really still runs.
	APIReader client.Reader
	// Requester admits the upgrades.
	Requester *upgraderequest.Requester
	// Recorder records the InPlaceUpgrade* events on the subject.
	Recorder events.EventRecorder
	// PollInterval is how often a running upgrade is looked at again without an event.
	PollInterval time.Duration
}

// reconcile brings the subject's annotations and its UpgradeTask to what
// in-place-upgrade-to asks.
func (u *targetUpgrader) reconcile(ctx context.Context, s *upgradeSubject) (ctrl.Result, error) {
	if !s.obj.GetDeletionTimestamp().IsZero() {
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("subject", s.name)
	ctx = ctrl.LoggerInto(ctx, log)
	cur := readUpgradeAnnotations(s.obj)
	switch {
	case cur.version() != "":
		return u.reconcileAsked(ctx, s, cur)
	case cur.status == inplacev1.UpgradeStatusInProgress:
		return ctrl.Result{}, u.reconcileWithdrawn(ctx, s, cur)
	}
	return ctrl.Result{}, nil
}

// reconcileAsked follows the task of the asked version, asking the Requester for it when
// there is none yet (or the version changed: the Requester then aborts the older task).
func (u *targetUpgrader) reconcileAsked(ctx context.Context, s *upgradeSubject, cur upgradeAnnotations) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	version := cur.version()
	var task *inplacev1.UpgradeTask
	if !cur.answered() && cur.task != "" {
		t, err := u.readTask(ctx, s.obj.GetNamespace(), cur.task, false)
		if err != nil {
			return ctrl.Result{}, err
		}
		if t != nil && s.carries(t, version) {
			task = t
		}
	}

	if task == nil {
		if s.problem != "" {
			log.Info("refusing the asked in-place upgrade", "version", version, "problem", s.problem)
			return ctrl.Result{}, u.write(ctx, s, refusedAnnotations(cur), nil, &cascadeEvent{
				eventType: corev1.EventTypeWarning, reason: inplacev1.InPlaceUpgradeFailedReason, action: "Refuse", note: s.problem,
			})
		}
		d, err := u.Requester.Request(ctx, s.requestFor(version))
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("ask for the in-place upgrade of %s to %s: %w", s.name, version, err)
		}
		if !d.Accepted {
			log.Info("the asked in-place upgrade was declined", "version", version, "reason", d.Reason, "message", d.Message)
			want := refusedAnnotations(cur)
			want.message = d.Message
			return ctrl.Result{}, u.write(ctx, s, want, nil, &cascadeEvent{
				eventType: corev1.EventTypeWarning, reason: inplacev1.InPlaceUpgradeFailedReason, action: "Refuse", note: d.Message,
			})
		}
		if task, err = u.readTask(ctx, s.obj.GetNamespace(), d.TaskName, true); err != nil {
			return ctrl.Result{}, err
		}
		if task == nil {
			return ctrl.Result{}, fmt.Errorf("UpgradeTask %s/%s, accepted for %s, is gone; asking again", s.obj.GetNamespace(), d.TaskName, s.name)
		}
		if len(d.Aborted) > 0 {
			log.Info("the new request aborted older UpgradeTasks of the target", "aborted", d.Aborted)
		}
	}

	want, ev := followTask(cur, task)
	if err := u.write(ctx, s, want, task, ev); err != nil {
		return ctrl.Result{}, err
	}
	if want.status == inplacev1.UpgradeStatusInProgress {
		return ctrl.Result{RequeueAfter: u.PollInterval}, nil
	}
	return ctrl.Result{}, nil
}

// reconcileWithdrawn handles an in-place-upgrade-to removed while its upgrade ran: the
// task is asked to abort (it stops at its next safe point), and the status annotation is
// removed. A task that ended before the removal was seen is answered as it ended.
func (u *targetUpgrader) reconcileWithdrawn(ctx context.Context, s *upgradeSubject, cur upgradeAnnotations) error {
	var task *inplacev1.UpgradeTask
	if cur.task != "" {
		t, err := u.readTask(ctx, s.obj.GetNamespace(), cur.task, true)
		if err != nil {
			return err
		}
		if t != nil && s.carries(t, t.Spec.Version) {
			task = t
		}
	}
	if task != nil && (task.Status.Phase == inplacev1.TaskPhaseCompleted || task.Status.Phase == inplacev1.TaskPhaseFailed) {
		want, ev := followTask(cur, task)
		return u.write(ctx, s, want, task, ev)
	}

	want := cur
	want.status = ""
	note := fmt.Sprintf("the in-place upgrade was aborted: %s was removed", inplacev1.UpgradeToAnnotation)
	if task != nil {
		if task.Spec.Phase != inplacev1.TaskActionAbort && !task.Status.Phase.IsFinal() {
			orig := task.DeepCopy()
			task.Spec.Phase = inplacev1.TaskActionAbort
			if err := u.Client.Patch(ctx, task, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("abort UpgradeTask %s of %s: %w", klog.KObj(task), s.name, err)
			}
			ctrl.LoggerFrom(ctx).Info("aborting the UpgradeTask: in-place-upgrade-to was removed", "upgradeTask", klog.KObj(task))
		}
		note = fmt.Sprintf("the in-place upgrade to %s was aborted: %s was removed; UpgradeTask %s stops at its next safe point, and machines already upgraded stay upgraded",
			task.Spec.Version, inplacev1.UpgradeToAnnotation, task.Name)
	}
	want.message = note
	return u.write(ctx, s, want, task, &cascadeEvent{eventType: corev1.EventTypeWarning, reason: inplacev1.InPlaceUpgradeAbortedReason, action: "Abort", note: note})
}

// followTask derives the subject's annotations, and the event of the change, from the
// state of the task that carries out its asked upgrade.
func followTask(cur upgradeAnnotations, task *inplacev1.UpgradeTask) (upgradeAnnotations, *cascadeEvent) {
	want := cur
	want.task = task.Name
	want.progress = task.Status.Progress
	v := task.Spec.Version
	switch {
	case task.Status.Phase == inplacev1.TaskPhaseCompleted:
		want.to, want.status, want.release, want.message = "", inplacev1.UpgradeStatusDone, v, ""
		return want, &cascadeEvent{eventType: corev1.EventTypeNormal, reason: inplacev1.InPlaceUpgradeDoneReason, action: "Upgrade",
			note: fmt.Sprintf("upgraded in place to %s: UpgradeTask %s upgraded %s machines", v, task.Name, progressOr(task, "all"))}
	case task.Status.Phase == inplacev1.TaskPhaseFailed:
		msg := fmt.Sprintf("the in-place upgrade to %s failed: %s (UpgradeTask %s)", v, taskFailure(task), task.Name)
		want.to, want.status, want.message = "", inplacev1.UpgradeStatusFailed, msg
		return want, &cascadeEvent{eventType: corev1.EventTypeWarning, reason: inplacev1.InPlaceUpgradeFailedReason, action: "Upgrade", note: msg}
	case task.Spec.Phase == inplacev1.TaskActionAbort || task.Status.Phase == inplacev1.TaskPhaseAborting || task.Status.Phase == inplacev1.TaskPhaseAborted:
		// Not by us: we abort only after in-place-upgrade-to was removed. Another request
		// for the same target superseded the task, or someone aborted it by hand. Asking
		// again would supersede that other request in turn, so this ask ends here.
		msg := fmt.Sprintf("the in-place upgrade to %s was aborted: UpgradeTask %s was superseded by a newer request for the same target, or aborted by hand; set %s again to ask anew",
			v, task.Name, inplacev1.UpgradeToAnnotation)
		want.to, want.status, want.message = "", inplacev1.UpgradeStatusFailed, msg
		return want, &cascadeEvent{eventType: corev1.EventTypeWarning, reason: inplacev1.InPlaceUpgradeAbortedReason, action: "Supersede", note: msg}
	}
	want.status, want.message = inplacev1.UpgradeStatusInProgress, ""
	if cur.status == inplacev1.UpgradeStatusInProgress && cur.task == task.Name {
		return want, nil
	}
	return want, &cascadeEvent{eventType: corev1.EventTypeNormal, reason: inplacev1.InPlaceUpgradeInProgressReason, action: "Start",
		note: fmt.Sprintf("upgrading in place to %s: UpgradeTask %s", v, task.Name)}
}

// refusedAnnotations answers an ask that no task can carry out: failed, with the ask
// removed and no task named.
func refusedAnnotations(cur upgradeAnnotations) upgradeAnnotations {
	want := cur
	want.to, want.status, want.task, want.progress = "", inplacev1.UpgradeStatusFailed, "", ""
	return want
}

// taskFailure is what made a task fail: its Degraded condition names the machine, its
// node and the node's own error.
func taskFailure(task *inplacev1.UpgradeTask) string {
	if c := meta.FindStatusCondition(task.Status.Conditions, inplacev1.DegradedCondition); c != nil && c.Status == metav1.ConditionTrue && c.Message != "" {
		return c.Message
	}
	return "the UpgradeTask failed"
}

func progressOr(task *inplacev1.UpgradeTask, fallback string) string {
	if task.Status.Progress != "" {
		return task.Status.Progress
	}
	return fallback
}

// readTask reads an UpgradeTask of the namespace, live or from the cache; nil when it
// does not exist.
func (u *targetUpgrader) readTask(ctx context.Context, namespace, name string, live bool) (*inplacev1.UpgradeTask, error) {
	return getUpgradeTask(ctx, u.Client, u.APIReader, client.ObjectKey{Namespace: namespace, Name: name}, live)
}

// write brings the subject's annotations to want and, when that changed them, records ev.
func (u *targetUpgrader) write(ctx context.Context, s *upgradeSubject, want upgradeAnnotations, task *inplacev1.UpgradeTask, ev *cascadeEvent) error {
	changed, err := writeUpgradeAnnotations(ctx, u.Client, s.obj, want)
	if err != nil || !changed {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("in-place upgrade annotations written", "to", want.to, "status", want.status, "release", want.release, "upgradeTask", want.task, "progress", want.progress)
	var related runtime.Object
	if task != nil {
		related = task
	}
	recordCascadeEvent(u.Recorder, s.obj, related, ev)
	return nil
}
