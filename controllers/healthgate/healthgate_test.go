package healthgate

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func TestJobNameIsStableAndFits(t *testing.T) {
	if a, b := JobName("md", "smoke", 2), JobName("md", "smoke", 2); a != b || a != "gate-md-smoke-2" {
		t.Fatalf("JobName = %q and %q, want gate-md-smoke-2 twice", a, b)
	}
	long := JobName(strings.Repeat("t", 60), strings.Repeat("g", 60), 12)
	if len(long) > 63 || !strings.HasSuffix(long, "-12") {
		t.Fatalf("JobName of long names = %q (%d characters), want at most 63 ending in -12", long, len(long))
	}
	if other := JobName(strings.Repeat("t", 60), strings.Repeat("g", 59)+"h", 12); other == long {
		t.Fatalf("two gates share the Job name %q", long)
	}
}

func TestCompileCEL(t *testing.T) {
	if _, err := CompileCEL(`objects.all(v, v.status.robustness == "healthy")`); err != nil {
		t.Fatalf("valid expression: %v", err)
	}
	if _, err := CompileCEL(`objects.all(v, v.status ==`); err == nil || !strings.Contains(err.Error(), "Syntax error") {
		t.Fatalf("bad expression: err = %v, want a syntax error", err)
	}
	if _, err := CompileCEL(`objects.size()`); err == nil || !strings.Contains(err.Error(), "not a bool") {
		t.Fatalf("int expression: err = %v, want not a bool", err)
	}
}

func TestMerge(t *testing.T) {
	cluster := func(value string) *clusterv1.Cluster {
		return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", Annotations: map[string]string{inplacev1.GatesAnnotation: value}}}
	}
	own := []inplacev1.HealthGate{{Name: "a", CEL: &inplacev1.CELGate{Expression: "true"}}}
	gates, bad := Merge(own, cluster(`[{"name":"a","job":{"namespace":"x","template":{}}},{"name":"b","cel":{"expression":"true","resource":{"apiVersion":"v1","kind":"Pod"}}}]`))
	if len(bad) != 0 || len(gates) != 2 || gates[0].CEL == nil || gates[1].Name != "b" {
		t.Fatalf("Merge = %+v, %+v; want the task's a, then the Cluster's b", gates, bad)
	}
	for value, want := range map[string]string{
		`{"name":"a"}`:                "is not a JSON list of gates",
		`[{"cel":{}}]`:                "has a gate without a name (item 0)",
		`[{"name":"x"},{"name":"x"}]`: `names gate "x" twice`,
	} {
		_, bad := Merge(own, cluster(value))
		if len(bad) != 1 || bad[0].Green || bad[0].Name != AnnotationGateName || !strings.Contains(bad[0].Message, want) {
			t.Fatalf("Merge(%s) = %+v, want one red gate saying %q", value, bad, want)
		}
	}
	if err := Validate(&inplacev1.HealthGate{Name: "two", CEL: &inplacev1.CELGate{}, Job: &inplacev1.JobGate{}}); err == nil || !strings.Contains(err.Error(), "set exactly one") {
		t.Fatalf("Validate of two kinds: %v", err)
	}
}
