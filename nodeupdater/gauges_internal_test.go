package nodeupdater

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// TestGaugeBook follows NodeUpdates of two updater kinds through their phases, their
// deletion and a repeated observation, and reads the gauges after each change.
func TestGaugeBook(t *testing.T) {
	nu := func(name, kind string, phase inplacev1.NodeUpdatePhase) *inplacev1.NodeUpdate {
		return &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec:       inplacev1.NodeUpdateSpec{UpdaterRef: inplacev1.UpdaterReference{Kind: kind}},
			Status:     inplacev1.NodeUpdateStatus{Phase: phase},
		}
	}
	value := func(g prometheus.Gauge) float64 {
		m := &dto.Metric{}
		if err := g.Write(m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	want := func(step string, kind string, inProgress, failed float64) {
		t.Helper()
		if got := value(nodeUpdatesInProgress.WithLabelValues(kind)); got != inProgress {
			t.Errorf("%s: %s in progress %v, want %v", step, kind, got, inProgress)
		}
		if got := value(nodeUpdatesFailed.WithLabelValues(kind)); got != failed {
			t.Errorf("%s: %s failed %v, want %v", step, kind, got, failed)
		}
	}
	var b gaugeBook
	b.observe(nu("a", "Job", inplacev1.NodeUpdatePhasePending))
	want("a pending", "Job", 0, 0)
	b.observe(nu("a", "Job", inplacev1.NodeUpdatePhaseInProgress))
	b.observe(nu("b", "Job", inplacev1.NodeUpdatePhaseInProgress))
	b.observe(nu("c", "HarvesterUpgrader", inplacev1.NodeUpdatePhaseInProgress))
	want("a and b in progress", "Job", 2, 0)
	want("c in progress", "HarvesterUpgrader", 1, 0)
	b.observe(nu("a", "Job", inplacev1.NodeUpdatePhaseInProgress))
	want("a seen again", "Job", 2, 0)
	b.observe(nu("a", "Job", inplacev1.NodeUpdatePhaseFailed))
	want("a failed", "Job", 1, 1)
	b.observe(nu("b", "Job", inplacev1.NodeUpdatePhaseSucceeded))
	want("b succeeded", "Job", 0, 1)
	b.forget(types.NamespacedName{Namespace: "ns", Name: "a"})
	b.forget(types.NamespacedName{Namespace: "ns", Name: "a"})
	want("a deleted, twice", "Job", 0, 0)
	want("c still in progress", "HarvesterUpgrader", 1, 0)
	b.forget(types.NamespacedName{Namespace: "ns", Name: "c"})
	want("c deleted", "HarvesterUpgrader", 0, 0)
}
