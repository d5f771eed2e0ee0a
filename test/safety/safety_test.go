package safety

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// defaultSeeds are the seeds `make test-e2e` runs: a fixed set, so that a run of the suite is
// the same plan every time.
var defaultSeeds = []int64{1, 2, 3, 4, 5, 6, 7, 8}

// seeds returns the seeds to run: SAFETY_SEED=<n> replays one seed; SAFETY_SEEDS=<count>
// runs seeds 1 to count (SAFETY_SEED_BASE shifts the first); else defaultSeeds.
func seeds(t *testing.T) []int64 {
	if v := os.Getenv("SAFETY_SEED"); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("SAFETY_SEED=%q: %v", v, err)
		}
		return []int64{seed}
	}
	if v := os.Getenv("SAFETY_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SAFETY_SEEDS=%q: want a count of seeds", v)
		}
		base := int64(1)
		if b := os.Getenv("SAFETY_SEED_BASE"); b != "" {
			if base, err = strconv.ParseInt(b, 10, 64); err != nil {
				t.Fatalf("SAFETY_SEED_BASE=%q: %v", b, err)
			}
		}
		out := make([]int64, n)
		for i := range out {
			out[i] = base + int64(i)
		}
		return out
	}
	return defaultSeeds
}

// TestSafety runs the randomized safety test for each seed, one after another on one API
// server, each in its own namespace, and fails with the seed and the history of any
// violation or of a seed that did not settle.
func TestSafety(t *testing.T) {
	testsuite.WholeRun(t)
	if os.Getenv("SAFETY_LOG") == "" {
		logf.SetLogger(logr.Discard())
	}
	env, err := testenv.Start()
	if err != nil {
		t.Fatalf("start the test API server: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	list := seeds(t)
	start := time.Now()
	var failed []int64
	violations := 0
	for _, seed := range list {
		res, err := RunSeed(ctx, env, seed, DefaultOptions())
		if err != nil {
			t.Fatalf("seed %d could not run: %v", seed, err)
		}
		fmt.Println(res.Summary())
		if os.Getenv("SAFETY_HISTORY") != "" {
			fmt.Print(res.History.Format(0))
		}
		if res.Failed() {
			failed = append(failed, seed)
			violations += len(res.Violations)
			t.Errorf("%s", res.Report())
		}
	}
	fmt.Printf("safety: %d seeds in %s (%.1fs a seed), %d violations, %d seeds failed %v\n",
		len(list), time.Since(start).Round(time.Second), time.Since(start).Seconds()/float64(len(list)), violations, len(failed), failed)
}

// The checker's own tests: each invariant check fails on a hand-made history that breaks
// it, and stays quiet on one that does not.

var (
	t0   = time.Unix(1_000_000, 0)
	topo = Topology{
		TargetOf:     map[string]string{"c1": "cp", "c2": "cp", "c3": "cp", "a1": "md-a", "a2": "md-a", "a3": "md-a"},
		ControlPlane: "cp",
		Kubelet: map[string]string{"c1": fromVersion, "c2": fromVersion, "c3": fromVersion,
			"a1": fromVersion, "a2": fromVersion, "a3": fromVersion},
		Slack:     300 * time.Millisecond,
		GateSlack: 400 * time.Millisecond,
	}
)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func start(ms int, nu, node string, mu int) Event {
	return Event{At: at(ms), Kind: EventNodeUpdateStart, NodeUpdate: nu, Node: node, Target: topo.TargetOf[node], Task: "t", MaxUnavailable: mu}
}

func down(ms int, nu, node string) Event {
	return Event{At: at(ms), Kind: EventNodeDown, NodeUpdate: nu, Node: node}
}

func done(ms int, nu, node, version string) Event {
	return Event{At: at(ms), Kind: EventNodeUpdateDone, NodeUpdate: nu, Node: node, Version: version}
}

func watched(ms int, nu, node, phase string) Event {
	return Event{At: at(ms), Kind: EventWatchNodeUpdate, NodeUpdate: nu, Node: node, Phase: phase}
}

// twatched is a watch event of a task's NodeUpdate of machine m-<node>.
func twatched(ms int, nu, node, task, phase string) Event {
	return Event{At: at(ms), Kind: EventWatchNodeUpdate, NodeUpdate: nu, Node: node, Machine: "m-" + node, Task: task, Phase: phase}
}

func gate(ms int, phase string) Event { return Event{At: at(ms), Kind: EventGate, Phase: phase} }

func taskPhase(ms int, task, pacing, phase string) Event {
	return Event{At: at(ms), Kind: EventWatchTask, Task: task, Phase: phase, Why: pacing + " "}
}

func replica(vol, node string) Event {
	return Event{At: t0, Kind: EventReplica, Volume: vol, Node: node}
}

func kubelet(ms int, node, version string) Event {
	return Event{At: at(ms), Kind: EventKubelet, Node: node, Version: version}
}

func broken(events ...Event) []int {
	c := NewChecker(topo)
	h := NewHistory(c)
	for _, e := range events {
		h.Record(e)
	}
	var out []int
	for _, v := range c.Violations() {
		out = append(out, v.Invariant)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestCheckerInvariants(t *testing.T) {
	testsuite.Unit(t)
	const v34, v35 = "v1.34.1+rke2r1", "v1.35.0+rke2r1"
	cases := []struct {
		name   string
		events []Event
		want   []int
	}{
		{"a whole clean upgrade of one worker and the control plane", []Event{
			replica("vol", "a1"), replica("vol", "a2"),
			watched(0, "n1", "c1", ""), start(10, "n1", "c1", 1), down(20, "n1", "c1"), kubelet(30, "c1", v34), done(30, "n1", "c1", v34), watched(40, "n1", "c1", "Succeeded"),
			kubelet(50, "c2", v34), kubelet(50, "c3", v34),
			watched(60, "n2", "a1", ""), start(70, "n2", "a1", 1), down(80, "n2", "a1"), kubelet(90, "a1", v34), done(90, "n2", "a1", v34),
		}, nil},
		{"1: two control plane nodes in the updater's hands", []Event{
			start(0, "n1", "c1", 1), start(10, "n2", "c2", 1),
		}, []int{InvControlPlaneOne}},
		{"1: two control plane NodeUpdates live in the watch", []Event{
			watched(0, "n1", "c1", "InProgress"), watched(10, "n2", "c2", "Pending"),
		}, []int{InvControlPlaneOne}},
		{"2: a second worker taken down with maxUnavailable 1", []Event{
			start(0, "n1", "a1", 1), down(10, "n1", "a1"), start(20, "n2", "a2", 1), down(30, "n2", "a2"),
		}, []int{InvMaxUnavailable}},
		{"2: a worker taken down while another flapped since before its NodeUpdate was created", []Event{
			{At: at(0), Kind: EventWorldDown, Node: "a2", Why: "flap"},
			watched(1000, "n1", "a1", ""), start(1010, "n1", "a1", 1), down(1020, "n1", "a1"),
		}, []int{InvMaxUnavailable}},
		{"2: not broken by a flap that began after the NodeUpdate was created", []Event{
			watched(1000, "n1", "a1", ""), {At: at(1001), Kind: EventWorldDown, Node: "a2", Why: "flap"},
			start(1010, "n1", "a1", 1), down(1020, "n1", "a1"),
		}, nil},
		{"1, 2: not broken by a node that is gone while its NodeUpdate is aborted", []Event{
			start(0, "n1", "c1", 1), down(10, "n1", "c1"), {At: at(20), Kind: EventNodeGone, Node: "c1"},
			watched(30, "n2", "c2", "Pending"), start(40, "n2", "c2", 1), down(50, "n2", "c2"),
		}, nil},
		{"2: not broken with maxUnavailable 2", []Event{
			start(0, "n1", "a1", 2), down(10, "n1", "a1"), start(20, "n2", "a2", 2), down(30, "n2", "a2"),
		}, nil},
		{"3: two NodeUpdates of one node in the updater's hands", []Event{
			start(0, "n1", "a1", 3), start(10, "n2", "a1", 3),
		}, []int{InvOneNodeUpdate}},
		{"3: two live NodeUpdates of one node in the watch", []Event{
			watched(0, "n1", "a1", "Pending"), watched(10, "n2", "a1", "Pending"),
		}, []int{InvOneNodeUpdate}},
		{"3: not broken when the first ended before the second", []Event{
			watched(0, "n1", "a1", "InProgress"), watched(5, "n1", "a1", "Aborted"), watched(10, "n2", "a1", "Pending"),
		}, nil},
		{"4: a node upgraded twice to the same version", []Event{
			start(0, "n1", "c1", 1), done(10, "n1", "c1", v34), start(20, "n2", "c1", 1), done(30, "n2", "c1", v34),
		}, []int{InvUpgradedOnce}},
		{"5: a volume's last replica taken down", []Event{
			replica("vol", "a1"), replica("vol", "a2"),
			start(0, "n1", "a1", 3), start(10, "n2", "a2", 3), down(20, "n2", "a2"),
		}, []int{InvVolumeReplica}},
		{"5: a volume's last replica taken down while its other replica's node flaps since long", []Event{
			replica("vol", "a1"), replica("vol", "a2"), {At: at(0), Kind: EventWorldDown, Node: "a1", Why: "flap"},
			watched(1000, "n2", "a2", ""), start(1010, "n2", "a2", 3), down(1020, "n2", "a2"),
		}, []int{InvVolumeReplica}},
		{"5: not broken by a volume that lost its only replica with a deleted machine (faulted: nothing to keep)", []Event{
			replica("vol", "a1"), {At: at(0), Kind: EventNodeGone, Node: "a1"}, {At: at(0), Kind: EventReplicaLost, Volume: "vol", Node: "a1"},
			start(10, "n1", "a2", 3), down(20, "n1", "a2"),
		}, nil},
		{"6: the updater asked to go on after its abort", []Event{
			start(0, "n1", "a1", 1), {At: at(10), Kind: EventNodeUpdateAborted, NodeUpdate: "n1", Node: "a1"},
			{At: at(20), Kind: EventResumedAfterEnd, NodeUpdate: "n1", Node: "a1", Why: "aborted"},
		}, []int{InvNothingAfterEnd}},
		{"8: a host rebooted after the updater's Abort said done", []Event{
			start(0, "n1", "a1", 1), down(10, "n1", "a1"), {At: at(20), Kind: EventNodeUpdateAborted, NodeUpdate: "n1", Node: "a1"},
			{At: at(30), Kind: EventHostReboot, NodeUpdate: "n1", Node: "a1"},
		}, []int{InvNoRebootAfterEnd}},
		{"8: a host rebooted after the API showed its NodeUpdate final", []Event{
			watched(0, "n1", "a1", "InProgress"), start(5, "n1", "a1", 1), down(10, "n1", "a1"), watched(20, "n1", "a1", "Aborted"),
			{At: at(30), Kind: EventHostReboot, NodeUpdate: "n1", Node: "a1"},
		}, []int{InvNoRebootAfterEnd}},
		{"8: not broken by a reboot while its NodeUpdate runs, nor by a gone node's", []Event{
			watched(0, "n1", "a1", "InProgress"), start(5, "n1", "a1", 1), down(10, "n1", "a1"),
			{At: at(20), Kind: EventHostReboot, NodeUpdate: "n1", Node: "a1"}, {At: at(30), Kind: EventNodeUpdateAborted, NodeUpdate: "n1", Node: "a1"},
			start(40, "n2", "a2", 1), down(50, "n2", "a2"), {At: at(60), Kind: EventNodeGone, Node: "a2"},
			{At: at(70), Kind: EventNodeUpdateAborted, NodeUpdate: "n2", Node: "a2"}, {At: at(80), Kind: EventHostReboot, NodeUpdate: "n2", Node: "a2"},
		}, nil},
		{"7: a worker upgraded past the control plane", []Event{
			kubelet(0, "c1", v35), kubelet(0, "c2", v35),
			start(10, "n1", "a1", 1), kubelet(20, "a1", v35), done(20, "n1", "a1", v35),
		}, []int{InvNoNewerThanPlanes}},
		{"7: not broken once every control plane node runs the version", []Event{
			kubelet(0, "c1", v35), kubelet(0, "c2", v35), kubelet(0, "c3", v35),
			start(10, "n1", "a1", 1), kubelet(20, "a1", v35), done(20, "n1", "a1", v35),
		}, nil},
	}
	// The task t's NodeUpdates of machine m-a1: its first and its retry.
	first, retry := "t-m-a1", "t-m-a1-retry"
	cases = append(cases, []struct {
		name   string
		events []Event
		want   []int
	}{
		{"9: a NodeUpdate created while the Cluster's gate has been red for longer than the slack", []Event{
			gate(0, "set"), gate(100, "red"), twatched(600, first, "a1", "t", ""),
		}, []int{InvGateRed}},
		{"9: not broken by a gate that turned red within the slack before the NodeUpdate was created", []Event{
			gate(0, "set"), gate(300, "red"), twatched(600, first, "a1", "t", ""),
		}, nil},
		{"9: not broken by a gate named by the Cluster within the slack before", []Event{
			gate(0, "red"), gate(300, "set"), twatched(600, first, "a1", "t", ""),
		}, nil},
		{"9: not broken by a red gate the Cluster no longer names, nor by one green again", []Event{
			gate(0, "set"), gate(10, "red"), gate(20, "removed"), twatched(600, first, "a1", "t", ""),
			gate(700, "set"), gate(1500, "green"), twatched(2000, "t-m-a2", "a2", "t", ""),
		}, nil},
		{"9: not broken by a NodeUpdate created before the gate turned red, seen again later", []Event{
			gate(0, "set"), twatched(10, first, "a1", "t", ""), gate(20, "red"), twatched(900, first, "a1", "t", "InProgress"),
		}, nil},
		{"10: a retry while the machine's first NodeUpdate is not Skipped", []Event{
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Failed"), twatched(20, retry, "a1", "t", ""),
		}, []int{InvSkipRetry}},
		{"10: a skipped machine tried twice (its retry made again)", []Event{
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Skipped"), twatched(20, retry, "a1", "t", ""),
			{At: at(30), Kind: EventWatchNodeUpdate, NodeUpdate: retry, Node: "a1", Machine: "m-a1", Task: "t", Phase: "Aborted", Deleted: true},
			twatched(40, retry, "a1", "t", ""),
		}, []int{InvSkipRetry}},
		{"10: a retry by a task Cluster API paces", []Event{
			taskPhase(0, "t", "External", "Ongoing"),
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Skipped"), twatched(20, retry, "a1", "t", ""),
		}, []int{InvSkipRetry}},
		{"10: a task completed though its retry was skipped again", []Event{
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Skipped"), twatched(20, retry, "a1", "t", ""),
			twatched(30, retry, "a1", "t", "Skipped"), taskPhase(40, "t", "Extension", "Completed"),
		}, []int{InvSkipRetry}},
		{"10: not broken by a skip, its retry skipped again and the task Failed", []Event{
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Skipped"), twatched(20, retry, "a1", "t", ""),
			twatched(30, retry, "a1", "t", "Skipped"), taskPhase(40, "t", "Extension", "Failed"),
		}, nil},
		{"10: not broken by a task completed after the machine skipped twice was deleted", []Event{
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Skipped"), twatched(20, retry, "a1", "t", ""),
			twatched(30, retry, "a1", "t", "Skipped"), {At: at(35), Kind: EventWorldDown, Node: "a1", Why: "machine m-a1 deleting"},
			taskPhase(40, "t", "Extension", "Completed"),
		}, nil},
		{"10: not broken by a skip whose retry succeeded and a completed task", []Event{
			twatched(0, first, "a1", "t", "InProgress"), twatched(10, first, "a1", "t", "Skipped"), twatched(20, retry, "a1", "t", ""),
			twatched(30, retry, "a1", "t", "Succeeded"), taskPhase(40, "t", "Extension", "Completed"),
		}, nil},
		{"6: the updater asked to go on after the API showed its NodeUpdate Skipped", []Event{
			start(0, first, "a1", 1), {At: at(10), Kind: EventNodeUpdateSkipping, NodeUpdate: first, Node: "a1"},
			{At: at(20), Kind: EventNodeUpdateSkipped, NodeUpdate: first, Node: "a1"}, twatched(30, first, "a1", "t", "Skipped"),
			{At: at(40), Kind: EventAskedAfterSkip, NodeUpdate: first, Node: "a1"},
		}, []int{InvNothingAfterEnd}},
		{"6: not broken by the updater asked again before the skip was persisted", []Event{
			twatched(0, first, "a1", "t", "InProgress"), start(5, first, "a1", 1), {At: at(10), Kind: EventNodeUpdateSkipping, NodeUpdate: first, Node: "a1"},
			{At: at(20), Kind: EventNodeUpdateSkipped, NodeUpdate: first, Node: "a1"}, {At: at(30), Kind: EventAskedAfterSkip, NodeUpdate: first, Node: "a1"},
			twatched(40, first, "a1", "t", "Skipped"),
		}, nil},
		{"6: a skipped node put back while the updater still holds it down", []Event{
			start(0, first, "a1", 1), down(10, first, "a1"), {At: at(20), Kind: EventNodeUpdateSkipped, NodeUpdate: first, Node: "a1"},
		}, []int{InvNothingAfterEnd}},
		{"6: the updater took a node down for a NodeUpdate it had put back", []Event{
			start(0, first, "a1", 1), {At: at(20), Kind: EventNodeUpdateSkipped, NodeUpdate: first, Node: "a1"}, down(30, first, "a1"),
		}, []int{InvNothingAfterEnd}},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := broken(c.events...); !slices.Equal(got, c.want) {
				t.Errorf("broken invariants %v, want %v", got, c.want)
			}
		})
	}
}

// TestVolumesRebuildAsLonghorn: a replica of a deleted node is rebuilt only from a replica
// that is left, and only onto a node Longhorn may schedule on (seed 197 of the soak had
// a single-replica volume "rebuilt" onto a node the updater was about to take down).
func TestVolumesRebuildAsLonghorn(t *testing.T) {
	testsuite.Unit(t)
	h := &History{}
	v := &Volumes{replicas: map[string]map[string]bool{
		"single": {"a1": true},
		"pair":   {"a1": true, "a2": true},
	}}
	v.NodeGone(rand.New(rand.NewSource(1)), "a1", []string{"a2", "a3"}, h)
	if got := v.replicas["single"]; len(got) != 0 {
		t.Errorf("single-replica volume rebuilt onto %v; with its only replica gone Longhorn has no source", got)
	}
	if got := v.replicas["pair"]; !got["a2"] || !got["a3"] || len(got) != 2 {
		t.Errorf("pair's replicas are %v, want a2 and the rebuilt one on a3 (the only schedulable node without one)", got)
	}
	if left := v.LeftWithout(map[string]bool{"a2": true, "a3": true}); !slices.Equal(left, []string{"pair (replicas on [a2 a3])"}) {
		t.Errorf("LeftWithout = %v, want only pair: a faulted volume has nothing to keep", left)
	}
	v.replicas["pair"] = map[string]bool{"a2": true, "a3": true}
	v.NodeGone(rand.New(rand.NewSource(2)), "a3", nil, h)
	if got := v.replicas["pair"]; len(got) != 1 || !got["a2"] {
		t.Errorf("pair's replicas are %v, want a2 alone: no node could take the rebuild", got)
	}
}
