package healthgate

import (
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

func TestParseKinds(t *testing.T) {
	got, err := ParseKinds(" v1/Secret, Setting.x , longhorn.io/Setting,apps/v1/Deployment,ConfigMap,")
	if err != nil {
		t.Fatal(err)
	}
	want := []schema.GroupKind{{Kind: "Secret"}, {Kind: "Setting.x"}, {Group: "longhorn.io", Kind: "Setting"}, {Group: "apps", Kind: "Deployment"}, {Kind: "ConfigMap"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseKinds = %v, want %v", got, want)
	}
	if got, err := ParseKinds(""); err != nil || len(got) != 0 {
		t.Fatalf("ParseKinds of nothing = %v, %v; want none", got, err)
	}
	for _, bad := range []string{"a/b/c/D", "v1/", "/Secret"} {
		if _, err := ParseKinds(bad); err == nil {
			t.Fatalf("ParseKinds(%q) gave no error", bad)
		}
	}
	p := DefaultPolicy()
	if !p.celDenied("", "Secret") || !p.celDenied("", "secret") || p.celDenied("example.io", "Secret") || p.celDenied("", "ConfigMap") {
		t.Fatalf("the default policy denies %v: want core Secrets only", p.CELDeniedKinds)
	}
}

// TestCELFailureQuotesNoValue evaluates expressions whose failures cel-go describes with
// the value at hand: the gate's message keeps only what went wrong.
func TestCELFailureQuotesNoValue(t *testing.T) {
	const secret = "s3cr3t-token-value"
	for _, expr := range []string{
		`objects.all(o, int(o.data.token) > 0)`,
		`objects.all(o, {"x": true}[o.data.token])`,
		`objects.all(o, duration(o.data.token) > duration("1s"))`,
		`objects.all(o, timestamp(o.data.token) > timestamp("2020-01-01T00:00:00Z"))`,
	} {
		prg, err := CompileCEL(expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		_, _, err = prg.Eval(map[string]any{"objects": []any{map[string]any{"data": map[string]any{"token": secret}}}})
		if err == nil {
			t.Fatalf("%s did not fail", expr)
		}
		if kind := celErrorKind(err); kind == "" || strings.Contains(kind, secret) {
			t.Fatalf("%s failed with %q; celErrorKind = %q, want the failure without the value", expr, err, kind)
		}
	}
}
