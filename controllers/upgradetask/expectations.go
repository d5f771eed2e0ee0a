package upgradetask

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// createdExpiry is how long a NodeUpdate this manager created may stay unseen by its
// cache before the cache is no longer trusted for its Cluster's NodeUpdates.
const createdExpiry = 30 * time.Second

// createdNodeUpdates remembers the NodeUpdates this manager created until its cache shows
// them, as the ReplicaSet controller expects the Pods it created. The NodeUpdates of a
// Cluster are read from the cache; one created a moment ago that the cache does not show
// yet still counts, so that no reconcile starts a node too many under maxUnavailable.
type createdNodeUpdates struct {
	mu        sync.Mutex
	byCluster map[types.NamespacedName]map[string]created
}

type created struct {
	nu *inplacev1.NodeUpdate
	at time.Time
}

// add remembers a NodeUpdate of the Cluster that was just created (or found existing).
func (c *createdNodeUpdates) add(cluster types.NamespacedName, nu *inplacev1.NodeUpdate, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byCluster == nil {
		c.byCluster = map[types.NamespacedName]map[string]created{}
	}
	if c.byCluster[cluster] == nil {
		c.byCluster[cluster] = map[string]created{}
	}
	c.byCluster[cluster][nu.Name] = created{nu: nu.DeepCopy(), at: now}
}

// merge returns the Cluster's NodeUpdates as listed (items) together with those created
// that the list does not show yet, and forgets those it shows. From the cache it returns
// false when one created more than createdExpiry ago is still not shown: the caller then
// lists the API server and merges again with fromAPIServer, which forgets such
// NodeUpdates (they were deleted) instead.
func (c *createdNodeUpdates) merge(cluster types.NamespacedName, items []inplacev1.NodeUpdate, now time.Time, fromAPIServer bool) ([]inplacev1.NodeUpdate, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pending := c.byCluster[cluster]
	for i := range items {
		if exp, ok := pending[items[i].Name]; ok && exp.nu.UID == items[i].UID {
			delete(pending, items[i].Name)
		}
	}
	for name, exp := range pending {
		if now.Sub(exp.at) <= createdExpiry {
			continue
		}
		if !fromAPIServer {
			return nil, false
		}
		delete(pending, name)
	}
	for _, exp := range pending {
		items = append(items, *exp.nu.DeepCopy())
	}
	if len(pending) == 0 {
		delete(c.byCluster, cluster)
	}
	return items, true
}

// writtenExpiry is how long a Machine this manager wrote is shown as written while the
// cache still shows it as it was.
const writtenExpiry = time.Minute

// writtenMachines remembers the Machines this manager wrote until its cache shows the
// writes. A reconcile that follows the last one closely reads a Machine from a cache that
// may not show the last write yet: deciding from it would write the Machine again with
// a resourceVersion the API server has left behind, and conflict. The next reconcile sees
// the Machine as it was written instead, as long as the cache shows it at a version the
// write replaced. A Machine the cache shows at another version was written by someone
// else after this manager: the cache is right, and the writes are forgotten. Once the
// cache shows the written version they are kept a while still: a background write handed
// over with the Machine as an earlier reconcile read it (machineWriter) starts from the
// Machine as last written.
type writtenMachines struct {
	mu      sync.Mutex
	written map[types.NamespacedName]writtenMachine
}

type writtenMachine struct {
	// over are the resourceVersions the writes replaced, oldest first.
	over    []writtenOver
	machine *clusterv1.Machine
	at      time.Time
}

// writtenOver is a resourceVersion a write replaced, and who wrote over it.
type writtenOver struct {
	rv string
	// by is the claim label value of the task that wrote.
	by string
}

// add remembers m as written by the task whose claim label value is by, over the
// resourceVersion from.
func (w *writtenMachines) add(m *clusterv1.Machine, from, by string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written == nil {
		w.written = map[types.NamespacedName]writtenMachine{}
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	prev := w.written[key]
	over := append(slices.Clone(prev.over), writtenOver{rv: from, by: by})
	w.written[key] = writtenMachine{over: over, machine: m.DeepCopy(), at: now}
	if len(w.written) > writtenSweepAt {
		for k, e := range w.written {
			if now.Sub(e.at) > writtenExpiry {
				delete(w.written, k)
			}
		}
	}
}

// replacedAt returns the position of a resourceVersion among those the writes replaced,
// or -1.
func (e writtenMachine) replacedAt(rv string) int {
	return slices.IndexFunc(e.over, func(o writtenOver) bool { return o.rv == rv })
}

// writtenSweepAt is the number of Machines remembered above which those remembered for
// longer than writtenExpiry are dropped.
const writtenSweepAt = 1000

// overlay replaces each Machine the cache shows at a version this manager's writes
// replaced by the Machine as written, and forgets the writes of a Machine the cache shows
// at a version this manager did not write.
func (w *writtenMachines) overlay(machines []clusterv1.Machine, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.written) == 0 {
		return
	}
	for i := range machines {
		key := types.NamespacedName{Namespace: machines[i].Namespace, Name: machines[i].Name}
		e, ok := w.written[key]
		if !ok {
			continue
		}
		switch {
		case now.Sub(e.at) > writtenExpiry:
			delete(w.written, key)
		case e.replacedAt(machines[i].ResourceVersion) >= 0:
			machines[i] = *e.machine.DeepCopy()
		case machines[i].ResourceVersion != e.machine.ResourceVersion:
			delete(w.written, key)
		}
	}
}

// latest returns m as this manager last wrote it when m is at a version that writes of
// the task whose claim label value is by replaced, and only that task wrote since; else m
// itself. What a task decided from m holds for the Machine as the task itself wrote it
// since, not as another task did: a claim decided from a Machine that another task claimed
// since must conflict, not take the claim.
func (w *writtenMachines) latest(m *clusterv1.Machine, by string, now time.Time) *clusterv1.Machine {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.written[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}]
	if !ok || now.Sub(e.at) > writtenExpiry {
		return m
	}
	i := e.replacedAt(m.ResourceVersion)
	if i < 0 {
		return m
	}
	for _, o := range e.over[i:] {
		if o.by != by {
			return m
		}
	}
	return e.machine.DeepCopy()
}
