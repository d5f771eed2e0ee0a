package metricsreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterReturnsTheCollectorAlreadyRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "capi_inplace_test_total", Help: "test"}
	first := Register(reg, prometheus.NewCounter(opts))
	second := Register(reg, prometheus.NewCounter(opts))
	if first != second {
		t.Fatal("a second collector of the same description was not replaced by the one registered")
	}
	second.Inc()
	families, err := reg.Gather()
	if err != nil || len(families) != 1 || families[0].GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Fatalf("the registry does not serve what the second manager counted: %v %v", families, err)
	}
}
