package nodeupdater

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ReadSnapshot is what one computation that only reads, an UpgradePreview, lets an
// updater share between its calls for the machines it judges (AtTarget, Preflight,
// PreviewDisruption): per workload cluster, one client that answers a read it already
// made from what it read. Judging six nodes then reads the workload cluster once, not
// once per node and per check, and every node is judged on the same state of it. The
// updater's code is the run's; only its reads are shared. A run has no snapshot: each of
// its reconciles reads afresh.
type ReadSnapshot struct {
	mu      sync.Mutex
	clients map[types.NamespacedName]client.Client
}

type readSnapshotKey struct{}

// WithReadSnapshot returns ctx carrying a new, empty ReadSnapshot. It lives as long as the
// computation that made it; nothing is kept beyond it.
func WithReadSnapshot(ctx context.Context) context.Context {
	return context.WithValue(ctx, readSnapshotKey{}, &ReadSnapshot{clients: map[types.NamespacedName]client.Client{}})
}

// ReadSnapshotFrom returns the ReadSnapshot ctx carries, nil when it carries none.
func ReadSnapshotFrom(ctx context.Context) *ReadSnapshot {
	s, _ := ctx.Value(readSnapshotKey{}).(*ReadSnapshot)
	return s
}

// WorkloadClient returns the snapshot's client of the workload cluster of the Cluster
// cluster, made by newClient on the first call for that cluster.
func (s *ReadSnapshot) WorkloadClient(cluster types.NamespacedName, newClient func() client.Client) client.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[cluster]
	if !ok {
		c = newClient()
		s.clients[cluster] = c
	}
	return c
}
