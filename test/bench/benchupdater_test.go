package main

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// The bench's updater is done at once by default; with a node time, only once that long
// has passed since its first call for the node, and it asks to be called again when it is.
func TestBenchUpdaterNodeTime(t *testing.T) {
	ctx := context.Background()
	nu := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nu-1"}}

	if res, err := newBenchUpdater(0).Reconcile(ctx, nu); err != nil || !res.Done {
		t.Fatalf("no node time: %+v, %v; want done at once", res, err)
	}

	const nodeTime = 200 * time.Millisecond
	u := newBenchUpdater(nodeTime)
	res, err := u.Reconcile(ctx, nu)
	if err != nil || res.Done || res.RequeueAfter <= 0 || res.RequeueAfter > nodeTime {
		t.Fatalf("first call: %+v, %v; want not done, called again within %s", res, err, nodeTime)
	}
	time.Sleep(res.RequeueAfter)
	if res, err := u.Reconcile(ctx, nu); err != nil || !res.Done {
		t.Fatalf("after the node time: %+v, %v; want done", res, err)
	}
	// Its start is the first call, whatever came after.
	if calls := u.firstCalls("ns"); len(calls) != 1 {
		t.Fatalf("first calls %v, want one", calls)
	}
}
