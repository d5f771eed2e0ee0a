package main

import (
	"strings"
	"testing"
	"time"
)

// The API server's CPU time is read from its Prometheus text exposition: the sample of
// process_cpu_seconds_total, not a metric whose name only starts the same, nor its HELP
// or TYPE lines.
func TestCPUFromMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, metrics string
		want          time.Duration
		err           string
	}{
		{
			name: "the sample among others",
			metrics: `# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total_other 99
process_cpu_seconds_total 12.25
process_max_fds 1.048576e+06
`,
			want: 12250 * time.Millisecond,
		},
		{name: "in exponent form", metrics: "process_cpu_seconds_total 1.5e+01\n", want: 15 * time.Second},
		{name: "missing", metrics: "process_max_fds 1024\n", err: "no process_cpu_seconds_total"},
		{name: "not a number", metrics: "process_cpu_seconds_total abc\n", err: `process_cpu_seconds_total "abc"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cpuFromMetrics([]byte(tc.metrics))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %s, %v; want an error naming %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}
