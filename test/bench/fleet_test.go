package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// A fleet Cluster's client, built by client-go from the kubeconfig fleetKubeconfig wrote,
// reaches the server without the view's path, and its lists of Nodes keep the Cluster's
// own Nodes (with the caller's selector kept); other requests are left as they are.
func TestFleetView(t *testing.T) {
	type seen struct{ path, selector string }
	var (
		mu  sync.Mutex
		got []seen
	)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		mu.Lock()
		got = append(got, seen{req.URL.Path, req.URL.Query().Get("labelSelector")})
		mu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		switch req.URL.Path {
		case "/api/v1/nodes":
			_, _ = rw.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[]}`))
		default:
			_, _ = rw.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}`))
		}
	}))
	defer srv.Close()

	kubeconfig := []byte(`apiVersion: v1
kind: Config
clusters: [{name: env, cluster: {server: "` + srv.URL + `"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: env, user: u}}]
current-context: c
`)
	fleet, err := fleetKubeconfig(kubeconfig, "bench-fleet-abc")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(fleet)
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + "/bench-fleet/bench-fleet-abc"; cfg.Host != want {
		t.Fatalf("server %q, want %q", cfg.Host, want)
	}
	fleetView(cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "role=worker"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{"/api/v1/nodes", nodeSetLabel + "=bench-fleet-abc"},
		{"/api/v1/nodes", "role=worker," + nodeSetLabel + "=bench-fleet-abc"},
		{"/api/v1/nodes/n1", ""},
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("the server saw %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: the server saw %+v, want %+v", i, got[i], want[i])
		}
	}

	// A config without the view's path is left alone.
	plain, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	fleetView(plain)
	if plain.WrapTransport != nil {
		t.Error("fleetView wrapped the transport of a config without its path")
	}
}
