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

// Labels of a gate's Jobs, to find the old ones and those of an ended task.
const (
	JobTaskLabel          = inplacev1.AnnotationPrefix + "gate-task"
	JobTaskNamespaceLabel = inplacev1.AnnotationPrefix + "gate-task-namespace"
	JobGateLabel          = inplacev1.AnnotationPrefix + "gate"
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

func taskLabels(in Input) client.MatchingLabels {
	return client.MatchingLabels{JobTaskNamespaceLabel: labelValue(in.Namespace), JobTaskLabel: labelValue(in.Task)}
}

// refuseJob says why the policy does not let the Job gate run, or "" when it does. It
// reads nothing: a refused gate creates nothing anywhere.
func refuseJob(g *inplacev1.HealthGate, in Input, policy *Policy) string {
	ns := policy.Namespace()
	if in.FromCluster[g.Name] && !policy.AnnotationJobGates {
		return fmt.Sprintf("gate %q is a Job gate of the Cluster's annotation %s, where the manager runs no Job gate unless started with --allow-annotation-job-gates; put the gate in the UpgradeTask's spec.gates, or make it a cel or prometheus gate",
			g.Name, inplacev1.GatesAnnotation)
	}
	if j := g.Job; j.Namespace != "" && j.Namespace != ns {
		return fmt.Sprintf("gate %q: job.namespace %q is not where gate Jobs run; leave job.namespace empty or set it to %q (the manager's --gate-job-namespace)", g.Name, j.Namespace, ns)
	}
	if asks := privilegesAsked(&g.Job.Template.Spec); len(asks) > 0 {
		return fmt.Sprintf("gate %q: the Job's pod template asks for %s; gate Jobs run in namespace %s under Pod Security's restricted profile and the ServiceAccount %s, so remove them from the template",
			g.Name, strings.Join(asks, ", "), ns, JobServiceAccount)
	}
	return ""
}

// privilegesAsked lists what a pod spec asks for that a gate Job may not have: another
// ServiceAccount's rights, or the node's (privileged containers, host paths, the host's
// network, process or IPC namespaces). Pod Security admission refuses the node's too;
// saying it here gives the gate's own message, and refuses it before anything is created.
func privilegesAsked(spec *corev1.PodSpec) []string {
	var asks []string
	for _, sa := range []string{spec.ServiceAccountName, spec.DeprecatedServiceAccount} {
		if sa != "" && sa != JobServiceAccount {
			asks = append(asks, fmt.Sprintf("serviceAccountName %q", sa))
			break
		}
	}
	if spec.HostNetwork {
		asks = append(asks, "hostNetwork")
	}
	if spec.HostPID {
		asks = append(asks, "hostPID")
	}
	if spec.HostIPC {
		asks = append(asks, "hostIPC")
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			asks = append(asks, fmt.Sprintf("the hostPath volume %q", v.Name))
		}
	}
	privileged := func(name string, sc *corev1.SecurityContext) {
		if sc != nil && sc.Privileged != nil && *sc.Privileged {
			asks = append(asks, fmt.Sprintf("a privileged container %q", name))
		}
	}
	for _, c := range spec.InitContainers {
		privileged(c.Name, c.SecurityContext)
	}
	for _, c := range spec.Containers {
		privileged(c.Name, c.SecurityContext)
	}
	for _, c := range spec.EphemeralContainers {
		privileged(c.Name, c.SecurityContext)
	}
	return asks
}

func evaluateJob(ctx context.Context, g *inplacev1.HealthGate, in Input, ns string) (bool, string) {
	name := JobName(in.Task, g.Name, in.Ended)
	if msg, err := deleteOldJobs(ctx, in, ns, g, name); err != nil {
		return false, msg
	}
	job := &batchv1.Job{}
	err := in.Workload.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, job)
	if apierrors.IsNotFound(err) {
		return false, startJob(ctx, in.Workload, newJob(g, in, ns, name))
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

// startJob prepares the Job namespace, asks the API server whether it admits the Job's
// pod there (a dry run, so that a pod Pod Security refuses is the gate's message rather
// than a Job that never starts a pod), and creates the Job. It returns the gate's message.
func startJob(ctx context.Context, workload client.Client, job *batchv1.Job) string {
	ns, name := job.Namespace, job.Name
	if err := ensureJobNamespace(ctx, workload, ns); err != nil {
		return fmt.Sprintf("prepare namespace %s of the workload cluster for gate Jobs: %v", ns, err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: job.Spec.Template.Labels}, Spec: *job.Spec.Template.Spec.DeepCopy()}
	if err := workload.Create(ctx, pod, client.DryRunAll); err != nil {
		return fmt.Sprintf("the workload cluster refuses the pod of Job %s/%s (a dry run): %v; make the template meet Pod Security's restricted profile", ns, name, err)
	}
	if err := workload.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Sprintf("create Job %s/%s on the workload cluster: %v", ns, name, err)
	}
	return fmt.Sprintf("Job %s/%s started; waiting for it to succeed", ns, name)
}

// ensureJobNamespace creates the Job namespace when it is missing, labels it to enforce
// Pod Security's restricted profile (again, when someone lowered it), and creates the
// gate Jobs' ServiceAccount in it, bound to nothing.
func ensureJobNamespace(ctx context.Context, workload client.Client, ns string) error {
	namespace := &corev1.Namespace{}
	err := workload.Get(ctx, client.ObjectKey{Name: ns}, namespace)
	if apierrors.IsNotFound(err) {
		namespace = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{PodSecurityEnforceLabel: PodSecurityRestricted}}}
		if err = workload.Create(ctx, namespace); apierrors.IsAlreadyExists(err) {
			// Created meanwhile, by someone else: its label is checked below.
			err = workload.Get(ctx, client.ObjectKey{Name: ns}, namespace)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("read or create namespace %s: %w", ns, err)
	case namespace.DeletionTimestamp != nil:
		return fmt.Errorf("namespace %s is being deleted; the gate runs once it is gone", ns)
	case namespace.Labels[PodSecurityEnforceLabel] != PodSecurityRestricted:
		patch := client.MergeFrom(namespace.DeepCopy())
		if namespace.Labels == nil {
			namespace.Labels = map[string]string{}
		}
		namespace.Labels[PodSecurityEnforceLabel] = PodSecurityRestricted
		if err := workload.Patch(ctx, namespace, patch); err != nil {
			return fmt.Errorf("label namespace %s %s=%s: %w", ns, PodSecurityEnforceLabel, PodSecurityRestricted, err)
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: JobServiceAccount}}
	if err := workload.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ServiceAccount %s/%s: %w", ns, JobServiceAccount, err)
	}
	return nil
}

// DeleteJobs deletes the gate Jobs of the task namespace/task from namespace ns of the
// workload cluster (and their pods: propagation Background), when the task ended or is
// deleted. It returns how many it deleted.
func DeleteJobs(ctx context.Context, workload client.Client, ns, taskNamespace, task string) (int, error) {
	jobs := &batchv1.JobList{}
	if err := workload.List(ctx, jobs, client.InNamespace(ns), taskLabels(Input{Namespace: taskNamespace, Task: task})); err != nil {
		return 0, fmt.Errorf("list the gate Jobs of UpgradeTask %s/%s in namespace %s of the workload cluster: %w", taskNamespace, task, ns, err)
	}
	deleted := 0
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if j.DeletionTimestamp != nil {
			continue
		}
		if err := workload.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("delete gate Job %s/%s of the workload cluster: %w", j.Namespace, j.Name, err)
		}
		deleted++
	}
	return deleted, nil
}

func newJob(g *inplacev1.HealthGate, in Input, ns, name string) *batchv1.Job {
	tpl := *g.Job.Template.DeepCopy()
	tpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	tpl.Spec.ServiceAccountName = JobServiceAccount
	tpl.Spec.DeprecatedServiceAccount = ""
	restrictedDefaults(&tpl.Spec)
	for i := range tpl.Spec.Containers {
		// The kubelet then keeps the container's last log lines (at most 80 lines or
		// 2048 bytes) as its termination message when it fails without writing one.
		tpl.Spec.Containers[i].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
	labels := taskLabels(in)
	labels[JobGateLabel] = labelValue(g.Name)
	deadline := g.Job.ActiveDeadlineSeconds
	if deadline == nil {
		deadline = ptr.To(int64(defaultJobDeadline))
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:          ptr.To(int32(0)),
			ActiveDeadlineSeconds: deadline,
			Template:              tpl,
		},
	}
}

// restrictedDefaults sets, where the template leaves them unset, what Pod Security's
// restricted profile requires: a plain template then runs (its image as a non-root
// user), and one that sets them otherwise is refused by admission, in the dry run.
func restrictedDefaults(spec *corev1.PodSpec) {
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	psc := spec.SecurityContext
	if psc.RunAsNonRoot == nil {
		psc.RunAsNonRoot = ptr.To(true)
	}
	if psc.SeccompProfile == nil {
		psc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	restrict := func(c *corev1.Container) {
		if c.SecurityContext == nil {
			c.SecurityContext = &corev1.SecurityContext{}
		}
		if c.SecurityContext.AllowPrivilegeEscalation == nil {
			c.SecurityContext.AllowPrivilegeEscalation = ptr.To(false)
		}
		if c.SecurityContext.Capabilities == nil {
			c.SecurityContext.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
		}
	}
	for i := range spec.InitContainers {
		restrict(&spec.InitContainers[i])
	}
	for i := range spec.Containers {
		restrict(&spec.Containers[i])
	}
}

// deleteOldJobs deletes the gate's Jobs of earlier counts of ended nodes.
func deleteOldJobs(ctx context.Context, in Input, ns string, g *inplacev1.HealthGate, current string) (string, error) {
	labels := taskLabels(in)
	labels[JobGateLabel] = labelValue(g.Name)
	jobs := &batchv1.JobList{}
	if err := in.Workload.List(ctx, jobs, client.InNamespace(ns), labels); err != nil {
		return fmt.Sprintf("list the gate's Jobs in namespace %s of the workload cluster: %v", ns, err), err
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
