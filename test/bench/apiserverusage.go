package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// apiServerUsage is what the test API server says it has spent since it started, from
// the /metrics it serves to its administrators. Every section's API server runs on the
// bench's cores, so what it spends per upgraded node bounds how many nodes a second the
// orchestration can hand over there, and how often its garbage collector runs.
type apiServerUsage struct {
	// cpu is process_cpu_seconds_total: user and system time of the process.
	cpu time.Duration
	// allocated is go_gc_heap_allocs_bytes_total: the bytes its heap allocations took.
	allocated float64
	// gc and busy are the Go runtime's estimates of the CPU its garbage collector took
	// (marking, mark assists and pauses: go_cpu_classes_gc_total_cpu_seconds_total) and
	// of all the CPU the process's Go code and collector took (gc plus
	// go_cpu_classes_user_cpu_seconds_total and the scavenger's). The runtime brings them
	// up to date at the end of each collection: over a span with no collection they do
	// not move.
	gc, busy time.Duration
}

// usageMetrics are the samples apiServerUsage is read from.
const (
	metricProcessCPU  = "process_cpu_seconds_total"
	metricAllocated   = "go_gc_heap_allocs_bytes_total"
	metricGCCPU       = "go_cpu_classes_gc_total_cpu_seconds_total"
	metricUserCPU     = "go_cpu_classes_user_cpu_seconds_total"
	metricScavengeCPU = "go_cpu_classes_scavenge_total_cpu_seconds_total"
)

// readAPIServerUsage reads the test API server's usage from its /metrics.
func readAPIServerUsage(ctx context.Context, b *bench) (apiServerUsage, error) {
	data, err := apiServerMetrics(ctx, b)
	if err != nil {
		return apiServerUsage{}, err
	}
	return usageFromMetrics(data)
}

// usageFromMetrics reads apiServerUsage from a Prometheus text exposition.
func usageFromMetrics(metrics []byte) (apiServerUsage, error) {
	names := []string{metricProcessCPU, metricAllocated, metricGCCPU, metricUserCPU, metricScavengeCPU}
	values, err := metricSamples(metrics, names...)
	if err != nil {
		return apiServerUsage{}, err
	}
	secs := func(name string) time.Duration { return time.Duration(values[name] * float64(time.Second)) }
	return apiServerUsage{
		cpu:       secs(metricProcessCPU),
		allocated: values[metricAllocated],
		gc:        secs(metricGCCPU),
		busy:      secs(metricGCCPU) + secs(metricUserCPU) + secs(metricScavengeCPU),
	}, nil
}

// metricSamples returns the value of each named sample without labels in a Prometheus
// text exposition: the sample itself, not a metric whose name only starts the same, nor
// its HELP or TYPE lines. A name with no sample is an error.
func metricSamples(metrics []byte, names ...string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(metrics), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || !want[fields[0]] {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", fields[0], fields[1], err)
		}
		out[fields[0]] = v
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("no %s in the API server's metrics", n)
		}
	}
	return out, nil
}

// since is what the API server spent between an earlier reading and u.
func (u apiServerUsage) since(earlier apiServerUsage) apiServerUsage {
	return apiServerUsage{
		cpu:       u.cpu - earlier.cpu,
		allocated: u.allocated - earlier.allocated,
		gc:        u.gc - earlier.gc,
		busy:      u.busy - earlier.busy,
	}
}

// per is u divided among n (requests, nodes); nothing when n is not positive.
func (u apiServerUsage) per(n int) apiServerUsage {
	if n <= 0 {
		return apiServerUsage{}
	}
	return apiServerUsage{cpu: u.cpu / time.Duration(n), allocated: u.allocated / float64(n), gc: u.gc / time.Duration(n), busy: u.busy / time.Duration(n)}
}

// gcShare is the part of the API server's busy CPU its garbage collector took.
func (u apiServerUsage) gcShare() float64 {
	if u.busy <= 0 {
		return 0
	}
	return u.gc.Seconds() / u.busy.Seconds()
}

// gcShareText is gcShare in percent, or "-" when no collection ended within the span.
func (u apiServerUsage) gcShareText() string {
	if u.busy <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*u.gcShare())
}
