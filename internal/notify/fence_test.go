package notify

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/capi-inplace/capi-inplace/internal/fence"
	"github.com/capi-inplace/capi-inplace/internal/fence/fencetest"
)

// The specs of the fence around the webhook calls (internal/fence): each runs the
// Dispatcher's delivery against a local server and reads the Warning event it records,
// the text an operator sees.

// warnings records the notes of the events a Dispatcher records.
type warnings struct {
	mu    sync.Mutex
	notes []string
}

func (w *warnings) Eventf(_ runtime.Object, _ runtime.Object, _, reason, _, note string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notes = append(w.notes, reason+": "+fmt.Sprintf(note, args...))
}

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.notes...)
}

// fencedDispatcher is testDispatcher with a recorder and the strict fence.
func fencedDispatcher(t *testing.T) (*Dispatcher, *warnings) {
	t.Helper()
	d, _ := testDispatcher(t)
	rec := &warnings{}
	d.Recorder = rec
	return d, rec
}

var regarding = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "task"}}

func startedAbout() Notification {
	n := started
	n.Regarding = regarding
	return n
}

// caOf is the PEM of the CA that signs an httptest TLS server's certificate.
func caOf(srv *httptest.Server) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
}

func only(t *testing.T, rec *warnings) string {
	t.Helper()
	notes := rec.all()
	if len(notes) != 1 {
		t.Fatalf("events: %q, want one", notes)
	}
	return notes[0]
}

func TestPlainHTTPIsRefusedUnlessAllowed(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	d, rec := fencedDispatcher(t)

	d.deliverWith(context.Background(), startedAbout(), hookWith(t, fence.Policy{AllowLoopback: true}, srv.URL+"/services/T0/B0/s3cretpath", nil))

	if len(rc.bodies) != 0 {
		t.Fatalf("the http webhook was called %d times", len(rc.bodies))
	}
	note := only(t, rec)
	for _, want := range []string{"NotificationNotConfigured: TaskStarted notification not sent: Secret ns/hook: \"url\" (" + srv.URL + ") is plain http", "--allow-http-fetch"} {
		if !strings.Contains(note, want) {
			t.Errorf("event %q does not say %q", note, want)
		}
	}
	if strings.Contains(note, "s3cretpath") {
		t.Errorf("event %q repeats the URL's path", note)
	}
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultNotConfigured, 1)

	d2, _ := fencedDispatcher(t)
	d2.deliverWith(context.Background(), startedAbout(), hookWith(t, lab, srv.URL, nil))
	if len(rc.bodies) != 1 {
		t.Fatalf("with http allowed the webhook was called %d times, want 1", len(rc.bodies))
	}
}

func TestCrossHostRedirectIsNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	var leaked atomic.Value
	leaked.Store("")
	other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		leaked.Store(r.Header.Get("Authorization") + r.Header.Get("X-Api-Key"))
	}))
	defer other.Close()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/collect", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	d, rec := fencedDispatcher(t)

	// One CA signs every httptest TLS server: the other host's certificate is trusted too.
	d.deliverWith(context.Background(), startedAbout(), hookWith(t, fence.Policy{AllowLoopback: true}, srv.URL+"/hook", map[string]string{
		"token": "s3cret", "headers": "X-Api-Key: k3y", "ca.crt": caOf(srv),
	}))

	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the other host was called %d times, with the credentials %q", n, leaked.Load())
	}
	note := only(t, rec)
	if want := "redirected to another origin, " + fence.Origin(mustURL(t, other.URL)); !strings.Contains(note, want) {
		t.Errorf("event %q does not say %q", note, want)
	}
	// A refusal of the fence is not tried again.
	expectCount(t, d.Metrics.attempts, TaskStarted, AttemptFailed, 1)
	expectCount(t, d.Metrics.notifications, TaskStarted, ResultFailed, 1)
}

func TestAnEchoedAnswerIsExcerpted(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		// An answer that repeats the request's credentials, with terminal escapes, a
		// bidirectional override and a lot more.
		_, _ = io.WriteString(w, "\x1b]0;owned\x07\x1b[2Jbad request from "+r.Header.Get("Authorization")+" key="+r.Header.Get("X-Api-Key")+"\u202e\r\n"+strings.Repeat("spam ", 2000))
	}))
	defer srv.Close()
	d, rec := fencedDispatcher(t)

	d.deliverWith(context.Background(), startedAbout(), hookWith(t, fence.Policy{AllowLoopback: true}, srv.URL, map[string]string{
		"token": "s3cret-t0ken", "headers": "X-Api-Key: k3y-value", "ca.crt": caOf(srv),
	}))

	note := only(t, rec)
	if !strings.HasPrefix(note, "NotificationFailed: TaskStarted notification not delivered: the webhook answered HTTP 400: ]0;owned [2Jbad request from [redacted] key=[redacted] spam spam") {
		t.Errorf("event %q", note)
	}
	for _, secret := range []string{"s3cret-t0ken", "k3y-value"} {
		if strings.Contains(note, secret) {
			t.Errorf("event %q repeats %q", note, secret)
		}
	}
	for _, r := range note {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			t.Fatalf("event %q holds %U", note, r)
		}
	}
	if n := utf8.RuneCountInString(note); n > 400 {
		t.Errorf("event of %d characters", n)
	}
}

func TestASlowWebhookFailsWithinTheTimeout(t *testing.T) {
	srv := fencetest.SlowTLSServer(t)
	d, rec := fencedDispatcher(t)
	d.Timeout = 200 * time.Millisecond
	d.MaxAttempts = 2

	start := time.Now()
	d.deliverWith(context.Background(), startedAbout(), hookWith(t, fence.Policy{AllowLoopback: true}, srv.URL, map[string]string{"ca.crt": caOf(srv)}))

	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("two attempts of 200ms took %s", took)
	}
	if note := only(t, rec); !strings.Contains(note, "POST to the webhook: no complete answer within 200ms") {
		t.Errorf("event %q does not name the timeout", note)
	}
	expectCount(t, d.Metrics.attempts, TaskStarted, AttemptFailed, 2)
}

func TestMetadataAddressesAreRefused(t *testing.T) {
	d, rec := fencedDispatcher(t)
	d.deliverWith(context.Background(), startedAbout(), hookWith(t, fence.Policy{}, "https://169.254.169.254/latest/meta-data/iam", nil))
	note := only(t, rec)
	if !strings.Contains(note, "169.254.169.254, a link-local address") || !strings.Contains(note, "--allow-link-local-fetch") {
		t.Errorf("event %q", note)
	}
	expectCount(t, d.Metrics.attempts, TaskStarted, AttemptFailed, 1)
}

func TestUserinfoIsNeverPrinted(t *testing.T) {
	d, rec := fencedDispatcher(t)
	// Port 1 of loopback: nothing listens, the call fails.
	d.MaxAttempts = 1
	d.deliverWith(context.Background(), startedAbout(), hookWith(t, fence.Policy{}, "https://alice:pa55word@127.0.0.1:1/hook?sig=q5ecret", nil))
	note := only(t, rec)
	for _, secret := range []string{"alice", "pa55word", "q5ecret", "/hook"} {
		if strings.Contains(note, secret) {
			t.Errorf("event %q repeats %q", note, secret)
		}
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
