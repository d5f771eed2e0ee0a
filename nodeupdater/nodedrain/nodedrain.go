// Package nodedrain cordons and drains a node of a workload cluster for an updater, the
// way `kubectl drain` does (k8s.io/kubectl/pkg/drain, which this module does not depend
// on): the node is cordoned, each pod is asked to leave through the Eviction API so
// that PodDisruptionBudgets are honoured, DaemonSet and mirror pods stay, and pods kubectl
// would refuse to delete by default (emptyDir data, no controller) are refused here too.
// It never blocks: Evict asks once and reports where the drain stands, and the updater
// calls it again on its next reconcile.
//
// A cordon is recorded as the NodeUpdate's own (CordonedByAnnotation), so that an
// updater lifts only a cordon it set, as the Harvester updater does with its own
// annotation (harvesteradapter/cordon.go).
//
// ApplyPolicy is the task's drain policy (Hold, Skip, Evict) over a blocked drain, for
// every updater that drains: the KubeadmUpdater's drain here, the Harvester updater's
// drain Plan and VM evacuation.
package nodedrain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// CordonedByAnnotation is set on a node an updater cordoned, to the UID of the NodeUpdate
// that cordoned it. Only that NodeUpdate lifts the cordon; a cordon without it is someone
// else's and is never undone.
const CordonedByAnnotation = inplacev1.AnnotationPrefix + "cordoned-by"

// mirrorPodAnnotation marks a static pod's mirror in the API server (kubelet
// pkg/kubelet/types): evicting it does nothing, the kubelet owns the pod.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// Cordon cordons node and records the cordon as owner's, unless it is owner's already.
// A node cordoned by someone else is not taken: held says so. The write carries the
// node's resourceVersion, so a cordon set meanwhile by someone else is never taken over
// as ours; a conflict (the kubelet writes the node all the time) is read again.
func Cordon(ctx context.Context, c client.Client, node string, owner types.UID) (held string, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		held = ""
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return err
		}
		if n.Annotations[CordonedByAnnotation] == string(owner) {
			return nil
		}
		if n.Spec.Unschedulable {
			held = fmt.Sprintf("holding: node %s is cordoned by someone else; uncordon it to let it be upgraded", node)
			return nil
		}
		patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[CordonedByAnnotation] = string(owner)
		n.Spec.Unschedulable = true
		return c.Patch(ctx, n, patch)
	})
	if err != nil {
		return "", fmt.Errorf("cordon node %s: %w", node, err)
	}
	return held, nil
}

// CordonedBy reports whether node's cordon is owner's.
func CordonedBy(n *corev1.Node, owner types.UID) bool {
	return n.Annotations[CordonedByAnnotation] == string(owner)
}

// UncordonIfOurs lifts node's cordon and removes its record when owner set it, and says
// whether it did. A cordon someone else set stays; a node that is gone has nothing to
// restore.
func UncordonIfOurs(ctx context.Context, c client.Client, node string, owner types.UID) (bool, error) {
	ours := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ours = false
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !CordonedBy(n, owner) {
			return nil
		}
		patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
		delete(n.Annotations, CordonedByAnnotation)
		n.Spec.Unschedulable = false
		if err := c.Patch(ctx, n, patch); err != nil {
			return err
		}
		ours = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("uncordon node %s: %w", node, err)
	}
	return ours, nil
}

// Options are kubectl drain's options that an updater offers.
type Options struct {
	// GracePeriod, when set, overrides each pod's terminationGracePeriodSeconds.
	GracePeriod *time.Duration
	// IgnoreDaemonSets leaves DaemonSet pods; without it a node with one is refused.
	IgnoreDaemonSets bool
	// DeleteEmptyDirData evicts pods with emptyDir volumes; without it they are refused.
	DeleteEmptyDirData bool
}

// Progress is where a drain stands after one Evict.
type Progress struct {
	// Leaving are the pods (namespace/name) asked to leave that are not gone yet.
	Leaving []string
	// Blocked are the pods the Eviction API refused to evict now, each with the API
	// server's reason (a PodDisruptionBudget that allows no disruption).
	Blocked []string
	// BlockedPods are the same pods, for a drain policy to act on.
	BlockedPods []BlockedPod
}

// BlockedPod is a pod whose eviction the API server refused now.
type BlockedPod struct {
	Namespace, Name string
	// Labels are the pod's labels.
	Labels map[string]string
	// Reason is what the API server said.
	Reason string
}

// Drained reports whether no pod that must leave is left.
func (p Progress) Drained() bool { return len(p.Leaving) == 0 && len(p.Blocked) == 0 }

// RefusedError names the pods that the drain will not evict with its options, as kubectl
// drain refuses them: waiting does not mend it, the operator does.
type RefusedError struct {
	// Pods are the refused pods, each with why.
	Pods []string
}

func (e *RefusedError) Error() string {
	return "pods that cannot be drained with the drain options: " + strings.Join(e.Pods, "; ")
}

// Evict asks every pod of node that must leave to leave, once, through the Eviction API,
// and reports what is still there. Pods already terminating are waited for; a pod that a
// PodDisruptionBudget keeps now (429 TooManyRequests) is Blocked and asked again on the
// next call. DaemonSet pods (with IgnoreDaemonSets), mirror pods and finished pods are
// left. A pod that kubectl drain would refuse with these options is a *RefusedError.
func Evict(ctx context.Context, c client.Client, node string, opts Options) (Progress, error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return Progress{}, fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	var refused []string
	var leave []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if why := refusal(p, opts); why != "" {
			refused = append(refused, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, why))
			continue
		}
		if stays(p, opts) {
			continue
		}
		leave = append(leave, p)
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		return Progress{}, &RefusedError{Pods: refused}
	}
	var progress Progress
	for _, p := range leave {
		name := p.Namespace + "/" + p.Name
		if !p.DeletionTimestamp.IsZero() {
			progress.Leaving = append(progress.Leaving, name)
			continue
		}
		eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		if opts.GracePeriod != nil {
			eviction.DeleteOptions = &metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(opts.GracePeriod.Seconds()))}
		}
		err := c.SubResource("eviction").Create(ctx, p, eviction)
		switch {
		case err == nil:
			progress.Leaving = append(progress.Leaving, name)
		case apierrors.IsNotFound(err):
			// gone meanwhile
		case apierrors.IsTooManyRequests(err):
			reason := apiMessage(err)
			progress.Blocked = append(progress.Blocked, fmt.Sprintf("%s (%s)", name, reason))
			progress.BlockedPods = append(progress.BlockedPods, BlockedPod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Reason: reason})
		default:
			return Progress{}, fmt.Errorf("evict pod %s of node %s: %w", name, node, err)
		}
	}
	return progress, nil
}

// Preview tells, without acting, which pods of node the drain could not empty now: those
// kubectl drain would refuse with these options (Evict's RefusedError), and those whose
// eviction the API server refuses now, asked with dryRun=All, so the API server judges
// their PodDisruptionBudgets with its own eviction code and evicts nothing. Pods already
// leaving, and those that stay (DaemonSet, mirror, finished), are not named.
func Preview(ctx context.Context, c client.Client, node string, opts Options) ([]inplacev1.PreviewPod, error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	var out []inplacev1.PreviewPod
	for i := range pods.Items {
		p := &pods.Items[i]
		if why := refusal(p, opts); why != "" {
			out = append(out, inplacev1.PreviewPod{Namespace: p.Namespace, Name: p.Name, Reason: "the drain refuses it: " + why})
			continue
		}
		if stays(p, opts) || !p.DeletionTimestamp.IsZero() {
			continue
		}
		eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
			DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}}
		err := c.SubResource("eviction").Create(ctx, p, eviction, client.DryRunAll)
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			out = append(out, inplacev1.PreviewPod{Namespace: p.Namespace, Name: p.Name, Reason: apiMessage(err)})
		default:
			return nil, fmt.Errorf("ask, as a dry run, for the eviction of pod %s/%s of node %s: %w", p.Namespace, p.Name, node, err)
		}
	}
	return out, nil
}

// refusal is why kubectl drain, with these options, would not delete p: a DaemonSet pod
// without IgnoreDaemonSets, a pod with emptyDir data without DeleteEmptyDirData, a pod
// without a controller (nothing would recreate it; kubectl needs --force). Mirror and
// finished pods are never refused.
func refusal(p *corev1.Pod, opts Options) string {
	if isMirror(p) || finished(p) || !p.DeletionTimestamp.IsZero() {
		return ""
	}
	owner := metav1.GetControllerOf(p)
	switch {
	case owner != nil && owner.Kind == "DaemonSet":
		if !opts.IgnoreDaemonSets {
			return "a DaemonSet pod; set drain.ignoreDaemonSets"
		}
		return ""
	case owner == nil:
		return "no controller would recreate it; delete it or give it one"
	}
	if !opts.DeleteEmptyDirData {
		for _, v := range p.Spec.Volumes {
			if v.EmptyDir != nil {
				return fmt.Sprintf("emptyDir volume %s would lose its data; set drain.deleteEmptyDirData", v.Name)
			}
		}
	}
	return ""
}

// stays reports whether p stays on the node: a mirror pod, a DaemonSet pod (ignored), or
// a finished pod (it holds nothing; kubectl deletes it, which changes nothing here).
func stays(p *corev1.Pod, opts Options) bool {
	if isMirror(p) || finished(p) {
		return true
	}
	owner := metav1.GetControllerOf(p)
	return owner != nil && owner.Kind == "DaemonSet" && opts.IgnoreDaemonSets
}

func isMirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[mirrorPodAnnotation]
	return ok
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// apiMessage is what the API server said, with the causes it gives: for an eviction a
// budget refuses, which budget and how many healthy pods it needs
// (pkg/registry/core/pod/storage/eviction.go).
func apiMessage(err error) string {
	var s apierrors.APIStatus
	if !errors.As(err, &s) || s.Status().Message == "" {
		return err.Error()
	}
	msg := strings.TrimSuffix(s.Status().Message, ".")
	if d := s.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Message != "" {
				msg += ": " + strings.TrimSuffix(c.Message, ".")
			}
		}
	}
	return msg
}
