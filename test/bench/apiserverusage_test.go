package main

import (
	"strings"
	"testing"
	"time"
)

// The API server's usage is read from its Prometheus text exposition: the samples
// themselves, not metrics whose names only start the same, nor their HELP or TYPE lines.
func TestUsageFromMetrics(t *testing.T) {
	const all = `# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.25
process_cpu_seconds_total_other 99
process_max_fds 1.048576e+06
go_gc_heap_allocs_bytes_total 3.5e+09
go_gc_heap_allocs_by_size_bytes_bucket{le="8.999999999999998"} 278187
go_cpu_classes_gc_total_cpu_seconds_total 2.5
go_cpu_classes_gc_mark_assist_cpu_seconds_total 0.5
go_cpu_classes_user_cpu_seconds_total 7
go_cpu_classes_scavenge_total_cpu_seconds_total 0.5
`
	for _, tc := range []struct {
		name, metrics string
		want          apiServerUsage
		err           string
	}{
		{
			name:    "the samples among others",
			metrics: all,
			want:    apiServerUsage{cpu: 12250 * time.Millisecond, allocated: 3.5e9, gc: 2500 * time.Millisecond, busy: 10 * time.Second},
		},
		{name: "in exponent form", metrics: strings.Replace(all, "process_cpu_seconds_total 12.25", "process_cpu_seconds_total 1.5e+01", 1),
			want: apiServerUsage{cpu: 15 * time.Second, allocated: 3.5e9, gc: 2500 * time.Millisecond, busy: 10 * time.Second}},
		{name: "missing", metrics: strings.Replace(all, "go_gc_heap_allocs_bytes_total 3.5e+09\n", "", 1), err: "no go_gc_heap_allocs_bytes_total"},
		{name: "not a number", metrics: strings.Replace(all, "process_cpu_seconds_total 12.25", "process_cpu_seconds_total abc", 1), err: `process_cpu_seconds_total "abc"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := usageFromMetrics([]byte(tc.metrics))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error naming %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// What was spent between two readings, and the collector's part of it.
func TestAPIServerUsageSince(t *testing.T) {
	before := apiServerUsage{cpu: 10 * time.Second, allocated: 1e9, gc: 2 * time.Second, busy: 9 * time.Second}
	after := apiServerUsage{cpu: 14 * time.Second, allocated: 3e9, gc: 3 * time.Second, busy: 13 * time.Second}
	got := after.since(before)
	want := apiServerUsage{cpu: 4 * time.Second, allocated: 2e9, gc: time.Second, busy: 4 * time.Second}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if s := got.gcShare(); s != 0.25 {
		t.Errorf("gc share %v, want 0.25", s)
	}
	if s := (apiServerUsage{}).gcShare(); s != 0 {
		t.Errorf("gc share of nothing %v, want 0", s)
	}
	if p := got.per(4); p != (apiServerUsage{cpu: time.Second, allocated: 5e8, gc: 250 * time.Millisecond, busy: time.Second}) {
		t.Errorf("per 4: %+v", p)
	}
	if p := got.per(0); p != (apiServerUsage{}) {
		t.Errorf("per 0: %+v, want nothing", p)
	}
	if s := got.gcShareText(); s != "25%" {
		t.Errorf("gc share text %q, want 25%%", s)
	}
	if s := (apiServerUsage{cpu: time.Second}).gcShareText(); s != "-" {
		t.Errorf("gc share text with no collection %q, want -", s)
	}
}
