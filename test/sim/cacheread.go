package sim

import (
	"context"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cacheCatchUp bounds how long a simulator waits for its informer cache to show its own
// write. An informer sees a write within milliseconds; the bound only keeps a simulator
// from hanging on an API server that stopped.
const cacheCatchUp = 2 * time.Second

// awaitCached waits until cache holds obj at the resourceVersion a write of the simulator
// returned, or a later one: the simulator's next pass then reads its own write, as a real
// controller's next sync does once its informer has the event. Resource versions are
// opaque to clients in general; on this API server they are etcd's revisions, which
// only grow, and the API server's watch cache compares them as numbers too. Without a
// cache, or without a number, there is nothing to wait for.
func awaitCached(ctx context.Context, cache client.Reader, obj client.Object) {
	if cache == nil {
		return
	}
	want, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	cached := obj.DeepCopyObject().(client.Object)
	deadline := time.Now().Add(cacheCatchUp)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		err := cache.Get(ctx, client.ObjectKeyFromObject(obj), cached)
		if err == nil {
			if got, perr := strconv.ParseUint(cached.GetResourceVersion(), 10, 64); perr != nil || got >= want {
				return
			}
		} else if !apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// awaitGone waits until cache no longer holds obj (or holds another object of its name,
// created since), after the simulator deleted it.
func awaitGone(ctx context.Context, cache client.Reader, obj client.Object) {
	if cache == nil {
		return
	}
	cached := obj.DeepCopyObject().(client.Object)
	deadline := time.Now().Add(cacheCatchUp)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		err := cache.Get(ctx, client.ObjectKeyFromObject(obj), cached)
		if apierrors.IsNotFound(err) || (err == nil && cached.GetUID() != obj.GetUID()) || (err != nil && !apierrors.IsNotFound(err)) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}
