package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// NodeUpdateWitness watches the NodeUpdates of a namespace and records what the API
// server saw: the most NodeUpdates unfinished at once, and how many were ever created per
// machine, in order. It is a test's independent witness of the controllers' safety.
type NodeUpdateWitness struct {
	mu         sync.Mutex
	phase      map[string]inplacev1.NodeUpdatePhase
	created    map[string]int
	order      []string
	maxRunning int
	stop       func()
}

// WatchNodeUpdates starts a witness of the NodeUpdates of namespace; Stop ends it.
func WatchNodeUpdates(ctx context.Context, c client.WithWatch, namespace string) (*NodeUpdateWitness, error) {
	w, err := c.Watch(ctx, &inplacev1.NodeUpdateList{}, client.InNamespace(namespace))
	if err != nil {
		return nil, fmt.Errorf("watch NodeUpdates in %s: %w", namespace, err)
	}
	rec := &NodeUpdateWitness{phase: map[string]inplacev1.NodeUpdatePhase{}, created: map[string]int{}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			if nu, ok := ev.Object.(*inplacev1.NodeUpdate); ok {
				rec.observe(ev.Type, nu)
			}
		}
	}()
	return rec, nil
}

func (r *NodeUpdateWitness) observe(t watch.EventType, nu *inplacev1.NodeUpdate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch t {
	case watch.Added:
		if _, known := r.phase[nu.Name]; !known {
			r.created[nu.Spec.MachineName]++
			r.order = append(r.order, nu.Spec.MachineName)
		}
		r.phase[nu.Name] = nu.Status.Phase
	case watch.Modified:
		r.phase[nu.Name] = nu.Status.Phase
	case watch.Deleted:
		delete(r.phase, nu.Name)
	}
	running := 0
	for _, p := range r.phase {
		if !p.IsFinal() {
			running++
		}
	}
	r.maxRunning = max(r.maxRunning, running)
}

// Stop ends the watch.
func (r *NodeUpdateWitness) Stop() { r.stop() }

// MaxRunning is the most NodeUpdates seen unfinished at once.
func (r *NodeUpdateWitness) MaxRunning() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxRunning
}

// Creations counts the NodeUpdates ever created, by machine.
func (r *NodeUpdateWitness) Creations() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.created)
}

// StartOrder lists the machines in the order their NodeUpdates were created.
func (r *NodeUpdateWitness) StartOrder() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}
