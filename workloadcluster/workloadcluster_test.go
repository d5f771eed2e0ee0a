package workloadcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func kubeconfigFor(server string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %s, insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`, server)
}

func TestClientsCacheAndRebuild(t *testing.T) {
	ctx := context.Background()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "prod-kubeconfig", Namespace: "clusters"},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfigFor("https://one.example:6443")},
	}
	reader := fake.NewClientBuilder().WithObjects(secret).Build()
	var hosts []string
	clients := &Clients{Reader: reader, Scheme: clientgoscheme.Scheme, Configure: func(c *rest.Config) { hosts = append(hosts, c.Host) }}
	cluster := types.NamespacedName{Namespace: "clusters", Name: "prod"}

	first, err := clients.Client(ctx, cluster)
	if err != nil {
		t.Fatalf("first client: %v", err)
	}
	again, err := clients.Client(ctx, cluster)
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	if first != again || len(hosts) != 1 {
		t.Errorf("an unchanged Secret must give the cached client; built %d clients", len(hosts))
	}

	secret.Data[KubeconfigSecretKey] = kubeconfigFor("https://two.example:6443")
	if err := reader.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	rotated, err := clients.Client(ctx, cluster)
	if err != nil {
		t.Fatalf("client after rotation: %v", err)
	}
	if rotated == first || len(hosts) != 2 || hosts[1] != "https://two.example:6443" {
		t.Errorf("a changed Secret must rebuild the client from the new kubeconfig; hosts %v", hosts)
	}

	clients.Forget(cluster)
	if _, err := clients.Client(ctx, cluster); err != nil || len(hosts) != 3 {
		t.Errorf("Forget must drop the cached client: err %v, hosts %v", err, hosts)
	}
}

func TestClientsRecheck(t *testing.T) {
	ctx := context.Background()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "prod-kubeconfig", Namespace: "clusters"},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfigFor("https://one.example:6443")},
	}
	reads := &countingReader{Reader: fake.NewClientBuilder().WithObjects(secret).Build()}
	clients := &Clients{Reader: reads, Scheme: clientgoscheme.Scheme, Recheck: time.Hour}
	cluster := types.NamespacedName{Namespace: "clusters", Name: "prod"}

	first, err := clients.Client(ctx, cluster)
	if err != nil {
		t.Fatalf("first client: %v", err)
	}
	secret.Data[KubeconfigSecretKey] = kubeconfigFor("https://two.example:6443")
	if err := reads.Reader.(client.Client).Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	again, err := clients.Client(ctx, cluster)
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	if again != first || reads.n != 1 {
		t.Errorf("within Recheck the Secret must not be read again: %d reads, same client %v", reads.n, again == first)
	}

	clients.Recheck = time.Nanosecond
	rotated, err := clients.Client(ctx, cluster)
	if err != nil {
		t.Fatalf("client after Recheck: %v", err)
	}
	if rotated == first || reads.n != 2 {
		t.Errorf("after Recheck the Secret must be read again and the client rebuilt: %d reads, same client %v", reads.n, rotated == first)
	}
}

// countingReader counts the Gets of its Reader.
type countingReader struct {
	client.Reader
	n int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.n++
	return c.Reader.Get(ctx, key, obj, opts...)
}

func TestClientsErrors(t *testing.T) {
	ctx := context.Background()
	noKey := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "empty-kubeconfig", Namespace: "clusters"},
		Data:       map[string][]byte{"other": []byte("x")},
	}
	clients := &Clients{Reader: fake.NewClientBuilder().WithObjects(noKey).Build(), Scheme: clientgoscheme.Scheme}

	_, err := clients.Client(ctx, types.NamespacedName{Namespace: "clusters", Name: "missing"})
	var notFound *SecretNotFoundError
	if !errors.As(err, &notFound) || notFound.Secret.Name != "missing-kubeconfig" {
		t.Errorf("a missing Secret must be a SecretNotFoundError naming it, got %v", err)
	}
	_, err = clients.Client(ctx, types.NamespacedName{Namespace: "clusters", Name: "empty"})
	if err == nil || err.Error() != `kubeconfig Secret clusters/empty-kubeconfig has no key "value"` {
		t.Errorf("a Secret without the key must say so, got %v", err)
	}
}

// A workload API server that takes a request and never answers: the client's request
// ends with an error after RequestTimeout instead of holding its caller.
func TestClientsRequestTimeout(t *testing.T) {
	release := make(chan struct{})
	server := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer server.Close()
	defer close(release)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "silent-kubeconfig", Namespace: "clusters"},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfigFor(server.URL)},
	}
	clients := &Clients{Reader: fake.NewClientBuilder().WithObjects(secret).Build(), Scheme: clientgoscheme.Scheme, RequestTimeout: 300 * time.Millisecond}
	cl, err := clients.Client(context.Background(), types.NamespacedName{Namespace: "clusters", Name: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- cl.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, client.RawPatch(types.MergePatchType, []byte(`{}`)))
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a request the server never answered succeeded")
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the request ended after %s, want about the RequestTimeout (300ms)", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request to a workload API server that never answers was still waiting after 10s")
	}
}
