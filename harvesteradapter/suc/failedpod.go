package suc

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ContainerFailure is a container of a failed Job's pod that ended in error, in the words
// the kubelet kept of it. A Job's Failed condition says only what the Job controller says
// (BackoffLimitExceeded, "Job has reached the specified backoff limit": kubernetes
// pkg/controller/job/job_controller.go); what failed is said here.
type ContainerFailure struct {
	// Pod and Container name the container.
	Pod, Container string
	// ExitCode is the code it exited with (never 0).
	ExitCode int32
	// Message is its termination message, bounded (maxWords): the file at its
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
// containers first, as podWords reads them for a SUC Job's failure; logs, when not nil,
// reads the end of each one's log. None when the pod is gone (a Job that failed at its
// activeDeadlineSeconds has its active pods deleted by the Job controller) or no container
// ended in error. It works for any Job whose pods carry the Job's name label, such as the
// cluster upgrade Job; read it before the Job is deleted, as its pods go with it.
func FailedContainers(ctx context.Context, wc client.Client, job *batchv1.Job, logs LogTail) ([]ContainerFailure, error) {
	pods := &corev1.PodList{}
	if err := wc.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{labelJobName: job.Name}); err != nil {
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
		f := ContainerFailure{Pod: newest.Name, Container: st.Name, ExitCode: t.ExitCode, Message: bounded(t.Message)}
		if logs != nil {
			log, err := logs(ctx, newest.Namespace, newest.Name, st.Name)
			f.LogError = err
			if f.Log = bounded(log); f.Log == f.Message {
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

// How much of a failed container's log is read: what the node steps put into a
// NodeUpdate's failure message (harvesteradapter Updater.logTail).
const (
	LogTailLines = 20
	LogTailBytes = 4096
)

// RESTConfigs are workload clients that also give REST configurations
// (workloadcluster.Clients): a client-go clientset reads what a controller-runtime client
// has no API for, such as a pod's log.
type RESTConfigs interface {
	RESTConfig(ctx context.Context, cluster types.NamespacedName) (*rest.Config, error)
}

// PodLogTail reads the end of a container's log (LogTailLines lines, at most LogTailBytes)
// in the workload cluster of the CAPI Cluster cluster, through its API server's pods/log.
func PodLogTail(configs RESTConfigs, cluster types.NamespacedName) LogTail {
	return func(ctx context.Context, namespace, pod, container string) (string, error) {
		cfg, err := configs.RESTConfig(ctx, cluster)
		if err != nil {
			return "", err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return "", err
		}
		opts := &corev1.PodLogOptions{Container: container, TailLines: ptr.To[int64](LogTailLines), LimitBytes: ptr.To[int64](LogTailBytes)}
		raw, err := cs.CoreV1().Pods(namespace).GetLogs(pod, opts).DoRaw(ctx)
		if err != nil {
			return "", fmt.Errorf("read the log of container %s of pod %s/%s: %w", container, namespace, pod, err)
		}
		return string(raw), nil
	}
}
