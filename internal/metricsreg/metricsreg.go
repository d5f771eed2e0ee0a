// Package metricsreg registers Prometheus collectors so that several managers in one
// process (the tests) share them.
package metricsreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it; when reg already holds a collector of the
// same description (registered by an earlier manager in this process), it returns that
// one, so that every manager counts into what the registry serves.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(T); ok {
				return existing
			}
		}
	}
	return c
}
