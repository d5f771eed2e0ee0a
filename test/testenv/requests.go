package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
)

// RequestCountsEnv names a directory into which every Environment writes, when it stops,
// how many requests its API server served, by verb and resource (kube-apiserver's own
// apiserver_request_total): the measure of what a spec costs, since the API servers and
// etcd use most of a run's CPU. make test and make test-e2e set it; hack/testsummary adds
// the files up per package.
const RequestCountsEnv = "CAPI_INPLACE_REQUEST_COUNTS"

// RequestCounts is what an API server served: requests by "VERB resource" (the
// subresource after a slash), as counted by its apiserver_request_total since it started.
type RequestCounts map[string]float64

// Total is the number of requests of every kind.
func (r RequestCounts) Total() float64 {
	var sum float64
	for _, n := range r {
		sum += n
	}
	return sum
}

// RequestCounts reads what the API server has served since it (last) started.
func (e *Environment) RequestCounts(ctx context.Context) (RequestCounts, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return nil, err
	}
	body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	return parseRequestCounts(body), nil
}

// parseRequestCounts adds up the apiserver_request_total series of a Prometheus text
// exposition by verb and resource.
func parseRequestCounts(metrics []byte) RequestCounts {
	out := RequestCounts{}
	sc := bufio.NewScanner(bytes.NewReader(metrics))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		if end < 0 {
			continue
		}
		value, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, pair := range strings.Split(line[len("apiserver_request_total{"):end], ",") {
			k, v, ok := strings.Cut(pair, "=")
			if ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		key := labels["verb"] + " " + labels["resource"]
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		out[key] += value
	}
	return out
}

var requestFileSeq atomic.Int64

// writeRequestCounts writes the API server's counts into the directory RequestCountsEnv
// names, as <package below the module, '/' as '_'>__<pid>-<n>.json, when it is set. A
// failure to read or write is reported on stderr and changes nothing else: the counts
// are a measure, not part of any spec.
func (e *Environment) writeRequestCounts() {
	dir := os.Getenv(RequestCountsEnv)
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	counts, err := e.RequestCounts(ctx)
	if err == nil {
		var data []byte
		if data, err = json.Marshal(counts); err == nil {
			if err = os.MkdirAll(dir, 0o755); err == nil {
				name := fmt.Sprintf("%s__%d-%d.json", packageName(e.RepoRoot), os.Getpid(), requestFileSeq.Add(1))
				err = os.WriteFile(filepath.Join(dir, name), data, 0o600)
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: the API server's request counts were not written: %v\n", err)
	}
}

// packageName is the working directory (go test runs a package's tests in its directory)
// below root, '/' as '_'; "root" for root itself.
func packageName(root string) string {
	wd, err := os.Getwd()
	if err != nil || root == "" {
		return "unknown"
	}
	rel, err := filepath.Rel(root, wd)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "unknown"
	}
	if rel == "." {
		return "root"
	}
	return strings.ReplaceAll(filepath.ToSlash(rel), "/", "_")
}
