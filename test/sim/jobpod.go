package sim

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the kubelet makes of a failed container's termination message (kubernetes
// pkg/kubelet/container/runtime.go, pkg/kubelet/kuberuntime/kuberuntime_container.go
// getTerminationMessage): it reads at most 4096 bytes of the file at the container's
// terminationMessagePath; with terminationMessagePolicy FallbackToLogsOnError and an empty
// file, a container that exited non-zero gets the last 80 lines of its log, at most 2048
// bytes, instead.
const (
	maxTerminationMessage        = 4096
	maxTerminationMessageLogLen  = 2048
	maxTerminationMessageLogLine = 80
)

// leaveFailedPod creates on c the last pod of a failed Job as the kubelet leaves it, as
// SUC.failedPod does for SUC's Jobs (sucpods.go, whose notes it follows): on node (empty
// leaves it unscheduled), phase Failed, the failing container (exit.container)
// terminated with its exit code and termination message (exit.termination, or by the
// container's terminationMessagePolicy the end of exit.log), the init containers before
// it Completed, the containers after it not started. It returns the pod's name.
func leaveFailedPod(ctx context.Context, c client.Client, job *batchv1.Job, node string, exit *containerExit, started, now metav1.Time) (string, error) {
	pod := failedPod(job, node, exit, started, now)
	status := pod.Status
	pod.Status = corev1.PodStatus{}
	if err := c.Create(ctx, pod); err != nil {
		return "", fmt.Errorf("create the failed pod of job %s: %w", job.Name, err)
	}
	pod.Status = status
	if err := c.Status().Update(ctx, pod); err != nil {
		return "", fmt.Errorf("report the failed pod %s: %w", pod.Name, err)
	}
	return pod.Name, nil
}

// failedPod is the pod leaveFailedPod leaves, with its status, not yet created.
func failedPod(job *batchv1.Job, node string, exit *containerExit, started, now metav1.Time) *corev1.Pod {
	tmpl := job.Spec.Template
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        job.Name + "-" + utilrand.String(5),
			Namespace:   job.Namespace,
			Labels:      copyMap(tmpl.Labels),
			Annotations: copyMap(tmpl.Annotations),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *tmpl.Spec.DeepCopy(),
	}
	pod.Labels[LabelJobName] = job.Name
	pod.Spec.NodeName = node
	status := func(ctr corev1.Container, failing, reached bool) corev1.ContainerStatus {
		st := corev1.ContainerStatus{Name: ctr.Name, Image: ctr.Image}
		switch {
		case failing:
			st.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: exit.code, Reason: "Error", Message: terminationMessage(ctr, exit), StartedAt: started, FinishedAt: now}
		case reached:
			st.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: now}
		default:
			st.State.Waiting = &corev1.ContainerStateWaiting{Reason: "PodInitializing"}
		}
		return st
	}
	inInit := false
	for _, ctr := range pod.Spec.InitContainers {
		if ctr.Name == exit.container {
			inInit = true
		}
	}
	reached := true
	for _, ctr := range pod.Spec.InitContainers {
		failing := ctr.Name == exit.container
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, status(ctr, failing, reached && !failing))
		if failing {
			reached = false
		}
	}
	for _, ctr := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, status(ctr, !inInit && ctr.Name == exit.container, false))
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.StartTime = &started
	return pod
}

// terminationMessage is what the kubelet reports as the termination message of ctr,
// which ended as exit says (see maxTerminationMessage).
func terminationMessage(ctr corev1.Container, exit *containerExit) string {
	message := exit.termination
	if len(message) > maxTerminationMessage {
		message = message[:maxTerminationMessage]
	}
	if message != "" || exit.code == 0 || ctr.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		return message
	}
	lines := strings.SplitAfter(exit.log, "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	if len(lines) > maxTerminationMessageLogLine {
		lines = lines[len(lines)-maxTerminationMessageLogLine:]
	}
	tail := strings.Join(lines, "")
	if len(tail) > maxTerminationMessageLogLen {
		tail = tail[len(tail)-maxTerminationMessageLogLen:]
	}
	return tail
}
