package upgradetask

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// TestMachineMessageNamesBlockedDrain: the task's machine message carries the NodeUpdate's
// DrainBlocked condition while it is True, and the step alone otherwise.
func TestMachineMessageNamesBlockedDrain(t *testing.T) {
	nu := &inplacev1.NodeUpdate{Status: inplacev1.NodeUpdateStatus{Phase: inplacev1.NodeUpdatePhaseInProgress, CurrentStep: "Drain"}}
	if state, msg := stateFromNodeUpdate(nu); state != inplacev1.MachineStateInProgress || msg != "step Drain" {
		t.Fatalf("not blocked: got %s %q", state, msg)
	}
	blocked := "the drain of node n2 is blocked by pod ns/web (PodDisruptionBudget web); drainPolicy Evict: ..."
	nu.Status.Conditions = []metav1.Condition{{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue, Reason: inplacev1.EvictionPendingReason, Message: blocked}}
	if _, msg := stateFromNodeUpdate(nu); msg != "step Drain: "+blocked {
		t.Fatalf("blocked: got %q", msg)
	}
	nu.Status.Conditions[0].Status = metav1.ConditionFalse
	if _, msg := stateFromNodeUpdate(nu); msg != "step Drain" {
		t.Fatalf("no longer blocked: got %q", msg)
	}
}

// TestClusterDrainPolicy reads the Cluster's drain-policy annotation.
func TestClusterDrainPolicy(t *testing.T) {
	task := &inplacev1.UpgradeTask{}
	if p, problem := drainPolicy(task, nil); p != nil || problem != "" {
		t.Fatalf("no Cluster: got %v %q", p, problem)
	}
	for _, tc := range []struct{ value, mode, problem string }{
		{`{"mode":"Evict","gracePeriod":"1m"}`, "Evict", ""},
		{`{}`, "Hold", ""},
		{`{"mode":"Skip","gracePeriod":"5m"}`, "Skip", ""},
		{`{"mode":"evict"}`, "", `mode "evict" is not Hold, Skip or Evict`},
		{`{"mode":"Evict","gracePeriod":"0s"}`, "", "gracePeriod must be more than 0s"},
		{`{"mode":"Evict","grace":"1m"}`, "", `unknown field "grace"`},
		{`Evict`, "", "invalid character"},
	} {
		c := clusterWithAnnotation(tc.value)
		p, problem := drainPolicy(task, c)
		switch {
		case tc.problem == "" && (problem != "" || p == nil || string(p.Mode) != tc.mode):
			t.Errorf("%s: got %v %q, want mode %s", tc.value, p, problem, tc.mode)
		case tc.problem != "" && (p != nil || !contains(problem, tc.problem) || !contains(problem, inplacev1.DrainPolicyAnnotation)):
			t.Errorf("%s: got %v %q, want a problem with %q", tc.value, p, problem, tc.problem)
		}
	}
}

func clusterWithAnnotation(v string) *clusterv1.Cluster {
	return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "harvester", Annotations: map[string]string{inplacev1.DrainPolicyAnnotation: v}}}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
