package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// pollInterval is how often a simulator without a cache looks at the cluster.
	pollInterval = 20 * time.Millisecond
	// eventResync is how often an event-driven simulator looks at the cluster without an
	// event or a delay that is due: a safety net, as an informer's resync is.
	eventResync = time.Second
)

// passLoop runs a simulator's pass over the cluster. Without a cache it polls every
// interval, as this package's simulators do by default. With one it runs the pass when
// an object of a kind the real controller watches changes, when a delay the simulator
// plays out is due (the pass names it with dueAt), and every resync. None of the real
// controllers polls: Rancher's and Fleet's are wrangler controllers, whose handlers run on
// the events of a shared informer (rancher/wrangler v3.7.0-rc.1 pkg/generic/controller.go
// registers them on rancher/lasso v0.2.9 pkg/controller/controller.go, which adds the
// informer's event handler), and the Deployment and Job controllers enqueue on their
// informers' events (kubernetes v1.36.3 pkg/controller/deployment/deployment_controller.go
// and pkg/controller/job/job_controller.go, NewController). Event-driven passes keep the simulators
// from loading the API server with lists that find nothing to do, which on a machine of
// two cores slows the requests of the upgrade itself.
type passLoop struct {
	once sync.Once
	kick chan struct{}

	mu  sync.Mutex
	due time.Time // the earliest delay the last passes wait out; zero when none
}

func (l *passLoop) init() {
	l.once.Do(func() { l.kick = make(chan struct{}, 1) })
}

// wake asks for a pass now.
func (l *passLoop) wake() {
	l.init()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// dueAt notes that a pass waits out a delay that ends at t: the next pass runs then.
func (l *passLoop) dueAt(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.due.IsZero() || t.Before(l.due) {
		l.due = t
	}
}

// takeDue returns and forgets the earliest due time.
func (l *passLoop) takeDue() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.due
	l.due = time.Time{}
	return t
}

// watch wakes the loop on every event of kinds.
func (l *passLoop) watch(ctx context.Context, cache ctrlcache.Cache, kinds []client.Object) error {
	wake := func(any) { l.wake() }
	handler := toolscache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, obj any) { wake(obj) }, DeleteFunc: wake}
	for _, kind := range kinds {
		informer, err := cache.GetInformer(ctx, kind)
		if err != nil {
			return fmt.Errorf("watch %T: %w", kind, err)
		}
		if _, err := informer.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watch %T: %w", kind, err)
		}
	}
	return nil
}

// run runs pass until ctx ends. Without a cache it runs every interval (default
// pollInterval); with one, on the events of kinds, when a due time comes, and every
// interval (default eventResync). A cache whose informers cannot be had is not used: the
// loop polls.
func (l *passLoop) run(ctx context.Context, interval time.Duration, cache ctrlcache.Cache, kinds []client.Object, pass func(context.Context)) {
	l.init()
	if cache != nil {
		if err := l.watch(ctx, cache, kinds); err != nil {
			cache = nil // poll: a simulator that cannot watch still plays its part
		}
	}
	for {
		pass(ctx)
		wait := orDefault(interval, pollInterval)
		if cache != nil {
			wait = orDefault(interval, eventResync)
			if due := l.takeDue(); !due.IsZero() && time.Until(due) < wait {
				wait = max(time.Until(due), 0)
			}
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-l.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}
