package harvesteradapter

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// readOnce is the workload cluster's client of one reconcile: a Get or List it already
// answered is answered again from what it read, until something of that kind is written
// through it. One reconcile runs several steps, and each reads what it decides on (the
// node, Longhorn's volumes, replicas, engines and nodes, the VMs): read once, those are the
// same answer a few milliseconds apart, and each further read would be a round trip to a
// workload API server that may be far away. A write of a kind drops what was read of that
// kind, so a step reads back what it wrote. Nothing is kept beyond the reconcile.
type readOnce struct {
	client.Client

	mu sync.Mutex
	// read is what was read, by kind, then by the read's key.
	read map[schema.GroupVersionKind]map[string]runtime.Object
}

func newReadOnce(c client.Client) *readOnce {
	return &readOnce{Client: c, read: map[schema.GroupVersionKind]map[string]runtime.Object{}}
}

// kindOf is the kind of obj (for a list, the list's kind), false when the scheme does
// not know it: such reads are not kept.
func (c *readOnce) kindOf(obj runtime.Object) (schema.GroupVersionKind, bool) {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	return gvk, err == nil
}

// recall copies what was read under gvk and key into obj.
func (c *readOnce) recall(gvk schema.GroupVersionKind, key string, obj runtime.Object) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept, ok := c.read[gvk][key]
	if !ok {
		return false
	}
	out := reflect.ValueOf(obj)
	in := reflect.ValueOf(kept.DeepCopyObject())
	if out.Type() != in.Type() {
		return false
	}
	out.Elem().Set(in.Elem())
	return true
}

func (c *readOnce) keep(gvk schema.GroupVersionKind, key string, obj runtime.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read[gvk] == nil {
		c.read[gvk] = map[string]runtime.Object{}
	}
	c.read[gvk][key] = obj.DeepCopyObject()
}

// forget drops what was read of obj's kind and of lists of it; for a kind the scheme
// does not know, everything.
func (c *readOnce) forget(obj runtime.Object) {
	gvk, ok := c.kindOf(obj)
	if !ok {
		c.forgetAll()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.read, gvk)
	delete(c.read, gvk.GroupVersion().WithKind(gvk.Kind+"List"))
}

func (c *readOnce) forgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.read)
}

func (c *readOnce) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	gvk, ok := c.kindOf(obj)
	if !ok || len(opts) > 0 {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	k := fmt.Sprintf("%T %s", obj, key)
	if c.recall(gvk, k, obj) {
		return nil
	}
	if err := c.Client.Get(ctx, key, obj); err != nil {
		return err
	}
	c.keep(gvk, k, obj)
	return nil
}

func (c *readOnce) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gvk, ok := c.kindOf(list)
	o := (&client.ListOptions{}).ApplyOptions(opts)
	if !ok || o.Limit != 0 || o.Continue != "" || o.Raw != nil || o.UnsafeDisableDeepCopy != nil {
		return c.Client.List(ctx, list, opts...)
	}
	k := fmt.Sprintf("%T ns=%q labels=%v fields=%v", list, o.Namespace, o.LabelSelector, o.FieldSelector)
	if c.recall(gvk, k, list) {
		return nil
	}
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	c.keep(gvk, k, list)
	return nil
}

func (c *readOnce) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	defer c.forget(obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *readOnce) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	defer c.forget(obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *readOnce) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	defer c.forget(obj)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// Apply drops everything read: an apply configuration does not say its kind the way an
// object does.
func (c *readOnce) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	defer c.forgetAll()
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *readOnce) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	defer c.forget(obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *readOnce) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	defer c.forget(obj)
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *readOnce) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c *readOnce) SubResource(subResource string) client.SubResourceClient {
	return &readOnceSubResource{SubResourceClient: c.Client.SubResource(subResource), c: c}
}

// readOnceSubResource drops what was read of a kind when a subresource of it is written.
type readOnceSubResource struct {
	client.SubResourceClient
	c *readOnce
}

func (s *readOnceSubResource) Create(ctx context.Context, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
	defer s.c.forget(obj)
	return s.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (s *readOnceSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	defer s.c.forget(obj)
	return s.SubResourceClient.Update(ctx, obj, opts...)
}

func (s *readOnceSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	defer s.c.forget(obj)
	return s.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

func (s *readOnceSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	defer s.c.forgetAll()
	return s.SubResourceClient.Apply(ctx, obj, opts...)
}

// workloadClient is the client of the workload cluster of cluster for a call of the
// updater outside a NodeUpdate's reconcile (AtTarget, Preflight, PreviewDisruption). Under
// an UpgradePreview's read snapshot (nodeupdater.WithReadSnapshot) it is the one readOnce
// of the whole computation: a read one machine's judgement made is answered to the next
// from what was read, as the steps of one reconcile share theirs. Elsewhere (the
// UpgradeTask's preflight of a node about to start) every call reads afresh.
func (u *Updater) workloadClient(ctx context.Context, cluster types.NamespacedName) (client.Client, error) {
	wc, err := u.Workloads.Client(ctx, cluster)
	if err != nil {
		return nil, err
	}
	if snap := nodeupdater.ReadSnapshotFrom(ctx); snap != nil {
		return snap.WorkloadClient(cluster, func() client.Client { return newReadOnce(wc) }), nil
	}
	return wc, nil
}
