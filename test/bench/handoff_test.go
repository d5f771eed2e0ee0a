package main

import (
	"slices"
	"testing"
	"time"
)

// Two places (maxUnavailable 2), five NodeUpdates: the k-th success is paired with the
// (2+k)-th creation, and the next start is the first creation at or after the success.
func TestHandoffsAndNextStarts(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	created := at(0, 0, 100, 350, 400)
	succeeded := at(90, 300, 320, 420, 450)

	got := handoffs(created, succeeded, 2)
	want := []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 80 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("handoffs: got %v, want %v", got, want)
	}
	got = nextStarts(created, succeeded, 2)
	// The third success (320) is followed by the creation at 350 that the second one made
	// room for: 30 ms to the next start, 80 ms to its own hand-off (400).
	want = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 30 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("nextStarts: got %v, want %v", got, want)
	}
}
