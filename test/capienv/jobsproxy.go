package capienv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// JobsProxy stands in front of a Cluster's workload API server, CAPD's in-memory one, and
// serves the one API group of a real API server that the KubeadmUpdater needs and the
// in-memory server lacks: batch/v1. CAPD's in-memory API server
// (sigs.k8s.io/cluster-api/test@v1.14.0 infrastructure/inmemory/pkg/server/api/const.go,
// apiGroupList and the resource lists) serves core/v1, apps/v1, rbac, storage,
// apiextensions and policy only, and CAPD puts nothing else in its scheme
// (infrastructure/docker/main.go, inmemoryScheme): a Job cannot be created there.
//
// The choice, of the ways to give the KubeadmUpdater's Jobs a place: the manager reaches
// a workload cluster only through the Cluster's <cluster>-kubeconfig Secret, as it must in
// production, so this proxy takes the Secret's server address (the certificate it serves
// is signed by the Cluster's own CA, from <cluster>-ca, so the kubeconfig is unchanged but
// for the address) and forwards every request to the in-memory server as it came, with
// the kubeconfig's own client certificate, except batch/v1, which it forwards to the test
// API server (a real kube-apiserver, which stores and validates Jobs as any cluster's
// does; its namespace kube-system stands for the workload's). Discovery (/apis) is the
// in-memory server's with batch/v1 added. No capi-inplace code knows about it. Cluster
// API's controllers that read the Secret after the change go through the proxy too, and
// see the same in-memory server. Jobs of every proxied cluster share the test API
// server's kube-system: the KubeadmUpdater names them by NodeUpdate UID, so they do not
// collide, and they carry their NodeUpdate (annotation) for the simulator that runs them.
type JobsProxy struct {
	server   *http.Server
	listener net.Listener
	mgmt     client.Client
	secret   client.ObjectKey
	original []byte
}

// ServeJobs starts a JobsProxy for the Cluster namespace/cluster, whose Jobs are served by
// the API server of jobs, and points the Cluster's kubeconfig Secret at it. Close undoes
// both.
func ServeJobs(ctx context.Context, mgmt client.Client, jobs *rest.Config, namespace, cluster string) (*JobsProxy, error) {
	p := &JobsProxy{mgmt: mgmt, secret: client.ObjectKey{Namespace: namespace, Name: cluster + "-kubeconfig"}}
	secret := &corev1.Secret{}
	if err := mgmt.Get(ctx, p.secret, secret); err != nil {
		return nil, fmt.Errorf("read the kubeconfig Secret of %s/%s: %w", namespace, cluster, err)
	}
	p.original = secret.Data["value"]
	workload, err := clientcmd.RESTConfigFromKubeConfig(p.original)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig of %s/%s: %w", namespace, cluster, err)
	}
	caSecret := &corev1.Secret{}
	if err := mgmt.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster + "-ca"}, caSecret); err != nil {
		return nil, fmt.Errorf("read the CA Secret of %s/%s: %w", namespace, cluster, err)
	}
	cert, err := servingCert(caSecret.Data["tls.crt"], caSecret.Data["tls.key"])
	if err != nil {
		return nil, fmt.Errorf("serving certificate for %s/%s: %w", namespace, cluster, err)
	}

	toWorkload, err := forwarder(workload)
	if err != nil {
		return nil, err
	}
	toJobs, err := forwarder(jobs)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/apis/batch/", toJobs)
	mux.HandleFunc("/apis", func(w http.ResponseWriter, r *http.Request) { p.discovery(w, r, workload, toWorkload) })
	mux.Handle("/", toWorkload)

	p.listener, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.server.Serve(p.listener) }()

	kubeconfig, err := clientcmd.Load(p.original)
	if err != nil {
		_ = p.server.Close()
		return nil, err
	}
	for _, c := range kubeconfig.Clusters {
		c.Server = "https://" + p.listener.Addr().String()
	}
	changed, err := clientcmd.Write(*kubeconfig)
	if err != nil {
		_ = p.server.Close()
		return nil, err
	}
	if err := p.setSecret(ctx, changed); err != nil {
		_ = p.server.Close()
		return nil, err
	}
	return p, nil
}

// Close points the kubeconfig Secret back at the in-memory server and stops the proxy.
func (p *JobsProxy) Close(ctx context.Context) error {
	err := p.setSecret(ctx, p.original)
	return errors.Join(err, p.server.Close())
}

func (p *JobsProxy) setSecret(ctx context.Context, kubeconfig []byte) error {
	secret := &corev1.Secret{}
	if err := p.mgmt.Get(ctx, p.secret, secret); err != nil {
		return err
	}
	patch := client.MergeFrom(secret.DeepCopy())
	secret.Data["value"] = kubeconfig
	if err := p.mgmt.Patch(ctx, secret, patch); err != nil {
		return fmt.Errorf("write the kubeconfig Secret %s: %w", p.secret, err)
	}
	return nil
}

// forwarder forwards requests, as they came, to the API server of cfg with cfg's
// credentials. Streams (watches) are flushed as they come; an upgraded connection
// (port-forward, which KubeadmControlPlane uses to reach etcd) is passed through by
// httputil.ReverseProxy, over HTTP/1.1 to the server.
func forwarder(cfg *rest.Config) (http.Handler, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", cfg.Host, err)
	}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("TLS configuration of %s: %w", cfg.Host, err)
	}
	transport := &http.Transport{TLSClientConfig: tlsConfig, Proxy: nil}
	var rt http.RoundTripper = transport
	if cfg.BearerToken != "" {
		rt = bearer{token: cfg.BearerToken, next: transport}
	}
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     rt,
		FlushInterval: -1,
	}, nil
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// discovery answers /apis with the in-memory server's groups and batch/v1. It asks for
// the plain APIGroupList (the in-memory server answers nothing else; client-go falls back
// to it from aggregated discovery, as it does with any server that answers so).
func (p *JobsProxy) discovery(w http.ResponseWriter, r *http.Request, workload *rest.Config, forward http.Handler) {
	if r.Method != http.MethodGet {
		forward.ServeHTTP(w, r)
		return
	}
	rec := &capture{header: http.Header{}}
	in := r.Clone(r.Context())
	in.Header.Set("Accept", "application/json")
	forward.ServeHTTP(rec, in)
	groups := &metav1.APIGroupList{}
	if rec.code/100 != 2 || json.Unmarshal(rec.body.Bytes(), groups) != nil {
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
		return
	}
	batch := metav1.GroupVersionForDiscovery{GroupVersion: "batch/v1", Version: "v1"}
	groups.Groups = append(groups.Groups, metav1.APIGroup{Name: "batch", Versions: []metav1.GroupVersionForDiscovery{batch}, PreferredVersion: batch})
	groups.Kind, groups.APIVersion = "APIGroupList", "v1"
	out, _ := json.Marshal(groups)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// capture is a ResponseWriter that keeps the answer.
type capture struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }
func (c *capture) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return c.body.Write(b)
}
func (c *capture) WriteHeader(code int) { c.code = code }

// servingCert is a certificate for 127.0.0.1 signed by the Cluster's CA (PEM
// certificate and key).
func servingCert(caCertPEM, caKeyPEM []byte) (tls.Certificate, error) {
	ca, err := tls.X509KeyPair(caCertPEM, caKeyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("the Cluster's CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "workload-jobs-proxy"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
}
