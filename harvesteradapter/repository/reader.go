package repository

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

// RESTConfigs gives the REST configs of workload clusters (see package workloadcluster).
type RESTConfigs interface {
	RESTConfig(ctx context.Context, cluster types.NamespacedName) (*rest.Config, error)
}

// ClusterReleaseReader reads the release metadata of a repository deployed in a workload
// cluster through that cluster's API server service proxy, which the manager reaches
// wherever it runs, and of any other repository (release.repositoryURL) over HTTP.
type ClusterReleaseReader struct {
	// Configs gives the workload clusters' REST configs.
	Configs RESTConfigs
	// HTTP reads from repositories outside the cluster.
	HTTP HTTPReleaseReader
}

// ReadRelease reads <repositoryURL>/harvester-release.yaml.
func (r ClusterReleaseReader) ReadRelease(ctx context.Context, cluster types.NamespacedName, repositoryURL string) ([]byte, error) {
	name, namespace, port, ok := inClusterService(repositoryURL)
	if !ok {
		return r.HTTP.ReadRelease(ctx, cluster, repositoryURL)
	}
	cfg, err := r.Configs.RESTConfig(ctx, cluster)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client of workload cluster %s: %w", cluster, err)
	}
	data, err := cs.CoreV1().Services(namespace).ProxyGet("http", name, port, MetadataPath, nil).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s through the service proxy of workload cluster %s: %w", repositoryURL+MetadataPath, cluster, err)
	}
	if len(data) > releases.MaxMetadataBytes {
		return nil, fmt.Errorf("%s%s is larger than %d bytes", repositoryURL, MetadataPath, releases.MaxMetadataBytes)
	}
	return data, nil
}

// inClusterService recognises the URL of a Service of the cluster,
// http://<name>.<namespace>.svc[.cluster.local][:port], and returns its parts.
func inClusterService(raw string) (name, namespace, port string, ok bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" {
		return "", "", "", false
	}
	host := strings.TrimSuffix(u.Hostname(), ".cluster.local")
	parts := strings.Split(host, ".")
	if len(parts) != 3 || parts[2] != "svc" {
		return "", "", "", false
	}
	port = u.Port()
	if port == "" {
		port = strconv.Itoa(repositoryPort)
	}
	return parts[0], parts[1], port, true
}

// ReleaseReader reads harvester-release.yaml from the base URL of a repository that
// serves a workload cluster.
type ReleaseReader interface {
	ReadRelease(ctx context.Context, cluster types.NamespacedName, repositoryURL string) ([]byte, error)
}

// HTTPReleaseReader reads release metadata over HTTP(S), for repositories the manager
// reaches directly (release.repositoryURL).
type HTTPReleaseReader struct {
	// Client is the HTTP client; nil means one with a 30 second timeout.
	Client *http.Client
}

// ReadRelease fetches <repositoryURL>/harvester-release.yaml.
func (r HTTPReleaseReader) ReadRelease(ctx context.Context, _ types.NamespacedName, repositoryURL string) ([]byte, error) {
	hc := r.Client
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	url := strings.TrimRight(repositoryURL, "/") + MetadataPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read %s: HTTP %d", url, resp.StatusCode)
	}
	return io.ReadAll(io.LimitReader(resp.Body, releases.MaxMetadataBytes+1))
}
