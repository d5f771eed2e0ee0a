package extension

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// HookReasonFailClosed: the Cluster is fail-closed and the change would make Cluster API
// replace machines.
const HookReasonFailClosed = "FailClosed"

// EventReasonInPlaceRefused is the reason of the Warning event a fail-closed Cluster gets
// when a CanUpdate hook refuses a change.
const EventReasonInPlaceRefused = "InPlaceRefused"

// FailClosed reports whether the Cluster asks never to have its machines replaced for a
// change capi-inplace cannot do in place (inplacev1.FailClosedAnnotation "true").
//
// The policy is an annotation on the Cluster rather than a field of the updater's
// configuration: it is a decision about one cluster's machines (a Harvester node replaced
// loses its local disks and VMs), whichever updater kind serves it, and the Cluster is the
// object the CanUpdate hooks already read from the cache.
func FailClosed(cluster *clusterv1.Cluster) bool {
	return strings.EqualFold(strings.TrimSpace(cluster.Annotations[inplacev1.FailClosedAnnotation]), "true")
}

// failClosedError is the Failure a fail-closed Cluster's CanUpdate hook answers: what
// capi-inplace could not cover, why, what Cluster API does with the Failure, and the two
// ways out.
func failClosedError(cluster *clusterv1.Cluster, in canUpdateInput, why string, left []string) error {
	return failuref("Cluster %s/%s is fail-closed (%s=true): %s %s/%s cannot be updated in place, and Cluster API would replace its machines. Not covered: %s (%s). "+
		"Cluster API stops this rollout and asks again with back-off; revert the change, or remove the annotation to let Cluster API replace the machines",
		cluster.Namespace, cluster.Name, inplacev1.FailClosedAnnotation, in.object, in.namespace, in.name, strings.Join(left, ", "), why)
}

// recordRefusal shows a fail-closed refusal on the Cluster as a Warning event. The
// recorder is asynchronous and aggregates repeats, so the hot hook does not wait on it.
func (h *InPlaceHooks) recordRefusal(cluster *clusterv1.Cluster, hook, message string) {
	if h.Recorder == nil {
		return
	}
	h.Recorder.Eventf(cluster, nil, corev1.EventTypeWarning, EventReasonInPlaceRefused, hook, "%s", message)
}

// remainingAfter is what Cluster API would still see differ after the answer's patches.
func remainingAfter(in canUpdateInput, current, desired objectDoc, docs map[string]objectDoc, bootstrap, infra [2]namedRaw, patches canUpdatePatches) ([]string, error) {
	left, err := remainingMachineSpec(current, desired, patches.machine, in.object, in.prefix)
	if err != nil {
		return nil, err
	}
	for _, o := range []struct {
		kind  string
		pair  [2]namedRaw
		patch runtimehooksv1.Patch
	}{
		{"bootstrap config", bootstrap, patches.bootstrap},
		{"infrastructure machine", infra, patches.infrastructure},
	} {
		more, err := remainingObject(docs[o.pair[0].field], docs[o.pair[1].field], o.patch, o.kind, in.prefix)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.pair[0].field, err)
		}
		left = append(left, more...)
	}
	return left, nil
}
