package suc

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/workloadcluster/jobpods"
)

// ContainerFailure is a container of a failed Job's pod that ended in error, in the words
// the kubelet kept of it (jobpods.ContainerFailure).
type ContainerFailure = jobpods.ContainerFailure

// FailedContainers are the containers of job's newest pod that ended in error
// (jobpods.FailedContainers).
func FailedContainers(ctx context.Context, wc client.Client, job *batchv1.Job, logs LogTail) ([]ContainerFailure, error) {
	return jobpods.FailedContainers(ctx, wc, job, logs)
}

// FailedContainersWords is what failures say, for a failure message
// (jobpods.FailedContainersWords).
func FailedContainersWords(failures []ContainerFailure) string {
	return jobpods.FailedContainersWords(failures)
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
