package kubeadmupdater

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
)

// fetch gets the target kubeadm onto the node (and, from a URL or an image, stages the
// kubelet and kubectl), checked, before anything changes on the node.
func (u *Updater) fetch(ctx context.Context, r *nodeRun) (bool, error) {
	args := append([]string{"fetch", "--version", r.nu.Spec.Version}, sourceArgs(r.cfg.Spec.Source)...)
	return u.runJob(ctx, r, StepFetch, args, false)
}

// upgrade runs kubeadm's upgrade of the node: the node program chooses `kubeadm upgrade
// apply` on the first control plane node and `kubeadm upgrade node` elsewhere. On a
// control plane node it restarts the static pods, so the ledger is asked first.
func (u *Updater) upgrade(ctx context.Context, r *nodeRun) (bool, error) {
	role := "worker"
	if r.controlPlane {
		role = "control-plane"
	}
	args := []string{"upgrade", "--version", r.nu.Spec.Version, "--role", role}
	return u.runJob(ctx, r, StepUpgrade, args, r.controlPlane)
}

// kubelet installs the target kubelet and kubectl and restarts the kubelet, on the
// drained node.
func (u *Updater) kubelet(ctx context.Context, r *nodeRun) (bool, error) {
	args := append([]string{"kubelet", "--version", r.nu.Spec.Version}, sourceArgs(r.cfg.Spec.Source)...)
	args = append(args, "--unit", r.cfg.Spec.KubeletUnit)
	return u.runJob(ctx, r, StepKubelet, args, false)
}

// runJob runs one step's Job and follows it to its end. The Job is created only from a
// Pending step, never once an abort was asked, and, when admit says so, only once the
// Cluster's disruption ledger lets the node go. A Job that failed fails the step and the
// NodeUpdate with the node program's own words.
func (u *Updater) runJob(ctx context.Context, r *nodeRun, step string, args []string, admit bool) (bool, error) {
	nu := r.nu
	key := client.ObjectKey{Namespace: r.cfg.Spec.Namespace, Name: JobName(nu, step)}
	log := ctrl.LoggerFrom(ctx).WithValues("step", step, "job", key.String())
	command := "capi-inplace node kubeadm " + args[0]

	job := &batchv1.Job{}
	if err := r.wc.Get(ctx, key, job); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("read Job %s on the workload cluster: %w", key, err)
		}
		if nodeupdater.StepState(nu, step) == inplacev1.StepStateRunning {
			// It ran part of the upgrade, or all of it; running it again blindly could
			// do it twice. A person decides.
			return false, nodeupdater.Permanentf("JobDeleted",
				"Job %s of step %s was deleted on the workload cluster before it ended", key, step)
		}
		if nu.Spec.Phase == inplacev1.TaskActionAbort {
			return false, nil // the reconciler aborts it next; nothing new starts
		}
		if admit {
			if held, err := u.admit(ctx, r, step); err != nil || held != "" {
				return false, err
			}
		}
		job = desiredJob(r, step, key, args)
		if err := r.wc.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, fmt.Errorf("create Job %s on the workload cluster: %w", key, err)
		}
		log.Info("Created kubeadm node Job", "image", r.image, "args", args)
		nodeupdater.StartStep(nu, step, fmt.Sprintf("Job %s runs %s on node %s", key, command, nu.Spec.NodeName))
		return false, nil
	}
	if owner := job.Labels[NodeUpdateUIDLabel]; owner != string(nu.UID) {
		return false, fmt.Errorf("job %s on the workload cluster belongs to another NodeUpdate (uid %q, this one is %q); delete it to go on",
			key, owner, nu.UID)
	}
	complete, failed := jobEnded(job)
	switch {
	case complete:
		log.Info("kubeadm node Job succeeded")
		nodeupdater.CompleteStep(nu, step, fmt.Sprintf("%s succeeded on node %s (Job %s)", command, nu.Spec.NodeName, key))
		return true, nil
	case failed != nil:
		words, err := failureWords(ctx, r.wc, job)
		if err != nil {
			return false, err
		}
		if words == "" {
			words = fmt.Sprintf("%s (%s); its pod is gone", failed.Message, failed.Reason)
		}
		msg := fmt.Sprintf("%s failed on node %s: %s (Job %s)", command, nu.Spec.NodeName, words, key)
		log.Info("kubeadm node Job failed", "reason", failed.Reason, "words", words)
		nodeupdater.FailStep(nu, step, msg)
		return false, nodeupdater.Permanent(step+"Failed", errors.New(msg))
	}
	msg := fmt.Sprintf("Job %s runs %s on node %s (active %d, failed %d)", key, command, nu.Spec.NodeName, job.Status.Active, job.Status.Failed)
	if nodeupdater.StepState(nu, step) != inplacev1.StepStateRunning {
		nodeupdater.StartStep(nu, step, msg)
	} else {
		nodeupdater.SetStepMessage(nu, step, msg)
	}
	return false, nil
}

// admit asks the Cluster's disruption ledger whether the node may take step; held says
// why not, and is the step's message meanwhile (the step stays Pending).
func (u *Updater) admit(ctx context.Context, r *nodeRun, step string) (string, error) {
	if u.Ledger == nil {
		return "", nil
	}
	what := map[string]string{StepUpgrade: "run kubeadm's upgrade (static pods restart)", StepDrain: "be cordoned and drained"}[step]
	held, err := u.Ledger.Admit(ctx, r.nu, r.controlPlane, what)
	if err != nil {
		return "", err
	}
	if held != "" {
		nodeupdater.SetStepMessage(r.nu, step, held)
	}
	return held, nil
}

// drain cordons the node as this NodeUpdate's and evicts its pods, asking again on each
// reconcile until none is left. A pod a PodDisruptionBudget keeps is named in the message
// until drain.timeout passes; then the step fails naming the pods still there.
func (u *Updater) drain(ctx context.Context, r *nodeRun) (bool, error) {
	nu, node := r.nu, r.nu.Spec.NodeName
	if nodeupdater.StepState(nu, StepDrain) == inplacev1.StepStatePending {
		if nu.Spec.Phase == inplacev1.TaskActionAbort {
			return false, nil
		}
		if held, err := u.admit(ctx, r, StepDrain); err != nil || held != "" {
			return false, err
		}
	}
	// Also on every later call: a cordon lifted by someone meanwhile is set again.
	held, err := nodedrain.Cordon(ctx, r.wc, node, nu.UID)
	if err != nil {
		return false, err
	}
	if held != "" {
		nodeupdater.SetStepMessage(nu, StepDrain, held)
		return false, nil
	}
	if nodeupdater.StepState(nu, StepDrain) != inplacev1.StepStateRunning {
		nodeupdater.StartStep(nu, StepDrain, fmt.Sprintf("node %s cordoned; evicting its pods", node))
	}
	d := r.cfg.Spec.Drain
	progress, err := nodedrain.Evict(ctx, r.wc, node, drainOptions(d))
	var refused *nodedrain.RefusedError
	if errors.As(err, &refused) {
		msg := fmt.Sprintf("node %s cannot be drained: %v", node, err)
		nodeupdater.FailStep(nu, StepDrain, msg)
		return false, nodeupdater.Permanent("DrainRefused", errors.New(msg))
	}
	if err != nil {
		return false, err
	}
	policy, err := u.applyDrainPolicy(ctx, r, progress)
	if err != nil {
		return false, err
	}
	if progress.Drained() {
		nodeupdater.CompleteStep(nu, StepDrain, fmt.Sprintf("node %s cordoned and drained", node))
		return true, nil
	}
	timeout := DefaultDrainTimeout
	if d.Timeout != nil {
		timeout = d.Timeout.Duration
	}
	var parts []string
	if len(progress.Blocked) > 0 {
		parts = append(parts, "held by a PodDisruptionBudget: "+strings.Join(progress.Blocked, ", "))
	}
	if policy != "" {
		parts = append(parts, policy)
	}
	if len(progress.Leaving) > 0 {
		parts = append(parts, "leaving: "+strings.Join(progress.Leaving, ", "))
	}
	if start := nodeupdater.Step(nu, StepDrain).StartTime; start != nil && time.Since(start.Time) > timeout {
		msg := fmt.Sprintf("node %s was not drained within drain.timeout %s; %s", node, timeout, strings.Join(parts, "; "))
		nodeupdater.FailStep(nu, StepDrain, msg)
		return false, nodeupdater.Permanent("DrainTimedOut", errors.New(msg))
	}
	nodeupdater.SetStepMessage(nu, StepDrain, fmt.Sprintf("draining node %s: %s", node, strings.Join(parts, "; ")))
	return false, nil
}

// drainOptions are the KubeadmUpdater's drain options as nodedrain takes them.
func drainOptions(d inplacev1.KubeadmDrain) nodedrain.Options {
	opts := nodedrain.Options{IgnoreDaemonSets: d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets, DeleteEmptyDirData: d.DeleteEmptyDirData}
	if d.GracePeriod != nil {
		opts.GracePeriod = &d.GracePeriod.Duration
	}
	return opts
}

// applyDrainPolicy applies the NodeUpdate's drain policy (the task's spec.drainPolicy, or
// its Cluster's drain-policy annotation) to the pods whose eviction a PodDisruptionBudget
// refuses now, as the Harvester updater does (nodedrain.ApplyPolicy): Hold waits until
// drain.timeout; Skip, once the drain has been blocked for the policy's grace period,
// puts the node back (the reconciler has Abort delete the node's Jobs and lift our
// cordon) and the NodeUpdate ends Skipped; Evict then deletes the blocking pods, their
// budgets ignored, one Warning event each, except Longhorn's, which are never deleted
// (the API's drainPolicy says why). kubeadm's upgrade of the node ran before its drain
// and is not undone by Skip. It returns what the step's message should add.
func (u *Updater) applyDrainPolicy(ctx context.Context, r *nodeRun, progress nodedrain.Progress) (string, error) {
	nu, node := r.nu, r.nu.Spec.NodeName
	event := func(eventType, reason, action, note string) { u.event(nu, eventType, reason, action, note) }
	if len(progress.BlockedPods) == 0 {
		return nodedrain.ApplyPolicy(nu, nil, event)
	}
	var deletable []nodedrain.BlockedPod
	var kept []string
	for _, p := range progress.BlockedPods {
		if p.Namespace == longhornNamespace || p.Labels[longhornComponentLabel] != "" {
			kept = append(kept, p.Namespace+"/"+p.Name)
		} else {
			deletable = append(deletable, p)
		}
	}
	b := &nodedrain.Blockage{Of: "the drain", What: strings.Join(progress.Blocked, ", "),
		Evicts: "they are deleted, their budgets ignored", Evicted: inplacev1.BlockingPodsDeletedReason,
		PutBack: "the node is put back (drain stopped, uncordoned) with its kubelet not upgraded; kubeadm's upgrade of the node ran before the drain and stays"}
	if len(kept) > 0 {
		b.Evicts = "the pods other than Longhorn's are deleted, their budgets ignored (Longhorn's never are)"
		b.CannotEvict = fmt.Sprintf("drainPolicy Evict never deletes Longhorn's pods (%s): Longhorn keeps an instance manager's PodDisruptionBudget while deleting its pod would crash attached volumes or lose a volume's only good copy; once those volumes are detached or rebuilt elsewhere, Longhorn deletes the budget and the drain goes on",
			strings.Join(kept, ", "))
	}
	if len(deletable) == 0 {
		return nodedrain.ApplyPolicy(nu, b, event)
	}
	b.Evict = func(blockedFor, grace time.Duration) (string, error) {
		pods := make([]inplacev1.PreviewPod, len(deletable))
		for i, p := range deletable {
			pods[i] = inplacev1.PreviewPod{Namespace: p.Namespace, Name: p.Name, Reason: p.Reason}
		}
		did, err := nodedrain.DeleteBlocking(ctx, r.wc, node, pods, blockedFor, grace, event)
		if err != nil {
			return "", err
		}
		if len(kept) > 0 {
			did += "; " + b.CannotEvict
		}
		return did, nil
	}
	return nodedrain.ApplyPolicy(nu, b, event)
}

// Longhorn's pods, which drainPolicy Evict never deletes (api/v1alpha1 DrainModeEvict):
// its namespace, and the label every instance manager pod carries (longhorn-manager
// types.GetInstanceManagerLabels).
const (
	longhornNamespace      = "longhorn-system"
	longhornComponentLabel = "longhorn.io/component"
)

// event records an event on the NodeUpdate, when the updater has a recorder.
func (u *Updater) event(nu *inplacev1.NodeUpdate, eventType, reason, action, note string) {
	if u.Recorder == nil {
		return
	}
	if len(note) > 1024 {
		note = note[:1021] + "..."
	}
	u.Recorder.Eventf(nu, nil, eventType, reason, action, "%s", note)
}

// uncordon waits for the node to report the target kubelet version and Ready, then lifts
// the cordon if this NodeUpdate set it.
func (u *Updater) uncordon(ctx context.Context, r *nodeRun) (bool, error) {
	nu, node := r.nu, r.node
	if !kubeletAt(node, nu.Spec.Version) || !nodeReady(node) {
		msg := fmt.Sprintf("waiting for node %s to report kubelet %s and Ready (it reports kubelet %s, Ready %t)",
			node.Name, nu.Spec.Version, node.Status.NodeInfo.KubeletVersion, nodeReady(node))
		if nodeupdater.StepState(nu, StepUncordon) != inplacev1.StepStateRunning {
			nodeupdater.StartStep(nu, StepUncordon, msg)
		} else {
			nodeupdater.SetStepMessage(nu, StepUncordon, msg)
		}
		return false, nil
	}
	uncordoned, err := nodedrain.UncordonIfOurs(ctx, r.wc, node.Name, nu.UID)
	if err != nil {
		return false, err
	}
	msg := fmt.Sprintf("node %s runs kubelet %s and is Ready; uncordoned", node.Name, nu.Spec.Version)
	if !uncordoned {
		msg = fmt.Sprintf("node %s runs kubelet %s and is Ready; not cordoned by this update, left as it is", node.Name, nu.Spec.Version)
	}
	nodeupdater.CompleteStep(nu, StepUncordon, msg)
	return true, nil
}
