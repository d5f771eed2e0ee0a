package capienv

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// MachineWitness watches the Machines of a namespace and records which were ever created
// and which Cluster API started to delete: a test's witness that an in-place rollout kept
// every machine (and that a replacement rollout did not).
type MachineWitness struct {
	mu      sync.Mutex
	seen    map[string]bool
	deleted map[string]bool
	stop    func()
}

// WatchMachines starts a witness of the Machines of namespace; Stop ends it.
func WatchMachines(ctx context.Context, c client.WithWatch, namespace string) (*MachineWitness, error) {
	rec := &MachineWitness{seen: map[string]bool{}, deleted: map[string]bool{}}
	f, err := sim.Follow(ctx, c, &clusterv1.MachineList{}, func(ev watch.Event) {
		m, ok := ev.Object.(*clusterv1.Machine)
		if !ok {
			return
		}
		rec.mu.Lock()
		rec.seen[m.Name] = true
		if ev.Type == watch.Deleted || !m.DeletionTimestamp.IsZero() {
			rec.deleted[m.Name] = true
		}
		rec.mu.Unlock()
	}, client.InNamespace(namespace))
	if err != nil {
		return nil, fmt.Errorf("watch Machines in %s: %w", namespace, err)
	}
	rec.stop = f.Stop
	return rec, nil
}

// Deleted returns the Machines that were deleted (or began to be), sorted.
func (r *MachineWitness) Deleted() []string { return r.names(r.deleted) }

// Seen returns every Machine seen, sorted.
func (r *MachineWitness) Seen() []string { return r.names(r.seen) }

func (r *MachineWitness) names(set map[string]bool) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Stop ends the watch.
func (r *MachineWitness) Stop() { r.stop() }
