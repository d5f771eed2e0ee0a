package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

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
