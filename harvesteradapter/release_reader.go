package harvesteradapter

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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
	data, err := cs.CoreV1().Services(namespace).ProxyGet("http", name, port, releaseMetadataPath, nil).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s through the service proxy of workload cluster %s: %w", repositoryURL+releaseMetadataPath, cluster, err)
	}
	if len(data) > maxReleaseMetadataBytes {
		return nil, fmt.Errorf("%s%s is larger than %d bytes", repositoryURL, releaseMetadataPath, maxReleaseMetadataBytes)
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
