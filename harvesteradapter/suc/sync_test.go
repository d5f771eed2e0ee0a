package suc

import (
	"context"
	"testing"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// A failed Job's error says the node's own words first (the failed container's
// termination message, with the container, pod and exit code after it), then the Job's
// name and the Job controller's reason, which says only that the backoff limit was
// reached: an operator reads what went wrong before any name, and a cut message keeps it.
func TestFailedJobSaysTheNodesWordsFirst(t *testing.T) {
	plan := &sucv1.Plan{ObjectMeta: metav1.ObjectMeta{Namespace: "cattle-system", Name: "capi-inplace-os-hv-1-abc"}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cattle-system", Name: "apply-capi-inplace-os-hv-1-abc-on-hv-1",
			Labels: map[string]string{"upgrade.cattle.io/plan": plan.Name, "upgrade.cattle.io/node": "hv-1"}},
		Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue,
			Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"}}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cattle-system", Name: job.Name + "-x7k2q", Labels: map[string]string{labelJobName: job.Name}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "upgrade", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "elemental upgrade failed with return code: 33\n"}}}}},
	}
	for _, tc := range []struct {
		name string
		objs []any
		want string
	}{
		{"the pod says why", []any{job, pod},
			"elemental upgrade failed with return code: 33 (container upgrade of pod apply-capi-inplace-os-hv-1-abc-on-hv-1-x7k2q exited with code 1); " +
				"SUC job apply-capi-inplace-os-hv-1-abc-on-hv-1 of plan capi-inplace-os-hv-1-abc failed on node hv-1: BackoffLimitExceeded: Job has reached the specified backoff limit"},
		{"the pod is gone", []any{job},
			"SUC job apply-capi-inplace-os-hv-1-abc-on-hv-1 of plan capi-inplace-os-hv-1-abc failed on node hv-1: BackoffLimitExceeded: Job has reached the specified backoff limit"},
	} {
		b := fake.NewClientBuilder()
		for _, o := range tc.objs {
			switch o := o.(type) {
			case *batchv1.Job:
				b = b.WithObjects(o.DeepCopy())
			case *corev1.Pod:
				b = b.WithObjects(o.DeepCopy())
			}
		}
		err := FailedJob(context.Background(), b.Build(), plan, "hv-1", nil)
		perm, ok := nodeupdater.AsPermanent(err)
		if !ok || perm.Reason != "PlanJobFailed" {
			t.Fatalf("%s: %v, want a permanent PlanJobFailed", tc.name, err)
		}
		if got := err.Error(); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
