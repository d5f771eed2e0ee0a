package upgradetask

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// machineChangedBeyondBookkeeping passes every event of a Machine but an update that
// changed nothing but the bookkeeping the UpgradeTask controller writes itself (its claim
// label, release and skip-remediation annotations, and its two conditions). Each node
// upgraded is about five such writes; a reconcile they woke would read the whole Cluster
// again to find what the writer already knew (it reads its own writes through
// writtenMachines), and the success of a node arriving meanwhile would wait for it
// (issue #55: half the reconciles of a 500-machine task). A change of anything else in
// the same update (Cluster API's own conditions, the node reference, a deletion) passes.
func machineChangedBeyondBookkeeping() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, ok1 := e.ObjectOld.(*clusterv1.Machine)
			m, ok2 := e.ObjectNew.(*clusterv1.Machine)
			if !ok1 || !ok2 {
				return true
			}
			return !equality.Semantic.DeepEqual(withoutBookkeeping(old), withoutBookkeeping(m))
		},
	}
}

// withoutBookkeeping is a shallow copy of m without what the UpgradeTask controller
// writes, nor what every write changes (resourceVersion, managed fields). It shares the
// rest with m: it is only compared.
func withoutBookkeeping(m *clusterv1.Machine) *clusterv1.Machine {
	c := *m
	c.ResourceVersion = ""
	c.ManagedFields = nil
	c.Labels = without(m.Labels, inplacev1.UpgradeTaskLabel)
	c.Annotations = without(m.Annotations, inplacev1.UpgradeReleaseAnnotation, clusterv1.MachineSkipRemediationAnnotation, inplacev1.SkipRemediationSetByAnnotation)
	c.Status.Conditions = slices.DeleteFunc(slices.Clone(m.Status.Conditions), func(cond metav1.Condition) bool {
		return cond.Type == inplacev1.InPlaceUpgradeUpToDateCondition || cond.Type == inplacev1.InPlaceUpgradeFailedCondition
	})
	return &c
}

// without is a copy of m without keys; nil when nothing is left, so that an empty map
// and none compare equal.
func without(m map[string]string, keys ...string) map[string]string {
	out := maps.Clone(m)
	for _, k := range keys {
		delete(out, k)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// notCreateEvents passes every event of a task's NodeUpdate but its creation: the task's
// own reconcile created it (nothing else creates a NodeUpdate a task owns) and counts it
// already (createdNodeUpdates), so a reconcile woken by it finds nothing new, and the
// success of a node arriving meanwhile would wait for it (issue #55). On a manager's start
// every task is reconciled by its own creation event.
func notCreateEvents() predicate.Predicate {
	return predicate.Funcs{CreateFunc: func(event.CreateEvent) bool { return false }}
}
