package sim

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/nodeprogram"
)

// TestJobAfterPod checks the simulated Job controller's rule for the KubeadmUpdater's
// Jobs (kubernetes v1.36.3 pkg/controller/job): an exit the podFailurePolicy lists fails
// the Job at once, an exit it does not list (the node program's 3) is counted and fails
// the Job only once status.failed is above spec.backoffLimit, a pod that succeeds after
// failed ones completes it with the failures still counted.
func TestJobAfterPod(t *testing.T) {
	started, now := metav1.NewTime(time.Unix(100, 0)), metav1.NewTime(time.Unix(200, 0))
	ended := func(job *batchv1.Job) (batchv1.JobConditionType, string) {
		for _, c := range job.Status.Conditions {
			if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
				return c.Type, c.Reason
			}
		}
		return "", ""
	}
	cases := []struct {
		name       string
		codes      []int // the exit of each pod, in order
		wantType   batchv1.JobConditionType
		wantReason string
		wantFailed int32
	}{
		{name: "a first pod that says not done yet leaves the Job running for its next pod", codes: []int{nodeprogram.ExitRetry}, wantFailed: 1},
		{name: "the pod after a retried one completes the Job", codes: []int{nodeprogram.ExitRetry, nodeprogram.ExitOK}, wantType: batchv1.JobComplete, wantReason: batchv1.JobReasonCompletionsReached, wantFailed: 1},
		{name: "a refusal fails the Job at once", codes: []int{nodeprogram.ExitFailed}, wantType: batchv1.JobFailed, wantReason: batchv1.JobReasonPodFailurePolicy, wantFailed: 1},
		{name: "a refusal after a retry fails it at once too", codes: []int{nodeprogram.ExitRetry, nodeprogram.ExitUsage}, wantType: batchv1.JobFailed, wantReason: batchv1.JobReasonPodFailurePolicy, wantFailed: 2},
		{name: "backoffLimit 3: the third retried pod still leaves the Job running", codes: []int{3, 3, 3}, wantFailed: 3},
		{name: "backoffLimit 3: the fourth fails it with BackoffLimitExceeded", codes: []int{3, 3, 3, 3}, wantType: batchv1.JobFailed, wantReason: batchv1.JobReasonBackoffLimitExceeded, wantFailed: 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			job := &batchv1.Job{Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](3)}}
			for i, code := range c.codes {
				if typ, _ := ended(job); typ != "" {
					t.Fatalf("pod %d ran after the Job ended (%s)", i+1, typ)
				}
				jobAfterPod(job, code, i+1, started, now)
			}
			typ, reason := ended(job)
			if typ != c.wantType || reason != c.wantReason {
				t.Errorf("Job ended %q (%q), want %q (%q)", typ, reason, c.wantType, c.wantReason)
			}
			if job.Status.Failed != c.wantFailed {
				t.Errorf("status.failed %d, want %d", job.Status.Failed, c.wantFailed)
			}
			if job.Status.StartTime == nil || !job.Status.StartTime.Equal(&started) {
				t.Errorf("status.startTime %v, want the first pod's start %v", job.Status.StartTime, started)
			}
		})
	}
}

// TestPodFailureBackoff checks the back-off between a failed pod and the next: doubled
// with each failure, at most 60 times the first (10 s and 10 min in the real controller).
func TestPodFailureBackoff(t *testing.T) {
	base := 10 * time.Second
	for failures, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 6: 320 * time.Second, 7: 10 * time.Minute, 30: 10 * time.Minute} {
		if got := podFailureBackoff(base, failures); got != want {
			t.Errorf("after %d failures: %s, want %s", failures, got, want)
		}
	}
}
