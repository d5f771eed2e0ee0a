package sim

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Follower is a watch that does not end when the API server ends it. The API server
// closes a watch whose reader falls behind (k8s.io/apiserver v0.36.3
// pkg/storage/cacher/cache_watcher.go, "Forcing watcher close due to unresponsiveness",
// which a loaded 2-core CI machine triggers) and every watch at its request timeout; a
// witness that stopped there would miss the rest of the run and pass blind (CI stop 59:
// a NodeUpdate's final phase never reached the drain-policy spec's witness). A Follower
// watches again from the last resource version it saw, as client-go's reflector does, so
// no stored change is lost; only if that version is gone from the server's window (410
// Gone) does it list again, and Gaps counts those times.
type Follower struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	gaps   int
}

// Follow starts following the objects of list that opts select, handing every change to
// on, in the order the API server stored them, from a goroutine of its own; first come
// the objects that exist, as Added. Stop ends it.
func Follow(ctx context.Context, c client.WithWatch, list client.ObjectList, on func(watch.Event), opts ...client.ListOption) (*Follower, error) {
	fctx, cancel := context.WithCancel(ctx)
	first, err := c.Watch(fctx, list, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	f := &Follower{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		w, rv := first, ""
		for {
			var gone bool
			rv, gone = f.drain(w, rv, on)
			if fctx.Err() != nil {
				return
			}
			for {
				if gone {
					f.mu.Lock()
					f.gaps++
					f.mu.Unlock()
				}
				again := append(append([]client.ListOption(nil), opts...),
					&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
				next, err := c.Watch(fctx, list.DeepCopyObject().(client.ObjectList), again...)
				if err == nil {
					w = next
					break
				}
				if fctx.Err() != nil {
					return
				}
				if gone = isGone(err); gone {
					rv = ""
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return f, nil
}

// drain hands w's events to on until w ends, and returns the resource version to watch
// again from: the last one seen, or "" and gone when the server no longer has it.
func (f *Follower) drain(w watch.Interface, rv string, on func(watch.Event)) (string, bool) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			if st, ok := ev.Object.(*metav1.Status); ok && st.Code == http.StatusGone {
				return "", true
			}
			continue
		}
		if o, ok := ev.Object.(client.Object); ok {
			rv = o.GetResourceVersion()
		}
		if ev.Type != watch.Bookmark {
			on(ev)
		}
	}
	return rv, false
}

func isGone(err error) bool {
	var st interface{ Status() metav1.Status }
	return errors.As(err, &st) && st.Status().Code == http.StatusGone
}

// Gaps counts the times the follower had to list again because the server no longer had
// the changes since its last resource version: changes in between may be missing.
func (f *Follower) Gaps() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gaps
}

// Stop ends the follower and waits for its last event to be handed on.
func (f *Follower) Stop() {
	f.cancel()
	<-f.done
}
