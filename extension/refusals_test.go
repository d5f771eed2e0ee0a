package extension

import (
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The log holds what Cluster API keeps: the latest answer per pair of MachineSets, a
// refusal for 24 hours, and an answer in place forgets an earlier refusal.
func TestRefusalLog(t *testing.T) {
	l := NewRefusalLog()
	old, next, other := client.ObjectKey{Namespace: "ns", Name: "ms-a"}, client.ObjectKey{Namespace: "ns", Name: "ms-b"}, client.ObjectKey{Namespace: "ns", Name: "ms-c"}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	l.answered(old, next, true, "not in place: no updater configured", at)
	l.answered(other, next, false, "covers version", at)
	if got := l.Of(old, at.Add(23*time.Hour)); len(got) != 1 || got[0].NewMachineSet != next || got[0].Until() != at.Add(24*time.Hour) {
		t.Fatalf("the refusal within 24 hours: %+v", got)
	}
	if got := l.Of(other, at); len(got) != 0 {
		t.Errorf("an answer in place is no refusal: %+v", got)
	}
	if got := l.Of(old, at.Add(24*time.Hour)); len(got) != 0 {
		t.Errorf("Cluster API forgets the answer after 24 hours: %+v", got)
	}
	l.answered(old, next, false, "covers version", at.Add(time.Hour))
	if got := l.Of(old, at.Add(2*time.Hour)); len(got) != 0 {
		t.Errorf("a later answer in place (Cluster API asked again) forgets the refusal: %+v", got)
	}
	var none *RefusalLog
	none.answered(old, next, true, "x", at)
	if none.Of(old, at) != nil {
		t.Error("a nil log remembers nothing")
	}
}
