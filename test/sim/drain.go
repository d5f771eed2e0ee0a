package sim

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// evictPods plays the pod removal of `kubectl drain <node>` as k8s.io/kubectl v0.36.3
// pkg/drain does it (the module cache has it):
//   - the pods of the node that --pod-selector selects go through the filters of
//     filters.go, in its order (makeFilters): a DaemonSet's running pod is an error
//     without --ignore-daemonsets and left alone with it (one whose DaemonSet is gone
//     is an error, removed with --force); a mirror pod is left alone; a running pod
//     with an emptyDir is an error without --delete-emptydir-data; a running pod with
//     no controller is an error without --force. Any error fails the drain at once,
//     before a pod is touched, with kubectl's "cannot delete <what>: <pods>" words;
//   - each other pod is evicted through the API server's pods/eviction (drain.go
//     EvictPod), which refuses with 429 when a PodDisruptionBudget does not allow the
//     disruption; kubectl retries a refused eviction every 5 s until --timeout (the
//     caller keeps the drain running and fails it at the timeout). With
//     --disable-eviction the pods are deleted instead, budgets ignored;
//   - kubectl then waits for the evicted pods to be gone. The kubelet's part, stopping
//     the containers and confirming the deletion, is played at once (a deletion with
//     grace 0): the simulator runs no containers.
//
// An API server with no disruption controller (envtest runs none) leaves every
// PodDisruptionBudget's status unobserved, and the eviction of a pod it covers is refused
// with a Retry-After of 10 s that client-go's own retries sit out (kubernetes v1.36.3
// pkg/registry/core/pod/storage/eviction.go, createTooManyRequestsError): a test writes a
// budget's status as the disruption controller would.
//
// The pods gone, the Longhorn volumes they alone used detach (longhornusers.go). It
// returns the pods whose eviction was refused, as kubectl names them, and a fatal error
// message when the filters refuse the drain.
func (s *SUC) evictPods(ctx context.Context, node string, args []string) (refused []string, fatal string, err error) {
	selector := labels.Everything()
	if v := flagValue(args, "--pod-selector"); v != "" {
		if selector, err = labels.Parse(v); err != nil {
			return nil, fmt.Sprintf("error: invalid argument %q for \"--pod-selector\" flag: %v", v, err), nil
		}
	}
	pods := &corev1.PodList{}
	if err := s.Client.List(ctx, pods, client.MatchingFields{"spec.nodeName": node}, client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, "", fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	var (
		remove []*corev1.Pod
		errs   = map[string][]string{}
	)
	for i := range pods.Items {
		pod := &pods.Items[i]
		deletable, problem, err := s.drainFilter(ctx, pod, args)
		if err != nil {
			return nil, "", err
		}
		if problem != "" {
			errs[problem] = append(errs[problem], pod.Namespace+"/"+pod.Name)
		}
		if deletable {
			remove = append(remove, pod)
		}
	}
	if len(errs) > 0 {
		var parts []string
		for what, names := range errs {
			parts = append(parts, fmt.Sprintf("cannot delete %s: %s", what, strings.Join(names, ", ")))
		}
		sort.Strings(parts)
		return nil, fmt.Sprintf("error: unable to drain node %q due to error: %s, continuing command...", node, strings.Join(parts, "; ")), nil
	}
	var gone []*corev1.Pod
	for _, pod := range remove {
		if hasFlag(args, "--disable-eviction") {
			err = s.Client.Delete(ctx, pod)
		} else {
			err = s.Client.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}})
		}
		switch {
		case apierrors.IsTooManyRequests(err):
			refused = append(refused, fmt.Sprintf("pods/%q -n %q (%s)", pod.Name, pod.Namespace, apierrors.ReasonForError(err)))
			continue
		case err != nil && !apierrors.IsNotFound(err):
			return nil, "", fmt.Errorf("evict pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		// The kubelet stops the pod and confirms its deletion.
		if err := s.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("delete evicted pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		gone = append(gone, pod)
	}
	if len(gone) > 0 {
		err := ReleaseVolumes(ctx, s.Client, func(namespace, podName, _, _ string) bool {
			return slices.ContainsFunc(gone, func(p *corev1.Pod) bool { return p.Namespace == namespace && p.Name == podName })
		})
		if err != nil {
			return nil, "", err
		}
	}
	return refused, "", nil
}

// drainFilter is kubectl drain's filters for one pod (filters.go makeFilters): whether
// the pod is removed, and the problem that fails the drain, if any.
func (s *SUC) drainFilter(ctx context.Context, pod *corev1.Pod, args []string) (bool, string, error) {
	finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	force := hasFlag(args, "--force")
	ref := metav1.GetControllerOf(pod)
	if ref != nil && ref.Kind == "DaemonSet" && ref.APIVersion == appsv1.SchemeGroupVersion.String() && !finished {
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &appsv1.DaemonSet{})
		switch {
		case apierrors.IsNotFound(err) && force:
			return true, "", nil
		case err != nil:
			return false, fmt.Sprintf("daemonsets.apps %q not found", ref.Name), client.IgnoreNotFound(err)
		case !hasFlag(args, "--ignore-daemonsets"):
			return false, "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)", nil
		}
		return false, "", nil
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false, "", nil
	}
	if !finished && !hasFlag(args, "--delete-emptydir-data") && slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.EmptyDir != nil }) {
		return false, "Pods with local storage (use --delete-emptydir-data to override)", nil
	}
	if !finished && ref == nil && !force {
		return false, "Pods that declare no controller (use --force to override)", nil
	}
	return true, "", nil
}

// hasFlag says whether a boolean flag is set in args (--flag or --flag=true).
func hasFlag(args []string, flag string) bool {
	return slices.Contains(args, flag) || flagValue(args, flag) == "true"
}
