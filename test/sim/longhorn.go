package sim

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/dataengine"
)

// Longhorn plays Longhorn's live v2 data engine upgrade: every DataEngineUpgradeManager
// in Namespace moves from pending through upgrading to completed after Duration, or to
// error for a node told to fail. It records the nodes it upgraded, in order.
type Longhorn struct {
	// Client reaches the workload cluster (which must serve DataEngineUpgradeManager).
	Client client.Client
	// Namespace is Longhorn's namespace (longhorn-system).
	Namespace string
	// Duration is how long an upgrade takes. Default 100ms.
	Duration time.Duration

	mu       sync.Mutex
	fails    map[string]string
	upgraded []string
}

// FailNode makes the upgrade of node end in error with message.
func (l *Longhorn) FailNode(node, message string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fails == nil {
		l.fails = map[string]string{}
	}
	l.fails[node] = message
}

// Upgraded returns the nodes whose data engine was upgraded, in order.
func (l *Longhorn) Upgraded() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.upgraded...)
}

// Run plays Longhorn until ctx ends.
func (l *Longhorn) Run(ctx context.Context) {
	for {
		l.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (l *Longhorn) pass(ctx context.Context) {
	list := &dataengine.DataEngineUpgradeManagerList{}
	if err := l.Client.List(ctx, list, client.InNamespace(l.Namespace)); err != nil {
		return
	}
	duration := l.Duration
	if duration == 0 {
		duration = 100 * time.Millisecond
	}
	for i := range list.Items {
		dum := &list.Items[i]
		state, message := dum.Status.State, ""
		switch state {
		case dataengine.UpgradeStateUndefined, dataengine.UpgradeStatePending:
			state = dataengine.UpgradeStateUpgrading
		case dataengine.UpgradeStateUpgrading:
			if time.Since(dum.CreationTimestamp.Time) < duration {
				continue
			}
			state = dataengine.UpgradeStateCompleted
			l.mu.Lock()
			for _, n := range dum.Spec.Nodes {
				if m, ok := l.fails[n]; ok {
					state, message = dataengine.UpgradeStateError, m
				}
			}
			if state == dataengine.UpgradeStateCompleted {
				l.upgraded = append(l.upgraded, dum.Spec.Nodes...)
			}
			l.mu.Unlock()
		default:
			continue
		}
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &dataengine.DataEngineUpgradeManager{}
			if err := l.Client.Get(ctx, client.ObjectKeyFromObject(dum), cur); err != nil {
				return err
			}
			cur.Status.State, cur.Status.Message = state, message
			return l.Client.Status().Update(ctx, cur)
		})
	}
}
