package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

// memResult is the manager's memory with a given number of Clusters, Machines and Nodes.
type memResult struct {
	clusters, machines, nodes int
	// rss is the median of VmRSS samples once the manager settled; peak is VmHWM.
	rss, peak uint64
	// heapInUse is go_memstats_heap_inuse_bytes from the manager's /metrics (no GC forced).
	heapInUse uint64
	// startup is from the process start to its controllers' workers running.
	startup time.Duration
}

// runMemoryBench creates Clusters of machinesPerCluster Machines (each with its Node) in
// steps up to the largest size asked, and at each size starts the real manager binary as a
// process (test/manager), lets it fill its cache and settle, and reads its VmRSS from
// /proc. Each size gets a fresh manager, so every figure is a manager that started with
// that many objects.
func runMemoryBench(ctx context.Context, b *bench) ([]memResult, error) {
	bin := b.cfg.managerBinary
	if bin == "" {
		b.printf("  building the manager binary...\n")
		var err error
		if bin, err = manager.Build(ctx, b.env.RepoRoot, b.tempDir("manager-bin")); err != nil {
			return nil, err
		}
	}
	certs, err := manager.NewServingCerts(b.tempDir("manager-certs"))
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(b.tempDir("manager-kubeconfig"), "kubeconfig")
	if err := os.WriteFile(kubeconfig, b.kubeconfig, 0o600); err != nil {
		return nil, err
	}

	sizes := slices.Clone(b.cfg.memClusters)
	slices.Sort(sizes)
	var out []memResult
	created := 0
	for _, clusters := range sizes {
		start := time.Now()
		for ; created < clusters; created++ {
			ns, err := fixtures.Namespace(ctx, b.client, fmt.Sprintf("bench-mem-%02d", created+1))
			if err != nil {
				return out, err
			}
			if err := createCluster(ctx, b.client, clusterShape{namespace: ns, name: fmt.Sprintf("cluster-%02d", created+1), machines: b.cfg.machinesPerCluster, version: orchFromVersion}); err != nil {
				return out, err
			}
		}
		b.printf("  %d clusters of %d machines and nodes in the API server (created in %s)\n", clusters, b.cfg.machinesPerCluster, secs(time.Since(start)))
		r, err := measureManager(ctx, b, bin, kubeconfig, certs.Dir)
		if err != nil {
			return out, err
		}
		r.clusters, r.machines, r.nodes = clusters, clusters*b.cfg.machinesPerCluster, clusters*b.cfg.machinesPerCluster
		b.printf("  %5d machines: VmRSS %s (peak %s), Go heap in use %s, ready in %s\n", r.machines, mib(r.rss), mib(r.peak), mib(r.heapInUse), secs(r.startup))
		out = append(out, r)
	}
	return out, nil
}

// measureManager runs the manager until its controllers run and its memory settles, and
// reads its memory.
func measureManager(ctx context.Context, b *bench, bin, kubeconfig, certDir string) (memResult, error) {
	var r memResult
	logFile := filepath.Join(b.tempDir("manager-log"), "manager.log")
	started := time.Now()
	p, err := manager.Start(manager.Options{Binary: bin, Kubeconfig: kubeconfig, CertDir: certDir, LogFile: logFile})
	if err != nil {
		return r, err
	}
	defer func() { _ = p.Stop() }()
	if err := p.WaitReady(2 * time.Minute); err != nil {
		return r, fmt.Errorf("%w; its log is %s", err, logFile)
	}
	pid, err := findProcess(bin)
	if err != nil {
		return r, err
	}
	// Controllers start their workers once their caches synced: wait for the number of
	// "Starting workers" lines to stop growing for memQuiet.
	last, stableSince := -1, time.Now()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		data, _ := os.ReadFile(logFile)
		n := bytes.Count(data, []byte(`"Starting workers"`))
		if n != last {
			last, stableSince = n, time.Now()
		}
		if n > 0 && time.Since(stableSince) >= b.cfg.memQuiet {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the manager's controllers did not start within 3 minutes; its log is %s", logFile)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	r.startup = stableSince.Sub(started)
	// Let the start-up garbage be collected, then sample.
	sleep(ctx, b.cfg.memSettle)
	var samples []uint64
	for i := range 5 {
		if i > 0 {
			sleep(ctx, b.cfg.memSampleEvery)
		}
		rss, _, err := procMemory(pid)
		if err != nil {
			return r, err
		}
		samples = append(samples, rss)
	}
	slices.Sort(samples)
	r.rss = samples[len(samples)/2]
	if _, r.peak, err = procMemory(pid); err != nil {
		return r, err
	}
	r.heapInUse, _ = metricValue(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricsPort), "go_memstats_heap_inuse_bytes")
	return r, nil
}

// findProcess returns the pid of the process running bin. The bench builds the manager
// into a directory of its own, so exactly one process runs that path.
func findProcess(bin string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && exe == bin {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process runs %s", bin)
}

// procMemory reads VmRSS and VmHWM of a process, in bytes.
func procMemory(pid int) (rss, hwm uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseUint(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm, s.Err()
}

// metricValue reads one unlabelled sample from a Prometheus text endpoint.
func metricValue(url, name string) (uint64, error) {
	resp, err := http.Get(url) //nolint:gosec,noctx // the manager's loopback metrics endpoint
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return uint64(v), err
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}
