package nodeprogram

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// kubeconfigFor writes a kubeconfig file for the API server at server.
func kubeconfigFor(t *testing.T, server string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin.conf")
	content := `apiVersion: v1
kind: Config
clusters:
- name: kubernetes
  cluster:
    server: ` + server + `
    insecure-skip-tls-verify: true
contexts:
- name: kubernetes-admin@kubernetes
  context: {cluster: kubernetes, user: kubernetes-admin}
current-context: kubernetes-admin@kubernetes
users:
- name: kubernetes-admin
  user: {token: admin-token}
`
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadClusterConfigurationReadsKubeadmConfig(t *testing.T) {
	const doc = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.34.3\n"
	quoted, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var path, auth string
	status := http.StatusOK
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, auth = r.URL.Path, r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		if status != http.StatusOK {
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"` + http.StatusText(status) + `","code":` + strconv.Itoa(status) + `}`))
			return
		}
		_, _ = w.Write([]byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"kubeadm-config","namespace":"kube-system"},"data":{"ClusterConfiguration":` + string(quoted) + `}}`))
	}))
	defer srv.Close()
	kubeconfig := kubeconfigFor(t, srv.URL)

	got, err := readClusterConfiguration(context.Background(), kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if got != doc {
		t.Errorf("ClusterConfiguration %q, want %q", got, doc)
	}
	if path != "/api/v1/namespaces/kube-system/configmaps/kubeadm-config" || auth != "Bearer admin-token" {
		t.Errorf("read %s with %q", path, auth)
	}
	if v, err := clusterVersion(got); err != nil || v != (kubeVersion{1, 34, 3}) {
		t.Errorf("clusterVersion = %v, %v", v, err)
	}

	status = http.StatusNotFound
	if _, err := readClusterConfiguration(context.Background(), kubeconfig); err == nil || !strings.Contains(err.Error(), "was not made by kubeadm") || isRetry(err) {
		t.Errorf("no ConfigMap: error %v, want a permanent one saying the cluster is not kubeadm's", err)
	}
	status = http.StatusForbidden
	if _, err := readClusterConfiguration(context.Background(), kubeconfig); err == nil || isRetry(err) {
		t.Errorf("forbidden: error %v, want a permanent one", err)
	}
	srv.Close()
	if _, err := readClusterConfiguration(context.Background(), kubeconfig); !isRetry(err) {
		t.Errorf("API server down: error %v, want one worth retrying", err)
	}
	if _, err := readClusterConfiguration(context.Background(), filepath.Join(t.TempDir(), "admin.conf")); err == nil || !strings.Contains(err.Error(), "pass --kubeconfig") || isRetry(err) {
		t.Errorf("no kubeconfig: error %v", err)
	}
}

func TestClusterVersionRefusesAnUnreleasedVersion(t *testing.T) {
	for _, doc := range []string{"kind: ClusterConfiguration\n", "kubernetesVersion: stable-1.34\n", "kubernetesVersion: [\n"} {
		if _, err := clusterVersion(doc); err == nil {
			t.Errorf("clusterVersion(%q) accepted", doc)
		}
	}
}

func isRetry(err error) bool {
	var r *retryError
	return errors.As(err, &r)
}
