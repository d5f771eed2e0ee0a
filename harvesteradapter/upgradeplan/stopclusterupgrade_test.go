package upgradeplan

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The end of a plan stops its cluster upgrade first, on a real API server (which keeps a
// Job deleted with foreground propagation, and no garbage collector runs here to take it
// away): a running Job is deleted with its pods first and waited for, at most
// clusterUpgradeStopWait past its deletion; a Job that ended, or another plan's, is not
// waited for.
func TestStopClusterUpgrade(t *testing.T) {
	env := testenv.ForTest(t)
	ctx := context.Background()
	wc := env.Client
	if err := wc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: repository.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	job := func(plan, label string) *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Namespace: repository.Namespace, Name: clusterupgrade.JobName(plan), Labels: map[string]string{LabelUpgradePlan: label}},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "apply", Image: "capi-inplace:test"}},
			}}},
		}
	}
	stop := func(plan string, now time.Time) string {
		t.Helper()
		waiting, err := stopClusterUpgrade(ctx, wc, plan, now)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	}
	read := func(plan string) *batchv1.Job {
		t.Helper()
		j := &batchv1.Job{}
		if err := wc.Get(ctx, client.ObjectKey{Namespace: repository.Namespace, Name: clusterupgrade.JobName(plan)}, j); err != nil {
			t.Fatal(err)
		}
		return j
	}
	let := func(j *batchv1.Job) { // the garbage collector's part, once the pods are gone
		t.Helper()
		before := j.DeepCopy()
		j.Finalizers = nil
		if err := wc.Patch(ctx, j, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}

	if got := stop("none-v1-8-1", time.Now()); got != "" {
		t.Fatalf("no Job: %q, want nothing to wait for", got)
	}

	// A running Job: deleted in the foreground, waited for, then given up on.
	if err := wc.Create(ctx, job("run-v1-8-1", "run-v1-8-1")); err != nil {
		t.Fatal(err)
	}
	if got := stop("run-v1-8-1", time.Now()); !strings.Contains(got, "its pod is deleted first") {
		t.Fatalf("a running Job: %q, want it deleted and waited for", got)
	}
	running := read("run-v1-8-1")
	if running.DeletionTimestamp == nil || !slices.Contains(running.Finalizers, metav1.FinalizerDeleteDependents) {
		t.Fatalf("the running Job is not being deleted in the foreground: deletionTimestamp %v, finalizers %v", running.DeletionTimestamp, running.Finalizers)
	}
	deleted := running.DeletionTimestamp.Time
	if got := stop("run-v1-8-1", deleted.Add(time.Minute)); !strings.Contains(got, "waiting for its pod to be gone (deleted 1m0s ago)") {
		t.Fatalf("a Job being deleted for a minute: %q, want it waited for", got)
	}
	if got := stop("run-v1-8-1", deleted.Add(clusterUpgradeStopWait+time.Second)); got != "" {
		t.Fatalf("a Job still there %s after its deletion: %q, want the cleanup to go on", clusterUpgradeStopWait, got)
	}
	let(running)

	// A Job that completed: its pods have ended; nothing to wait for, left to removeLabelled.
	done := job("done-v1-8-1", "done-v1-8-1")
	if err := wc.Create(ctx, done); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	done.Status = batchv1.JobStatus{StartTime: &now, CompletionTime: &now, Succeeded: 1, Conditions: []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastTransitionTime: now},
	}}
	if err := wc.Status().Update(ctx, done); err != nil {
		t.Fatal(err)
	}
	if got := stop("done-v1-8-1", time.Now()); got != "" {
		t.Fatalf("a completed Job: %q, want nothing to wait for", got)
	}
	if read("done-v1-8-1").DeletionTimestamp != nil {
		t.Fatal("a completed Job was deleted by stopClusterUpgrade; removeLabelled deletes it")
	}

	// A Job of that name that another plan labelled is not this plan's to stop.
	if err := wc.Create(ctx, job("other-v1-8-1", "someone-else")); err != nil {
		t.Fatal(err)
	}
	if got := stop("other-v1-8-1", time.Now()); got != "" || read("other-v1-8-1").DeletionTimestamp != nil {
		t.Fatalf("another plan's Job: %q, deleted %v; want it left alone", got, read("other-v1-8-1").DeletionTimestamp)
	}
}
