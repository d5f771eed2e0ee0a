package capienv

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
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

// CordonWitness watches the Nodes of a workload cluster and keeps every set of Nodes that
// were cordoned (spec.unschedulable) at once, so a spec can assert the most cordoned at
// any moment of a run, not only at its end.
type CordonWitness struct {
	mu       sync.Mutex
	cordoned map[string]bool
	history  []map[string]bool
	stop     context.CancelFunc
}

// WatchCordons starts a CordonWitness of the workload cluster namespace/cluster, reached
// through its kubeconfig Secret.
func WatchCordons(ctx context.Context, mgmt client.Client, scheme *runtime.Scheme, namespace, cluster string) (*CordonWitness, error) {
	secret := &corev1.Secret{}
	if err := mgmt.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster + "-kubeconfig"}, secret); err != nil {
		return nil, fmt.Errorf("read the kubeconfig of %s/%s: %w", namespace, cluster, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
	if err != nil {
		return nil, err
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w, err := wc.Watch(ctx, &corev1.NodeList{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch the Nodes of %s/%s: %w", namespace, cluster, err)
	}
	r := &CordonWitness{cordoned: map[string]bool{}, stop: func() { cancel(); w.Stop() }}
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			r.mu.Lock()
			now := n.Spec.Unschedulable && ev.Type != watch.Deleted
			if now != r.cordoned[n.Name] {
				set := maps.Clone(r.cordoned)
				if now {
					set[n.Name] = true
				} else {
					delete(set, n.Name)
				}
				r.cordoned = set
				r.history = append(r.history, set)
			}
			r.mu.Unlock()
		}
	}()
	return r, nil
}

// MaxCordoned is the most of nodes cordoned at once since the witness started.
func (r *CordonWitness) MaxCordoned(nodes ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	most := 0
	for _, set := range r.history {
		n := 0
		for _, node := range nodes {
			if set[node] {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// Cordoned are the Nodes cordoned now, as last seen.
func (r *CordonWitness) Cordoned() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.cordoned))
}

// Stop ends the watch.
func (r *CordonWitness) Stop() { r.stop() }
