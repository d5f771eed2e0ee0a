// Package faults makes every failure of capi-inplace countable. Each failure path says
// what went wrong with a Warning event on the object concerned (and a condition, where
// the object is ours); the event recorder every controller gets is wrapped by
// CountWarnings, so each Warning event also increments capi_inplace_warnings_total by the
// object's kind and the event's reason, without a counter call of its own on any path.
// The hook handlers, whose failures are answers rather than events, count their Failure
// answers in capi_inplace_hook_failures_total. ReportErrors gives an error that a
// reconciler returns (and that otherwise only the log would show) the same treatment.
package faults

import (
	"errors"
	"reflect"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric names, for tests and documentation.
const (
	WarningsMetric     = "capi_inplace_warnings_total"
	HookFailuresMetric = "capi_inplace_hook_failures_total"
)

var (
	warnings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: WarningsMetric,
		Help: "Warning events recorded, by the kind of the object they are about and their reason: every failure path of capi-inplace records one.",
	}, []string{"kind", "reason"})

	hookFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: HookFailuresMetric,
		Help: "Failure answers of the runtime hooks (and declines of ExternalUpgradeRequest), by hook and reason.",
	}, []string{"hook", "reason"})

	registerOnce sync.Once
)

// register adds the collectors to controller-runtime's registry, which the manager's
// metrics endpoint serves, once per process.
func register() {
	registerOnce.Do(func() {
		for _, c := range []prometheus.Collector{warnings, hookFailures} {
			if err := ctrlmetrics.Registry.Register(c); err != nil {
				var already prometheus.AlreadyRegisteredError
				if !errors.As(err, &already) {
					panic(err)
				}
			}
		}
	})
}

func init() { register() }

// countingRecorder counts the Warning events it records.
type countingRecorder struct {
	events.EventRecorder
}

// CountWarnings wraps an event recorder so that every Warning event it records also
// increments capi_inplace_warnings_total{kind,reason}. A recorder already wrapped, or
// nil, is returned as it is.
func CountWarnings(r events.EventRecorder) events.EventRecorder {
	if r == nil {
		return nil
	}
	if _, ok := r.(countingRecorder); ok {
		return r
	}
	return countingRecorder{EventRecorder: r}
}

// Eventf implements events.EventRecorder.
func (c countingRecorder) Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if eventtype == corev1.EventTypeWarning {
		warnings.WithLabelValues(KindOf(regarding), reason).Inc()
	}
	c.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// HookFailed counts one Failure answer (or decline) of a hook.
func HookFailed(hook, reason string) {
	if reason == "" {
		reason = "Unknown"
	}
	hookFailures.WithLabelValues(hook, reason).Inc()
}

// KindOf names an object's kind: its type meta when set (unstructured objects, and typed
// ones read with it), else its Go type's name, which is the kind for the API types.
func KindOf(obj runtime.Object) string {
	if obj == nil {
		return ""
	}
	if kind := obj.GetObjectKind().GroupVersionKind().Kind; kind != "" {
		return kind
	}
	t := reflect.TypeOf(obj)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}
