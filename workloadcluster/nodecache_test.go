package workloadcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// env is the one test API server of this file. It plays the management cluster (the
// kubeconfig Secrets) and every workload cluster (the Nodes).
var env *testenv.Environment

func TestMain(m *testing.M) {
	ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 1}))
	var err error
	env, err = testenv.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "start the test API server: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop the test API server: %v\n", err)
	}
	os.Exit(code)
}

// requestCounter counts the requests a workload cluster's clients send, by verb (get,
// list, watch, create, ...) and resource.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *requestCounter) configure(cfg *rest.Config) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &countingTransport{next: rt, counter: c}
	})
}

func (c *requestCounter) count(verb, resource string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[verb+" "+resource]
}

func (c *requestCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.counts)
}

type countingTransport struct {
	next    http.RoundTripper
	counter *requestCounter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if verb, resource := classify(req); resource != "" {
		t.counter.mu.Lock()
		if t.counter.counts == nil {
			t.counter.counts = map[string]int{}
		}
		t.counter.counts[verb+" "+resource]++
		t.counter.mu.Unlock()
	}
	return t.next.RoundTrip(req)
}

// classify returns the verb and resource of a request of the Kubernetes API; resource is
// empty for discovery and other non-resource requests.
func classify(req *http.Request) (verb, resource string) {
	segments := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(segments) >= 3 && segments[0] == "api":
		rest = segments[2:]
	case len(segments) >= 4 && segments[0] == "apis":
		rest = segments[3:]
	default:
		return "", ""
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	resource = rest[0]
	named := len(rest) >= 2
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}

// testClients returns Clients reading kubeconfig Secrets from the test API server, whose
// workload cluster clients count their requests.
func testClients() (*Clients, *requestCounter) {
	counter := &requestCounter{}
	return &Clients{Reader: env.Client, Scheme: env.Scheme, Configure: counter.configure}, counter
}

// startCaches starts caches as a manager would, returns once they are started, and
// stops them at the end of the test.
func startCaches(t *testing.T, clients *Clients) *NodeCaches {
	t.Helper()
	return start(t, &NodeCaches{Clients: clients})
}

// start starts caches as a manager would, returns once they are started, and stops them
// at the end of the test.
func start(t *testing.T, caches *NodeCaches) *NodeCaches {
	t.Helper()
	caches.init()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- caches.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("NodeCaches.Start returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("NodeCaches.Start did not return after its context ended")
		}
	})
	select {
	case <-caches.started:
	case <-time.After(10 * time.Second):
		t.Fatal("NodeCaches.Start did not start")
	}
	return caches
}

// workloadCluster creates a namespace of its own for the test and the kubeconfig Secret
// of a Cluster in it, and returns the Cluster.
func workloadCluster(t *testing.T, kubeconfig []byte) types.NamespacedName {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "nodecache-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	cluster := types.NamespacedName{Namespace: ns.Name, Name: "workload"}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: KubeconfigSecretName(cluster.Name)},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfig},
	}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatalf("create kubeconfig Secret: %v", err)
	}
	return cluster
}

func envKubeconfig(t *testing.T) []byte {
	t.Helper()
	data, err := env.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// createNode creates a Node of the workload cluster (the test API server), deleted at
// the end of the test.
func createNode(t *testing.T, prefix string) string {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := env.Client.Create(context.Background(), node); err != nil {
		t.Fatalf("create Node: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), node); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Node %s: %v", node.Name, err)
		}
	})
	return node.Name
}

// listNodes lists the Nodes through c as a reconcile does (no options) and returns their
// names.
func listNodes(ctx context.Context, c client.Client) (map[string]bool, error) {
	list := &corev1.NodeList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, node := range list.Items {
		names[node.Name] = true
	}
	return names, nil
}

func mustListNodes(t *testing.T, c client.Client, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, err := listNodes(ctx, c)
	if err != nil {
		t.Fatalf("list Nodes: %v", err)
	}
	for _, name := range want {
		if !names[name] {
			t.Fatalf("list of Nodes %v lacks Node %s", names, name)
		}
	}
}

// eventually calls f every 250ms until it returns nil, and fails the test with its last
// error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func cachedClient(t *testing.T, caches *NodeCaches, cluster types.NamespacedName) *nodeCachingClient {
	t.Helper()
	c, err := caches.Client(context.Background(), cluster)
	if err != nil {
		t.Fatalf("client of workload cluster: %v", err)
	}
	cached, ok := c.(*nodeCachingClient)
	if !ok {
		t.Fatalf("started NodeCaches gave a %T, not a Node caching client", c)
	}
	return cached
}

func TestNodeCacheServesListsFromWatch(t *testing.T) {
	first, second := createNode(t, "cached"), createNode(t, "cached")
	cluster := workloadCluster(t, envKubeconfig(t))
	clients, counter := testClients()
	caches := startCaches(t, clients)

	c := cachedClient(t, caches, cluster)
	mustListNodes(t, c, first, second)
	if counter.count("watch", "nodes") == 0 {
		t.Errorf("the first list of Nodes through the started caches sent no WATCH of Nodes: %v", counter)
	}

	lists := counter.count("list", "nodes")
	for range 5 {
		mustListNodes(t, cachedClient(t, caches, cluster), first, second)
	}
	if got := counter.count("list", "nodes"); got != lists {
		t.Errorf("lists of Nodes once the cache synced sent %d LIST nodes requests, want none", got-lists)
	}
	// A reader of the cached Nodes themselves (an UpgradeTask reconcile) is served from the
	// cache too; any other option goes to the API server.
	uncopied := &corev1.NodeList{}
	if err := c.List(context.Background(), uncopied, client.UnsafeDisableDeepCopy); err != nil {
		t.Fatalf("list Nodes with UnsafeDisableDeepCopy: %v", err)
	}
	if got := counter.count("list", "nodes"); got != lists || len(uncopied.Items) < 2 {
		t.Errorf("a list of Nodes with UnsafeDisableDeepCopy sent %d LIST nodes requests and gave %d Nodes, want none and at least 2", got-lists, len(uncopied.Items))
	}
	if err := c.List(context.Background(), &corev1.NodeList{}, client.MatchingLabels{"absent": "x"}); err != nil {
		t.Fatalf("list Nodes by label: %v", err)
	}
	if got := counter.count("list", "nodes"); got != lists+1 {
		t.Errorf("a list of Nodes by label sent %d LIST nodes requests, want 1 (served by the API server)", got-lists)
	}
	lists++

	third := createNode(t, "cached")
	eventually(t, 30*time.Second, "a Node created after the sync is listed", func() error {
		names, err := listNodes(context.Background(), c)
		if err != nil {
			return err
		}
		if !names[third] {
			return fmt.Errorf("Node %s not in %v", third, names)
		}
		return nil
	})
	if got := counter.count("list", "nodes"); got != lists {
		t.Errorf("the new Node reached the list through %d LIST nodes requests, want through the watch", got-lists)
	}
}

// TestNodeCacheReportsNodeChanges: OnNodeChange hears of what a step waits for on a Node
// (a label, the cordon, the Ready condition, the kubelet's version), not of a kubelet's
// heartbeat.
func TestNodeCacheReportsNodeChanges(t *testing.T) {
	node := createNode(t, "changes")
	cluster := workloadCluster(t, envKubeconfig(t))
	clients, _ := testClients()
	var mu sync.Mutex
	var heard []string
	caches := start(t, &NodeCaches{Clients: clients, OnNodeChange: func(c types.NamespacedName, name string) {
		if name != node {
			return // another test's Node
		}
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, c.String())
	}})
	mustListNodes(t, cachedClient(t, caches, cluster), node)
	heardNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), heard...)
	}
	ctx := context.Background()
	change := func(what string, edit func(*corev1.Node), status bool) {
		t.Helper()
		n := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			t.Fatalf("get Node %s: %v", node, err)
		}
		edit(n)
		write := env.Client.Update
		if status {
			write = func(ctx context.Context, obj client.Object, _ ...client.UpdateOption) error {
				return env.Client.Status().Update(ctx, obj)
			}
		}
		if err := write(ctx, n); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// want waits until OnNodeChange was called n times in all.
	want := func(n int, after string) {
		t.Helper()
		eventually(t, 10*time.Second, "OnNodeChange after "+after, func() error {
			if got := heardNow(); len(got) != n {
				return fmt.Errorf("OnNodeChange called %d times (%v), want %d", len(got), got, n)
			}
			return nil
		})
	}
	ready := func(status corev1.ConditionStatus, heartbeat time.Time) func(*corev1.Node) {
		return func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(heartbeat), Reason: "KubeletReady"}}
		}
	}
	t0 := time.Now()
	change("the kubelet reports Ready", ready(corev1.ConditionTrue, t0), true)
	want(1, "Ready")
	change("a heartbeat", ready(corev1.ConditionTrue, t0.Add(10*time.Second)), true)
	change("a label", func(n *corev1.Node) { n.Labels = map[string]string{"plan.upgrade.cattle.io/drain": "hash"} }, false)
	want(2, "a heartbeat, then a label (the heartbeat is not reported)")
	change("the cordon", func(n *corev1.Node) { n.Spec.Unschedulable = true }, false)
	want(3, "the cordon")
	change("the reboot", ready(corev1.ConditionUnknown, t0.Add(20*time.Second)), true)
	want(4, "NotReady")
	change("the new kubelet", func(n *corev1.Node) { n.Status.NodeInfo.KubeletVersion = "v1.34.1+rke2r1" }, true)
	want(5, "the kubelet's new version")
	for _, got := range heardNow() {
		if got != cluster.String() {
			t.Errorf("OnNodeChange named Cluster %s, want %s", got, cluster)
		}
	}
}

func TestNodeCacheBeforeStartListsLive(t *testing.T) {
	node := createNode(t, "live")
	cluster := workloadCluster(t, envKubeconfig(t))
	clients, counter := testClients()
	caches := &NodeCaches{Clients: clients}

	c, err := caches.Client(context.Background(), cluster)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		mustListNodes(t, c, node)
		if got := counter.count("list", "nodes"); got != i {
			t.Errorf("after %d lists of Nodes before Start, %d LIST nodes requests were sent, want %d", i, got, i)
		}
	}
	if got := counter.count("watch", "nodes"); got != 0 {
		t.Errorf("Nodes were watched (%d WATCH nodes requests) before Start", got)
	}
}

func TestNodeCacheRebuiltWhenSecretChanges(t *testing.T) {
	ctx := context.Background()
	node := createNode(t, "rotated")
	kubeconfig := envKubeconfig(t)
	cluster := workloadCluster(t, kubeconfig)
	clients, counter := testClients()
	caches := startCaches(t, clients)

	built := time.Now()
	old := cachedClient(t, caches, cluster)
	mustListNodes(t, old, node)
	watches := counter.count("watch", "nodes")
	if watches == 0 {
		t.Fatalf("no WATCH of Nodes for the first cache: %v", counter)
	}

	// The same server, the same credentials, a kubeconfig written differently.
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.CurrentContext].Namespace = "kube-system"
	rotated, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: cluster.Namespace, Name: KubeconfigSecretName(cluster.Name)}, secret); err != nil {
		t.Fatal(err)
	}
	secret.Data[KubeconfigSecretKey] = rotated
	if err := env.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}

	// Within SecretRecheck of the cache's start the Secret is not read again.
	again := cachedClient(t, caches, cluster)
	if time.Since(built) < SecretRecheck/2 && again.cache != old.cache {
		t.Errorf("the Secret was read again %s after the cache started, before SecretRecheck (%s)", time.Since(built), SecretRecheck)
	}

	var current *nodeCachingClient
	eventually(t, SecretRecheck+30*time.Second, "a new cache is built from the changed Secret", func() error {
		current = cachedClient(t, caches, cluster)
		if _, err := listNodes(ctx, current); err != nil {
			return err
		}
		if current.cache == old.cache {
			return errors.New("still the first cache")
		}
		return nil
	})
	if got := counter.count("watch", "nodes"); got <= watches {
		t.Errorf("the new cache sent no WATCH of Nodes: %v", counter)
	}
	mustListNodes(t, current, node)

	old.cache.mu.Lock()
	stopped := old.cache.stopped
	old.cache.mu.Unlock()
	if !stopped {
		t.Error("the cache of the former kubeconfig was not stopped")
	}
	lists := counter.count("list", "nodes")
	mustListNodes(t, old, node)
	if got := counter.count("list", "nodes"); got != lists+1 {
		t.Errorf("a client of the former cache sent %d LIST nodes requests, want 1 (a live list)", got-lists)
	}
}

// closedPort returns a local TCP port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// unreachableKubeconfig is a kubeconfig of an API server no one listens for.
func unreachableKubeconfig(port int) []byte {
	return kubeconfigFor(fmt.Sprintf("https://127.0.0.1:%d", port))
}

func TestNodeCacheUnreachableClusterFails(t *testing.T) {
	cluster := workloadCluster(t, unreachableKubeconfig(closedPort(t)))
	clients, _ := testClients()
	caches := startCaches(t, clients)

	for i := range 2 { // the second read builds the cache again
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := caches.Client(ctx, cluster)
		if err == nil {
			_, err = listNodes(ctx, c)
		}
		switch {
		case err == nil:
			t.Errorf("read %d: listed the Nodes of an unreachable workload cluster", i+1)
		case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
			t.Errorf("read %d: the list of an unreachable workload cluster's Nodes hung until the deadline: %v", i+1, err)
		case strings.Contains(err.Error(), "no list of its Nodes within"):
			t.Errorf("read %d: the list waited for the sync timeout instead of failing on the watch error: %v", i+1, err)
		case !nodeupdater.IsUnreachable(err):
			t.Errorf("read %d: the NodeUpdate reconciler would count %v against a step's attempts instead of waiting for the cluster", i+1, err)
		default:
			t.Logf("read %d: %v", i+1, err)
		}
		cancel()
	}
}

// TestNodeCacheWatchErrorFailsFirstList reaches the wait for the first sync (the
// unreachable cluster of TestNodeCacheUnreachableClusterFails fails before, at
// discovery): a user who may discover the API but not list Nodes.
func TestNodeCacheWatchErrorFailsFirstList(t *testing.T) {
	cfg, err := clientcmd.Load(envKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Impersonate = "nodecache-nobody"
	kubeconfig, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	cluster := workloadCluster(t, kubeconfig)
	clients, counter := testClients()
	caches := startCaches(t, clients)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := cachedClient(t, caches, cluster)
	_, err = listNodes(ctx, c)
	switch {
	case err == nil:
		t.Fatal("listed the Nodes of a workload cluster whose user may not list them")
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("the first list hung until the deadline: %v", err)
	case strings.Contains(err.Error(), "no list of its Nodes within"):
		t.Fatalf("the first list waited for the sync timeout instead of failing on the watch error: %v", err)
	case !apierrors.IsForbidden(err):
		t.Errorf("the first list failed with %v, want the API server's Forbidden", err)
	}
	if counter.count("list", "nodes")+counter.count("watch", "nodes") == 0 {
		t.Errorf("the cache never asked for the Nodes: %v", counter)
	}

	// The failed cache is dropped: the next read builds a new one.
	if again := cachedClient(t, caches, cluster); again.cache == c.cache {
		t.Error("the cache that failed its sync was kept")
	}
}

func TestNodeCacheForget(t *testing.T) {
	node := createNode(t, "forgotten")
	cluster := workloadCluster(t, envKubeconfig(t))
	clients, counter := testClients()
	caches := startCaches(t, clients)

	c := cachedClient(t, caches, cluster)
	mustListNodes(t, c, node)
	lists := counter.count("list", "nodes")
	mustListNodes(t, c, node)
	if got := counter.count("list", "nodes"); got != lists {
		t.Fatalf("the synced cache sent %d LIST nodes requests, want none", got-lists)
	}

	caches.Forget(cluster)
	mustListNodes(t, c, node)
	if got := counter.count("list", "nodes"); got != lists+1 {
		t.Errorf("a list through a client of a forgotten cache sent %d LIST nodes requests, want 1 (a live list)", got-lists)
	}

	watches := counter.count("watch", "nodes")
	fresh := cachedClient(t, caches, cluster)
	if fresh.cache == c.cache {
		t.Error("after Forget, Client gave the forgotten cache")
	}
	mustListNodes(t, fresh, node)
	if got := counter.count("watch", "nodes"); got <= watches {
		t.Errorf("after Forget, the next client built no new cache (no WATCH nodes): %v", counter)
	}
}

// TestNodeCacheAPIServerOutage stops the shared API server: it must stay the last test
// of the file.
func TestNodeCacheAPIServerOutage(t *testing.T) {
	node := createNode(t, "outage")
	cluster := workloadCluster(t, envKubeconfig(t))
	clients, counter := testClients()
	caches := startCaches(t, clients)

	// The client is kept through the outage: the kubeconfig Secret lives on the same
	// API server, and a new Client would fail to read it.
	c := cachedClient(t, caches, cluster)
	mustListNodes(t, c, node)
	// An outage hits a watch open for long: client-go handles a watch that ends within a
	// second of its start differently ("very short watch").
	time.Sleep(2 * time.Second)

	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	up := false
	t.Cleanup(func() {
		if !up {
			if err := env.StartAPIServer(); err != nil {
				t.Errorf("start the API server again: %v", err)
			}
		}
	})

	eventually(t, 60*time.Second, "lists of Nodes fail once the API server is gone", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		names, err := listNodes(ctx, c)
		if err != nil {
			t.Logf("list of Nodes without API server: %v", err)
			return nil
		}
		return fmt.Errorf("still listed %d Nodes from the stale cache", len(names))
	})
	// Once the watch failed, every list goes to the (gone) API server.
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := listNodes(ctx, c)
		cancel()
		if err == nil {
			t.Fatal("a list of Nodes succeeded from the stale cache after the watch failed")
		}
	}

	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	up = true
	eventually(t, 60*time.Second, "lists of Nodes succeed once the API server is back", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		names, err := listNodes(ctx, c)
		if err != nil {
			return err
		}
		if !names[node] {
			return fmt.Errorf("Node %s not in %v", node, names)
		}
		return nil
	})
	eventually(t, 90*time.Second, "the cache serves the lists again once its watch delivered Nodes", func() error {
		lists := counter.count("list", "nodes")
		if _, err := listNodes(context.Background(), c); err != nil {
			return err
		}
		if got := counter.count("list", "nodes"); got != lists {
			return fmt.Errorf("the list was sent to the API server (%d LIST nodes)", got-lists)
		}
		return nil
	})
}
