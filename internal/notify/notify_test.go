package notify

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/fence"
)

// receiver is a webhook that answers each call with the next status of answers (200
// once they run out) and records every body.
type receiver struct {
	mu      sync.Mutex
	answers []int
	bodies  []string
	auth    []string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.bodies = append(rc.bodies, string(body))
	rc.auth = append(rc.auth, r.Header.Get("Authorization"))
	status := http.StatusOK
	if len(rc.answers) > 0 {
		status, rc.answers = rc.answers[0], rc.answers[1:]
	}
	w.WriteHeader(status)
}

// testDispatcher is a Dispatcher on its own registry whose backoff records the delays
// asked instead of waiting them.
func testDispatcher(t *testing.T) (*Dispatcher, *[]time.Duration) {
	t.Helper()
	var delays []time.Duration
	d := &Dispatcher{Metrics: NewMetrics(prometheus.NewRegistry()), Workers: 1, QueueSize: 2}
	d.sleep = func(_ context.Context, dl time.Duration) bool { delays = append(delays, dl); return true }
	d.init()
	return d, &delays
}

// lab is the fence of a manager started with --allow-http-fetch: the specs whose
// webhook is a plain http server on loopback use it.
var lab = fence.Policy{AllowHTTP: true, AllowLoopback: true}

func hookFor(t *testing.T, url string, data map[string]string) func() (*webhook, error) {
	t.Helper()
	return hookWith(t, lab, url, data)
}

// hookWith loads the webhook of a Secret with url and data under a fence policy.
func hookWith(t *testing.T, fetch fence.Policy, url string, data map[string]string) func() (*webhook, error) {
	t.Helper()
	secret := &corev1.Secret{Data: map[string][]byte{"url": []byte(url)}}
	for k, v := range data {
		secret.Data[k] = []byte(v)
	}
	return func() (*webhook, error) {
		return parseWebhook(client.ObjectKey{Namespace: "ns", Name: "hook"}, secret, "", fetch)
	}
}

var started = Notification{Event: Event{Type: TaskStarted, Namespace: "ns", Cluster: "c", Task: "md", Version: "v1.34.1", Phase: "InProgress", Progress: "0/3"}}

func TestBackoffDoublesUpToTheBound(t *testing.T) {
	got := []time.Duration{}
	for attempt := 1; attempt <= 7; attempt++ {
		got = append(got, Backoff(attempt, time.Second, 10*time.Second))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestRetriesWithBackoffUntilDelivered(t *testing.T) {
	rc := &receiver{answers: []int{http.StatusServiceUnavailable, http.StatusInternalServerError}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	d, delays := testDispatcher(t)

	d.deliverWith(context.Background(), started, hookFor(t, srv.URL, map[string]string{"token": "s3cret"}))

	if len(rc.bodies) != 3 {
		t.Fatalf("calls: got %d, want 3 (two refused, then delivered)", len(rc.bodies))
	}
	if got := *delays; len(got) != 2 || got[0] != DefaultBaseDelay || got[1] != 2*DefaultBaseDelay {
		t.Fatalf("backoff between attempts: got %v, want [1s 2s]", got)
	}
	if rc.auth[2] != "Bearer s3cret" {
		t.Fatalf("Authorization: got %q", rc.auth[2])
	}
	var ev Event
	if err := json.Unmarshal([]byte(rc.bodies[2]), &ev); err != nil || ev.Type != TaskStarted || ev.Task != "md" || ev.Progress != "0/3" {
		t.Fatalf("body %s: %+v, %v", rc.bodies[2], ev, err)
	}
	expectCount(t, d.Metrics.attempts, TaskStarted, AttemptFailed, 2)
	expectCount(t, d.Metrics.attempts, TaskStarted, AttemptSucceeded, 1)
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultDelivered, 1)
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultFailed, 0)
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	rc := &receiver{answers: []int{503, 503, 503, 503, 503, 503}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	d, delays := testDispatcher(t)

	d.deliverWith(context.Background(), started, hookFor(t, srv.URL, nil))

	if len(rc.bodies) != DefaultMaxAttempts {
		t.Fatalf("calls: got %d, want %d", len(rc.bodies), DefaultMaxAttempts)
	}
	if len(*delays) != DefaultMaxAttempts-1 {
		t.Fatalf("backoffs: got %v, want one between each two attempts", *delays)
	}
	expectCount(t, d.Metrics.attempts, TaskStarted, AttemptFailed, DefaultMaxAttempts)
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultFailed, 1)
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultDelivered, 0)
}

func TestARefusedRequestIsNotRetried(t *testing.T) {
	rc := &receiver{answers: []int{http.StatusUnauthorized}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	d, delays := testDispatcher(t)

	d.deliverWith(context.Background(), started, hookFor(t, srv.URL, nil))

	if len(rc.bodies) != 1 || len(*delays) != 0 {
		t.Fatalf("a 401 is tried once: got %d calls, backoffs %v", len(rc.bodies), *delays)
	}
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultFailed, 1)
}

func TestDropsWhenTheQueueIsFull(t *testing.T) {
	d, _ := testDispatcher(t) // not started: nothing takes from the queue
	for i := range 2 {
		if !d.Enqueue(started) {
			t.Fatalf("notification %d dropped with room in the queue", i+1)
		}
	}
	if d.Enqueue(started) {
		t.Fatal("a third notification was queued in a queue of 2")
	}
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultDropped, 1)
}

func TestATasksNotificationsShareOneWorker(t *testing.T) {
	d := &Dispatcher{Metrics: NewMetrics(prometheus.NewRegistry()), Workers: 4, QueueSize: 400}
	d.init()
	for range 3 {
		d.Enqueue(started)
	}
	used := 0
	for _, q := range d.queues {
		if len(q) > 0 {
			used++
			if len(q) != 3 {
				t.Fatalf("the task's queue holds %d of its 3 notifications", len(q))
			}
		}
	}
	if used != 1 {
		t.Fatalf("one task's notifications went to %d workers, want 1 (their order is kept by one worker)", used)
	}
}

func TestParseWebhook(t *testing.T) {
	key := client.ObjectKey{Namespace: "ns", Name: "hook"}
	for _, tc := range []struct {
		name    string
		data    map[string]string
		format  inplacev1.NotifyFormat
		wantErr string
		want    inplacev1.NotifyFormat
	}{
		{name: "url only", data: map[string]string{"url": "https://hooks.example/x"}, want: inplacev1.NotifyFormatJSON},
		{name: "format from the Secret", data: map[string]string{"url": "https://hooks.example/x", "format": "Slack"}, want: inplacev1.NotifyFormatSlack},
		{name: "the task's format wins", data: map[string]string{"url": "https://hooks.example/x", "format": "Slack"}, format: inplacev1.NotifyFormatJSON, want: inplacev1.NotifyFormatJSON},
		{name: "no url", data: map[string]string{"token": "t"}, wantErr: `Secret ns/hook has no "url" key; add the webhook's URL under it`},
		{name: "not a URL", data: map[string]string{"url": "hooks.example"}, wantErr: `"url" is not an http or https URL`},
		{name: "bad format", data: map[string]string{"url": "http://h/", "format": "XML"}, wantErr: `"format" is "XML"; set it to JSON or Slack`},
		{name: "bad header", data: map[string]string{"url": "http://h/", "headers": "X-Ok: 1\nnocolon"}, wantErr: `line 2 of "headers" is not "Name: value"`},
		{name: "bad ca", data: map[string]string{"url": "https://h/", "ca.crt": "not pem"}, wantErr: `"ca.crt" holds no PEM certificate`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := &corev1.Secret{Data: map[string][]byte{}}
			for k, v := range tc.data {
				secret.Data[k] = []byte(v)
			}
			hook, err := parseWebhook(key, secret, tc.format, lab)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error: got %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || hook.format != tc.want {
				t.Fatalf("got %+v, %v; want format %s", hook, err, tc.want)
			}
		})
	}
}

func TestSlackBody(t *testing.T) {
	ev := Event{Type: NodeFailed, Namespace: "ns", Cluster: "c", Task: "md", Version: "v1.34.1", Machine: "workers-2", Node: "n2", Message: "boom", Progress: "1/3"}
	body, err := Body(ev, inplacev1.NotifyFormatSlack)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"text":"Cluster ns/c, UpgradeTask md to v1.34.1: machine workers-2 (node n2) failed: boom (1/3 upgraded)"}`
	if string(body) != want {
		t.Fatalf("got %s, want %s", body, want)
	}
}

func expectCount(t *testing.T, c *prometheus.CounterVec, event, result string, want float64) {
	t.Helper()
	m := &dto.Metric{}
	if err := c.WithLabelValues(event, result).Write(m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != want {
		t.Fatalf("%s{%s,%s}: got %v, want %v", "counter", event, result, got, want)
	}
}
