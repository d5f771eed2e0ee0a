package upgradetask

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func machineAt(name, rv, label string) clusterv1.Machine {
	m := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
	if label != "" {
		m.Labels = map[string]string{"claim": label}
	}
	return m
}

func TestWrittenMachinesOverlay(t *testing.T) {
	now := time.Now()
	var w writtenMachines

	// m1 written twice (1 -> 2 -> 3); m2 written once (5 -> 6).
	w.add(ptrTo(machineAt("m1", "2", "a")), "1", "t", now)
	w.add(ptrTo(machineAt("m1", "3", "b")), "2", "t", now)
	w.add(ptrTo(machineAt("m2", "6", "x")), "5", "t", now)

	// The cache shows m1 before either write and m2 before its write: both as written.
	got := []clusterv1.Machine{machineAt("m1", "1", ""), machineAt("m2", "5", ""), machineAt("m3", "9", "")}
	w.overlay(got, now)
	if got[0].ResourceVersion != "3" || got[0].Labels["claim"] != "b" {
		t.Errorf("m1 cached at a replaced version: want the last write (3, b), got %s %v", got[0].ResourceVersion, got[0].Labels)
	}
	if got[1].ResourceVersion != "6" || got[1].Labels["claim"] != "x" {
		t.Errorf("m2 cached at a replaced version: want the write (6, x), got %s %v", got[1].ResourceVersion, got[1].Labels)
	}
	if got[2].ResourceVersion != "9" {
		t.Errorf("m3 was never written: want the cached machine, got %s", got[2].ResourceVersion)
	}

	// The cache shows m1 after the first write only: still replaced by the second.
	got = []clusterv1.Machine{machineAt("m1", "2", "a")}
	w.overlay(got, now)
	if got[0].ResourceVersion != "3" {
		t.Errorf("m1 cached between two writes: want the last write, got %s", got[0].ResourceVersion)
	}

	// The cache caught up with m1 (3) and shows m2 written by someone else (7): both are
	// taken from the cache. m2's writes are forgotten; m1's are kept, for a write that
	// starts from a Machine read before the cache caught up.
	got = []clusterv1.Machine{machineAt("m1", "3", "b"), machineAt("m2", "7", "y")}
	w.overlay(got, now)
	if got[0].ResourceVersion != "3" || got[1].ResourceVersion != "7" || got[1].Labels["claim"] != "y" {
		t.Errorf("caught-up and newer machines come from the cache: got %s, %s %v", got[0].ResourceVersion, got[1].ResourceVersion, got[1].Labels)
	}
	got = []clusterv1.Machine{machineAt("m1", "1", ""), machineAt("m2", "5", "")}
	w.overlay(got, now)
	if got[0].ResourceVersion != "3" || got[1].ResourceVersion != "5" {
		t.Errorf("m1's writes are kept once the cache caught up, m2's forgotten: got %s, %s", got[0].ResourceVersion, got[1].ResourceVersion)
	}
	if m := w.latest(ptrTo(machineAt("m1", "2", "a")), "t", now); m.ResourceVersion != "3" || m.Labels["claim"] != "b" {
		t.Errorf("latest of m1 read between its writes: want the last write (3, b), got %s %v", m.ResourceVersion, m.Labels)
	}
	if m := w.latest(ptrTo(machineAt("m2", "5", "")), "t", now); m.ResourceVersion != "5" {
		t.Errorf("latest of a Machine whose writes were forgotten: want it unchanged, got %s", m.ResourceVersion)
	}

	// A write the cache has not shown for longer than writtenExpiry is not trusted.
	w.add(ptrTo(machineAt("m4", "11", "z")), "10", "t", now)
	got = []clusterv1.Machine{machineAt("m4", "10", "")}
	w.overlay(got, now.Add(writtenExpiry+time.Second))
	if got[0].ResourceVersion != "10" {
		t.Errorf("an expired write is not overlaid: got %s", got[0].ResourceVersion)
	}

	// The overlay is a copy: changing it does not change what is remembered.
	w.add(ptrTo(machineAt("m5", "21", "c")), "20", "t", now)
	got = []clusterv1.Machine{machineAt("m5", "20", "")}
	w.overlay(got, now)
	got[0].Labels["claim"] = "changed"
	again := []clusterv1.Machine{machineAt("m5", "20", "")}
	w.overlay(again, now)
	if again[0].Labels["claim"] != "c" {
		t.Errorf("the remembered machine changed through an overlay: %v", again[0].Labels)
	}
}

func ptrTo[T any](v T) *T { return &v }

// A task's decision, made from a Machine it read, holds for the Machine as that task
// wrote it since, never for one another task wrote since: latest rebases only over the
// task's own writes.
func TestWrittenMachinesLatestOnlyOverOwnWrites(t *testing.T) {
	now := time.Now()
	var w writtenMachines
	// Task a writes m (1 -> 2), then task b claims it (2 -> 3).
	w.add(ptrTo(machineAt("m", "2", "a")), "1", "a", now)
	w.add(ptrTo(machineAt("m", "3", "b")), "2", "b", now)

	if got := w.latest(ptrTo(machineAt("m", "1", "")), "a", now); got.ResourceVersion != "1" {
		t.Errorf("task a, from before b's write: want the Machine as read (1), so that its write conflicts; got %s", got.ResourceVersion)
	}
	if got := w.latest(ptrTo(machineAt("m", "2", "a")), "b", now); got.ResourceVersion != "3" || got.Labels["claim"] != "b" {
		t.Errorf("task b, over its own write only: want its write (3, b); got %s %v", got.ResourceVersion, got.Labels)
	}
	if got := w.latest(ptrTo(machineAt("m", "1", "")), "b", now); got.ResourceVersion != "1" {
		t.Errorf("task b, from before a's write: want the Machine as read (1); got %s", got.ResourceVersion)
	}
	if got := w.latest(ptrTo(machineAt("m", "2", "a")), "c", now); got.ResourceVersion != "2" {
		t.Errorf("a task that never wrote m: want the Machine as read (2); got %s", got.ResourceVersion)
	}
}
