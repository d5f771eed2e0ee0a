package inplacectl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// UpgradeStatus is everything `kubectl inplace status` shows of one Cluster's upgrade.
type UpgradeStatus struct {
	// Namespace and Cluster name the Cluster.
	Namespace, Cluster string
	// Annotations are the Cluster's annotations: the cascade's in-place-upgrade-* keys.
	// Nil when the Cluster could not be read.
	Annotations map[string]string
	// Tasks are the Cluster's UpgradeTasks: per control plane or MachineDeployment, the
	// newest.
	Tasks []inplacev1.UpgradeTask
	// NodeUpdates are the Cluster's NodeUpdates, by name.
	NodeUpdates map[string]inplacev1.NodeUpdate
	// Now is when the objects were read; "running for" counts to it.
	Now time.Time
}

// CollectStatus reads the Cluster, its UpgradeTasks and its NodeUpdates. A missing
// Cluster is an error that says what to do; one that exists without any task is not.
func CollectStatus(ctx context.Context, c client.Client, namespace, cluster string, now time.Time) (*UpgradeStatus, error) {
	st := &UpgradeStatus{Namespace: namespace, Cluster: cluster, Now: now, NodeUpdates: map[string]inplacev1.NodeUpdate{}}
	cl := &clusterv1.Cluster{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: cluster}, cl); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: there is no Cluster %q in namespace %q: `kubectl get clusters -A` lists them; give the right one, with -n for its namespace", ErrClusterNotFound, cluster, namespace)
		}
		return nil, fmt.Errorf("read Cluster %s/%s: %w", namespace, cluster, err)
	}
	st.Annotations = cl.Annotations
	tasks := &inplacev1.UpgradeTaskList{}
	if err := c.List(ctx, tasks, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list UpgradeTasks in %s: %w", namespace, err)
	}
	st.Tasks = newestPerTarget(tasks.Items, cluster)
	nodeUpdates := &inplacev1.NodeUpdateList{}
	if err := c.List(ctx, nodeUpdates, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list NodeUpdates in %s: %w", namespace, err)
	}
	for _, nu := range nodeUpdates.Items {
		if nu.Spec.ClusterName == cluster {
			st.NodeUpdates[nu.Name] = nu
		}
	}
	return st, nil
}

// newestPerTarget keeps the cluster's newest task of each control plane and
// MachineDeployment: older ones were superseded or are history, and would bury the one
// that runs. Control plane first, as the cascade goes.
func newestPerTarget(tasks []inplacev1.UpgradeTask, cluster string) []inplacev1.UpgradeTask {
	newest := map[string]inplacev1.UpgradeTask{}
	for _, t := range tasks {
		if t.Spec.ClusterName != cluster {
			continue
		}
		key := TaskTarget(&t)
		if old, ok := newest[key]; !ok || old.CreationTimestamp.Before(&t.CreationTimestamp) ||
			(old.CreationTimestamp.Equal(&t.CreationTimestamp) && old.Name < t.Name) {
			newest[key] = t
		}
	}
	out := make([]inplacev1.UpgradeTask, 0, len(newest))
	for _, t := range newest {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		ci, cj := out[i].Spec.ControlPlaneRef != nil, out[j].Spec.ControlPlaneRef != nil
		if ci != cj {
			return ci
		}
		return TaskTarget(&out[i]) < TaskTarget(&out[j])
	})
	return out
}

// TaskTarget names what a task upgrades, as Kind/name.
func TaskTarget(t *inplacev1.UpgradeTask) string {
	switch {
	case t.Spec.ControlPlaneRef != nil:
		return t.Spec.ControlPlaneRef.Kind + "/" + t.Spec.ControlPlaneRef.Name
	case t.Spec.MachineDeploymentRef != nil:
		return "MachineDeployment/" + t.Spec.MachineDeploymentRef.Name
	}
	return "-"
}

// PrintStatus writes one screen of a Cluster's upgrade: the cascade's annotations, each
// task with its conditions, each machine in order with its node's current step, and the
// failures with the node's own error.
func PrintStatus(w io.Writer, st *UpgradeStatus) error {
	// What the cluster wrote is shown without the controls a terminal would act on.
	st = CleanCopy(st)
	ew := &errWriter{w: w}
	printCascade(ew, st)
	if len(st.Tasks) == 0 {
		ew.printf("\nNo UpgradeTask for Cluster %s/%s: no in-place upgrade was asked for, or its tasks were deleted.\n", st.Namespace, st.Cluster)
		return ew.err
	}
	for i := range st.Tasks {
		printTask(ew, st, &st.Tasks[i])
	}
	printFailures(ew, st)
	return ew.err
}
