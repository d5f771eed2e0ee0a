package main

import (
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// requestCounter counts the requests that pass through the transports it wraps, by verb
// (GET, LIST and WATCH told apart, as the API server does in apiserver_request_total) and
// resource. Writes are POST, PUT, PATCH and DELETE.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
	// took is how long each write took, from the request to the response's headers, by
	// the same key: what a write waits for in the API server, whatever the load.
	took map[string][]time.Duration
}

func newRequestCounter() *requestCounter {
	return &requestCounter{counts: map[string]int{}, took: map[string][]time.Duration{}}
}

// wrap returns a copy of cfg whose every client (the manager's cached and direct
// clients, its event recorder) counts its writes here.
func (w *requestCounter) wrap(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	w.wrapInPlace(out)
	return out
}

// wrapInPlace makes every client built from cfg count its requests here.
func (w *requestCounter) wrapInPlace(cfg *rest.Config) {
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &countingTransport{next: rt, counter: w}
	}
}

// reset forgets every count.
func (w *requestCounter) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts = map[string]int{}
	w.took = map[string][]time.Duration{}
}

// writeLatencies returns how long the writes took, by "VERB resource[/subresource]".
func (w *requestCounter) writeLatencies() map[string]latencies {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]latencies, len(w.took))
	for k, v := range w.took {
		out[k] = summarize(slices.Clone(v))
	}
	return out
}

func (w *requestCounter) observe(key string, d time.Duration) {
	w.mu.Lock()
	w.took[key] = append(w.took[key], d)
	w.mu.Unlock()
}

// snapshot returns the counts by "VERB resource[/subresource]".
func (w *requestCounter) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.counts))
	for k, v := range w.counts {
		out[k] = v
	}
	return out
}

func (w *requestCounter) add(key string) {
	w.mu.Lock()
	w.counts[key]++
	w.mu.Unlock()
}

type countingTransport struct {
	next    http.RoundTripper
	counter *requestCounter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resource, collection := resourceOf(req.URL.Path)
	verb := req.Method
	if verb == http.MethodGet {
		switch {
		case req.URL.Query().Get("watch") == "true":
			verb = "WATCH"
		case collection:
			verb = "LIST"
		}
	}
	key := verb + " " + resource
	t.counter.add(key)
	if !isWrite(key) {
		return t.next.RoundTrip(req)
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	t.counter.observe(key, time.Since(start))
	return resp, err
}

// isWrite reports whether a counter key is a write.
func isWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	switch verb {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// split returns the writes and the reads (GET and LIST; watches are left out) of counts.
func split(counts map[string]int) (writes, reads map[string]int) {
	writes, reads = map[string]int{}, map[string]int{}
	for k, v := range counts {
		switch {
		case isWrite(k):
			writes[k] = v
		case !strings.HasPrefix(k, "WATCH "):
			reads[k] = v
		}
	}
	return writes, reads
}

// resourceOf extracts resource[/subresource] from an API path
// (/api/v1/namespaces/ns/events, /apis/group/version/namespaces/ns/machines/name/status)
// and whether the path names a collection rather than one object.
func resourceOf(path string) (string, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) > 0 && parts[0] == "api":
		parts = parts[min(2, len(parts)):]
	case len(parts) > 0 && parts[0] == "apis":
		parts = parts[min(3, len(parts)):]
	default:
		return path, false
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		if len(parts) == 2 {
			return "namespaces", false
		}
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "?", true
	case 1:
		return parts[0], true
	case 2:
		return parts[0], false
	default:
		return parts[0] + "/" + parts[2], false
	}
}

// writeTotals sums counts and lists them in a stable order, largest first.
func writeTotals(counts map[string]int) (int, []string) {
	total := 0
	keys := make([]string, 0, len(counts))
	for k, v := range counts {
		total += v
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return total, keys
}
