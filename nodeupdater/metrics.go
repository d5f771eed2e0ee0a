package nodeupdater

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The collectors are the only package-level state: Prometheus collectors live once per
// process in controller-runtime's registry, which the manager's metrics endpoint serves.
var (
	nodeUpdateDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capi_inplace_nodeupdate_duration_seconds",
		Help: "Duration of node updates from start to end, by updater kind and result (Succeeded, Failed, Aborted).",
		// From a minute to eight hours: node upgrades with reboots take minutes to hours.
		Buckets: []float64{60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 14400, 28800},
	}, []string{"updater", "result"})

	nodeUpdatesInProgress = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "capi_inplace_nodeupdates_in_progress",
		Help: "NodeUpdates in phase InProgress, by updater kind.",
	}, []string{"updater"})

	nodeUpdatesFailed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "capi_inplace_nodeupdates_failed",
		Help: "NodeUpdates in phase Failed that still exist, by updater kind.",
	}, []string{"updater"})

	stepFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capi_inplace_nodeupdate_step_failures_total",
		Help: "Steps of node updates that failed, by updater kind and step.",
	}, []string{"updater", "step"})

	stepRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capi_inplace_nodeupdate_retries_total",
		Help: "Retryable errors of node updates that scheduled a retry, by updater kind and step.",
	}, []string{"updater", "step"})

	registerMetricsOnce sync.Once
	registerMetricsErr  error
)

// registerMetrics registers the collectors with controller-runtime's registry once per
// process, so that several managers in one process (tests) share them.
func registerMetrics() error {
	registerMetricsOnce.Do(func() {
		for _, c := range []prometheus.Collector{nodeUpdateDuration, nodeUpdatesInProgress, nodeUpdatesFailed, stepFailures, stepRetries} {
			if err := metrics.Registry.Register(c); err != nil {
				var already prometheus.AlreadyRegisteredError
				if !errors.As(err, &already) {
					registerMetricsErr = err
					return
				}
			}
		}
	})
	return registerMetricsErr
}
