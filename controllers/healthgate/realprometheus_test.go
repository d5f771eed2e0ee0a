//go:build realprometheus

package healthgate_test

// A by-hand check of the Prometheus health gate against a real Prometheus, never part of
// make test or CI: `make check-real-prometheus` builds Prometheus 3.16.0 from the Go module
// proxy (github.com/prometheus/prometheus@v0.316.0, cmd/prometheus) into
// bin/prometheus-v0.316.0 and runs this test with REAL_PROMETHEUS naming it.
//
// The test runs that Prometheus behind TLS and basic authentication (its --web.config.file)
// with one rule group evaluated every second: an alert that always fires, one that stays
// pending, one that never fires. It points the Evaluator the UpgradeTask controller uses at
// it, with the gate's Secret in a real API server, and asserts each gate's colour and
// message. It also asserts that the real responses have the shapes the recorded server of
// controllers/upgradetask/healthgates_test.go answers with, so that the specs which run in
// make test stand on what a real Prometheus sends.

import (
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
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
	"github.com/capi-inplace/capi-inplace/internal/fence"
	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// A user and bcrypt hash of Prometheus's exporter-toolkit's own tests
// (github.com/prometheus/exporter-toolkit@v0.20.0 web/testdata/web_config_users.good.yml,
// whose password alice123 web/handler_test.go logs in with).
const (
	promUser     = "alice"
	promPassword = "alice123"
	promHash     = "$2y$12$1DpfPeqF9HzHJt.EWswy1exHluGfbhnn3yXhR7Xes6m3WJqFg0Wby"
)

const rules = `groups:
- name: gates
  interval: 1s
  rules:
  - alert: AlwaysFiring
    expr: vector(1)
    for: 0s
    labels: {severity: test}
    annotations: {summary: always fires}
  - alert: AlwaysPending
    expr: vector(1)
    for: 1h
  - alert: NeverFiring
    expr: vector(1) == 0
`

func TestRealPrometheus(t *testing.T) {
	bin := os.Getenv("REAL_PROMETHEUS")
	if bin == "" {
		t.Fatal("REAL_PROMETHEUS must name a prometheus binary (make check-real-prometheus builds one)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dir := t.TempDir()
	caPEM := writeServingCert(t, dir)
	write(t, filepath.Join(dir, "rules.yml"), rules)
	write(t, filepath.Join(dir, "prometheus.yml"), fmt.Sprintf("global:\n  evaluation_interval: 1s\nrule_files:\n- %s\n", filepath.Join(dir, "rules.yml")))
	write(t, filepath.Join(dir, "web.yml"), fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n  %s: %s\n",
		filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), promUser, promHash))
	address := "https://" + freeAddress(t)

	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	require(t, err)
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--web.config.file="+filepath.Join(dir, "web.yml"),
		"--web.listen-address="+strings.TrimPrefix(address, "https://"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	procguard.Guard(cmd) // Prometheus ends with this test binary, even a killed one
	require(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("prometheus log:\n%s", out)
		}
	}()
	version, _ := exec.Command(bin, "--version").CombinedOutput()
	t.Logf("%s", strings.TrimSpace(string(version)))

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	get := func(path string, query url.Values) (int, []byte, error) {
		u := address + path
		if len(query) > 0 {
			u += "?" + query.Encode()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return 0, nil, err
		}
		req.SetBasicAuth(promUser, promPassword)
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, body, err
	}

	// Ready, and the rule group evaluated: AlwaysFiring firing, AlwaysPending pending.
	started := time.Now()
	var alertsBody []byte
	waitFor(t, time.Minute, "Prometheus ready with AlwaysFiring firing and AlwaysPending pending", func() error {
		code, body, err := get("/api/v1/alerts", nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("HTTP %d: %s", code, body)
		}
		states := map[string]string{}
		var r struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return err
		}
		for _, a := range r.Data.Alerts {
			states[a.Labels["alertname"]] = a.State
		}
		if states["AlwaysFiring"] != "firing" || states["AlwaysPending"] != "pending" {
			return fmt.Errorf("alert states %v", states)
		}
		alertsBody = body
		return nil
	})
	t.Logf("ready, rules evaluated after %s", time.Since(started).Round(time.Millisecond))

	// The shapes the recorded server answers with (controllers/upgradetask/healthgates_test.go).
	t.Logf("GET /api/v1/alerts: %s", alertsBody)
	var alerts struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []map[string]json.RawMessage `json:"alerts"`
		} `json:"data"`
	}
	require(t, json.Unmarshal(alertsBody, &alerts))
	if alerts.Status != "success" || len(alerts.Data.Alerts) != 2 {
		t.Errorf("GET /api/v1/alerts: status %q with %d alerts, want success with 2 (NeverFiring gives none)", alerts.Status, len(alerts.Data.Alerts))
	}
	for _, a := range alerts.Data.Alerts {
		if keys := sortedKeys(a); !slices.Equal(keys, []string{"activeAt", "annotations", "labels", "state", "value"}) {
			t.Errorf("an alert of GET /api/v1/alerts has the keys %v, the recorded server's have activeAt, annotations, labels, state, value", keys)
		}
		if string(a["value"]) != `"1e+00"` {
			t.Errorf("an alert's value is %s, the recorded server's is \"1e+00\"", a["value"])
		}
	}
	shapes := []struct {
		query    string
		code     int
		contains []string
	}{
		{`vector(1) > 0`, http.StatusOK, []string{`{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[`}},
		{`up{job="node"} == 0`, http.StatusOK, []string{`{"status":"success","data":{"resultType":"vector","result":[]}}`}},
		{`label_replace(vector(0), "instance", "n1:9100", "", "")`, http.StatusOK, []string{`"result":[{"metric":{"instance":"n1:9100"},"value":[`, `,"0"]}]`}},
		{`vector(1) >`, http.StatusBadRequest, []string{`{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": `}},
	}
	for _, s := range shapes {
		code, body, err := get("/api/v1/query", url.Values{"query": {s.query}})
		require(t, err)
		t.Logf("GET /api/v1/query?query=%s: HTTP %d %s", s.query, code, body)
		if code != s.code {
			t.Errorf("query %q: HTTP %d, want %d", s.query, code, s.code)
		}
		for _, want := range s.contains {
			if !strings.Contains(string(body), want) {
				t.Errorf("query %q: body %s does not contain %s", s.query, body, want)
			}
		}
	}

	// The gates, evaluated as the UpgradeTask controller does, their Secrets in a real API
	// server.
	e, err := testenv.Start()
	require(t, err)
	defer func() { _ = e.Stop() }()
	secret := func(name string, data map[string]string) corev1.LocalObjectReference {
		require(t, e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, StringData: data}))
		return corev1.LocalObjectReference{Name: name}
	}
	ok := secret("prometheus", map[string]string{"address": address, "username": promUser, "password": promPassword, "ca.crt": string(caPEM)})
	wrongPassword := secret("wrong-password", map[string]string{"address": address, "username": promUser, "password": "alice1234", "ca.crt": string(caPEM)})
	noCA := secret("no-ca", map[string]string{"address": address, "username": promUser, "password": promPassword})

	alertsURL := address + "/api/v1/alerts"
	labelQuery := `label_replace(vector(0), "instance", "n1:9100", "", "")`
	// message is the whole message; with also set, its beginning, and also is in the rest.
	cases := []struct {
		name          string
		gate          inplacev1.PrometheusGate
		green         bool
		message, also string
	}{
		{"firing", inplacev1.PrometheusGate{SecretRef: ok, Alerts: []string{"AlwaysFiring"}}, false, "alert(s) firing: AlwaysFiring", ""},
		{"never-firing", inplacev1.PrometheusGate{SecretRef: ok, Alerts: []string{"NeverFiring"}}, true, "none of NeverFiring is firing", ""},
		{"pending", inplacev1.PrometheusGate{SecretRef: ok, Alerts: []string{"AlwaysPending"}}, true, "none of AlwaysPending is firing", ""},
		{"three-alerts", inplacev1.PrometheusGate{SecretRef: ok, Alerts: []string{"NeverFiring", "AlwaysPending", "AlwaysFiring"}}, false, "alert(s) firing: AlwaysFiring", ""},
		{"query-red", inplacev1.PrometheusGate{SecretRef: ok, Query: `vector(1) > 0`}, false, `query "vector(1) > 0" returns 1 series, for example {}`, ""},
		{"query-labels", inplacev1.PrometheusGate{SecretRef: ok, Query: labelQuery}, false, fmt.Sprintf(`query %q returns 1 series, for example {instance="n1:9100"}`, labelQuery), ""},
		{"query-empty", inplacev1.PrometheusGate{SecretRef: ok, Query: `up{job="node"} == 0`}, true, `query "up{job=\"node\"} == 0" returns nothing`, ""},
		{"query-scalar", inplacev1.PrometheusGate{SecretRef: ok, Query: `scalar(vector(1))`}, false, `query "scalar(vector(1))" gives a scalar; write a query that gives an instant vector`, ""},
		{"query-bad", inplacev1.PrometheusGate{SecretRef: ok, Query: `vector(1) >`}, false, `query "vector(1) >": HTTP 400, bad_data: invalid parameter "query": `, "parse error"},
		{"wrong-password", inplacev1.PrometheusGate{SecretRef: wrongPassword, Alerts: []string{"AlwaysFiring"}}, false, "GET " + alertsURL + ": HTTP 401, not a Prometheus API response: Unauthorized", ""},
		{"no-ca", inplacev1.PrometheusGate{SecretRef: noCA, Alerts: []string{"AlwaysFiring"}}, false, "GET " + alertsURL + ": ", "x509: certificate signed by unknown authority"},
	}
	gates := make([]inplacev1.HealthGate, len(cases))
	for i, c := range cases {
		gates[i] = inplacev1.HealthGate{Name: c.name, Prometheus: &c.gate}
	}
	// The Prometheus runs beside the check, on loopback: the fence lets that through only
	// with --allow-loopback-fetch.
	policy := healthgate.DefaultPolicy()
	policy.Fetch = fence.Policy{AllowLoopback: true}
	ev := &healthgate.Evaluator{Management: e.Client, Policy: policy}
	results := ev.Evaluate(ctx, gates, healthgate.Input{Namespace: "default", Task: "real-prometheus", WorkloadErr: errors.New("no workload cluster in this check")})
	for i, c := range cases {
		r := results[i]
		t.Logf("gate %-14s green=%-5v %s", r.Name, r.Green, r.Message)
		matches := r.Message == c.message
		if c.also != "" {
			matches = strings.HasPrefix(r.Message, c.message) && strings.Contains(r.Message[len(c.message):], c.also)
		}
		if r.Name != c.name || r.Green != c.green || !matches {
			t.Errorf("gate %s: green=%v message %q; want green=%v message %q (and then %q)", c.name, r.Green, r.Message, c.green, c.message, c.also)
		}
	}
}

// writeServingCert writes a self-signed certificate for 127.0.0.1 and its key to dir as
// tls.crt and tls.key, and returns the certificate's PEM, the CA a client trusts.
func writeServingCert(t *testing.T, dir string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "real-prometheus"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	write(t, filepath.Join(dir, "tls.crt"), string(certPEM))
	write(t, filepath.Join(dir, "tls.key"), string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	return certPEM
}

// freeAddress returns 127.0.0.1 with a port that was free a moment ago.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require(t, err)
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func write(t *testing.T, path, content string) {
	t.Helper()
	require(t, os.WriteFile(path, []byte(content), 0o600))
}

func require(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
