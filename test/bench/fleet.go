package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The fleet section (issue #55): many Clusters upgraded at once by one manager.

// runFleetBench upgrades fleetClusters Clusters of fleetMachines machines each at once.
func runFleetBench(ctx context.Context, b *bench) (orchResult, error) {
	return runUpgrades(ctx, b, b.cfg.fleetClusters, b.cfg.fleetMachines, b.cfg.fleetMaxUnavailable, b.cfg.fleetTimeout)
}

// fleetPathPrefix starts the path of the server of a fleet Cluster's kubeconfig; the
// Cluster's namespace follows. A server URL with a path is what a proxy in front of
// workload clusters hands out (Rancher's /k8s/clusters/<id>), and client-go keeps the
// path in front of every request.
const fleetPathPrefix = "/bench-fleet/"

// fleetKubeconfig is kubeconfig with every server URL given the path of namespace's view.
func fleetKubeconfig(kubeconfig []byte, namespace string) ([]byte, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("read the test API server's kubeconfig: %w", err)
	}
	for _, cluster := range cfg.Clusters {
		cluster.Server = strings.TrimRight(cluster.Server, "/") + fleetPathPrefix + namespace
	}
	return clientcmd.Write(*cfg)
}

// fleetView makes a workload client whose server URL fleetKubeconfig made see the test
// API server as that Cluster's own workload cluster: the path prefix is taken off every
// request, and lists and watches of Nodes keep the Nodes of the Cluster (nodeSetLabel), as
// a workload API server per Cluster would hold only its own. Without it each Cluster's
// Node cache would hold every Node of the fleet. A config without the prefix is left as
// it is.
func fleetView(cfg *rest.Config) {
	u, err := url.Parse(cfg.Host)
	if err != nil || !strings.HasPrefix(u.Path, fleetPathPrefix) {
		return
	}
	prefix := strings.TrimRight(u.Path, "/")
	namespace := strings.TrimPrefix(prefix, fleetPathPrefix)
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &fleetTransport{next: rt, prefix: prefix, namespace: namespace}
	}
}

type fleetTransport struct {
	next              http.RoundTripper
	prefix, namespace string
}

func (t *fleetTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	path, ok := strings.CutPrefix(req.URL.Path, t.prefix)
	if !ok {
		return t.next.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.URL.Path, req.URL.RawPath = path, ""
	if req.Method == http.MethodGet && path == "/api/v1/nodes" {
		q := req.URL.Query()
		selector := nodeSetLabel + "=" + t.namespace
		if s := q.Get("labelSelector"); s != "" {
			if _, err := labels.Parse(s); err != nil {
				return nil, fmt.Errorf("fleet view: label selector %q: %w", s, err)
			}
			selector = s + "," + selector
		}
		q.Set("labelSelector", selector)
		req.URL.RawQuery = q.Encode()
	}
	return t.next.RoundTrip(req)
}

// processUsage is what the bench process (which runs the manager) used during a run.
type processUsage struct {
	// cpu is the process's user and system CPU time.
	cpu time.Duration
	// wall is how long the measurement ran.
	wall time.Duration
	// rssStart is VmRSS at the start; rssPeak and heapPeak the largest VmRSS and Go heap
	// in use sampled every usageSampleEvery.
	rssStart, rssPeak, heapPeak uint64
}

// cores is the average number of cores the process kept busy.
func (u processUsage) cores() float64 {
	if u.wall <= 0 {
		return 0
	}
	return u.cpu.Seconds() / u.wall.Seconds()
}

const usageSampleEvery = 250 * time.Millisecond

// usageMeter samples the process until stop.
type usageMeter struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	usage   processUsage
	start   time.Time
	cpuFrom time.Duration
}

func startUsage(ctx context.Context) *usageMeter {
	ctx, cancel := context.WithCancel(ctx)
	m := &usageMeter{cancel: cancel, done: make(chan struct{}), start: time.Now(), cpuFrom: processCPU()}
	m.usage.rssStart, _, _ = procMemory(os.Getpid())
	m.sample()
	go func() {
		defer close(m.done)
		tick := time.NewTicker(usageSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				m.sample()
			}
		}
	}()
	return m
}

func (m *usageMeter) sample() {
	rss, _, _ := procMemory(os.Getpid())
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.mu.Lock()
	m.usage.rssPeak = max(m.usage.rssPeak, rss)
	m.usage.heapPeak = max(m.usage.heapPeak, ms.HeapInuse)
	m.mu.Unlock()
}

// stop ends the sampling and returns what was measured.
func (m *usageMeter) stop() processUsage {
	m.sample()
	m.cancel()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.usage
	u.wall = time.Since(m.start)
	u.cpu = processCPU() - m.cpuFrom
	return u
}
