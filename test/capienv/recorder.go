package capienv

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/capi-inplace/capi-inplace/test/manager"
)

// Exchange is one hook call Cluster API made: the hook (the path's hook segment, for
// example "canupdatemachineset"), and the request and response bodies.
type Exchange struct {
	Hook     string
	Request  []byte
	Response []byte
}

// HookRecorder is a TLS reverse proxy between Cluster API and the extension that records
// every call: register its URL in the ExtensionConfig, and the calls reach the extension
// unchanged while the test keeps what Cluster API sent and what it was answered (to check
// test/capisim's reading of the answers against what Cluster API did with them). It also
// keeps the extension's address stable across a restart of the manager on another port.
type HookRecorder struct {
	// URL is the proxy's address.
	URL string

	mu        sync.Mutex
	target    *url.URL
	exchanges []Exchange
	server    *http.Server
}

// NewHookRecorder starts a recorder on a free loopback port, serving the certificate in
// certDir (tls.crt, tls.key, for 127.0.0.1) and forwarding to target over TLS, trusting caPEM.
func NewHookRecorder(certDir string, caPEM []byte, target string) (*HookRecorder, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("load the recorder's serving certificate: %w", err)
	}
	clientTLS, err := manager.TLSConfig(caPEM)
	if err != nil {
		return nil, err
	}
	r := &HookRecorder{}
	if err := r.SetTarget(target); err != nil {
		return nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			r.mu.Lock()
			pr.SetURL(r.target)
			r.mu.Unlock()
		},
		Transport: &http.Transport{TLSClientConfig: clientTLS},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	r.URL = fmt.Sprintf("https://%s", l.Addr().String())
	r.server = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(body))
			rec := &recordingWriter{ResponseWriter: w}
			proxy.ServeHTTP(rec, req)
			segments := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
			hook := ""
			if len(segments) >= 3 {
				hook = segments[2]
			}
			r.mu.Lock()
			r.exchanges = append(r.exchanges, Exchange{Hook: hook, Request: body, Response: rec.body.Bytes()})
			r.mu.Unlock()
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = r.server.ServeTLS(l, "", "") }()
	return r, nil
}

// SetTarget points the recorder at another address of the extension.
func (r *HookRecorder) SetTarget(target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("extension address %q: %w", target, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = u
	return nil
}

// Exchanges returns the calls of hook recorded so far ("" for all).
func (r *HookRecorder) Exchanges(hook string) []Exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Exchange
	for _, e := range r.exchanges {
		if hook == "" || e.Hook == hook {
			out = append(out, e)
		}
	}
	return out
}

// Close stops the recorder.
func (r *HookRecorder) Close() error { return r.server.Close() }

type recordingWriter struct {
	http.ResponseWriter
	body bytes.Buffer
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}
