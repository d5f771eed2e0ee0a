// Package ctrlqueue chooses the work queue of capi-inplace's controllers.
package ctrlqueue

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
)

// Options returns o with controller-runtime's rate-limited work queue, unless the caller
// chose a queue. controller-runtime v0.24.1's priority queue (its default) can keep a
// stopping manager waiting for its whole grace period: it hands a ready item to a waiting
// worker while it holds its locks, and a worker that stopped waiting because the queue
// shut down leaves that hand-over blocked, and with it the next worker that ends a
// reconcile (Done takes the same lock). The manager then gives up after its grace period
// instead of stopping at once; a rolling update or a leader hand-over waits for it.
func Options(o controller.Options) controller.Options {
	if o.UsePriorityQueue == nil {
		o.UsePriorityQueue = ptr.To(false)
	}
	return o
}
