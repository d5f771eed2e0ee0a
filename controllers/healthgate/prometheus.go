package healthgate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// Keys of a Prometheus gate's Secret.
const (
	AddressKey  = "address"
	TokenKey    = "token"
	UsernameKey = "username"
	PasswordKey = "password"
	CAKey       = "ca.crt"
)

// apiResponse is the envelope of every Prometheus HTTP API response
// (https://prometheus.io/docs/prometheus/latest/querying/api/#format-overview).
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

// alertsData is the data of GET /api/v1/alerts.
type alertsData struct {
	Alerts []struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	} `json:"alerts"`
}

// queryData is the data of GET /api/v1/query.
type queryData struct {
	ResultType string          `json:"resultType"`
	Result     json.RawMessage `json:"result"`
}

func (e *Evaluator) prometheus(ctx context.Context, g *inplacev1.PrometheusGate, in Input) (bool, string) {
	secret := &corev1.Secret{}
	if err := e.Management.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: g.SecretRef.Name}, secret); err != nil {
		return false, fmt.Sprintf("read Secret %s/%s of the Prometheus gate: %v; create it with the key %s (and optionally %s, or %s and %s, and %s)",
			in.Namespace, g.SecretRef.Name, err, AddressKey, TokenKey, UsernameKey, PasswordKey, CAKey)
	}
	address := strings.TrimRight(strings.TrimSpace(string(secret.Data[AddressKey])), "/")
	if address == "" {
		return false, fmt.Sprintf("Secret %s/%s has no key %s; set it to the Prometheus URL, for example https://prometheus.monitoring:9090", in.Namespace, g.SecretRef.Name, AddressKey)
	}
	httpClient := &http.Client{}
	if ca := secret.Data[CAKey]; len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return false, fmt.Sprintf("Secret %s/%s: %s holds no PEM certificate", in.Namespace, g.SecretRef.Name, CAKey)
		}
		httpClient.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	get := func(path string, query url.Values) (json.RawMessage, error) {
		u := address + path
		if len(query) > 0 {
			u += "?" + query.Encode()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		if t := secret.Data[TokenKey]; len(t) > 0 {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(t)))
		} else if u := secret.Data[UsernameKey]; len(u) > 0 {
			req.SetBasicAuth(string(u), string(secret.Data[PasswordKey]))
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		if err != nil {
			return nil, err
		}
		var r apiResponse
		if err := json.Unmarshal(body, &r); err != nil {
			// For example a wrong basic-auth password: Prometheus's web config answers
			// HTTP 401 with the text "Unauthorized\n", whose newline a condition's
			// message should not carry.
			return nil, fmt.Errorf("HTTP %d, not a Prometheus API response: %.200s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		if r.Status != "success" {
			return nil, fmt.Errorf("HTTP %d, %s: %s", resp.StatusCode, r.ErrorType, r.Error)
		}
		return r.Data, nil
	}

	if len(g.Alerts) > 0 {
		data, err := get("/api/v1/alerts", nil)
		if err != nil {
			return false, fmt.Sprintf("GET %s/api/v1/alerts: %v", address, err)
		}
		var alerts alertsData
		if err := json.Unmarshal(data, &alerts); err != nil {
			return false, fmt.Sprintf("GET %s/api/v1/alerts: %v", address, err)
		}
		var firing []string
		for _, a := range alerts.Alerts {
			name := a.Labels["alertname"]
			if a.State == "firing" && slices.Contains(g.Alerts, name) && !slices.Contains(firing, name) {
				firing = append(firing, name)
			}
		}
		if len(firing) > 0 {
			return false, fmt.Sprintf("alert(s) firing: %s", strings.Join(firing, ", "))
		}
		return true, fmt.Sprintf("none of %s is firing", strings.Join(g.Alerts, ", "))
	}

	data, err := get("/api/v1/query", url.Values{"query": {g.Query}})
	if err != nil {
		return false, fmt.Sprintf("query %q: %v", g.Query, err)
	}
	var q queryData
	if err := json.Unmarshal(data, &q); err != nil {
		return false, fmt.Sprintf("query %q: %v", g.Query, err)
	}
	if q.ResultType != "vector" {
		return false, fmt.Sprintf("query %q gives a %s; write a query that gives an instant vector", g.Query, q.ResultType)
	}
	var vector []struct {
		Metric map[string]string `json:"metric"`
	}
	if err := json.Unmarshal(q.Result, &vector); err != nil {
		return false, fmt.Sprintf("query %q: %v", g.Query, err)
	}
	if len(vector) > 0 {
		first := make([]string, 0, len(vector[0].Metric))
		for k, v := range vector[0].Metric {
			first = append(first, fmt.Sprintf("%s=%q", k, v))
		}
		slices.Sort(first)
		return false, fmt.Sprintf("query %q returns %d series, for example {%s}", g.Query, len(vector), strings.Join(first, ","))
	}
	return true, fmt.Sprintf("query %q returns nothing", g.Query)
}
