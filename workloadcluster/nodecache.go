package workloadcluster

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// nodeCacheSyncTimeout bounds the first list of a workload cluster's Nodes.
	nodeCacheSyncTimeout = 10 * time.Second
	// nodeCacheIdle is how long a workload cluster's Node cache lives unread.
	nodeCacheIdle = 10 * time.Minute
	// SecretRecheck is how often the kubeconfig Secret behind a Node cache, or a client
	// of Clients with Recheck set to it, is read again, so that a rotated kubeconfig is
	// picked up.
	SecretRecheck = 10 * time.Second
)

// NodeCaches hands out clients of workload clusters whose Node lists are served from a
// watch of the cluster's Nodes, kept per Cluster, as Cluster API's ClusterCache does for
// its controllers: an UpgradeTask reconcile reads every Node of its workload cluster, and
// listing them from the API server each time costs a round trip and a decode that grow
// with the cluster. Every other read and write goes to the API server, as Clients does.
//
// A cache is started on the first read of a Cluster's Nodes, rebuilt when its kubeconfig
// Secret changes, and stopped once unread for nodeCacheIdle. Once a request of the cache
// failed (the workload API server refused, reset or timed out a connection, answered
// 5xx, or the watch failed), Nodes are listed from the API server until the cluster
// answers the cache again: a cache never answers for a workload cluster it may have lost
// sight of.
//
// NodeCaches is a manager.Runnable: its caches end with the manager.
type NodeCaches struct {
	// Clients builds the clients and REST configs of the workload clusters.
	Clients *Clients
	// OnNodeChange, when set, is called, from the watch, for every change of a Node a
	// step may wait for: its labels (System Upgrade Controller marks a finished Plan with
	// one), annotations, spec (cordon, taints), Ready condition or node info (the kubelet's
	// version, the OS image). It must not block. A
	// cache runs only while read, so it is a hint to act sooner than the next poll, never
	// the only way a change is seen. Set it before the manager starts.
	OnNodeChange func(cluster types.NamespacedName, node string)

	started chan struct{}
	once    sync.Once
	ctx     context.Context

	mu     sync.Mutex
	caches map[types.NamespacedName]*nodeCache
}

type nodeCache struct {
	// config is the REST config the cache was built from: the same pointer until the
	// kubeconfig Secret changes.
	config *rest.Config
	// direct is the uncached client of the workload cluster.
	direct client.Client
	cache  ctrlcache.Cache
	cancel context.CancelFunc // use stop
	synced chan struct{}

	mu        sync.Mutex
	checked   time.Time // kubeconfig Secret last read
	lastRead  time.Time
	lastError time.Time // last failed request or watch error
	lastOK    time.Time // last request answered, or Node delivered
	syncErr   error
	stopped   bool
	// firstErr receives the first watch error, which ends the wait for the first list.
	firstErr chan error
}

func (n *NodeCaches) init() {
	n.once.Do(func() {
		n.started = make(chan struct{})
		n.caches = map[types.NamespacedName]*nodeCache{}
	})
}

// Start implements manager.Runnable: caches run within the manager's lifetime, and those
// unread for a while are stopped.
func (n *NodeCaches) Start(ctx context.Context) error {
	n.init()
	n.ctx = ctx
	close(n.started)
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			n.mu.Lock()
			for key, c := range n.caches {
				c.stop()
				delete(n.caches, key)
			}
			n.mu.Unlock()
			return nil
		case <-tick.C:
			n.mu.Lock()
			for key, c := range n.caches {
				c.mu.Lock()
				idle := time.Since(c.lastRead) > nodeCacheIdle
				c.mu.Unlock()
				if idle {
					c.stop()
					delete(n.caches, key)
				}
			}
			n.mu.Unlock()
		}
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: caches are started by the
// reads of the controllers, and must outlive them.
func (n *NodeCaches) NeedLeaderElection() bool { return false }

// Client returns a client of the workload cluster of the Cluster namespace/name whose
// lists of Nodes come from the cluster's Node cache. Before the manager started the
// caches it is the direct client of Clients.
func (n *NodeCaches) Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error) {
	n.init()
	select {
	case <-n.started:
	default:
		return n.Clients.Client(ctx, cluster)
	}
	c, err := n.current(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return &nodeCachingClient{Client: c.direct, caches: n, cluster: cluster, cache: c}, nil
}

// Forget stops the Node cache of a Cluster and drops its client.
func (n *NodeCaches) Forget(cluster types.NamespacedName) {
	n.init()
	n.mu.Lock()
	if c, ok := n.caches[cluster]; ok {
		c.stop()
		delete(n.caches, cluster)
	}
	n.mu.Unlock()
	n.Clients.Forget(cluster)
}

// nodeCachingClient serves lists of all Nodes from the cluster's Node cache.
type nodeCachingClient struct {
	client.Client
	caches  *NodeCaches
	cluster types.NamespacedName
	cache   *nodeCache
}

func (c *nodeCachingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	nodes, ok := list.(*corev1.NodeList)
	if !ok || !onlyUnsafeDisableDeepCopy(opts) {
		return c.Client.List(ctx, list, opts...)
	}
	cache, err := c.caches.reader(ctx, c.cluster, c.cache)
	if err != nil {
		return err
	}
	if cache == nil {
		return c.Client.List(ctx, nodes)
	}
	return cache.List(ctx, nodes, opts...)
}

// onlyUnsafeDisableDeepCopy says whether a List of every Node asks for nothing but,
// perhaps, the cached Nodes themselves (client.UnsafeDisableDeepCopy: the caller only
// reads them): such a List is served from the cache.
func onlyUnsafeDisableDeepCopy(opts []client.ListOption) bool {
	for _, o := range opts {
		if o != client.UnsafeDisableDeepCopy {
			return false
		}
	}
	return true
}

// reader returns the synced Node cache c of a Cluster, or nil when its Nodes are to be
// listed from the API server: the watch failed since it last delivered a Node.
func (n *NodeCaches) reader(ctx context.Context, cluster types.NamespacedName, c *nodeCache) (ctrlcache.Cache, error) {
	select {
	case <-c.synced:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c.mu.Lock()
	c.lastRead = time.Now()
	syncErr, live := c.syncErr, c.stopped || c.lastError.After(c.lastOK)
	c.mu.Unlock()
	switch {
	case syncErr != nil:
		n.drop(cluster, c)
		return nil, syncErr
	case live:
		return nil, nil
	}
	return c.cache, nil
}

// current returns the Node cache of a Cluster for its current kubeconfig.
func (n *NodeCaches) current(ctx context.Context, cluster types.NamespacedName) (*nodeCache, error) {
	n.mu.Lock()
	c, ok := n.caches[cluster]
	n.mu.Unlock()
	if ok {
		c.mu.Lock()
		fresh := time.Since(c.checked) < SecretRecheck
		c.mu.Unlock()
		if fresh {
			return c, nil
		}
	}
	e, err := n.Clients.entry(ctx, cluster)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.caches[cluster]; ok {
		if c.config == e.config {
			c.mu.Lock()
			c.checked = time.Now()
			c.mu.Unlock()
			return c, nil
		}
		c.stop() // the kubeconfig changed
		delete(n.caches, cluster)
	}
	c, err = n.start(cluster, e)
	if err != nil {
		return nil, err
	}
	n.caches[cluster] = c
	return c, nil
}

// start starts a Node cache of a workload cluster; it is synced when c.synced is closed.
func (n *NodeCaches) start(cluster types.NamespacedName, e entry) (*nodeCache, error) {
	c := &nodeCache{config: e.config, direct: e.client, synced: make(chan struct{}), firstErr: make(chan error, 1), checked: time.Now(), lastRead: time.Now()}
	// The reflector retries a refused connection by itself and reports no error for it:
	// the cache's own requests say whether the workload cluster answers.
	cfg := rest.CopyConfig(e.config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &healthTracking{next: rt, cache: c} })
	cache, err := ctrlcache.New(cfg, ctrlcache.Options{
		Scheme: n.Clients.Scheme,
		ByObject: map[client.Object]ctrlcache.ByObject{
			&corev1.Node{}: {Transform: c.seen},
		},
		DefaultWatchErrorHandler: func(_ context.Context, _ *toolscache.Reflector, err error) {
			c.failed(err)
			ctrl.LoggerFrom(n.ctx).V(1).Info("watch of workload cluster Nodes failed; listing them from its API server until it recovers", "cluster", cluster, "reason", err.Error())
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create the Node cache of workload cluster %s: %w", cluster, err)
	}
	ctx, cancel := context.WithCancel(n.ctx)
	c.cache, c.cancel = cache, cancel
	go func() { _ = cache.Start(ctx) }()
	go func() {
		defer close(c.synced)
		sctx, scancel := context.WithTimeout(ctx, nodeCacheSyncTimeout)
		defer scancel()
		listed := make(chan error, 1)
		go func() {
			informer, err := cache.GetInformer(sctx, &corev1.Node{})
			if err == nil && n.OnNodeChange != nil {
				_, err = informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
					if name, changed := nodeChanged(oldObj, newObj); changed {
						n.OnNodeChange(cluster, name)
					}
				}})
			}
			if err == nil && !cache.WaitForCacheSync(sctx) {
				err = fmt.Errorf("no list of its Nodes within %s", nodeCacheSyncTimeout)
			}
			listed <- err
		}()
		var err error
		select {
		case err = <-listed:
		case err = <-c.firstErr: // unreachable: as a direct list would, fail now
		}
		if err != nil {
			c.setSyncErr(fmt.Errorf("watch Nodes: %w", err))
		}
	}()
	return c, nil
}

// stop stops the cache; a client still holding it lists Nodes from the API server.
func (c *nodeCache) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.cancel()
}

func (c *nodeCache) setSyncErr(err error) {
	c.mu.Lock()
	c.syncErr = err
	c.mu.Unlock()
}

// seen is the cache's transform of every Node the watch delivers: it notes that the
// watch works, and drops what no reader here needs (the images a node holds, managed
// fields), which is most of a Node's size.
func (c *nodeCache) seen(obj any) (any, error) {
	c.ok()
	if node, ok := obj.(*corev1.Node); ok {
		node.ManagedFields = nil
		node.Status.Images = nil
	}
	return obj, nil
}

// nodeChanged reports whether a Node changed in what OnNodeChange reports, and its name.
func nodeChanged(oldObj, newObj any) (string, bool) {
	before, ok1 := oldObj.(*corev1.Node)
	after, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return "", false
	}
	changed := !maps.Equal(before.Labels, after.Labels) || !maps.Equal(before.Annotations, after.Annotations) ||
		!equality.Semantic.DeepEqual(before.Spec, after.Spec) || readyOf(before) != readyOf(after) ||
		before.Status.NodeInfo != after.Status.NodeInfo
	return after.Name, changed
}

// readyOf is the status of a Node's Ready condition, empty when it has none.
func readyOf(node *corev1.Node) corev1.ConditionStatus {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// ok notes that the workload cluster answered.
func (c *nodeCache) ok() {
	c.mu.Lock()
	c.lastOK = time.Now()
	c.mu.Unlock()
}

// failed notes that a request of the cache failed: Nodes are listed live until the
// cluster answers again, and a cache not synced yet gives up.
func (c *nodeCache) failed(err error) {
	c.mu.Lock()
	c.lastError = time.Now()
	c.mu.Unlock()
	select {
	case c.firstErr <- err:
	default:
	}
}

// healthTracking notes, for each request of a Node cache, whether the workload cluster
// answered: a transport error or a 5xx is a failure, a 2xx an answer.
type healthTracking struct {
	next  http.RoundTripper
	cache *nodeCache
}

func (h *healthTracking) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.next.RoundTrip(req)
	switch {
	case err != nil:
		if req.Context().Err() == nil { // not the cache being stopped
			h.cache.failed(err)
		}
	case resp.StatusCode >= 500:
		h.cache.failed(fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status))
	case resp.StatusCode < 300:
		h.cache.ok()
	}
	return resp, err
}

// drop stops a cache that failed to sync, so that the next read tries again.
func (n *NodeCaches) drop(cluster types.NamespacedName, c *nodeCache) {
	c.stop()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.caches[cluster] == c {
		delete(n.caches, cluster)
	}
}
