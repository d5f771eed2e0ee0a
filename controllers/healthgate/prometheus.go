package healthgate

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/fence"
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

// maxAnswer bounds what is read of one Prometheus answer.
const maxAnswer = 8 << 20

func (e *Evaluator) prometheus(ctx context.Context, g *inplacev1.PrometheusGate, in Input) (bool, string) {
	secret := &corev1.Secret{}
	if err := e.Management.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: g.SecretRef.Name}, secret); err != nil {
		return false, fmt.Sprintf("read Secret %s/%s of the Prometheus gate: %v; create it with the key %s (and optionally %s, or %s and %s, and %s)",
			in.Namespace, g.SecretRef.Name, err, AddressKey, TokenKey, UsernameKey, PasswordKey, CAKey)
	}
	raw := strings.TrimSpace(string(secret.Data[AddressKey]))
	if raw == "" {
		return false, fmt.Sprintf("Secret %s/%s has no key %s; set it to the Prometheus URL, for example https://prometheus.monitoring:9090", in.Namespace, g.SecretRef.Name, AddressKey)
	}
	var fetch fence.Policy // the zero Policy is the strict one
	if e.Policy != nil {
		fetch = e.Policy.Fetch
	}
	// url.Parse's error repeats the URL, userinfo included: not printed.
	base, err := url.Parse(raw)
	if err == nil {
		err = fetch.CheckURL(fmt.Sprintf("the %s of Secret %s/%s", AddressKey, in.Namespace, g.SecretRef.Name), base)
	} else {
		err = fmt.Errorf("the %s of Secret %s/%s is not a URL; set it to the Prometheus URL, for example https://prometheus.monitoring:9090", AddressKey, in.Namespace, g.SecretRef.Name)
	}
	if err != nil {
		return false, err.Error()
	}
	base.Path = strings.TrimRight(base.Path, "/")
	base.RawPath = ""
	// What messages call the address: no userinfo, no query.
	address := fence.Redact(base)
	var roots *x509.CertPool
	if ca := secret.Data[CAKey]; len(ca) > 0 {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(ca) {
			return false, fmt.Sprintf("Secret %s/%s: %s holds no PEM certificate", in.Namespace, g.SecretRef.Name, CAKey)
		}
	}
	httpClient := fetch.NewClient(roots)
	get := func(path string, query url.Values) (json.RawMessage, error) {
		u := *base
		u.Path += path
		u.RawQuery = query.Encode()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			// Its error repeats the URL: not printed.
			return nil, errors.New("the address does not make a request URL; set it to the Prometheus URL, for example https://prometheus.monitoring:9090")
		}
		if t := secret.Data[TokenKey]; len(t) > 0 {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(t)))
		} else if u := secret.Data[UsernameKey]; len(u) > 0 {
			req.SetBasicAuth(string(u), string(secret.Data[PasswordKey]))
		}
		resp, err := httpClient.Do(req, maxAnswer)
		if err != nil {
			return nil, err
		}
		if resp.Truncated {
			return nil, fmt.Errorf("HTTP %d, an answer larger than %d bytes; ask for less (a narrower query)", resp.StatusCode, maxAnswer)
		}
		var r apiResponse
		if err := json.Unmarshal(resp.Body, &r); err != nil {
			// For example a wrong basic-auth password: Prometheus's web config answers
			// HTTP 401 with the text "Unauthorized\n". Whatever the server sent, only a
			// short excerpt without control characters or the request's credentials is
			// shown: the message goes to the task's status, an event and the log.
			return nil, fmt.Errorf("HTTP %d, not a Prometheus API response: %s", resp.StatusCode, fence.Excerpt(resp.Body, fence.Secrets(req)...))
		}
		if r.Status != "success" {
			return nil, fmt.Errorf("HTTP %d, %s: %s", resp.StatusCode, fence.Excerpt([]byte(r.ErrorType)), fence.Excerpt([]byte(r.Error), fence.Secrets(req)...))
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
		return false, fmt.Sprintf("query %q gives a %s; write a query that gives an instant vector", g.Query, fence.Excerpt([]byte(q.ResultType)))
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
		// The labels come from the server: bounded and sanitized as any answer (%q
		// already escapes their control characters).
		return false, fmt.Sprintf("query %q returns %d series, for example {%s}", g.Query, len(vector), fence.Excerpt([]byte(strings.Join(first, ","))))
	}
	return true, fmt.Sprintf("query %q returns nothing", g.Query)
}
