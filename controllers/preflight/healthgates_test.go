package preflight

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func TestHealthGate(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	soak := &metav1.Duration{Duration: 2 * time.Minute}
	green := func(since time.Time) HealthGate { return HealthGate{Name: "g", Green: true, GreenSince: since} }
	for _, tc := range []struct {
		name     string
		soak     *metav1.Duration
		health   []HealthGate
		lastNode time.Time
		open     bool
		message  string
		retry    time.Duration
	}{
		{name: "no gates", open: true},
		{name: "every gate green, no soak", health: []HealthGate{green(now.Add(-time.Second))}, lastNode: now.Add(-time.Second), open: true},
		{name: "a red gate closes, named with its message",
			health:  []HealthGate{green(now), {Name: "volumes", Message: "volume pvc-1 degraded"}},
			message: "gate volumes is red: volume pvc-1 degraded"},
		{name: "green before any node ended: no soak", soak: soak, health: []HealthGate{green(now)}, open: true},
		{name: "soak counts from the node's end", soak: soak, health: []HealthGate{green(now.Add(-time.Hour))}, lastNode: now.Add(-time.Minute),
			message: "must stay green until 2026-11-27T12:01:00Z", retry: time.Minute},
		{name: "soak counts from the gate turning green after the node ended", soak: soak, health: []HealthGate{green(now.Add(-30 * time.Second))}, lastNode: now.Add(-time.Hour),
			message: "must stay green until 2026-11-27T12:01:30Z", retry: 90 * time.Second},
		{name: "soak passed", soak: soak, health: []HealthGate{green(now.Add(-3 * time.Minute))}, lastNode: now.Add(-5 * time.Minute), open: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := healthGate(GateInput{Spec: &inplacev1.UpgradeTaskSpec{GateSoak: tc.soak}, Now: now, LastNodeCompletion: tc.lastNode, Health: tc.health})
			if r.Open != tc.open {
				t.Fatalf("open = %v, want %v (%s)", r.Open, tc.open, r.Message)
			}
			if tc.open {
				return
			}
			if r.Reason != inplacev1.GateRedReason || !strings.Contains(r.Message, tc.message) || r.RetryAfter != tc.retry {
				t.Fatalf("got %s %q retry %s; want %s containing %q retry %s", r.Reason, r.Message, r.RetryAfter, inplacev1.GateRedReason, tc.message, tc.retry)
			}
		})
	}
}
