package main

import "testing"

// TestSummarizeMemory: the peak is never below the median VmRSS, even when the last
// VmHWM read is (the reads CI saw: a VmRSS sample above the VmHWM read after it).
func TestSummarizeMemory(t *testing.T) {
	samples := []memRead{
		{rss: 84_000_000, hwm: 84_100_000},
		{rss: 85_192_704, hwm: 85_192_704},
		{rss: 85_200_000, hwm: 85_200_000},
		{rss: 84_500_000, hwm: 84_951_040},
		{rss: 85_190_000, hwm: 84_951_040},
	}
	all := append(append([]memRead{}, samples...), memRead{rss: 84_900_000, hwm: 84_951_040})
	median, peak := summarizeMemory(samples, all)
	if median != 85_190_000 {
		t.Errorf("median VmRSS %d, want 85190000", median)
	}
	if peak != 85_200_000 {
		t.Errorf("peak %d, want the highest VmRSS read, 85200000", peak)
	}
	if _, peak := summarizeMemory(samples[:1], []memRead{{rss: 1, hwm: 90_000_000}}); peak != 90_000_000 {
		t.Errorf("peak %d, want the VmHWM above every VmRSS, 90000000", peak)
	}
}
