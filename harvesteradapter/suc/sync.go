package suc

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/nodeupdater"

	"github.com/capi-inplace/capi-inplace/workloadcluster/jobpods"
)

// syncPlan makes the workload cluster's SUC Plan want.Name carry want's spec and labels
// (labels another writer put on it stay). It returns the Plan once System Upgrade
// Controller has resolved it (its latest hash is set); until then nil and what it waits
// for. forWhat names what the Plan is for, in messages.
func Sync(ctx context.Context, wc client.Client, want *sucv1.Plan, forWhat string) (*sucv1.Plan, string, error) {
	current := &sucv1.Plan{}
	err := wc.Get(ctx, client.ObjectKeyFromObject(want), current)
	switch {
	case apierrors.IsNotFound(err):
		if err := wc.Create(ctx, want); err != nil {
			return nil, "", fmt.Errorf("create SUC plan %s for %s: %w", want.Name, forWhat, err)
		}
		return nil, fmt.Sprintf("created SUC plan %s/%s for %s", want.Namespace, want.Name, forWhat), nil
	case err != nil:
		return nil, "", fmt.Errorf("get SUC plan %s: %w", want.Name, err)
	}
	if !equality.Semantic.DeepEqual(current.Spec, want.Spec) || !hasLabels(current.Labels, want.Labels) {
		current.Spec = want.Spec
		if current.Labels == nil {
			current.Labels = map[string]string{}
		}
		maps.Copy(current.Labels, want.Labels)
		if err := wc.Update(ctx, current); err != nil {
			return nil, "", fmt.Errorf("update SUC plan %s for %s: %w", want.Name, forWhat, err)
		}
		return nil, fmt.Sprintf("updated SUC plan %s/%s for %s", want.Namespace, want.Name, forWhat), nil
	}
	if current.Status.LatestHash == "" {
		return nil, fmt.Sprintf("waiting for System Upgrade Controller to resolve plan %s", current.Name), nil
	}
	return current, "", nil
}

// hasLabels reports whether labels carries every label of want.
func hasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// planDoneOn reports whether SUC finished plan on node: the node carries
// plan.upgrade.cattle.io/<plan> equal to the Plan's latest hash (shared/facts/suc.md,
// fact 46).
func DoneOn(plan *sucv1.Plan, node *corev1.Node) bool {
	return node.Labels["plan.upgrade.cattle.io/"+plan.Name] == plan.Status.LatestHash
}

// failedPlanJob is a permanent error naming a failed Job of plan on node (on any node when
// node is empty), with the Job's reason; nil when none failed. A Job older than the Plan
// belongs to an earlier Plan of the same name.
//
// The error says first what the Job's failed pod says (podWords), then the Job's name and
// reason: the node's own words are what an operator acts on, and the Job's condition only
// says that its backoff limit was reached, so they lead even where a message is cut.
// logs, when not nil, reads the end of a failed container's log.
func FailedJob(ctx context.Context, wc client.Client, plan *sucv1.Plan, node string, logs LogTail) error {
	jobs, err := planJobs(ctx, wc, plan, node)
	if err != nil {
		return err
	}
	for _, job := range jobs {
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				words, err := podWords(ctx, wc, &job, logs)
				if err != nil {
					return err
				}
				if words != "" {
					words += "; "
				}
				return nodeupdater.Permanentf("PlanJobFailed", "%sSUC job %s of plan %s failed on node %s: %s: %s",
					words, job.Name, plan.Name, job.Labels["upgrade.cattle.io/node"], c.Reason, c.Message)
			}
		}
	}
	return nil
}

// labelJobName is the label the API server puts on a Job's pods with the Job's name.
const labelJobName = jobpods.JobNameLabel

// LogTail reads the last lines of a container's log through the API server (pods/log).
type LogTail = jobpods.LogTail

// podWords is what the failed Job's newest pod says about its failure, for the Job's
// failure message: for each container that ended in error, its termination message (the
// node program writes its outcome there; nodeprogram Main) and, when logs is set and the
// log says more (kubectl writes no termination message: a drain's error is in its log
// only), the last lines of its log; then, in parentheses, the container, its pod and its
// exit code. The Job controller's condition says only that the backoff limit was
// reached, and the pod goes with the Job when its Plan is removed, so this is read
// before any cleanup. Empty when the pod is gone or no container ended in error. A log
// that cannot be read is said only when there is no termination message.
func podWords(ctx context.Context, wc client.Client, job *batchv1.Job, logs LogTail) (string, error) {
	failures, err := FailedContainers(ctx, wc, job, logs)
	if err != nil {
		return "", err
	}
	said := make([]string, 0, len(failures))
	for _, f := range failures {
		message := f.Message
		switch {
		case message == "" && f.Log == "" && f.LogError != nil:
			message = fmt.Sprintf("no termination message, and its log could not be read: %v", f.LogError)
		case message == "" && f.Log == "":
			message = "no termination message (see the pod's log)"
		case message == "":
			message = "no termination message; its log ends: " + f.Log
		case f.Log != "":
			message += "; its log ends: " + f.Log
		}
		said = append(said, fmt.Sprintf("%s (%s)", message, f.Where()))
	}
	return strings.Join(said, "; "), nil
}

// JobRunning reports whether a Job of one of plans runs on node.
func JobRunning(ctx context.Context, wc client.Client, node string, plans []sucv1.Plan) (bool, error) {
	for _, p := range plans {
		jobs := &batchv1.JobList{}
		if err := wc.List(ctx, jobs, client.InNamespace(p.Namespace), client.MatchingLabels{"upgrade.cattle.io/plan": p.Name, "upgrade.cattle.io/node": node}); err != nil {
			return false, fmt.Errorf("list jobs of plan %s: %w", p.Name, err)
		}
		for i := range jobs.Items {
			if !jobFinished(&jobs.Items[i]) {
				return true, nil
			}
		}
	}
	return false, nil
}

// NodeUpdateJobRunning reports whether a Job of the NodeUpdate's Plans (any Plan: the
// Jobs and their pods carry the Plan's label naming the NodeUpdate, fact 25), or a pod
// of one, has not ended in namespace. After the Plans are deleted, SUC and the garbage
// collector delete their Jobs (facts 27, 42); a Job deleted with background propagation
// is gone before its pod, which runs on until the garbage collector deletes it, so the
// pods are looked at too: this tells when nothing of the NodeUpdate runs any more.
func NodeUpdateJobRunning(ctx context.Context, wc client.Client, namespace string, nodeUpdate types.UID) (bool, error) {
	ours := client.MatchingLabels{LabelNodeUpdate: string(nodeUpdate)}
	jobs := &batchv1.JobList{}
	if err := wc.List(ctx, jobs, client.InNamespace(namespace), ours); err != nil {
		return false, fmt.Errorf("list the Jobs of NodeUpdate %s: %w", nodeUpdate, err)
	}
	for i := range jobs.Items {
		if !jobFinished(&jobs.Items[i]) {
			return true, nil
		}
	}
	pods := &corev1.PodList{}
	if err := wc.List(ctx, pods, client.InNamespace(namespace), ours); err != nil {
		return false, fmt.Errorf("list the pods of NodeUpdate %s: %w", nodeUpdate, err)
	}
	for i := range pods.Items {
		if phase := pods.Items[i].Status.Phase; phase != corev1.PodSucceeded && phase != corev1.PodFailed {
			return true, nil
		}
	}
	return false, nil
}

// JobSucceeded tells whether a Job of plan, no older than the Plan, completed on node.
func JobSucceeded(ctx context.Context, wc client.Client, plan *sucv1.Plan, node string) (bool, error) {
	jobs, err := planJobs(ctx, wc, plan, node)
	if err != nil {
		return false, err
	}
	for _, job := range jobs {
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
	}
	return false, nil
}

// NoJob says, when System Upgrade Controller has made no Job of plan for node although
// the Plan has existed for longer than after, that SUC is silent, since when, and what
// to look at; "" otherwise. A Plan SUC never turns into a Job otherwise shows only as a
// step waiting until its timeout (rancher/system-upgrade-controller#217, "No generated
// jobs after submitting update plan"; rancher/rancher#44221, SUC stuck at "Starting
// upgrade.cattle.io/v1, Kind=Plan controller"; issue #53).
func NoJob(ctx context.Context, wc client.Client, plan *sucv1.Plan, node string, after time.Duration, now time.Time) (string, error) {
	since := now.Sub(plan.CreationTimestamp.Time)
	if since < after {
		return "", nil
	}
	jobs, err := planJobs(ctx, wc, plan, node)
	if err != nil || len(jobs) > 0 {
		return "", err
	}
	return fmt.Sprintf("System Upgrade Controller has made no Job of plan %s/%s for node %s in %s: it is not acting on the Plan. "+
		"Check it (kubectl -n %s get deploy system-upgrade-controller; kubectl -n %s logs deploy/system-upgrade-controller) and the Plan's conditions (kubectl -n %s get plan %s -o yaml); the step fails at its timeout",
		plan.Namespace, plan.Name, node, since.Round(time.Second), plan.Namespace, plan.Namespace, plan.Namespace, plan.Name), nil
}

// planJobs lists the Jobs of plan on node (on any node when node is empty), leaving out
// a Job older than the Plan: it belongs to an earlier Plan of the same name.
func planJobs(ctx context.Context, wc client.Client, plan *sucv1.Plan, node string) ([]batchv1.Job, error) {
	selector := client.MatchingLabels{"upgrade.cattle.io/plan": plan.Name}
	if node != "" {
		selector["upgrade.cattle.io/node"] = node
	}
	jobs := &batchv1.JobList{}
	if err := wc.List(ctx, jobs, client.InNamespace(plan.Namespace), selector); err != nil {
		return nil, fmt.Errorf("list jobs of plan %s: %w", plan.Name, err)
	}
	out := jobs.Items[:0]
	for _, job := range jobs.Items {
		if !job.CreationTimestamp.Before(&plan.CreationTimestamp) {
			out = append(out, job)
		}
	}
	return out, nil
}

func jobFinished(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
