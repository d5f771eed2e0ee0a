package faults_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/faults"
)

// counter reads a counter's sample whose labels include labels from controller-runtime's
// registry, the one the manager serves.
func counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestCountWarningsCountsWarningsOnly(t *testing.T) {
	fake := events.NewFakeRecorder(10)
	r := faults.CountWarnings(fake)
	if faults.CountWarnings(r) != r {
		t.Error("wrapping a counting recorder again must not count twice")
	}
	task := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"}}
	labels := map[string]string{"kind": "UpgradeTask", "reason": "UnitTestFailure"}
	before := counter(t, faults.WarningsMetric, labels)

	r.Eventf(task, nil, corev1.EventTypeWarning, "UnitTestFailure", "Test", "it broke: %s", "disk full")
	r.Eventf(task, nil, corev1.EventTypeNormal, "UnitTestFailure", "Test", "a normal event is not a failure")
	faults.CountWarnings(r).Eventf(task, nil, corev1.EventTypeWarning, "UnitTestFailure", "Test", "again")

	if got := counter(t, faults.WarningsMetric, labels) - before; got != 2 {
		t.Errorf("%s%v rose by %v, want 2 (two Warning events, no Normal one)", faults.WarningsMetric, labels, got)
	}
	if got := len(fake.Events); got != 3 {
		t.Errorf("the wrapped recorder recorded %d events, want all 3", got)
	}
	if e := <-fake.Events; e != "Warning UnitTestFailure it broke: disk full" {
		t.Errorf("first event %q", e)
	}
}

func TestHookFailed(t *testing.T) {
	labels := map[string]string{"hook": "UnitTestHook", "reason": "Unknown"}
	before := counter(t, faults.HookFailuresMetric, labels)
	faults.HookFailed("UnitTestHook", "")
	if got := counter(t, faults.HookFailuresMetric, labels) - before; got != 1 {
		t.Errorf("%s%v rose by %v, want 1", faults.HookFailuresMetric, labels, got)
	}
}

func TestKindOf(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("controlplane.cluster.x-k8s.io/v1beta2")
	u.SetKind("KubeadmControlPlane")
	for _, c := range []struct {
		obj  runtime.Object
		want string
	}{
		{&inplacev1.NodeUpdate{}, "NodeUpdate"},
		{u, "KubeadmControlPlane"},
		{&corev1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node"}}, "Node"},
	} {
		if got := faults.KindOf(c.obj); got != c.want {
			t.Errorf("KindOf(%T) = %q, want %q", c.obj, got, c.want)
		}
	}
}
