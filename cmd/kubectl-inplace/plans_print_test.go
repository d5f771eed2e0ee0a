package main

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// An UpgradePlan's message is the cluster's words: an escape sequence in it (here one
// that clears the screen and one that sets the terminal's title) is not printed.
func TestPrintPlansStripsEscapes(t *testing.T) {
	msg := "node n1 failed\x1b[2J\x1b]0;owned\x07: see its NodeUpdate"
	plans := []harvesterv1.UpgradePlan{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "held\x1b[31m"},
			Spec:       harvesterv1.UpgradePlanSpec{Version: "v1.8.1"},
			Status: harvesterv1.UpgradePlanStatus{Phase: harvesterv1.UpgradePlanNodeUpgrading,
				Conditions: []metav1.Condition{{Type: harvesterv1.UpgradePlanDegraded, Status: metav1.ConditionTrue, Message: msg}}},
		},
		{ObjectMeta: metav1.ObjectMeta{Name: "failed"}, Status: harvesterv1.UpgradePlanStatus{Phase: harvesterv1.UpgradePlanFailed, Message: msg}},
	}
	var buf bytes.Buffer
	printPlans(&buf, plans)
	out := buf.String()
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("the output holds an escape sequence: %q", out)
	}
	for _, want := range []string{"UpgradePlan held: Harvester v1.8.1", "held in NodeUpgrading: node n1 failed: see its NodeUpdate", "failed: node n1 failed: see its NodeUpdate"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if plans[1].Status.Message != msg {
		t.Error("printPlans changed the plans it was given")
	}
}
