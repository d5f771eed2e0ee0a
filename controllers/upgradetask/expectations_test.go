package upgradetask

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// expectNU is a NodeUpdate as the tests of createdNodeUpdates name it: name and uid.
type expectNU struct {
	name string
	uid  types.UID
}

func expectationNU(name string, uid types.UID) inplacev1.NodeUpdate {
	return inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid}}
}

func expectationNUs(nus ...expectNU) []inplacev1.NodeUpdate {
	out := make([]inplacev1.NodeUpdate, 0, len(nus))
	for _, nu := range nus {
		out = append(out, expectationNU(nu.name, nu.uid))
	}
	return out
}

// namesAndUIDs sorts what merge returned, so that tests do not depend on the order in
// which the created NodeUpdates (a map) are appended.
func namesAndUIDs(items []inplacev1.NodeUpdate) []expectNU {
	out := make([]expectNU, 0, len(items))
	for _, nu := range items {
		out = append(out, expectNU{name: nu.Name, uid: nu.UID})
	}
	slices.SortFunc(out, func(a, b expectNU) int {
		if a.name != b.name {
			if a.name < b.name {
				return -1
			}
			return 1
		}
		switch {
		case a.uid < b.uid:
			return -1
		case a.uid > b.uid:
			return 1
		}
		return 0
	})
	return out
}

// expectationStep is one call on a createdNodeUpdates: an add, or a merge with what it
// must return.
type expectationStep struct {
	// add, when set, is a NodeUpdate created in cluster at time at.
	add *expectNU
	// merge lists items (listed) in cluster at time at, from the API server when
	// fromAPIServer; the call must return want and ok.
	merge         bool
	listed        []expectNU
	fromAPIServer bool
	want          []expectNU
	ok            bool

	cluster types.NamespacedName
	at      time.Duration // since t0
}

func TestCreatedNodeUpdatesMerge(t *testing.T) {
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	other := types.NamespacedName{Namespace: "other", Name: "a"} // same name, another namespace
	nu1 := expectNU{name: "nu-1", uid: "uid-1"}
	nu1Old := expectNU{name: "nu-1", uid: "uid-old"} // an earlier NodeUpdate of that name
	nu2 := expectNU{name: "nu-2", uid: "uid-2"}
	listedX := expectNU{name: "nu-x", uid: "uid-x"}
	add := func(cluster types.NamespacedName, nu expectNU, at time.Duration) expectationStep {
		return expectationStep{add: &nu, cluster: cluster, at: at}
	}
	merge := func(cluster types.NamespacedName, at time.Duration, fromAPIServer bool, listed []expectNU, want []expectNU, ok bool) expectationStep {
		return expectationStep{merge: true, cluster: cluster, at: at, fromAPIServer: fromAPIServer, listed: listed, want: want, ok: ok}
	}
	none := []expectNU{}

	tests := []struct {
		name  string
		steps []expectationStep
	}{
		{
			name: "nothing created: the list is returned as it is",
			steps: []expectationStep{
				merge(a, 0, false, nil, none, true),
				merge(a, 0, false, []expectNU{listedX}, []expectNU{listedX}, true),
			},
		},
		{
			name: "a created NodeUpdate the cache does not show yet is merged in, again and again until shown",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, time.Second, false, []expectNU{listedX}, []expectNU{nu1, listedX}, true),
				merge(a, 2*time.Second, false, nil, []expectNU{nu1}, true),
			},
		},
		{
			name: "once listed with its uid it is forgotten: a later merge without it no longer returns it",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, time.Second, false, []expectNU{nu1}, []expectNU{nu1}, true),
				// Gone from the list (deleted meanwhile): not brought back.
				merge(a, 2*time.Second, false, nil, none, true),
				// Not even once it would have expired.
				merge(a, createdExpiry+time.Minute, false, nil, none, true),
			},
		},
		{
			name: "listed by the API server (fromAPIServer) with its uid it is forgotten too",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, time.Second, true, []expectNU{nu1}, []expectNU{nu1}, true),
				merge(a, 2*time.Second, false, nil, none, true),
			},
		},
		{
			name: "a listed NodeUpdate of the same name but another uid does not clear the expectation",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, time.Second, false, []expectNU{nu1Old}, []expectNU{nu1Old, nu1}, true),
				// Still expected: a list without it returns it.
				merge(a, 2*time.Second, false, nil, []expectNU{nu1}, true),
				// And it still expires: the cache is not trusted past createdExpiry.
				merge(a, createdExpiry+time.Second, false, []expectNU{nu1Old}, nil, false),
				// Listed with its own uid at last: forgotten.
				merge(a, createdExpiry+2*time.Second, false, []expectNU{nu1}, []expectNU{nu1}, true),
				merge(a, createdExpiry+3*time.Second, false, nil, none, true),
			},
		},
		{
			name: "each of several created NodeUpdates is forgotten when listed",
			steps: []expectationStep{
				add(a, nu1, 0),
				add(a, nu2, 0),
				merge(a, time.Second, false, []expectNU{nu2}, []expectNU{nu1, nu2}, true),
				merge(a, 2*time.Second, false, nil, []expectNU{nu1}, true),
				merge(a, 3*time.Second, false, []expectNU{nu1}, []expectNU{nu1}, true),
				merge(a, 4*time.Second, false, nil, none, true),
			},
		},
		{
			name: "an expectation exactly createdExpiry old is still trusted",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, createdExpiry, false, nil, []expectNU{nu1}, true),
			},
		},
		{
			name: "an expectation older than createdExpiry fails a cache merge, and stays until the API server is listed",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, createdExpiry+time.Nanosecond, false, []expectNU{listedX}, nil, false),
				// A failed cache merge dropped nothing: it fails again.
				merge(a, createdExpiry+time.Second, false, []expectNU{listedX}, nil, false),
				// The API server does not show it either: it was deleted, and is dropped.
				merge(a, createdExpiry+time.Second, true, []expectNU{listedX}, []expectNU{listedX}, true),
				// Dropped: the cache is trusted again, and it is not merged in.
				merge(a, createdExpiry+2*time.Second, false, nil, none, true),
			},
		},
		{
			name: "an API-server merge drops only the expired expectations and keeps the recent ones",
			steps: []expectationStep{
				add(a, nu1, 0),
				add(a, nu2, createdExpiry),
				merge(a, createdExpiry+time.Second, false, nil, nil, false),
				merge(a, createdExpiry+time.Second, true, nil, []expectNU{nu2}, true),
				merge(a, createdExpiry+2*time.Second, false, nil, []expectNU{nu2}, true),
			},
		},
		{
			name: "an expired expectation the cache does show does not fail the merge",
			steps: []expectationStep{
				add(a, nu1, 0),
				merge(a, createdExpiry+time.Minute, false, []expectNU{nu1}, []expectNU{nu1}, true),
				merge(a, createdExpiry+2*time.Minute, false, nil, none, true),
			},
		},
		{
			name: "adding a NodeUpdate again restarts its expiry",
			steps: []expectationStep{
				add(a, nu1, 0),
				add(a, nu1, createdExpiry),
				merge(a, createdExpiry+time.Second, false, nil, []expectNU{nu1}, true),
			},
		},
		{
			name: "clusters are independent",
			steps: []expectationStep{
				add(a, nu1, 0),
				add(b, nu2, createdExpiry),
				// Cluster b does not see a's NodeUpdate, nor a b's.
				merge(b, time.Second, false, nil, []expectNU{nu2}, true),
				merge(a, time.Second, false, nil, []expectNU{nu1}, true),
				// A Cluster of the same name in another namespace sees neither.
				merge(other, time.Second, false, nil, none, true),
				// a's expectation expired: only a's cache merge fails.
				merge(a, createdExpiry+time.Second, false, nil, nil, false),
				merge(b, createdExpiry+time.Second, false, nil, []expectNU{nu2}, true),
				// Listing nu-2 in a does not clear it in b (and adds it to a's list only).
				merge(a, createdExpiry+time.Second, true, []expectNU{nu2}, []expectNU{nu2}, true),
				merge(b, createdExpiry+2*time.Second, false, nil, []expectNU{nu2}, true),
				// a's expectation was dropped by its API-server merge, b's is kept.
				merge(a, createdExpiry+2*time.Second, false, nil, none, true),
				merge(b, createdExpiry+2*time.Second, false, []expectNU{nu2}, []expectNU{nu2}, true),
				merge(b, createdExpiry+3*time.Second, false, nil, none, true),
			},
		},
	}

	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c createdNodeUpdates
			for i, step := range tt.steps {
				now := t0.Add(step.at)
				if step.add != nil {
					nu := expectationNU(step.add.name, step.add.uid)
					c.add(step.cluster, &nu, now)
					continue
				}
				listed := expectationNUs(step.listed...)
				before := namesAndUIDs(listed)
				got, ok := c.merge(step.cluster, listed, now, step.fromAPIServer)
				if ok != step.ok {
					t.Fatalf("step %d: merge(%s, %v, +%s, fromAPIServer=%t) ok = %t, want %t", i, step.cluster, step.listed, step.at, step.fromAPIServer, ok, step.ok)
				}
				if !step.ok {
					if got != nil {
						t.Errorf("step %d: a failed merge returned %v, want nil", i, namesAndUIDs(got))
					}
					continue
				}
				if g, w := namesAndUIDs(got), namesAndUIDs(expectationNUs(step.want...)); !slices.Equal(g, w) {
					t.Errorf("step %d: merge(%s, %v, +%s, fromAPIServer=%t) = %v, want %v", i, step.cluster, step.listed, step.at, step.fromAPIServer, g, w)
				}
				if after := namesAndUIDs(listed); !slices.Equal(after, before) {
					t.Errorf("step %d: merge changed the items it was given: %v, was %v", i, after, before)
				}
			}
		})
	}
}

// TestCreatedNodeUpdatesMergeReturnsCopies checks that what merge returns of a created
// NodeUpdate is a copy: a caller changing it changes neither what is remembered nor the
// NodeUpdate given to add.
func TestCreatedNodeUpdatesMergeReturnsCopies(t *testing.T) {
	cluster := types.NamespacedName{Namespace: "ns", Name: "a"}
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	var c createdNodeUpdates
	nu := expectationNU("nu-1", "uid-1")
	nu.Labels = map[string]string{"k": "v"}
	c.add(cluster, &nu, t0)
	nu.Labels["k"] = "changed after add"

	got, ok := c.merge(cluster, nil, t0, false)
	if !ok || len(got) != 1 {
		t.Fatalf("merge = %v, %t; want the created NodeUpdate", namesAndUIDs(got), ok)
	}
	if got[0].Labels["k"] != "v" {
		t.Errorf("merge returned labels %v; want those given to add, %v", got[0].Labels, map[string]string{"k": "v"})
	}
	got[0].Labels["k"] = "changed by the caller"

	again, ok := c.merge(cluster, nil, t0, false)
	if !ok || len(again) != 1 {
		t.Fatalf("merge = %v, %t; want the created NodeUpdate", namesAndUIDs(again), ok)
	}
	if again[0].Labels["k"] != "v" {
		t.Errorf("a caller's change to a merged NodeUpdate changed what is remembered: labels %v", again[0].Labels)
	}
}
