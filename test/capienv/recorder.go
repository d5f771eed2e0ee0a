package capienv

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
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
	// ClientCommonName is the common name of the client certificate the caller presented
	// (empty when the recorder does not ask for one).
	ClientCommonName string
}

// ClientAuth makes a HookRecorder authenticate its callers as the manager does with
// --hook-client-ca: a caller must present a client certificate CAPEM signed, and one of
// Callers' common names; the recorder forwards its call with that one of Callers, so the
// extension sees the same identity as if it were called directly.
type ClientAuth struct {
	CAPEM   []byte
	Callers []ClientCert
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
// certDir (tls.crt, tls.key, for 127.0.0.1) and forwarding to target over TLS, trusting
// caPEM. With auth, only callers with a client certificate auth.CAPEM signed are served.
func NewHookRecorder(certDir string, caPEM []byte, target string, auth *ClientAuth) (*HookRecorder, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("load the recorder's serving certificate: %w", err)
	}
	clientTLS, err := manager.TLSConfig(caPEM)
	if err != nil {
		return nil, err
	}
	serverTLS := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if auth != nil {
		callers := x509.NewCertPool()
		if !callers.AppendCertsFromPEM(auth.CAPEM) {
			return nil, fmt.Errorf("the recorder's client CA holds no PEM certificate")
		}
		serverTLS.ClientCAs, serverTLS.ClientAuth = callers, tls.RequireAndVerifyClientCert
	}
	r := &HookRecorder{}
	if err := r.SetTarget(target); err != nil {
		return nil, err
	}
	newProxy := func(tlsConfig *tls.Config) *httputil.ReverseProxy {
		return &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				r.mu.Lock()
				pr.SetURL(r.target)
				r.mu.Unlock()
			},
			Transport: &http.Transport{TLSClientConfig: tlsConfig},
		}
	}
	// proxies forward by the caller's common name ("" without client authentication).
	proxies := map[string]*httputil.ReverseProxy{}
	if auth == nil {
		proxies[""] = newProxy(clientTLS)
	} else {
		for _, c := range auth.Callers {
			pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("load the client certificate of %s: %w", c.CommonName, err)
			}
			forward := clientTLS.Clone()
			forward.Certificates = []tls.Certificate{pair}
			proxies[c.CommonName] = newProxy(forward)
		}
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
			caller := ""
			if req.TLS != nil && len(req.TLS.PeerCertificates) > 0 {
				caller = req.TLS.PeerCertificates[0].Subject.CommonName
			}
			proxy, ok := proxies[caller]
			if !ok {
				http.Error(w, fmt.Sprintf("the hook recorder does not know the caller %q", caller), http.StatusForbidden)
				return
			}
			rec := &recordingWriter{ResponseWriter: w}
			proxy.ServeHTTP(rec, req)
			segments := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
			hook := ""
			if len(segments) >= 3 {
				hook = segments[2]
			}
			r.mu.Lock()
			r.exchanges = append(r.exchanges, Exchange{Hook: hook, Request: body, Response: rec.body.Bytes(), ClientCommonName: caller})
			r.mu.Unlock()
		}),
		TLSConfig:         serverTLS,
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

// ExtensionClientAuth is the ClientAuth of a recorder between these controllers and an
// extension that trusts ExtensionClientCA: it lets in the client certificates the
// controllers present and forwards each call with the caller's own certificate.
func (c *Controllers) ExtensionClientAuth() *ClientAuth {
	auth := &ClientAuth{CAPEM: c.CAPEM}
	for _, cert := range c.ClientCerts {
		auth.Callers = append(auth.Callers, cert)
	}
	return auth
}

// ExtensionClientCA is the CA bundle that signed the controllers' client certificates:
// what the manager's --hook-client-ca names.
func (c *Controllers) ExtensionClientCA() string { return filepath.Join(c.CertDir, "ca.crt") }
