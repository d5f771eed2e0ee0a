package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// latencies summarises a sample of durations.
type latencies struct {
	n             int
	p50, p99, max time.Duration
}

// summarize returns the nearest-rank percentiles of d (which it sorts).
func summarize(d []time.Duration) latencies {
	if len(d) == 0 {
		return latencies{}
	}
	slices.Sort(d)
	return latencies{n: len(d), p50: percentile(d, 50), p99: percentile(d, 99), max: d[len(d)-1]}
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// ms formats a duration in milliseconds with a precision that fits its size.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// secs formats a duration in seconds.
func secs(d time.Duration) string {
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// mib formats bytes in MiB.
func mib(b uint64) string {
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}
