package notify

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/capi-inplace/capi-inplace/internal/metricsreg"
)

// How a notification ended, the result label of capi_inplace_notifications_total.
const (
	// ResultDelivered: the webhook answered 2xx.
	ResultDelivered = "delivered"
	// ResultFailed: every attempt failed, or the webhook refused it (4xx).
	ResultFailed = "failed"
	// ResultDropped: the queue was full; it was never sent.
	ResultDropped = "dropped"
	// ResultNotConfigured: its Secret is missing or incomplete; it was never sent.
	ResultNotConfigured = "not_configured"
)

// How one HTTP call ended, the result label of capi_inplace_notification_attempts_total.
const (
	AttemptSucceeded = "succeeded"
	AttemptFailed    = "failed"
)

// Metrics are the notification metrics.
type Metrics struct {
	// notifications counts notifications by event type and how they ended.
	notifications *prometheus.CounterVec
	// attempts counts HTTP calls to webhooks by event type and result.
	attempts *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg (controller-runtime's
// registry when nil). Registering twice (several managers in one process, as in tests)
// reuses the collectors already registered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m := &Metrics{
		notifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capi_inplace_notifications_total",
			Help: "Notifications by event type and how they ended: delivered, failed (every attempt failed or the webhook refused it), dropped (queue full), not_configured (Secret missing or incomplete).",
		}, []string{"event", "result"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capi_inplace_notification_attempts_total",
			Help: "HTTP calls to notification webhooks by event type and result (succeeded, failed); a notification retried counts each call.",
		}, []string{"event", "result"}),
	}
	m.notifications = metricsreg.Register(reg, m.notifications)
	m.attempts = metricsreg.Register(reg, m.attempts)
	return m
}

func (m *Metrics) notification(event, result string) {
	m.notifications.WithLabelValues(event, result).Inc()
}

func (m *Metrics) attempt(event, result string) {
	m.attempts.WithLabelValues(event, result).Inc()
}
