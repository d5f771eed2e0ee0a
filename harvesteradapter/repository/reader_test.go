package repository

import "testing"

func TestInClusterService(t *testing.T) {
	tests := []struct {
		url                   string
		name, namespace, port string
		ok                    bool
	}{
		{url: ServiceURL("v1.6.0"), name: "capi-inplace-repo-v1-6-0", namespace: Namespace, port: "80", ok: true},
		{url: "http://repo.harvester-system.svc.cluster.local:8080", name: "repo", namespace: "harvester-system", port: "8080", ok: true},
		{url: "https://releases.example/harvester/v1.6.0"},
		{url: "http://10.0.0.5:8080"},
		{url: "http://repo.harvester-system.example.com"},
	}
	for _, tt := range tests {
		name, ns, port, ok := inClusterService(tt.url)
		if ok != tt.ok || name != tt.name || ns != tt.namespace || port != tt.port {
			t.Errorf("inClusterService(%q) = %q, %q, %q, %v", tt.url, name, ns, port, ok)
		}
	}
}
