package upgradeplan

import (
	"context"
	"fmt"
	"maps"

	"github.com/rancher/wrangler/v3/pkg/name"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// jobLogsKey is the ConfigMap that keeps what the pods of the plan's failed Jobs said,
// after cleanup has deleted the Jobs and their pods with them: in the upgrade namespace,
// beside the cluster upgrade's progress ConfigMap, named after the plan, and, like the
// progress ConfigMap, without the plan's label, so that removeLabelled keeps it. An
// operator who deletes the plan deletes it by hand once read.
func jobLogsKey(plan string) client.ObjectKey {
	return client.ObjectKey{Namespace: repository.Namespace, Name: name.SafeConcatName(plan, "job-logs")}
}

// maxJobLogs bounds what the job-logs ConfigMap holds (a ConfigMap holds at most 1 MiB):
// a failed Job's entries are not added past it. Each container's entries are bounded
// (suc.ContainerFailure), so only a Plan failing on many nodes at once comes near it.
const maxJobLogs = 512 << 10

// logTail reads the end of a container's log in the workload cluster of the plan's
// Cluster through its API server's pods/log, as the node steps read theirs; nil when the
// workload clients give no REST configuration (the words are then the termination
// messages only).
func (r *PlanReconciler) logTail(cluster types.NamespacedName) suc.LogTail {
	configs, ok := r.Env.Workloads.(suc.RESTConfigs)
	if !ok {
		return nil
	}
	return suc.PodLogTail(configs, cluster)
}

// keepFailedJobLogs reads what the pods of the plan's failed Jobs said (the cluster
// upgrade Job, and the Jobs System Upgrade Controller runs for the plan's own Plans:
// preload, image cleanup, the restart guard; all carry the plan's label) and writes it
// into the plan's job-logs ConfigMap (jobLogsKey) before cleanup deletes those Jobs: an
// operator needs the words most when the plan failed, exactly when its Jobs are removed.
// It returns, by Job, the containers that failed. It may be called again: a Job's entries
// are written anew, the other Jobs' stay.
func (r *PlanReconciler) keepFailedJobLogs(ctx context.Context, pr *PlanRun) (map[types.NamespacedName][]suc.ContainerFailure, error) {
	jobs := &batchv1.JobList{}
	if err := pr.Workload.List(ctx, jobs, client.MatchingLabels{LabelUpgradePlan: pr.Plan.Name}); err != nil {
		return nil, fmt.Errorf("list the Jobs of plan %s: %w", pr.Plan.Name, err)
	}
	logs := r.logTail(pr.Cluster)
	failed := map[types.NamespacedName][]suc.ContainerFailure{}
	data := map[string]string{}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		condition := jobFailed(job)
		if condition == nil {
			continue
		}
		failures, err := suc.FailedContainers(ctx, pr.Workload, job, logs)
		if err != nil {
			return nil, err
		}
		if len(failures) == 0 {
			continue // the pod is gone (a Job past its deadline): nothing to keep
		}
		failed[client.ObjectKeyFromObject(job)] = failures
		for _, f := range failures {
			prefix := job.Name + "." + f.Container
			data[prefix+".failure"] = fmt.Sprintf("Job %s/%s failed: %s: %s; %s", job.Namespace, job.Name, condition.Reason, condition.Message, f.Where())
			data[prefix+".termination-message"] = f.Message
			if f.Log != "" {
				data[prefix+".log"] = f.Log
			} else if f.LogError != nil {
				data[prefix+".log"] = fmt.Sprintf("(the log could not be read: %v)", f.LogError)
			}
		}
	}
	if len(data) == 0 {
		return failed, nil
	}
	return failed, writeJobLogs(ctx, pr.Workload, pr.Plan.Name, data)
}

// writeJobLogs adds data to the plan's job-logs ConfigMap, creating it the first time.
func writeJobLogs(ctx context.Context, wc client.Client, plan string, data map[string]string) error {
	key := jobLogsKey(plan)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm := &corev1.ConfigMap{}
		err := wc.Get(ctx, key, cm)
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: key.Namespace, Name: key.Name,
					// An annotation, not the label: removeLabelled deletes what carries the label.
					Annotations: map[string]string{LabelUpgradePlan: plan},
				},
				Data: boundedJobLogs(nil, data),
			}
			if err := wc.Create(ctx, cm); err != nil {
				return fmt.Errorf("create ConfigMap %s keeping the words of plan %s's failed Jobs: %w", key, plan, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("get ConfigMap %s: %w", key, err)
		}
		cm.Data = boundedJobLogs(cm.Data, data)
		if err := wc.Update(ctx, cm); err != nil {
			return fmt.Errorf("update ConfigMap %s keeping the words of plan %s's failed Jobs: %w", key, plan, err)
		}
		return nil
	})
}

// boundedJobLogs is kept with data's entries added, as long as the whole stays within
// maxJobLogs; an entry already kept is replaced.
func boundedJobLogs(kept, data map[string]string) map[string]string {
	out := maps.Clone(kept)
	if out == nil {
		out = map[string]string{}
	}
	size := 0
	for k, v := range out {
		size += len(k) + len(v)
	}
	for k, v := range data {
		grow := len(k) + len(v)
		if old, ok := out[k]; ok {
			grow -= len(k) + len(old)
		}
		if size+grow > maxJobLogs {
			continue
		}
		out[k] = v
		size += grow
	}
	return out
}

// jobFailed is the Job's Failed condition when it is true, else nil.
func jobFailed(job *batchv1.Job) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

// jobFailure is the plan's failure message for a failed Job of its own (what names it,
// such as "the cluster upgrade Job"): first what the Job's pod said (its failed
// containers' own words, each bounded as the node steps bound theirs), then the Job, the
// Job controller's reason, and the ConfigMap that keeps the words after cleanup. A Job
// whose pod left no words (the Job controller deletes the pods of a Job past its
// activeDeadlineSeconds) is said with its reason only.
func jobFailure(what string, job *batchv1.Job, failures []suc.ContainerFailure, kept client.ObjectKey) string {
	reason, message := "Failed", ""
	if c := jobFailed(job); c != nil {
		reason, message = c.Reason, c.Message
	}
	if len(failures) == 0 {
		return fmt.Sprintf("%s %s/%s failed: %s: %s; its pod left no termination message or log", what, job.Namespace, job.Name, reason, message)
	}
	return fmt.Sprintf("%s; %s %s/%s failed: %s: %s; its pod's termination message and log are kept in ConfigMap %s/%s",
		suc.FailedContainersWords(failures), what, job.Namespace, job.Name, reason, message, kept.Namespace, kept.Name)
}
