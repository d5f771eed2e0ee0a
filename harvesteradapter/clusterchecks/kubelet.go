package clusterchecks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeletReader reads what the cluster preflight needs of a node's kubelet: its
// /stats/summary and its /configz.
type KubeletReader interface {
	// Summary returns the node's kubelet /stats/summary.
	Summary(ctx context.Context, node string) (*KubeletSummary, error)
	// Config returns the kubelet configuration of the node's kubelet /configz.
	Config(ctx context.Context, node string) (*KubeletConfig, error)
}

// KubeletSummary is the part of a kubelet's /stats/summary the preflight reads
// (k8s.io/kubelet/pkg/apis/stats/v1alpha1 Summary, with its JSON names).
type KubeletSummary struct {
	Node KubeletNodeStats `json:"node"`
}

// KubeletNodeStats is the node part of a kubelet's /stats/summary.
type KubeletNodeStats struct {
	NodeName string `json:"nodeName"`
	// Fs is the node's root filesystem, where the kubelet keeps its data.
	Fs *KubeletFsStats `json:"fs,omitempty"`
	// Runtime holds the container runtime's image filesystem.
	Runtime *KubeletRuntimeStats `json:"runtime,omitempty"`
}

// KubeletRuntimeStats is the container runtime part of a kubelet's /stats/summary.
type KubeletRuntimeStats struct {
	// ImageFs is the filesystem where the runtime keeps its images.
	ImageFs *KubeletFsStats `json:"imageFs,omitempty"`
}

// KubeletFsStats is a filesystem's usage as a kubelet reports it.
type KubeletFsStats struct {
	AvailableBytes *uint64 `json:"availableBytes,omitempty"`
	CapacityBytes  *uint64 `json:"capacityBytes,omitempty"`
	UsedBytes      *uint64 `json:"usedBytes,omitempty"`
}

// KubeletConfig is the part of a kubelet's configuration the preflight reads
// (k8s.io/kubelet/config/v1beta1 KubeletConfiguration, with its JSON names).
type KubeletConfig struct {
	// ImageGCHighThresholdPercent is the disk usage of the image filesystem above which
	// the kubelet removes images; nil leaves the kubelet's default.
	ImageGCHighThresholdPercent *int32 `json:"imageGCHighThresholdPercent,omitempty"`
}

// kubeletRequestTimeout bounds one request to a kubelet through the API server.
const kubeletRequestTimeout = 30 * time.Second

// NewProxyKubeletReader returns a KubeletReader that reaches each node's kubelet through
// the workload API server's node proxy (GET /api/v1/nodes/<node>/proxy/stats/summary and
// /configz): no address or port of a node has to be reachable from the manager, and the
// API server authenticates to the kubelet with its own kubelet client credentials. The
// user of cfg needs get on nodes/proxy.
func NewProxyKubeletReader(cfg *rest.Config) (KubeletReader, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 || cfg.Timeout > kubeletRequestTimeout {
		cfg.Timeout = kubeletRequestTimeout
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client of the workload API server for the kubelet proxy: %w", err)
	}
	return &proxyKubeletReader{client: cs.CoreV1().RESTClient()}, nil
}

type proxyKubeletReader struct {
	client rest.Interface
}

func (r *proxyKubeletReader) Summary(ctx context.Context, node string) (*KubeletSummary, error) {
	s := &KubeletSummary{}
	if err := r.get(ctx, node, s, "stats", "summary"); err != nil {
		return nil, err
	}
	return s, nil
}

func (r *proxyKubeletReader) Config(ctx context.Context, node string) (*KubeletConfig, error) {
	var wrapped struct {
		KubeletConfig *KubeletConfig `json:"kubeletconfig"`
	}
	if err := r.get(ctx, node, &wrapped, "configz"); err != nil {
		return nil, err
	}
	if wrapped.KubeletConfig == nil {
		return nil, fmt.Errorf("the kubelet of node %s answered /configz without a kubeletconfig", node)
	}
	return wrapped.KubeletConfig, nil
}

func (r *proxyKubeletReader) get(ctx context.Context, node string, into any, path ...string) error {
	data, err := r.client.Get().Resource("nodes").Name(node).SubResource("proxy").Suffix(path...).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("read /%s of node %s's kubelet through the API server: %w", strings.Join(path, "/"), node, err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("parse /%s of node %s's kubelet: %w", strings.Join(path, "/"), node, err)
	}
	return nil
}
