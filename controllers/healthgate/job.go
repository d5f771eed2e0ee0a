package healthgate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// Labels of a gate's Jobs, to find the old ones.
const (
	JobTaskLabel = inplacev1.AnnotationPrefix + "gate-task"
	JobGateLabel = inplacev1.AnnotationPrefix + "gate"
)

// JobRetryAfter is how long a failed gate Job is kept (its message shown) before it is
// deleted and run again.
const JobRetryAfter = time.Minute

const defaultJobDeadline = 600

// JobName is the name of the Job of a gate for the count of ended nodes: the same after a
// restart of the manager, so the Job is found again rather than run twice.
func JobName(task, gate string, ended int) string {
	suffix := fmt.Sprintf("-%d", ended)
	base := "gate-" + task + "-" + gate
	if len(base)+len(suffix) > 63 {
		base = base[:63-len(suffix)-9] + "-" + shortHash(task+"/"+gate)
	}
	return base + suffix
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:8]
}

// labelValue fits a name into a label value.
func labelValue(s string) string {
	if len(s) <= 63 {
		return s
	}
	return s[:54] + "-" + shortHash(s)
}

func evaluateJob(ctx context.Context, g *inplacev1.HealthGate, in Input) (bool, string) {
	name := JobName(in.Task, g.Name, in.Ended)
	ns := g.Job.Namespace
	if msg, err := deleteOldJobs(ctx, in, g, name); err != nil {
		return false, msg
	}
	job := &batchv1.Job{}
	err := in.Workload.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, job)
	if apierrors.IsNotFound(err) {
		if err := in.Workload.Create(ctx, newJob(g, in, name)); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, fmt.Sprintf("create Job %s/%s on the workload cluster: %v", ns, name, err)
		}
		return false, fmt.Sprintf("Job %s/%s started; waiting for it to succeed", ns, name)
	}
	if err != nil {
		return false, fmt.Sprintf("read Job %s/%s of the workload cluster: %v", ns, name, err)
	}
	if jobCondition(job, batchv1.JobComplete) != nil || job.Status.Succeeded > 0 {
		return true, fmt.Sprintf("Job %s/%s succeeded", ns, name)
	}
	failed := jobCondition(job, batchv1.JobFailed)
	if failed == nil && job.Status.Failed == 0 {
		return false, fmt.Sprintf("Job %s/%s is running; waiting for it to succeed", ns, name)
	}
	msg := fmt.Sprintf("Job %s/%s failed", ns, name)
	if failed != nil && failed.Message != "" {
		msg += ": " + failed.Message
	}
	if tail := failedContainerMessage(ctx, in.Workload, job); tail != "" {
		msg += "; " + tail
	}
	// A failed Job is run again after a while: the gate may turn green without a node
	// ending (someone fixed what it checks).
	since := job.CreationTimestamp.Time
	if failed != nil {
		since = failed.LastTransitionTime.Time
	}
	if time.Since(since) >= JobRetryAfter {
		if err := in.Workload.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			msg += fmt.Sprintf(" (delete it to run it again: %v)", err)
		} else {
			msg += "; it runs again"
		}
	}
	return false, msg
}

func newJob(g *inplacev1.HealthGate, in Input, name string) *batchv1.Job {
	tpl := *g.Job.Template.DeepCopy()
	tpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	for i := range tpl.Spec.Containers {
		// The kubelet then keeps the container's last log lines (at most 80 lines or
		// 2048 bytes) as its termination message when it fails without writing one.
		tpl.Spec.Containers[i].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
	labels := map[string]string{JobTaskLabel: labelValue(in.Task), JobGateLabel: labelValue(g.Name)}
	deadline := g.Job.ActiveDeadlineSeconds
	if deadline == nil {
		deadline = ptr.To(int64(defaultJobDeadline))
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: g.Job.Namespace, Name: name, Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:          ptr.To(int32(0)),
			ActiveDeadlineSeconds: deadline,
			Template:              tpl,
		},
	}
}

// deleteOldJobs deletes the gate's Jobs of earlier counts of ended nodes.
func deleteOldJobs(ctx context.Context, in Input, g *inplacev1.HealthGate, current string) (string, error) {
	jobs := &batchv1.JobList{}
	if err := in.Workload.List(ctx, jobs, client.InNamespace(g.Job.Namespace),
		client.MatchingLabels{JobTaskLabel: labelValue(in.Task), JobGateLabel: labelValue(g.Name)}); err != nil {
		return fmt.Sprintf("list the gate's Jobs in namespace %s of the workload cluster: %v", g.Job.Namespace, err), err
	}
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if j.Name == current || j.DeletionTimestamp != nil {
			continue
		}
		if err := in.Workload.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Sprintf("delete the old gate Job %s/%s: %v", j.Namespace, j.Name, err), err
		}
	}
	return "", nil
}

func jobCondition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range job.Status.Conditions {
		if c := &job.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// failedContainerMessage returns the termination message of the Job's failed containers:
// with FallbackToLogsOnError, the last lines of their log.
func failedContainerMessage(ctx context.Context, workload client.Client, job *batchv1.Job) string {
	pods := &corev1.PodList{}
	if err := workload.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{batchv1.JobNameLabel: job.Name}); err != nil {
		return fmt.Sprintf("its pods cannot be listed: %v", err)
	}
	var parts []string
	for _, pod := range pods.Items {
		for _, cs := range pod.Status.ContainerStatuses {
			t := cs.State.Terminated
			if t == nil || t.ExitCode == 0 {
				continue
			}
			part := fmt.Sprintf("pod %s container %s exited %d", pod.Name, cs.Name, t.ExitCode)
			if m := strings.TrimSpace(t.Message); m != "" {
				part += ", last log lines:\n" + m
			}
			parts = append(parts, part)
		}
	}
	return strings.Join(parts, "; ")
}
