package scenario

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// history builds a watch's history: each value at its offset from t0.
func history(t0 time.Time, changes ...any) []SettingChange {
	var out []SettingChange
	for i := 0; i+2 < len(changes)+1; i += 3 {
		out = append(out, SettingChange{Setting: changes[i].(string), Value: changes[i+1].(string), At: t0.Add(changes[i+2].(time.Duration))})
	}
	return out
}

// The settings must hold from before the first node's work to after the last's: a
// value changed after the first node started, or given back before the last ended, is
// named; values already at what the roll wants (Longhorn's wait above 1800, no
// descheduler) are not.
func TestHeldForNodes(t *testing.T) {
	t0 := time.Now()
	s := time.Second
	first, last := t0.Add(10*s), t0.Add(20*s)
	good := history(t0,
		SettingWorkloadUpdateMethods, `["LiveMigrate"]`, time.Duration(0),
		SettingReplicaReplenishment, "600", time.Duration(0),
		SettingDescheduler, "true", time.Duration(0),
		SettingWorkloadUpdateMethods, "[]", 5*s,
		SettingReplicaReplenishment, "1800", 9*s,
		SettingDescheduler, "false", 9*s,
		SettingWorkloadUpdateMethods, `["LiveMigrate"]`, 21*s,
		SettingReplicaReplenishment, "600", 21*s,
		SettingDescheduler, "true", 21*s,
	)
	if p := heldForNodes(good, first, last); len(p) != 0 {
		t.Errorf("a run that held every setting for the nodes: %q", p)
	}
	already := history(t0,
		SettingWorkloadUpdateMethods, `(unset)`, time.Duration(0),
		SettingReplicaReplenishment, "3600", time.Duration(0),
		SettingDescheduler, "(unset)", time.Duration(0),
		SettingWorkloadUpdateMethods, "[]", 5*s,
	)
	if p := heldForNodes(already, first, last); len(p) != 0 {
		t.Errorf("a cluster whose wait is above 1800 and has no descheduler: %q", p)
	}
	late := history(t0,
		SettingWorkloadUpdateMethods, `["LiveMigrate"]`, time.Duration(0),
		SettingReplicaReplenishment, "600", time.Duration(0),
		SettingDescheduler, "true", time.Duration(0),
		SettingWorkloadUpdateMethods, "[]", 11*s, // after the first node started
		SettingReplicaReplenishment, "1800", 9*s,
		SettingDescheduler, "false", 9*s,
		SettingDescheduler, "true", 15*s, // given back while nodes were upgraded
	)
	p := strings.Join(heldForNodes(late, first, last), "; ")
	for _, want := range []string{SettingWorkloadUpdateMethods + ` was ["LiveMigrate"] when the first node's work started`, SettingDescheduler + " became true at "} {
		if !strings.Contains(p, want) {
			t.Errorf("the problems %q do not say %q", p, want)
		}
	}
	if strings.Contains(p, SettingReplicaReplenishment) {
		t.Errorf("Longhorn's wait held, yet: %q", p)
	}
	if p := heldForNodes(nil, first, last); len(p) != len(RestoredSettings) {
		t.Errorf("an empty history: %q, want each setting named as never read", p)
	}
}

// A story is the value before, the values during in order (each once in a row), and the
// value at the end: restored only when it changed and is back.
func TestStories(t *testing.T) {
	t0 := time.Now()
	h := history(t0,
		SettingReplicaReplenishment, "600", time.Duration(0),
		SettingDescheduler, "true", time.Duration(0),
		SettingMultusFailurePolicy, "(unset)", time.Duration(0),
		SettingReplicaReplenishment, "1800", time.Second,
		SettingDescheduler, "false", time.Second,
		SettingMultusFailurePolicy, "abort", time.Second,
		SettingReplicaReplenishment, "600", 2*time.Second,
	)
	got := map[string]string{}
	for _, st := range stories(h, map[string]string{SettingReplicaReplenishment: "600", SettingDescheduler: "false", SettingMultusFailurePolicy: "abort"}) {
		got[st.Setting] = st.String()
	}
	for setting, want := range map[string]string{
		SettingReplicaReplenishment: SettingReplicaReplenishment + ": before 600, during the run 1800, at the end 600 (restored)",
		SettingDescheduler:          SettingDescheduler + ": before true, during the run false, at the end false (not restored)",
		SettingMultusFailurePolicy:  SettingMultusFailurePolicy + ": before (unset), during the run abort, at the end abort (kept, as the release keeps it)",
	} {
		if got[setting] != want {
			t.Errorf("%s: %q, want %q", setting, got[setting], want)
		}
	}
	if _, ok := got[SettingWorkloadUpdateMethods]; ok {
		t.Errorf("a setting never seen has a story: %v", got)
	}
	if st := (SettingStory{Setting: SettingDescheduler, Before: absent, End: absent}); st.String() != SettingDescheduler+": (unset), not changed" {
		t.Errorf("an unchanged setting: %q", st.String())
	}
	if st := (SettingStory{Setting: SettingDescheduler, Before: absent, During: []string{"false"}, End: "false"}); !strings.HasSuffix(st.String(), "(created by the upgrade)") {
		t.Errorf("a setting the upgrade created: %q", st.String())
	}
	if changedForRoll(SettingDescheduler, absent) || changedForRoll(SettingDescheduler, "false") || !changedForRoll(SettingDescheduler, "true") ||
		changedForRoll(SettingReplicaReplenishment, absent) || !changedForRoll(SettingWorkloadUpdateMethods, absent) {
		t.Error("changedForRoll does not follow what the upgrade changes for the roll")
	}
}

// A setting not back at its value before while the UpgradePlan runs is said to be not
// restored yet, naming the plan and where it stands: the plan gives it back when it ends.
// Once the plan has ended, or without one, it is plainly not restored.
func TestStoryWhileThePlanRuns(t *testing.T) {
	plan := &harvesterv1.UpgradePlan{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "harvester-v1-8-1"},
		Status: harvesterv1.UpgradePlanStatus{Phase: harvesterv1.UpgradePlanNodeUpgrading}}
	if PlanHold(plan) != "" || PlanStanding(plan) != "UpgradePlan demo/harvester-v1-8-1 is in NodeUpgrading" {
		t.Errorf("a plan nothing holds: hold %q, standing %q", PlanHold(plan), PlanStanding(plan))
	}
	held := "node demo-workers-2 failed at OSUpgrade: elemental upgrade failed with return code: 33; to go on: retry the node (...) or end the plan (...), which gives every setting back"
	plan.Status.Conditions = []metav1.Condition{{Type: harvesterv1.UpgradePlanDegraded, Status: metav1.ConditionTrue, Reason: "Held", Message: held}}
	if PlanHold(plan) != held || PlanStanding(plan) != "UpgradePlan demo/harvester-v1-8-1 is held in NodeUpgrading" {
		t.Errorf("a held plan: hold %q, standing %q", PlanHold(plan), PlanStanding(plan))
	}
	st := SettingStory{Setting: SettingWorkloadUpdateMethods, Before: `["LiveMigrate"]`, During: []string{"[]"}, End: "[]", PlanRuns: PlanStanding(plan)}
	if want := SettingWorkloadUpdateMethods + `: before ["LiveMigrate"], during the run [], at the end [] (not restored yet: UpgradePlan demo/harvester-v1-8-1 is held in NodeUpgrading, and gives it back when it ends)`; st.String() != want {
		t.Errorf("while the plan runs:\n got %q\nwant %q", st.String(), want)
	}
	st.End = st.Before
	if !strings.HasSuffix(st.String(), "(restored)") {
		t.Errorf("a setting back while the plan runs: %q", st.String())
	}
	plan.Status.Phase = harvesterv1.UpgradePlanFailed
	if !PlanEnded(plan) || PlanHold(plan) != "" {
		t.Errorf("a failed plan has ended and nothing holds it: ended %t, hold %q", PlanEnded(plan), PlanHold(plan))
	}
}
