package sim

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the simulator leaves of a failed Job's pod, where an operator (and the updater)
// finds a node's own words: the Job's Failed condition says only what the Job controller
// says (reason BackoffLimitExceeded, "Job has reached the specified backoff limit":
// kubernetes pkg/controller/job/job_controller.go; shared/facts/suc.md fact 45 quotes it
// through the Plan's JobFailed message), while the container's termination message (the
// file at its terminationMessagePath, which the node program writes, nodeprogram Main;
// SUC sets no terminationMessagePolicy, so File, the default) and its log are on the pod.
//
// Simplified: the pods of Jobs that succeed are not created (nothing reads them), and of
// the backoffLimit+1 pods a real Job controller starts before it gives up, only the last
// one is.

// backoffLimitMessage is the Job controller's message of its BackoffLimitExceeded
// condition.
const backoffLimitMessage = "Job has reached the specified backoff limit"

// LabelJobName is the label the API server puts on a Job's pod template, and so on its
// pods, with the Job's name (Job's generated selector, batch/v1 since Kubernetes 1.27).
const LabelJobName = "batch.kubernetes.io/job-name"

// failedPod creates the last pod of a failed Job as the kubelet leaves it: phase Failed,
// the failing container terminated with its exit code and termination message, the init
// containers before it Completed; its log is kept for PodLog.
func (s *SUC) failedPod(ctx context.Context, job *batchv1.Job, run *podRun, now metav1.Time) error {
	exit := run.exit
	name, err := leaveFailedPod(ctx, s.Client, job, run.node, exit, metav1.NewTime(run.start), now)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.podLogs == nil {
		s.podLogs = map[string]string{}
	}
	s.podLogs[job.Namespace+"/"+name+"/"+exit.container] = exit.log
	s.mu.Unlock()
	return nil
}

// PodLog is the log of a container of a failed pod the simulator left, and whether it
// knows that container (Kubelet.Logs fits).
func (s *SUC) PodLog(namespace, pod, container string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	log, ok := s.podLogs[namespace+"/"+pod+"/"+container]
	return log, ok
}

// deletePods deletes the pods of a Job the simulator deleted, as the garbage collector
// does on a real cluster (envtest runs none): at once, as no kubelet runs them.
func (s *SUC) deletePods(ctx context.Context, job *batchv1.Job) error {
	pods := &corev1.PodList{}
	if err := s.Client.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{LabelJobName: job.Name}); err != nil {
		return fmt.Errorf("list the pods of job %s: %w", job.Name, err)
	}
	for i := range pods.Items {
		if err := s.Client.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s of job %s: %w", pods.Items[i].Name, job.Name, err)
		}
	}
	return nil
}
