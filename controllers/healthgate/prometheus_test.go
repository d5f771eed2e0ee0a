package healthgate_test

// The fence around the Prometheus gate's calls (internal/fence), seen through the
// Evaluator the UpgradeTask controller uses, its Secrets in a real API server: a gate's
// message is what status.gates, a Warning event and the log carry.

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
	"github.com/capi-inplace/capi-inplace/internal/fence"
	"github.com/capi-inplace/capi-inplace/internal/fence/fencetest"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// alerts answers GET /api/v1/alerts as Prometheus does, nothing firing.
func alerts(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"success","data":{"alerts":[]}}`)
}

func caOf(srv *httptest.Server) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
}

func TestPrometheusGateFence(t *testing.T) {
	e, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Stop() }()
	ctx := context.Background()
	n := 0
	// gate evaluates one alerts gate whose Secret holds data, under the fence policy.
	gate := func(t *testing.T, fetch fence.Policy, timeout time.Duration, data map[string]string) healthgate.Result {
		t.Helper()
		n++
		name := "prom-" + string(rune('a'+n))
		if err := e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, StringData: data}); err != nil {
			t.Fatal(err)
		}
		ev := &healthgate.Evaluator{Management: e.Client, Timeout: timeout, Policy: &healthgate.Policy{Fetch: fetch}}
		results := ev.Evaluate(ctx, []inplacev1.HealthGate{{Name: "prom", Prometheus: &inplacev1.PrometheusGate{
			SecretRef: corev1.LocalObjectReference{Name: name}, Alerts: []string{"NodeDown"},
		}}}, healthgate.Input{Namespace: "default", Task: "t", WorkloadErr: errors.New("none")})
		t.Logf("green=%v %s", results[0].Green, results[0].Message)
		return results[0]
	}

	t.Run("https by default, http only when allowed", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(alerts))
		defer srv.Close()
		r := gate(t, fence.Policy{AllowLoopback: true}, 0, map[string]string{"address": srv.URL})
		if r.Green || !strings.Contains(r.Message, "is plain http, and the manager fetches only https URLs") || !strings.Contains(r.Message, "--allow-http-fetch") {
			t.Errorf("an http address under the default fence: %+v, want red naming --allow-http-fetch", r)
		}
		if r := gate(t, fence.Policy{AllowHTTP: true, AllowLoopback: true}, 0, map[string]string{"address": srv.URL}); !r.Green {
			t.Errorf("an http address with http allowed: %+v, want green", r)
		}
		tlsSrv := httptest.NewTLSServer(http.HandlerFunc(alerts))
		defer tlsSrv.Close()
		if r := gate(t, fence.Policy{AllowLoopback: true}, 0, map[string]string{"address": tlsSrv.URL, "ca.crt": caOf(tlsSrv)}); !r.Green || r.Message != "none of NodeDown is firing" {
			t.Errorf("an https address under the default fence: %+v, want green", r)
		}
	})

	t.Run("no redirect to another host", func(t *testing.T) {
		var leaked atomic.Value
		leaked.Store("")
		var calls atomic.Int32
		other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			leaked.Store(r.Header.Get("Authorization"))
			alerts(w, r)
		}))
		defer other.Close()
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, http.StatusFound)
		}))
		defer srv.Close()
		r := gate(t, fence.Policy{AllowLoopback: true}, 0, map[string]string{"address": srv.URL, "token": "s3cret", "ca.crt": caOf(srv)})
		if c := calls.Load(); c != 0 {
			t.Fatalf("the other host was called %d times, with Authorization %q", c, leaked.Load())
		}
		want := "GET " + srv.URL + "/api/v1/alerts: the server at " + srv.URL + " redirected to another origin, " + other.URL + ", which the manager does not follow"
		if r.Green || !strings.HasPrefix(r.Message, want) {
			t.Errorf("got %+v, want red starting %q", r, want)
		}
	})

	t.Run("an echoed answer is a short sanitized excerpt", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "\x1b[2J\x1b]8;;http://evil\x07proxy error for "+r.Header.Get("Authorization")+"\u202e\r\n"+strings.Repeat("trace ", 3000))
		}))
		defer srv.Close()
		r := gate(t, fence.Policy{AllowLoopback: true}, 0, map[string]string{"address": srv.URL, "token": "s3cret-t0ken", "ca.crt": caOf(srv)})
		want := "GET " + srv.URL + "/api/v1/alerts: HTTP 502, not a Prometheus API response: [2J ]8;;http://evil proxy error for [redacted] trace trace"
		if r.Green || !strings.HasPrefix(r.Message, want) {
			t.Errorf("got %+v, want red starting %q", r, want)
		}
		if strings.Contains(r.Message, "s3cret-t0ken") {
			t.Errorf("the message repeats the token: %q", r.Message)
		}
		for _, c := range r.Message {
			if unicode.IsControl(c) || unicode.Is(unicode.Cf, c) {
				t.Fatalf("the message holds %U: %q", c, r.Message)
			}
		}
		if l := utf8.RuneCountInString(r.Message); l > 400 {
			t.Errorf("a message of %d characters", l)
		}
	})

	t.Run("a slow server is a red gate naming the timeout", func(t *testing.T) {
		srv := fencetest.SlowTLSServer(t)
		start := time.Now()
		r := gate(t, fence.Policy{AllowLoopback: true}, 300*time.Millisecond, map[string]string{"address": srv.URL, "ca.crt": caOf(srv)})
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the gate took %s", took)
		}
		if r.Green || !strings.Contains(r.Message, "no complete answer within") {
			t.Errorf("got %+v, want red naming the timeout", r)
		}
	})

	t.Run("metadata addresses are refused", func(t *testing.T) {
		for _, address := range []string{"https://169.254.169.254", "https://[fd00:ec2::254]:443/prometheus"} {
			r := gate(t, fence.Policy{}, 0, map[string]string{"address": address})
			if r.Green || !strings.Contains(r.Message, "which the manager does not connect to; start the manager with --allow-link-local-fetch") {
				t.Errorf("%s: got %+v, want a refusal naming --allow-link-local-fetch", address, r)
			}
		}
	})

	t.Run("the manager's own loopback is refused unless allowed", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(alerts))
		defer srv.Close()
		r := gate(t, fence.Policy{}, 0, map[string]string{"address": srv.URL, "ca.crt": caOf(srv)})
		if r.Green || !strings.Contains(r.Message, "a loopback address") || !strings.Contains(r.Message, "--allow-loopback-fetch") {
			t.Errorf("a Prometheus on the manager's loopback under the default fence: %+v, want red naming --allow-loopback-fetch", r)
		}
		if r := gate(t, fence.Policy{AllowLoopback: true}, 0, map[string]string{"address": srv.URL, "ca.crt": caOf(srv)}); !r.Green {
			t.Errorf("with loopback allowed: %+v, want green", r)
		}
	})

	t.Run("userinfo is never printed", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
		}))
		defer srv.Close()
		address := strings.Replace(srv.URL, "https://", "https://alice:pa55word@", 1) + "/?sig=q5ecret"
		r := gate(t, fence.Policy{AllowLoopback: true}, 0, map[string]string{"address": address, "ca.crt": caOf(srv)})
		if want := "GET " + srv.URL + "/api/v1/alerts: HTTP 401, not a Prometheus API response: Unauthorized"; r.Message != want {
			t.Errorf("got %q, want %q", r.Message, want)
		}
		bad := gate(t, fence.Policy{}, 0, map[string]string{"address": "http://alice:pa55word@prom:9090"})
		for _, secret := range []string{"alice", "pa55word", "q5ecret"} {
			if strings.Contains(r.Message, secret) || strings.Contains(bad.Message, secret) {
				t.Errorf("messages %q and %q, one repeats %q", r.Message, bad.Message, secret)
			}
		}
	})
}
