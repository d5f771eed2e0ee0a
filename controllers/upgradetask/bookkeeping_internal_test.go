package upgradetask

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func TestMachineChangedBeyondBookkeeping(t *testing.T) {
	base := func() *clusterv1.Machine {
		return &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", ResourceVersion: "1",
				Labels:      map[string]string{clusterv1.ClusterNameLabel: "c"},
				Annotations: map[string]string{"a": "b"}},
			Spec: clusterv1.MachineSpec{Version: "v1.35.0"},
			Status: clusterv1.MachineStatus{Conditions: []metav1.Condition{
				{Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready"}}},
		}
	}
	ours := metav1.Condition{Type: inplacev1.InPlaceUpgradeUpToDateCondition, Status: metav1.ConditionFalse, Reason: inplacev1.WaitingReason, Message: "waiting"}
	cases := []struct {
		name   string
		change func(m *clusterv1.Machine)
		passes bool
	}{
		{"nothing but the resourceVersion", func(m *clusterv1.Machine) { m.ResourceVersion = "2" }, false},
		{"the claim label", func(m *clusterv1.Machine) { m.Labels[inplacev1.UpgradeTaskLabel] = "task" }, false},
		{"the release and skip-remediation annotations", func(m *clusterv1.Machine) {
			m.Annotations[inplacev1.UpgradeReleaseAnnotation] = "v1.36.0"
			m.Annotations[clusterv1.MachineSkipRemediationAnnotation] = ""
			m.Annotations[inplacev1.SkipRemediationSetByAnnotation] = "task"
		}, false},
		{"our conditions", func(m *clusterv1.Machine) {
			m.Status.Conditions = append(m.Status.Conditions, ours,
				metav1.Condition{Type: inplacev1.InPlaceUpgradeFailedCondition, Status: metav1.ConditionTrue, Reason: "Failed"})
		}, false},
		{"the only label removed", func(m *clusterv1.Machine) { m.Labels = nil }, true},
		{"another label", func(m *clusterv1.Machine) { m.Labels["x"] = "y" }, true},
		{"another annotation", func(m *clusterv1.Machine) { m.Annotations[clusterv1.UpdateInProgressAnnotation] = "" }, true},
		{"Cluster API's condition", func(m *clusterv1.Machine) { m.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		{"the node reference", func(m *clusterv1.Machine) { m.Status.NodeRef.Name = "node" }, true},
		{"the version", func(m *clusterv1.Machine) { m.Spec.Version = "v1.36.0" }, true},
		{"a deletion", func(m *clusterv1.Machine) { now := metav1.Now(); m.DeletionTimestamp = &now }, true},
		{"our claim and Cluster API's condition together", func(m *clusterv1.Machine) {
			m.Labels[inplacev1.UpgradeTaskLabel] = "task"
			m.Status.Conditions[0].Reason = "Other"
		}, true},
	}
	p := machineChangedBeyondBookkeeping()
	for _, c := range cases {
		old, m := base(), base()
		c.change(m)
		if got := p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: m}); got != c.passes {
			t.Errorf("an update changing %s: passes %v, want %v", c.name, got, c.passes)
		}
		if got := p.Update(event.UpdateEvent{ObjectOld: m, ObjectNew: old}); got != c.passes {
			t.Errorf("the update undoing %s: passes %v, want %v", c.name, got, c.passes)
		}
	}
	if !p.Create(event.CreateEvent{Object: base()}) || !p.Delete(event.DeleteEvent{Object: base()}) {
		t.Errorf("a Machine created or deleted does not pass")
	}
}
