package controllers

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
	w.add(ptrTo(machineAt("m1", "2", "a")), "1", now)
	w.add(ptrTo(machineAt("m1", "3", "b")), "2", now)
	w.add(ptrTo(machineAt("m2", "6", "x")), "5", now)

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
	// taken from the cache, and forgotten.
	got = []clusterv1.Machine{machineAt("m1", "3", "b"), machineAt("m2", "7", "y")}
	w.overlay(got, now)
	if got[0].ResourceVersion != "3" || got[1].ResourceVersion != "7" || got[1].Labels["claim"] != "y" {
		t.Errorf("caught-up and newer machines come from the cache: got %s, %s %v", got[0].ResourceVersion, got[1].ResourceVersion, got[1].Labels)
	}
	got = []clusterv1.Machine{machineAt("m1", "1", ""), machineAt("m2", "5", "")}
	w.overlay(got, now)
	if got[0].ResourceVersion != "1" || got[1].ResourceVersion != "5" {
		t.Errorf("forgotten writes are not overlaid again: got %s, %s", got[0].ResourceVersion, got[1].ResourceVersion)
	}

	// A write the cache has not shown for longer than writtenExpiry is not trusted.
	w.add(ptrTo(machineAt("m4", "11", "z")), "10", now)
	got = []clusterv1.Machine{machineAt("m4", "10", "")}
	w.overlay(got, now.Add(writtenExpiry+time.Second))
	if got[0].ResourceVersion != "10" {
		t.Errorf("an expired write is not overlaid: got %s", got[0].ResourceVersion)
	}

	// The overlay is a copy: changing it does not change what is remembered.
	w.add(ptrTo(machineAt("m5", "21", "c")), "20", now)
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
