package disruption

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func machine(name string, controlPlane bool) clusterv1.Machine {
	m := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if controlPlane {
		m.Labels[clusterv1.MachineControlPlaneLabel] = ""
	}
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-" + name}
	return m
}

func node(name string, ready bool, edit func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
	if edit != nil {
		edit(n)
	}
	return n
}

func TestCompute(t *testing.T) {
	now := metav1.Now()
	deleting := machine("deleting", false)
	deleting.DeletionTimestamp = &now
	deleting.Finalizers = []string{"x"}
	noNode := machine("no-node", false)
	noNode.Status.NodeRef = clusterv1.MachineNodeReference{}

	machines := []clusterv1.Machine{
		machine("cp-1", true), machine("cp-2", true), machine("cp-3", true),
		machine("ready", false), machine("notready", false), machine("cordoned", false),
		machine("maintenance", false), machine("upgrading", false), machine("done", false),
		deleting, noNode, machine("missing-node", false),
	}
	nodes := map[string]*corev1.Node{}
	for _, m := range machines {
		nodes[m.Status.NodeRef.Name] = node(m.Status.NodeRef.Name, true, nil)
	}
	delete(nodes, "node-missing-node")
	nodes["node-notready"] = node("node-notready", false, nil)
	nodes["node-cordoned"] = node("node-cordoned", true, func(n *corev1.Node) { n.Spec.Unschedulable = true })
	nodes["node-maintenance"] = node("node-maintenance", true, func(n *corev1.Node) {
		n.Annotations = map[string]string{HarvesterMaintainStatusAnnotation: "running"}
	})
	nus := []inplacev1.NodeUpdate{
		{ObjectMeta: metav1.ObjectMeta{Name: "nu-upgrading"}, Spec: inplacev1.NodeUpdateSpec{MachineName: "upgrading", NodeName: "node-upgrading"},
			Status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nu-done"}, Spec: inplacev1.NodeUpdateSpec{MachineName: "done", NodeName: "node-done"},
			Status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseSucceeded}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nu-cp-2"}, Spec: inplacev1.NodeUpdateSpec{MachineName: "cp-2", NodeName: "node-cp-2"},
			Status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhasePending}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nu-gone"}, Spec: inplacev1.NodeUpdateSpec{MachineName: "gone", NodeName: "node-gone"},
			Status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress}},
	}
	b := Compute(machines, nodes, nus)

	want := map[string]string{
		"notready":     "node not Ready",
		"cordoned":     "node cordoned",
		"maintenance":  "node in Harvester maintenance mode (running)",
		"upgrading":    "being upgraded by NodeUpdate nu-upgrading",
		"cp-2":         "being upgraded by NodeUpdate nu-cp-2",
		"deleting":     "machine being deleted",
		"no-node":      "machine has no node",
		"missing-node": "node not found",
		"gone":         "being upgraded by NodeUpdate nu-gone",
	}
	for _, m := range append(machines, machine("gone", false)) {
		why, ok := b.Disrupted(m.Name)
		if want[m.Name] == "" {
			if ok {
				t.Errorf("%s: disrupted (%s), want not disrupted", m.Name, why)
			}
			continue
		}
		if !ok || why != want[m.Name] {
			t.Errorf("%s: disrupted=%v %q, want %q", m.Name, ok, why, want[m.Name])
		}
	}
	if got := b.LiveNodeUpdate("done"); got != nil {
		t.Errorf("a NodeUpdate that ended is not live, got %s", got.Name)
	}
	if got := b.LiveNodeUpdate("cp-2"); got == nil || got.Name != "nu-cp-2" {
		t.Errorf("live NodeUpdate of cp-2: %v", got)
	}
	if got := b.DisruptedControlPlane(); len(got) != 1 || got[0] != "node-cp-2 (being upgraded by NodeUpdate nu-cp-2)" {
		t.Errorf("disrupted control plane: %v", got)
	}
	if got := b.DisruptedControlPlane("cp-2"); len(got) != 0 {
		t.Errorf("disrupted control plane except cp-2: %v", got)
	}
	got := b.DisruptedNodes("upgrading")
	wantNodes := []string{"machine no-node", "node-cordoned", "node-cp-2", "node-deleting", "node-gone", "node-maintenance", "node-missing-node", "node-notready"}
	if len(got) != len(wantNodes) {
		t.Fatalf("disrupted nodes: %v, want %v", got, wantNodes)
	}
	for i := range got {
		if got[i] != wantNodes[i] {
			t.Errorf("disrupted nodes: %v, want %v", got, wantNodes)
			break
		}
	}
}
