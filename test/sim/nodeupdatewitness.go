package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

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
	machineOf  map[string]string
	maxRunning int
	// finalAt is when the watch first showed each NodeUpdate final.
	finalAt map[string]time.Time
	// twice names the machines that ever had two NodeUpdates running at once.
	twice map[string]bool
	// maxRunningOf counts, for the sets given to CountRunning, the most running at once.
	groups     map[string]map[string]bool
	maxOfGroup map[string]int
	follow     *Follower
}

// WatchNodeUpdates starts a witness of the NodeUpdates of namespace; Stop ends it.
func WatchNodeUpdates(ctx context.Context, c client.WithWatch, namespace string) (*NodeUpdateWitness, error) {
	rec := &NodeUpdateWitness{phase: map[string]inplacev1.NodeUpdatePhase{}, created: map[string]int{}, machineOf: map[string]string{},
		finalAt: map[string]time.Time{}, twice: map[string]bool{}, groups: map[string]map[string]bool{}, maxOfGroup: map[string]int{}}
	f, err := Follow(ctx, c, &inplacev1.NodeUpdateList{}, func(ev watch.Event) {
		if nu, ok := ev.Object.(*inplacev1.NodeUpdate); ok {
			rec.observe(ev.Type, nu)
		}
	}, client.InNamespace(namespace))
	if err != nil {
		return nil, fmt.Errorf("watch NodeUpdates in %s: %w", namespace, err)
	}
	rec.follow = f
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
	r.machineOf[nu.Name] = nu.Spec.MachineName
	if _, seen := r.finalAt[nu.Name]; !seen && t != watch.Deleted && nu.Status.Phase.IsFinal() {
		r.finalAt[nu.Name] = time.Now()
	}
	running := 0
	perMachine := map[string]int{}
	perGroup := map[string]int{}
	for name, p := range r.phase {
		if p.IsFinal() {
			continue
		}
		running++
		m := r.machineOf[name]
		perMachine[m]++
		if perMachine[m] > 1 {
			r.twice[m] = true
		}
		for g, members := range r.groups {
			if members[m] {
				perGroup[g]++
			}
		}
	}
	r.maxRunning = max(r.maxRunning, running)
	for g, n := range perGroup {
		r.maxOfGroup[g] = max(r.maxOfGroup[g], n)
	}
}

// CountRunning makes the witness count, from now on, the most NodeUpdates running at once
// on the machines of a named group (for example the control plane).
func (r *NodeUpdateWitness) CountRunning(group string, machines ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups[group] = map[string]bool{}
	for _, m := range machines {
		r.groups[group][m] = true
	}
}

// MaxRunningOf is the most NodeUpdates seen running at once on the machines of a group.
func (r *NodeUpdateWitness) MaxRunningOf(group string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxOfGroup[group]
}

// RunTwice names the machines that ever had two NodeUpdates running at the same time.
func (r *NodeUpdateWitness) RunTwice() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.twice))
	for m := range r.twice {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// FinalAt is when the watch first showed the NodeUpdate final (zero while it has not): a
// moment just after the API server stored its final status.
func (r *NodeUpdateWitness) FinalAt(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finalAt[name]
}

// Stop ends the watch.
func (r *NodeUpdateWitness) Stop() { r.follow.Stop() }

// Gaps counts the times the witness lost the API server's history and listed again:
// NodeUpdates may have run at once unseen in between, so a safety check that leans on
// MaxRunning asserts it is zero.
func (r *NodeUpdateWitness) Gaps() int { return r.follow.Gaps() }

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
