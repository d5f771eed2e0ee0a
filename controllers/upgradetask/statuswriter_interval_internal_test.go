package upgradetask

import (
	"fmt"
	"testing"
	"time"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// withEntries is a status of n machines.
func withEntries(n int) *inplacev1.UpgradeTaskStatus {
	st := &inplacev1.UpgradeTaskStatus{}
	for i := range n {
		st.Machines = append(st.Machines, inplacev1.MachineUpgradeStatus{Name: fmt.Sprintf("m-%d", i), State: inplacev1.MachineStateWaiting})
	}
	return st
}

// A task's status is written at most once per interval, one interval more for every
// statusEntriesPerInterval entries more, up to maxStatusWriteInterval: what its writes cost
// the API server per second does not grow with the task.
func TestStatusWriteIntervalGrowsWithEntries(t *testing.T) {
	w := &statusWriter{interval: statusWriteInterval}
	for _, tc := range []struct {
		entries int
		want    time.Duration
	}{
		{0, time.Second},
		{1, time.Second},
		{100, time.Second},
		{101, 2 * time.Second},
		{250, 3 * time.Second},
		{500, 5 * time.Second},
		{1000, 10 * time.Second},
		{5000, 10 * time.Second},
	} {
		if got := w.intervalFor(withEntries(tc.entries)); got != tc.want {
			t.Errorf("%d entries: interval %s, want %s", tc.entries, got, tc.want)
		}
	}
	// An interval set longer than the bound (a test's) is kept.
	w.interval = time.Hour
	if got := w.intervalFor(withEntries(5000)); got != time.Hour {
		t.Errorf("interval of an hour with 5000 entries: %s, want 1h", got)
	}
}
