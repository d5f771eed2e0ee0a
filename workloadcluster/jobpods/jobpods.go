// Package jobpods reads what the pods of a failed Job on a workload cluster say about the
// failure, in the containers' own words: the Job's Failed condition says only that its
// backoff limit or pod failure policy was reached. The updaters that run Jobs on nodes
// (the Harvester updater's SUC Plans and cluster upgrade Job, the KubeadmUpdater) share it.
package jobpods

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// JobNameLabel is the label the API server puts on a Job's pod template, so on its pods,
// with the Job's name (batch/v1, Kubernetes 1.27 on).
const JobNameLabel = "batch.kubernetes.io/job-name"

// maxWords bounds what is taken from one termination message: the kubelet keeps up to
// 4096 bytes of it, a NodeUpdate's failureMessage holds 10 KiB.
const maxWords = 4096

// Bounded is text without its surrounding space, cut at maxWords bytes.
func Bounded(text string) string {
	text = strings.TrimSpace(text)
	if len(text) > maxWords {
		text = text[:maxWords] + "…"
	}
	return text
}

// LogTail reads the last lines of a container's log through the API server (pods/log).
type LogTail func(ctx context.Context, namespace, pod, container string) (string, error)

// ContainerFailure is a container of a failed Job's pod that ended in error, in the words
// the kubelet kept of it. A Job's Failed condition says only what the Job controller says
// (BackoffLimitExceeded, "Job has reached the specified backoff limit": kubernetes
// pkg/controller/job/job_controller.go); what failed is said here.
type ContainerFailure struct {
	// Pod and Container name the container.
	Pod, Container string
	// ExitCode is the code it exited with (never 0).
	ExitCode int32
	// Message is its termination message, bounded (Bounded): the file at its
	// terminationMessagePath, where the node program writes its outcome (nodeprogram
	// Main), or with FallbackToLogsOnError the end of its log when it wrote none.
	Message string
	// Log is the end of its log (pods/log, LogTailLines lines), bounded, when it was read
	// and says more than Message.
	Log string
	// LogError is why its log could not be read, when it was asked for and could not.
	LogError error
}

// Words are the container's own words about its failure: its termination message, else
// the end of its log, else what is known of why neither is there.
func (f ContainerFailure) Words() string {
	switch {
	case f.Message != "":
		return f.Message
	case f.Log != "":
		return f.Log
	case f.LogError != nil:
		return fmt.Sprintf("no termination message, and its log could not be read: %v", f.LogError)
	}
	return "no termination message (see the pod's log)"
}

// Where names the container, its pod and its exit code.
func (f ContainerFailure) Where() string {
	return fmt.Sprintf("container %s of pod %s exited with code %d", f.Container, f.Pod, f.ExitCode)
}

// FailedContainers are the containers of job's newest pod that ended in error, init
// containers first, as the Harvester updater reads them for a SUC Job's failure and the KubeadmUpdater for its node Jobs; logs, when not nil,
// reads the end of each one's log. None when the pod is gone (a Job that failed at its
// activeDeadlineSeconds has its active pods deleted by the Job controller) or no container
// ended in error. It works for any Job whose pods carry the Job's name label, such as the
// cluster upgrade Job; read it before the Job is deleted, as its pods go with it.
func FailedContainers(ctx context.Context, wc client.Client, job *batchv1.Job, logs LogTail) ([]ContainerFailure, error) {
	pods := &corev1.PodList{}
	if err := wc.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{JobNameLabel: job.Name}); err != nil {
		return nil, fmt.Errorf("list the pods of job %s: %w", job.Name, err)
	}
	var newest *corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; newest == nil || newest.CreationTimestamp.Before(&p.CreationTimestamp) {
			newest = p
		}
	}
	if newest == nil {
		return nil, nil
	}
	var out []ContainerFailure
	for _, st := range append(append([]corev1.ContainerStatus(nil), newest.Status.InitContainerStatuses...), newest.Status.ContainerStatuses...) {
		t := st.State.Terminated
		if t == nil {
			t = st.LastTerminationState.Terminated
		}
		if t == nil || t.ExitCode == 0 {
			continue
		}
		f := ContainerFailure{Pod: newest.Name, Container: st.Name, ExitCode: t.ExitCode, Message: Bounded(t.Message)}
		if logs != nil {
			log, err := logs(ctx, newest.Namespace, newest.Name, st.Name)
			f.LogError = err
			if f.Log = Bounded(log); f.Log == f.Message {
				f.Log = ""
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// FailedContainersWords is what failures say, for a failure message: each container's
// own words first, then where they come from, joined by "; ".
func FailedContainersWords(failures []ContainerFailure) string {
	said := make([]string, 0, len(failures))
	for _, f := range failures {
		said = append(said, fmt.Sprintf("%s (%s)", f.Words(), f.Where()))
	}
	return strings.Join(said, "; ")
}
