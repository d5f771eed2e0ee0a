package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// requestCost is what one kind of request the upgrade of a node makes costs the test API
// server: the kind's requests sent one after another, each to an object of its own, with
// the API server's usage read before and after (apiServerUsage).
type requestCost struct {
	// kind is "VERB resource[/subresource]", as section 3 counts the manager's requests.
	kind string
	// ops is how many requests were sent; wall is how long they took, one after another.
	ops  int
	wall time.Duration
	// usage is what the API server spent on them, and on the watch events they made.
	usage apiServerUsage
}

func (c requestCost) cpuPerOp() time.Duration { return c.usage.per(c.ops).cpu }

func (c requestCost) allocatedPerOp() float64 { return c.usage.per(c.ops).allocated }

func (c requestCost) wallPerOp() time.Duration {
	if c.ops == 0 {
		return 0
	}
	return c.wall / time.Duration(c.ops)
}

// requestCostSettle is how long after a kind's last request the API server's usage is
// read: the watch events of the last requests are decoded and sent by then.
const requestCostSettle = 500 * time.Millisecond

// runRequestCosts measures, on n machines of a cluster as the orchestration creates them
// (their Machines carry the status Cluster API leaves, their Nodes the kubelet's), what
// each kind of request the upgrade of a node makes costs the API server, written as the
// manager writes it (the same patch types and optimistic locks). A watch of each kind is
// open, as the manager's informers and the workload cluster's Node cache are, so that each
// request's cost includes the watch event it makes. Each request is sent from the object
// the previous one returned, so that no read is counted with it.
func runRequestCosts(ctx context.Context, b *bench, n int) ([]requestCost, error) {
	c := b.client
	ns, err := fixtures.Namespace(ctx, c, "bench-cost")
	if err != nil {
		return nil, err
	}
	const clusterName = "bench"
	if err := createCluster(ctx, c, clusterShape{namespace: ns, name: clusterName, machines: n, version: orchFromVersion}); err != nil {
		return nil, err
	}
	defer func() { _ = deleteNodes(ctx, c, ns) }()
	for _, list := range []client.ObjectList{&clusterv1.MachineList{}, &inplacev1.NodeUpdateList{}, &corev1.NodeList{}, &eventsv1.EventList{}} {
		var only client.ListOption = client.InNamespace(ns)
		if _, node := list.(*corev1.NodeList); node {
			only = client.MatchingLabels{nodeSetLabel: ns} // Nodes are cluster-scoped
		}
		w, err := b.watchClient.Watch(ctx, list, only)
		if err != nil {
			return nil, err
		}
		defer w.Stop()
		go func() {
			for range w.ResultChan() { //nolint:revive // drained: the events are what the API server sends
			}
		}()
	}

	machines := make([]*clusterv1.Machine, n)
	nodes := make([]*corev1.Node, n)
	nus := make([]*inplacev1.NodeUpdate, n)
	for i := range n {
		machines[i], nodes[i] = &clusterv1.Machine{}, &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: machineName(i + 1)}, machines[i]); err != nil {
			return nil, err
		}
		if err := c.Get(ctx, client.ObjectKey{Name: fixtures.NodeName(ns, machineName(i+1))}, nodes[i]); err != nil {
			return nil, err
		}
	}
	locked := func(obj client.Object) client.Patch {
		return client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	}
	kinds := []struct {
		kind string
		send func(i int) error
	}{
		// The claim of a machine (writeMachine): its label, with the resourceVersion read.
		{"PATCH machines", func(i int) error {
			patch := locked(machines[i])
			machines[i].Labels[inplacev1.UpgradeTaskLabel] = "workers-v1.36.0"
			return c.Patch(ctx, machines[i], patch)
		}},
		// Its InPlaceUpgradeUpToDate condition (writeMachine).
		{"PATCH machines/status", func(i int) error {
			patch := locked(machines[i])
			meta.SetStatusCondition(&machines[i].Status.Conditions, metav1.Condition{Type: inplacev1.InPlaceUpgradeUpToDateCondition,
				Status: metav1.ConditionFalse, Reason: inplacev1.WaitingReason, Message: "waits for its turn in UpgradeTask workers-v1.36.0"})
			return c.Status().Patch(ctx, machines[i], patch)
		}},
		// Its NodeUpdate, as startNodeUpdate creates it.
		{"POST nodeupdates", func(i int) error {
			nus[i] = &inplacev1.NodeUpdate{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workers-v1.36.0-" + machineName(i+1),
					Labels:      map[string]string{inplacev1.UpgradeTaskLabel: "workers-v1.36.0", inplacev1.ClusterNameLabel: clusterName},
					Annotations: map[string]string{disruption.TargetAnnotation: "MachineDeployment/workers", disruption.MaxUnavailableAnnotation: strconv.Itoa(1)},
					Finalizers:  []string{inplacev1.NodeUpdateFinalizer}},
				Spec: inplacev1.NodeUpdateSpec{ClusterName: clusterName, MachineName: machineName(i + 1), NodeName: nodes[i].Name, Version: orchToVersion,
					UpdaterRef: inplacev1.UpdaterReference{Kind: "ConfigMap", Name: benchUpdaterName}, Phase: inplacev1.TaskActionOngoing},
			}
			return c.Create(ctx, nus[i])
		}},
		// Its end, as the NodeUpdate reconciler patches it (writeStatus: no lock).
		{"PATCH nodeupdates/status", func(i int) error {
			patch := client.MergeFrom(nus[i].DeepCopy())
			now := metav1.Now()
			nus[i].Status.Phase, nus[i].Status.StartTime, nus[i].Status.ObservedGeneration = inplacev1.NodeUpdatePhaseSucceeded, &now, nus[i].Generation
			return c.Status().Patch(ctx, nus[i], patch)
		}},
		// A read of it from the API server (section 3's reads).
		{"GET nodeupdates", func(i int) error {
			return c.Get(ctx, client.ObjectKeyFromObject(nus[i]), &inplacev1.NodeUpdate{})
		}},
		// An event of the task about the machine (events.k8s.io, as the manager's recorder).
		{"POST events", func(i int) error {
			now := metav1.NewMicroTime(time.Now())
			return c.Create(ctx, &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("workers-v1.36.0.%d", i)},
				EventTime:  now, ReportingController: "capi-inplace", ReportingInstance: "capi-inplace-bench",
				Action: "Start", Reason: inplacev1.NodeStartedReason, Type: corev1.EventTypeNormal,
				Regarding: corev1.ObjectReference{Kind: "UpgradeTask", Namespace: ns, Name: "workers-v1.36.0"},
				Related:   &corev1.ObjectReference{Kind: "Machine", Namespace: ns, Name: machineName(i + 1)},
				Note:      fmt.Sprintf("started the in-place upgrade of machine %s (node %s) to %s", machineName(i+1), nodes[i].Name, orchToVersion),
			})
		}},
		// The upgrade-pending taint of its Node (the taint writer, on the workload cluster).
		{"PATCH nodes", func(i int) error {
			patch := locked(nodes[i])
			nodes[i].Spec.Taints = append(nodes[i].Spec.Taints, corev1.Taint{Key: inplacev1.UpgradePendingTaint, Value: ns + ".workers-v1.36.0", Effect: corev1.TaintEffectPreferNoSchedule})
			return c.Patch(ctx, nodes[i], patch)
		}},
	}
	var out []requestCost
	for _, k := range kinds {
		before, err := readAPIServerUsage(ctx, b)
		if err != nil {
			return out, err
		}
		start := time.Now()
		for i := range n {
			if err := k.send(i); err != nil {
				return out, fmt.Errorf("%s %d: %w", k.kind, i, err)
			}
		}
		wall := time.Since(start)
		sleep(ctx, requestCostSettle)
		after, err := readAPIServerUsage(ctx, b)
		if err != nil {
			return out, err
		}
		out = append(out, requestCost{kind: k.kind, ops: n, wall: wall, usage: after.since(before)})
	}
	return out, nil
}
