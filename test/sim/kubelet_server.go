package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// DiskStats is what a simulated kubelet reports of a node's filesystems in
// /stats/summary, and its image garbage collection threshold in /configz: the two
// endpoints upgrade-toolkit's preflight reads (shared/facts/harvester-node-upgrade.md,
// fact 46), with the summary's shape of the kubelet's own types
// (k8s.io/kubelet v0.36.3, pkg/apis/stats/v1alpha1: node.fs, node.runtime.imageFs).
type DiskStats struct {
	// RootCapacity and RootUsed are the node's root filesystem (summary node.fs).
	RootCapacity, RootUsed uint64
	// ImageCapacity and ImageUsed are the runtime's image filesystem (summary
	// node.runtime.imageFs); both 0 leaves it out of the summary.
	ImageCapacity, ImageUsed uint64
	// ImageGCHighThresholdPercent is the kubelet configuration's; nil leaves it out of
	// /configz, as a kubelet at its default does not.
	ImageGCHighThresholdPercent *int32
	// Fail makes /stats/summary and /configz answer 500 with this text.
	Fail string
}

// DefaultDiskStats is what a served node reports until SetDiskStats: one 100 GiB
// filesystem, 20 GiB used, the kubelet's default threshold.
var DefaultDiskStats = DiskStats{RootCapacity: 100 << 30, RootUsed: 20 << 30, ImageCapacity: 100 << 30, ImageUsed: 20 << 30}

// kubeletServers is the HTTPS side of the simulated kubelets: one server per node,
// serving /stats/summary and /configz, on ServeAddress and a port of its own that the
// node's status points at (status.addresses InternalIP, daemonEndpoints.kubeletEndpoint).
type kubeletServers struct {
	mu      sync.Mutex
	servers map[string]*httptest.Server
	disks   map[string]DiskStats
}

// NonLoopbackIPv4 returns an IPv4 address of this machine that is not a loopback or link-
// local one: kube-apiserver's node proxy refuses those (it would let a node's status make
// the API server reach its own host), so a simulated kubelet meant to be reached through
// it listens on such an address.
func NonLoopbackIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("list this machine's addresses: %w", err)
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip := n.IP.To4()
		if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		return ip.String(), nil
	}
	return "", errors.New("this machine has no IPv4 address besides loopback and link-local ones")
}

// serve starts the node's kubelet server and returns the address and port the node's
// status must name.
func (k *Kubelet) serve(node string) (string, int32, error) {
	k.servers.mu.Lock()
	defer k.servers.mu.Unlock()
	if k.servers.servers == nil {
		k.servers.servers = map[string]*httptest.Server{}
	}
	if old, ok := k.servers.servers[node]; ok {
		old.Close()
	}
	l, err := net.Listen("tcp", net.JoinHostPort(k.ServeAddress, "0"))
	if err != nil {
		return "", 0, fmt.Errorf("listen for node %s's kubelet on %s: %w", node, k.ServeAddress, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.handle(node, w, r)
	}))
	_ = srv.Listener.Close()
	srv.Listener = l
	srv.StartTLS()
	k.servers.servers[node] = srv
	host, port, err := net.SplitHostPort(l.Addr().String())
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", 0, err
	}
	return host, int32(p), nil //nolint:gosec // a TCP port fits
}

// SetDiskStats sets what the node's kubelet reports of its disks from now on.
func (k *Kubelet) SetDiskStats(node string, s DiskStats) {
	k.servers.mu.Lock()
	defer k.servers.mu.Unlock()
	if k.servers.disks == nil {
		k.servers.disks = map[string]DiskStats{}
	}
	k.servers.disks[node] = s
}

// Close stops the kubelet servers.
func (k *Kubelet) Close() {
	k.servers.mu.Lock()
	defer k.servers.mu.Unlock()
	for name, s := range k.servers.servers {
		s.Close()
		delete(k.servers.servers, name)
	}
}

func (k *Kubelet) handle(node string, w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/containerLogs/"); ok {
		k.containerLogs(w, r, rest)
		return
	}
	k.servers.mu.Lock()
	disk, ok := k.servers.disks[node]
	k.servers.mu.Unlock()
	if !ok {
		disk = DefaultDiskStats
	}
	if disk.Fail != "" {
		http.Error(w, disk.Fail, http.StatusInternalServerError)
		return
	}
	type fsStats struct {
		AvailableBytes uint64 `json:"availableBytes"`
		CapacityBytes  uint64 `json:"capacityBytes"`
		UsedBytes      uint64 `json:"usedBytes"`
	}
	fs := func(capacity, used uint64) *fsStats {
		return &fsStats{AvailableBytes: capacity - min(used, capacity), CapacityBytes: capacity, UsedBytes: used}
	}
	var body any
	switch r.URL.Path {
	case "/stats/summary":
		type runtimeStats struct {
			ImageFs *fsStats `json:"imageFs,omitempty"`
		}
		nodeStats := struct {
			NodeName string        `json:"nodeName"`
			Fs       *fsStats      `json:"fs"`
			Runtime  *runtimeStats `json:"runtime,omitempty"`
		}{NodeName: node, Fs: fs(disk.RootCapacity, disk.RootUsed)}
		if disk.ImageCapacity != 0 || disk.ImageUsed != 0 {
			nodeStats.Runtime = &runtimeStats{ImageFs: fs(disk.ImageCapacity, disk.ImageUsed)}
		}
		body = map[string]any{"node": nodeStats, "pods": []any{}}
	case "/configz":
		cfg := map[string]any{"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1"}
		if disk.ImageGCHighThresholdPercent != nil {
			cfg["imageGCHighThresholdPercent"] = *disk.ImageGCHighThresholdPercent
		}
		body = map[string]any{"kubeletconfig": cfg}
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// containerLogs serves the kubelet's /containerLogs/<namespace>/<pod>/<container>, what
// the API server's pods/log subresource proxies to (kubelet server.go getContainerLogs):
// the container's log from Logs, its last tailLines lines when asked, as text/plain. A
// container Logs knows nothing of is not found.
func (k *Kubelet) containerLogs(w http.ResponseWriter, r *http.Request, path string) {
	parts := strings.Split(path, "/")
	if len(parts) != 3 || k.Logs == nil {
		http.NotFound(w, r)
		return
	}
	text, ok := k.Logs(parts[0], parts[1], parts[2])
	if !ok {
		http.Error(w, fmt.Sprintf("container %q in pod %q is not available", parts[2], parts[1]), http.StatusNotFound)
		return
	}
	if tail := r.URL.Query().Get("tailLines"); tail != "" {
		n, err := strconv.Atoi(tail)
		if err != nil || n < 0 {
			http.Error(w, "tailLines must be a non-negative integer", http.StatusBadRequest)
			return
		}
		lines := strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n")
		text = strings.Join(lines[max(0, len(lines)-n):], "")
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, text)
}

// StartServing starts the kubelet server of a node created without one (ServeAddress set
// since), and points the node's status at it.
func (k *Kubelet) StartServing(ctx context.Context, name string) error {
	host, port, err := k.serve(name)
	if err != nil {
		return err
	}
	return k.updateStatus(ctx, name, func(st *corev1.NodeStatus) { servedStatus(st, host, port) })
}

// servedStatus points a node's status at its kubelet server.
func servedStatus(st *corev1.NodeStatus, host string, port int32) {
	st.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}}
	st.DaemonEndpoints.KubeletEndpoint.Port = port
}
