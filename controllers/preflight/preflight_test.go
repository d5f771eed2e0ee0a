package preflight

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

func TestResolveMaxUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value *intstr.IntOrString
		total int
		want  int
	}{
		{"unset is one", nil, 5, 1},
		{"a number", ptr.To(intstr.FromInt32(2)), 5, 2},
		{"a number above the total", ptr.To(intstr.FromInt32(9)), 3, 9},
		{"a percentage rounds down", ptr.To(intstr.FromString("50%")), 5, 2},
		{"a small percentage is at least one", ptr.To(intstr.FromString("10%")), 3, 1},
		{"all", ptr.To(intstr.FromString("100%")), 4, 4},
		{"no machines", ptr.To(intstr.FromString("25%")), 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveMaxUnavailable(tc.value, tc.total)
			if err != nil || got != tc.want {
				t.Fatalf("ResolveMaxUnavailable(%v, %d) = %d, %v; want %d", tc.value, tc.total, got, err, tc.want)
			}
		})
	}
	if _, err := ResolveMaxUnavailable(ptr.To(intstr.FromString("many")), 3); err == nil {
		t.Fatal("a malformed maxUnavailable must be an error")
	}
}

func TestWindowOpen(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	nightly := &inplacev1.MaintenanceWindow{TimeZone: "Europe/Berlin", Start: "22:00", End: "04:00"}
	weekend := &inplacev1.MaintenanceWindow{TimeZone: "UTC", Days: []inplacev1.Weekday{"Saturday", "Sunday"}, Start: "08:00", End: "12:00"}
	saturdayNight := &inplacev1.MaintenanceWindow{TimeZone: "Europe/Berlin", Days: []inplacev1.Weekday{"Saturday"}, Start: "22:00", End: "04:00"}
	for _, tc := range []struct {
		name     string
		window   *inplacev1.MaintenanceWindow
		now      time.Time
		open     bool
		nextOpen time.Time
	}{
		{"before a nightly window", nightly, time.Date(2026, 11, 18, 21, 59, 0, 0, berlin), false, time.Date(2026, 11, 18, 22, 0, 0, 0, berlin)},
		{"at its start", nightly, time.Date(2026, 11, 18, 22, 0, 0, 0, berlin), true, time.Time{}},
		{"past midnight", nightly, time.Date(2026, 11, 19, 3, 59, 0, 0, berlin), true, time.Time{}},
		{"at its end", nightly, time.Date(2026, 11, 19, 4, 0, 0, 0, berlin), false, time.Date(2026, 11, 19, 22, 0, 0, 0, berlin)},
		{"the time zone counts, not UTC", nightly, time.Date(2026, 11, 18, 21, 30, 0, 0, time.UTC), true, time.Time{}},
		{"weekend window on a Friday", weekend, time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC), false, time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)},
		{"weekend window on Sunday", weekend, time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC), true, time.Time{}},
		{"weekend window after it on Sunday", weekend, time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC), false, time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)},
		{"a day names the opening day: Sunday 01:00 is in Saturday's window", saturdayNight, time.Date(2026, 11, 22, 1, 0, 0, 0, berlin), true, time.Time{}},
		{"but Sunday 23:00 is not", saturdayNight, time.Date(2026, 11, 22, 23, 0, 0, 0, berlin), false, time.Date(2026, 11, 28, 22, 0, 0, 0, berlin)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, next, err := WindowOpen(tc.window, tc.now)
			if err != nil {
				t.Fatal(err)
			}
			if open != tc.open || !next.Equal(tc.nextOpen) {
				t.Fatalf("WindowOpen at %s = %v, next %s; want %v, next %s", tc.now, open, next, tc.open, tc.nextOpen)
			}
		})
	}
	if _, _, err := WindowOpen(&inplacev1.MaintenanceWindow{TimeZone: "Mars/Olympus", Start: "01:00", End: "02:00"}, time.Now()); err == nil {
		t.Fatal("an unknown time zone must be an error")
	}
}

func TestGates(t *testing.T) {
	now := time.Date(2026, 11, 18, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		spec       inplacev1.UpgradeTaskSpec
		last       time.Time
		open       bool
		reason     string
		retryAfter time.Duration
	}{
		{"nothing set", inplacev1.UpgradeTaskSpec{}, time.Time{}, true, "", 0},
		{"paused", inplacev1.UpgradeTaskSpec{Paused: true}, time.Time{}, false, inplacev1.PausedByUserReason, 0},
		{"paused wins over the window", inplacev1.UpgradeTaskSpec{Paused: true, Window: &inplacev1.MaintenanceWindow{Start: "01:00", End: "02:00"}}, time.Time{}, false, inplacev1.PausedByUserReason, 0},
		{"outside the window", inplacev1.UpgradeTaskSpec{Window: &inplacev1.MaintenanceWindow{Start: "13:00", End: "14:00"}}, time.Time{}, false, inplacev1.OutsideWindowReason, time.Hour},
		{"soaking", inplacev1.UpgradeTaskSpec{PostNodeDelay: &metav1.Duration{Duration: 10 * time.Minute}}, now.Add(-4 * time.Minute), false, inplacev1.SoakingReason, 6 * time.Minute},
		{"soaked", inplacev1.UpgradeTaskSpec{PostNodeDelay: &metav1.Duration{Duration: 10 * time.Minute}}, now.Add(-10 * time.Minute), true, "", 0},
		{"no node ended yet", inplacev1.UpgradeTaskSpec{PostNodeDelay: &metav1.Duration{Duration: 10 * time.Minute}}, time.Time{}, true, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			got := Gates(GateInput{Spec: &spec, Now: now, LastNodeCompletion: tc.last})
			if got.Open != tc.open || got.Reason != tc.reason || got.RetryAfter != tc.retryAfter {
				t.Fatalf("Gates = %+v; want open %v, reason %q, retry after %s", got, tc.open, tc.reason, tc.retryAfter)
			}
		})
	}
}

func readyNode(name string, ready bool) *corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}}}
}

func machine(name, node string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
	m.Status.NodeRef.Name = node
	return m
}

type stubUpdater struct{ results []nodeupdater.CheckResult }

func (stubUpdater) Reconcile(context.Context, *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	return nodeupdater.Result{}, nil
}
func (stubUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) { return true, nil }
func (s stubUpdater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return s.results
}

func TestChecks(t *testing.T) {
	deleting := metav1.NewTime(time.Now())
	healthyCP := []MachineNode{
		{Machine: machine("cp-1", "n1"), Node: readyNode("n1", true)},
		{Machine: machine("cp-2", "n2"), Node: readyNode("n2", true)},
		{Machine: machine("cp-3", "n3"), Node: readyNode("n3", true)},
	}
	withCP := func(mutate func([]MachineNode)) []MachineNode {
		out := make([]MachineNode, len(healthyCP))
		for i, m := range healthyCP {
			out[i] = MachineNode{Machine: m.Machine.DeepCopy(), Node: m.Node.DeepCopy()}
		}
		mutate(out)
		return out
	}
	registry := nodeupdater.NewRegistry()
	if err := registry.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Group: "example.com", Kind: "Holding"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater: stubUpdater{results: []nodeupdater.CheckResult{
			{Name: "VolumesHealthy", Passed: true},
			{Name: "LastReplica", Passed: false, Message: "volume pvc-1 has its only healthy replica on n1"},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	candidate := MachineNode{Machine: machine("m1", "n1"), Node: readyNode("n1", true)}

	for _, tc := range []struct {
		name      string
		check     Check
		in        Input
		candidate MachineNode
		want      Result
	}{
		{"ready node", NodeReady{}, Input{}, candidate, Result{Name: "NodeReady", Passed: true}},
		{"NotReady node", NodeReady{}, Input{}, MachineNode{Machine: machine("m1", "n1"), Node: readyNode("n1", false)}, Result{Name: "NodeReady", Message: "node n1 is not Ready"}},
		{"node not found", NodeReady{}, Input{}, MachineNode{Machine: machine("m1", "n1")}, Result{Name: "NodeReady", Message: "node n1 of machine m1 not found in the workload cluster"}},
		{"machine without node", NodeReady{}, Input{}, MachineNode{Machine: machine("m1", "")}, Result{Name: "NodeReady", Message: "machine m1 has no node yet"}},
		{"not deleting", NotDeleting{}, Input{}, candidate, Result{Name: "NotDeleting", Passed: true}},
		{"machine deleting", NotDeleting{}, Input{}, MachineNode{Machine: func() *clusterv1.Machine {
			m := machine("m1", "n1")
			m.DeletionTimestamp = &deleting
			return m
		}(), Node: readyNode("n1", true)}, Result{Name: "NotDeleting", Message: "machine m1 is being deleted"}},
		{"node deleting", NotDeleting{}, Input{}, MachineNode{Machine: machine("m1", "n1"), Node: func() *corev1.Node {
			n := readyNode("n1", true)
			n.DeletionTimestamp = &deleting
			return n
		}()}, Result{Name: "NotDeleting", Message: "node n1 is being deleted"}},
		{"room under maxUnavailable", Availability{}, Input{MaxUnavailable: 2, Unavailable: []string{"n4"}}, candidate, Result{Name: "Availability", Passed: true}},
		{"no room under maxUnavailable", Availability{}, Input{MaxUnavailable: 2, Unavailable: []string{"n4", "n5"}}, candidate,
			Result{Name: "Availability", Message: "2 node(s) of the target already unavailable (n4, n5); maxUnavailable is 2"}},
		{"workers skip the control plane check", ControlPlaneHealthy{}, Input{}, candidate, Result{Name: "ControlPlaneHealthy", Passed: true}},
		{"healthy control plane", ControlPlaneHealthy{}, Input{ControlPlane: true, ControlPlaneMachines: healthyCP}, candidate, Result{Name: "ControlPlaneHealthy", Passed: true}},
		{"control plane node NotReady", ControlPlaneHealthy{}, Input{ControlPlane: true, ControlPlaneMachines: withCP(func(m []MachineNode) { m[2].Node = readyNode("n3", false) })}, candidate,
			Result{Name: "ControlPlaneHealthy", Message: "control plane node n3 is not Ready"}},
		{"control plane machine being deleted", ControlPlaneHealthy{}, Input{ControlPlane: true, ControlPlaneMachines: withCP(func(m []MachineNode) { m[1].Machine.DeletionTimestamp = &deleting })}, candidate,
			Result{Name: "ControlPlaneHealthy", Message: "control plane machine cp-2 is being deleted"}},
		{"control plane machine failing its health check", ControlPlaneHealthy{}, Input{ControlPlane: true, ControlPlaneMachines: withCP(func(m []MachineNode) {
			m[1].Machine.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse}}
		})}, candidate, Result{Name: "ControlPlaneHealthy", Message: "control plane machine cp-2 failed its health check"}},
		{"control plane machine being remediated", ControlPlaneHealthy{}, Input{ControlPlane: true, ControlPlaneMachines: withCP(func(m []MachineNode) {
			m[0].Machine.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse}}
		})}, candidate, Result{Name: "ControlPlaneHealthy", Message: "control plane machine cp-1 is being remediated"}},
		{"control plane machine marked for remediation", ControlPlaneHealthy{}, Input{ControlPlane: true, ControlPlaneMachines: withCP(func(m []MachineNode) {
			m[0].Machine.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
		})}, candidate, Result{Name: "ControlPlaneHealthy", Message: "control plane machine cp-1 is marked for remediation"}},
		{"updater's failing check named", UpdaterChecks{Registry: registry}, Input{Cluster: cluster, UpdaterRef: inplacev1.UpdaterReference{Kind: "Holding", Name: "x"}}, candidate,
			Result{Name: "UpdaterChecks/LastReplica", Message: "volume pvc-1 has its only healthy replica on n1"}},
		{"external updater has no checks here", UpdaterChecks{Registry: registry}, Input{Cluster: cluster, UpdaterRef: inplacev1.UpdaterReference{Kind: "Elsewhere", Name: "x"}}, candidate,
			Result{Name: "UpdaterChecks", Passed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			if got := tc.check.Check(context.Background(), &in, tc.candidate); got != tc.want {
				t.Fatalf("%s = %+v; want %+v", tc.check.Name(), got, tc.want)
			}
		})
	}
}
