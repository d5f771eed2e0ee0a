// Package workloadcluster gives clients of CAPI workload clusters, built from the
// kubeconfig Secret CAPI keeps for each Cluster (<cluster>-kubeconfig, key value, in the
// Cluster's namespace). Clients are cached per Cluster and rebuilt when the Secret
// changes, so that a rotated kubeconfig is picked up without a restart. For a
// self-managed cluster (a Harvester cluster managing itself) the Secret simply points at
// the management API server.
package workloadcluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeconfigSecretKey is the key of the kubeconfig in CAPI's <cluster>-kubeconfig Secret.
const KubeconfigSecretKey = "value"

// KubeconfigSecretName is the name of the Secret CAPI keeps the kubeconfig of a Cluster in.
func KubeconfigSecretName(cluster string) string {
	return cluster + "-kubeconfig"
}

// SecretNotFoundError says that the kubeconfig Secret of a Cluster does not exist (yet,
// or any more, when the Cluster is being deleted).
type SecretNotFoundError struct {
	// Secret is the Secret's namespace/name.
	Secret types.NamespacedName
}

func (e *SecretNotFoundError) Error() string {
	return fmt.Sprintf("kubeconfig Secret %s of the workload cluster does not exist", e.Secret)
}

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// DefaultRequestTimeout is how long a request of a workload cluster's client may take: the
// request timeout kube-apiserver itself gives a request (its --request-timeout, 60s), past
// which a server that still answers would have answered with an error.
const DefaultRequestTimeout = 60 * time.Second

// Clients hands out clients of workload clusters. The zero value is not usable: set
// Reader and Scheme.
type Clients struct {
	// Reader reads the kubeconfig Secrets on the management cluster. An uncached reader
	// (the manager's API reader) keeps the manager from watching every Secret.
	Reader client.Reader
	// Scheme is the scheme of the clients handed out.
	Scheme *runtime.Scheme
	// Configure, when set, adjusts the REST config built from the kubeconfig (QPS,
	// timeouts, user agent).
	Configure func(*rest.Config)
	// RequestTimeout bounds each request of the clients Client hands out, from sending it
	// to reading its answer; DefaultRequestTimeout when zero. Without it a workload API
	// server, or a proxy in front of it, that takes a request and never answers would hold
	// the reconcile that sent it, and with it its NodeUpdate's timeout and abort, for as long
	// as the connection lives. RESTConfig's configs (watches, logs, port-forwards) are not
	// bounded by it.
	RequestTimeout time.Duration
	// Recheck is how long a client is handed out after its Secret was read before the
	// Secret is read again; zero reads it on every call. SecretRecheck is what the
	// manager uses: a rotated kubeconfig is picked up within it, and the reconciles of
	// a busy cluster do not read the Secret several times each.
	Recheck time.Duration

	mu      sync.Mutex
	entries map[types.NamespacedName]entry
}

type entry struct {
	resourceVersion string
	config          *rest.Config
	client          client.Client
	// read is when the Secret was last read.
	read time.Time
}

// Client returns a client of the workload cluster of the Cluster namespace/name. It
// reads the kubeconfig Secret (a cheap GET) unless it did within Recheck, and builds a
// new client only when the Secret's resourceVersion changed. The client reads from the API server directly,
// without a cache. A missing Secret is a *SecretNotFoundError.
func (c *Clients) Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error) {
	e, err := c.entry(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return e.client, nil
}

// RESTConfig returns (a copy of) the REST config of the workload cluster of the Cluster
// namespace/name, for what a controller-runtime client does not offer, such as the API
// server's service proxy.
func (c *Clients) RESTConfig(ctx context.Context, cluster types.NamespacedName) (*rest.Config, error) {
	e, err := c.entry(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return rest.CopyConfig(e.config), nil
}

func (c *Clients) entry(ctx context.Context, cluster types.NamespacedName) (entry, error) {
	if c.Recheck > 0 {
		c.mu.Lock()
		e, ok := c.entries[cluster]
		c.mu.Unlock()
		if ok && time.Since(e.read) < c.Recheck {
			return e, nil
		}
	}
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: KubeconfigSecretName(cluster.Name)}
	secret := &corev1.Secret{}
	if err := c.Reader.Get(ctx, key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return entry{}, &SecretNotFoundError{Secret: key}
		}
		return entry{}, fmt.Errorf("read kubeconfig Secret %s: %w", key, err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[cluster]; ok && e.resourceVersion == secret.ResourceVersion {
		e.read = time.Now()
		c.entries[cluster] = e
		return e, nil
	}
	data, ok := secret.Data[KubeconfigSecretKey]
	if !ok || len(data) == 0 {
		return entry{}, fmt.Errorf("kubeconfig Secret %s has no key %q", key, KubeconfigSecretKey)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return entry{}, fmt.Errorf("parse kubeconfig of Secret %s: %w", key, err)
	}
	// As controller-runtime does for the management cluster: no client-side rate limit
	// unless one is configured, relying on the API server's priority and fairness.
	// client-go's default (5 requests/s) would pace every UpgradeTask reconcile.
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	if c.Configure != nil {
		c.Configure(cfg)
	}
	bounded := rest.CopyConfig(cfg)
	bounded.Timeout = c.RequestTimeout
	if bounded.Timeout <= 0 {
		bounded.Timeout = DefaultRequestTimeout
	}
	cl, err := client.New(bounded, client.Options{Scheme: c.Scheme})
	if err != nil {
		return entry{}, fmt.Errorf("create client of workload cluster %s: %w", cluster, err)
	}
	if c.entries == nil {
		c.entries = map[types.NamespacedName]entry{}
	}
	e := entry{resourceVersion: secret.ResourceVersion, config: cfg, client: cl, read: time.Now()}
	c.entries[cluster] = e
	return e, nil
}

// Forget drops the cached client of a Cluster, for example once the Cluster is deleted.
func (c *Clients) Forget(cluster types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, cluster)
}
