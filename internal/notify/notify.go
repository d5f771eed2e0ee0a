// Package notify tells a webhook what happens to an upgrade: a bounded in-memory queue
// and a pool of workers deliver each notification, retried with exponential backoff,
// without ever making the caller wait. The queue lives in memory: what is queued or being
// retried when the manager stops is not sent (at most once across a restart).
package notify

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/fence"
)

// Event types: what happened.
const (
	// TaskStarted: the task's first node started (its phase became InProgress).
	TaskStarted = "TaskStarted"
	// NodeFailed: a machine's upgrade failed.
	NodeFailed = "NodeFailed"
	// TaskPaused: the task's Paused condition became True, or changed its reason.
	TaskPaused = "TaskPaused"
	// TaskResumed: the task's Paused condition went back to False while the task runs.
	TaskResumed = "TaskResumed"
	// TaskCompleted: every machine reached the version.
	TaskCompleted = "TaskCompleted"
	// TaskFailed: the task ended because a node failed.
	TaskFailed = "TaskFailed"
	// TaskAborted: the task was stopped on request.
	TaskAborted = "TaskAborted"
)

// Event is what a webhook is told, as the JSON body's fields.
type Event struct {
	// Type is one of the event types above.
	Type string `json:"type"`
	// Namespace is the namespace of the Cluster and the task.
	Namespace string `json:"namespace"`
	// Cluster is the CAPI Cluster's name.
	Cluster string `json:"cluster"`
	// Task is the UpgradeTask's name.
	Task string `json:"task"`
	// Version is the version the task upgrades to.
	Version string `json:"version"`
	// Phase is the task's phase after the change.
	Phase string `json:"phase"`
	// Machine and Node name the machine concerned (NodeFailed), else are empty.
	Machine string `json:"machine,omitempty"`
	Node    string `json:"node,omitempty"`
	// Reason is a CamelCase word for why (the Paused condition's reason, Failed, ...).
	Reason string `json:"reason,omitempty"`
	// Message says what happened, for a person.
	Message string `json:"message,omitempty"`
	// Progress is upgraded/total machines.
	Progress string `json:"progress"`
	// Time is when the controller saw the change.
	Time time.Time `json:"time"`
}

// Notification is one event for one webhook.
type Notification struct {
	Event Event
	// SecretNamespace and SecretName name the Secret that configures the webhook.
	SecretNamespace string
	SecretName      string
	// Format, when set, is the body's format; unset means the Secret's "format" key, else JSON.
	Format inplacev1.NotifyFormat
	// Regarding is the object the Warning events of a notification that could not be
	// sent are recorded on (the UpgradeTask).
	Regarding runtime.Object
}

// Defaults of a Dispatcher's unset fields.
const (
	DefaultWorkers     = 2
	DefaultQueueSize   = 256
	DefaultMaxAttempts = 5
	DefaultBaseDelay   = time.Second
	DefaultMaxDelay    = 30 * time.Second
	DefaultTimeout     = 10 * time.Second
)

// Dispatcher queues notifications and delivers them in the background; it is a
// manager.Runnable. The notifications of one task go to one worker, in the order they
// were queued: a webhook sees a task's events in the order they happened.
type Dispatcher struct {
	// Reader reads the notification Secrets (the API server, not a cache of every Secret).
	Reader client.Reader
	// Recorder records a Warning event on a notification's Regarding object when it
	// cannot be sent.
	Recorder events.EventRecorder
	// Metrics counts notifications and attempts; nil means NewMetrics on controller-runtime's registry.
	Metrics *Metrics
	// Workers, QueueSize (all workers together), MaxAttempts, BaseDelay, MaxDelay and
	// Timeout (of one HTTP call); zero means the Default above.
	Workers     int
	QueueSize   int
	MaxAttempts int
	BaseDelay   time.Duration
	MaxDelay    time.Duration
	Timeout     time.Duration
	// Fetch fences the calls to the webhooks (internal/fence); its zero value is the
	// strict one (https only, no link-local or metadata address).
	Fetch fence.Policy

	queues []chan Notification
	// sleep waits d or until ctx ends (false then); tests replace it to see the delays
	// without waiting them.
	sleep func(ctx context.Context, d time.Duration) bool
}

// New returns a Dispatcher with the defaults filled in; its queue takes notifications
// at once, and Start delivers them.
func New(reader client.Reader, recorder events.EventRecorder, metrics *Metrics) *Dispatcher {
	d := &Dispatcher{Reader: reader, Recorder: recorder, Metrics: metrics}
	d.init()
	return d
}

func (d *Dispatcher) init() {
	if d.queues != nil {
		return
	}
	if d.Workers <= 0 {
		d.Workers = DefaultWorkers
	}
	if d.QueueSize <= 0 {
		d.QueueSize = DefaultQueueSize
	}
	if d.MaxAttempts <= 0 {
		d.MaxAttempts = DefaultMaxAttempts
	}
	if d.BaseDelay <= 0 {
		d.BaseDelay = DefaultBaseDelay
	}
	if d.MaxDelay <= 0 {
		d.MaxDelay = DefaultMaxDelay
	}
	if d.Timeout <= 0 {
		d.Timeout = DefaultTimeout
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics(nil)
	}
	if d.sleep == nil {
		d.sleep = sleepCtx
	}
	per := max(1, d.QueueSize/d.Workers)
	d.queues = make([]chan Notification, d.Workers)
	for i := range d.queues {
		d.queues[i] = make(chan Notification, per)
	}
}

// Enqueue queues a notification and returns at once. When the task's queue is full the
// notification is dropped, counted, and false is returned.
func (d *Dispatcher) Enqueue(n Notification) bool {
	if d == nil {
		return false
	}
	d.init()
	h := fnv.New32a()
	_, _ = h.Write([]byte(n.Event.Namespace + "/" + n.Event.Task))
	select {
	case d.queues[h.Sum32()%uint32(len(d.queues))] <- n:
		return true
	default:
		d.Metrics.notification(n.Event.Type, ResultDropped)
		return false
	}
}

// Start runs the workers until ctx ends; what is still queued then is not sent.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.init()
	done := make(chan struct{}, len(d.queues))
	for _, q := range d.queues {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-ctx.Done():
					return
				case n := <-q:
					d.deliver(ctx, n)
				}
			}
		}()
	}
	for range d.queues {
		<-done
	}
	return nil
}

// deliver sends one notification, retrying with backoff, and records how it ended.
func (d *Dispatcher) deliver(ctx context.Context, n Notification) {
	d.deliverWith(ctx, n, func() (*webhook, error) { return d.readWebhook(ctx, n) })
}

// deliverWith is deliver with the webhook read by load, again after a failed read.
func (d *Dispatcher) deliverWith(ctx context.Context, n Notification, load func() (*webhook, error)) {
	log := ctrl.LoggerFrom(ctx).WithValues("notification", n.Event.Type, "namespace", n.Event.Namespace, "task", n.Event.Task, "secret", n.SecretName)
	var hook *webhook
	var lastErr error
	for attempt := 1; attempt <= d.MaxAttempts; attempt++ {
		if hook == nil {
			var err error
			if hook, err = load(); err != nil {
				var cfg *ConfigError
				if errors.As(err, &cfg) {
					d.Metrics.notification(n.Event.Type, ResultNotConfigured)
					log.Info("notification not sent: its configuration is incomplete", "problem", err.Error())
					d.warn(n, inplacev1.NotificationNotConfiguredReason, "%s notification not sent: %v; the upgrade goes on", n.Event.Type, err)
					return
				}
				// The Secret could not be read (the API server did not answer): tried
				// again like a failed call.
				lastErr = err
			}
		}
		if hook != nil {
			var permanent bool
			permanent, lastErr = hook.send(ctx, n.Event, d.Timeout)
			if lastErr == nil {
				d.Metrics.attempt(n.Event.Type, AttemptSucceeded)
				d.Metrics.notification(n.Event.Type, ResultDelivered)
				log.V(4).Info("notification delivered", "attempts", attempt)
				return
			}
			d.Metrics.attempt(n.Event.Type, AttemptFailed)
			log.V(4).Info("notification attempt failed", "attempt", attempt, "error", lastErr.Error())
			if permanent {
				break
			}
		}
		if attempt == d.MaxAttempts || !d.sleep(ctx, Backoff(attempt, d.BaseDelay, d.MaxDelay)) {
			break
		}
	}
	if ctx.Err() != nil {
		// The manager stops: the notification is lost, as the rest of the queue.
		return
	}
	d.Metrics.notification(n.Event.Type, ResultFailed)
	log.Info("notification not delivered", "error", lastErr.Error())
	d.warn(n, inplacev1.NotificationFailedReason, "%s notification not delivered: %v", n.Event.Type, lastErr)
}

// Backoff is how long to wait after the attempt-th failed attempt (from 1): base,
// doubled each time, at most max.
func Backoff(attempt int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

func (d *Dispatcher) warn(n Notification, reason, format string, args ...any) {
	if d.Recorder == nil || n.Regarding == nil {
		return
	}
	d.Recorder.Eventf(n.Regarding, nil, corev1.EventTypeWarning, reason, "Notify", format, args...)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ConfigError says what is missing from a notification's configuration and what to do.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

// webhook is a notification Secret, read and checked.
type webhook struct {
	url     string
	headers http.Header
	format  inplacev1.NotifyFormat
	client  *fence.Client
}

const secretKeys = `"url" (required), optionally "token", "headers", "ca.crt", "format"`

// readWebhook reads and checks the notification's Secret. A missing Secret, key or a
// value that does not parse is a *ConfigError.
func (d *Dispatcher) readWebhook(ctx context.Context, n Notification) (*webhook, error) {
	secret := &corev1.Secret{}
	key := client.ObjectKey{Namespace: n.SecretNamespace, Name: n.SecretName}
	if err := d.Reader.Get(ctx, key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &ConfigError{fmt.Sprintf("Secret %s not found; create it with the keys %s", key, secretKeys)}
		}
		return nil, fmt.Errorf("read Secret %s: %w", key, err)
	}
	return parseWebhook(key, secret, n.Format, d.Fetch)
}

// parseWebhook checks a notification Secret's keys, and its URL against the fence;
// format, when set, wins over the Secret's. What is missing, does not parse or is
// refused is a *ConfigError that says what to do.
func parseWebhook(key client.ObjectKey, secret *corev1.Secret, format inplacev1.NotifyFormat, fetch fence.Policy) (*webhook, error) {
	raw := strings.TrimSpace(string(secret.Data[inplacev1.NotifyURLKey]))
	if raw == "" {
		return nil, &ConfigError{fmt.Sprintf("Secret %s has no %q key; add the webhook's URL under it", key, inplacev1.NotifyURLKey)}
	}
	// Neither url.Parse's error nor the URL is printed: a Slack webhook's path is its secret.
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &ConfigError{fmt.Sprintf("Secret %s: %q is not an http or https URL; set it to the webhook's URL", key, inplacev1.NotifyURLKey)}
	}
	if err := fetch.CheckURL(fmt.Sprintf("Secret %s: %q", key, inplacev1.NotifyURLKey), u); err != nil {
		return nil, &ConfigError{err.Error()}
	}
	hook := &webhook{url: raw, headers: http.Header{}, format: format}
	if hook.format == "" {
		hook.format = inplacev1.NotifyFormat(strings.TrimSpace(string(secret.Data[inplacev1.NotifyFormatKey])))
	}
	switch hook.format {
	case "":
		hook.format = inplacev1.NotifyFormatJSON
	case inplacev1.NotifyFormatJSON, inplacev1.NotifyFormatSlack:
	default:
		return nil, &ConfigError{fmt.Sprintf("Secret %s: %q is %q; set it to JSON or Slack", key, inplacev1.NotifyFormatKey, hook.format)}
	}
	for i, line := range strings.Split(string(secret.Data[inplacev1.NotifyHeadersKey]), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, &ConfigError{fmt.Sprintf("Secret %s: line %d of %q is not \"Name: value\"", key, i+1, inplacev1.NotifyHeadersKey)}
		}
		hook.headers.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	if token := strings.TrimSpace(string(secret.Data[inplacev1.NotifyTokenKey])); token != "" {
		hook.headers.Set("Authorization", "Bearer "+token)
	}
	var roots *x509.CertPool
	if ca := secret.Data[inplacev1.NotifyCAKey]; len(ca) > 0 {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(ca) {
			return nil, &ConfigError{fmt.Sprintf("Secret %s: %q holds no PEM certificate; put the CA that signs the webhook's certificate there, or remove the key", key, inplacev1.NotifyCAKey)}
		}
	}
	hook.client = fetch.NewClient(roots)
	return hook, nil
}

// send makes one HTTP call. permanent says that trying again cannot help: the webhook
// refused the request itself (a 4xx other than 408 and 429).
func (w *webhook) send(ctx context.Context, ev Event, timeout time.Duration) (permanent bool, err error) {
	body, err := Body(ev, w.format)
	if err != nil {
		return true, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		// Its error repeats the URL, whose path may be a secret: not printed.
		return true, errors.New("the URL does not make a request; set it to the webhook's URL")
	}
	for k, v := range w.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	// The answer is read only for an excerpt of a refusal.
	resp, err := w.client.Do(req, 4<<10)
	if err != nil {
		// The fence's errors name no URL (a Slack webhook's path is its secret). A
		// refusal of the fence is not tried again.
		return fence.IsRefused(err), fmt.Errorf("POST to the webhook: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		return false, nil
	}
	// The status line's text and the body come from the server: its status code and a
	// short excerpt without control characters or the request's credentials.
	err = fmt.Errorf("the webhook answered HTTP %d: %s", resp.StatusCode, fence.Excerpt(resp.Body, fence.Secrets(req)...))
	permanent = resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests
	return permanent, err
}

// Body is the request body of an event in a format.
func Body(ev Event, format inplacev1.NotifyFormat) ([]byte, error) {
	if format == inplacev1.NotifyFormatSlack {
		return json.Marshal(map[string]string{"text": SlackText(ev)})
	}
	return json.Marshal(ev)
}

// SlackText is the one line a Slack-compatible webhook shows for an event.
func SlackText(ev Event) string {
	var what string
	switch ev.Type {
	case TaskStarted:
		what = "started"
	case NodeFailed:
		what = fmt.Sprintf("machine %s (node %s) failed: %s", ev.Machine, ev.Node, ev.Message)
	case TaskPaused:
		what = fmt.Sprintf("paused (%s): %s", ev.Reason, ev.Message)
	case TaskResumed:
		what = "resumed"
	case TaskCompleted:
		what = "completed"
	case TaskFailed:
		what = "failed: " + ev.Message
	case TaskAborted:
		what = "aborted"
	default:
		what = ev.Type + ": " + ev.Message
	}
	return fmt.Sprintf("Cluster %s/%s, UpgradeTask %s to %s: %s (%s upgraded)", ev.Namespace, ev.Cluster, ev.Task, ev.Version, what, ev.Progress)
}
