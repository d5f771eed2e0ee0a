package upgraderequest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func TestTaskName(t *testing.T) {
	hash := digest("request")
	for _, tc := range []struct {
		name, target, version string
		attempt               int
		want                  string
	}{
		{"readable", "workers", "v1.33.3+rke2r1", 1, "workers-v1.33.3-rke2r1-" + hash[:8]},
		{"a later attempt", "workers", "v1.33.3", 3, "workers-v1.33.3-" + hash[:8] + "-3"},
		{"upper case and odd characters", "Pool_A", "v1.34.0-rc.1", 1, "pool-a-v1.34.0-rc.1-" + hash[:8]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TaskName(tc.target, tc.version, hash, tc.attempt); got != tc.want {
				t.Fatalf("TaskName = %q; want %q", got, tc.want)
			}
		})
	}
	long := TaskName(strings.Repeat("machinedeployment", 5), "v1.33.3+rke2r1", hash, 12)
	if len(long) > 63 || !strings.HasSuffix(long, "-"+hash[:8]+"-12") {
		t.Fatalf("a long name must be shortened to 63 characters keeping the digest and attempt, got %q (%d)", long, len(long))
	}
	if errs := validation.IsValidLabelValue(long); len(errs) > 0 {
		t.Fatalf("task name %q is not a valid label value: %v", long, errs)
	}
	if errs := validation.IsDNS1123Subdomain(long); len(errs) > 0 {
		t.Fatalf("task name %q is not a valid object name: %v", long, errs)
	}
}

func TestRequestHash(t *testing.T) {
	base := Request{Namespace: "ns", ClusterName: "c", Target: Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "w"}},
		Version: "v1.34.1", Machines: []string{"b", "a"}}
	same := base
	same.Machines = []string{"a", "b"}
	if requestHash(base) != requestHash(same) {
		t.Fatal("the order of machines must not make another request")
	}
	for name, mutate := range map[string]func(*Request){
		"version":        func(r *Request) { r.Version = "v1.34.2" },
		"maxUnavailable": func(r *Request) { r.MaxUnavailable = ptr.To(intstr.FromInt32(2)) },
		"target": func(r *Request) {
			r.Target = Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "x"}}
		},
		"machines": func(r *Request) { r.Machines = []string{"a"} },
	} {
		other := base
		mutate(&other)
		if requestHash(base) == requestHash(other) {
			t.Fatalf("another %s must make another request", name)
		}
	}
}

func TestRequiresUpgrade(t *testing.T) {
	target := version.MustParseSemantic("v1.34.1+rke2r2")
	for _, tc := range []struct {
		name        string
		spec        string
		release     string
		wantRequire bool
	}{
		{"older", "v1.33.3+rke2r1", "", true},
		{"same", "v1.34.1+rke2r2", "", false},
		{"same release, other build", "v1.34.1+rke2r1", "", true},
		{"newer", "v1.35.0", "", false},
		{"unknown", "", "", true},
		{"reached in place", "v1.33.3+rke2r1", "v1.34.1+rke2r2", false},
		{"same release, newer build", "v1.34.1+rke2r3", "", false},
		{"same release, build metadata without an order", "v1.34.1+foo", "", false},
		{"same release, no build metadata", "v1.34.1", "", false},
		{"the release annotation wins over an older spec", "v1.34.1+rke2r2", "v1.33.0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: clusterv1.MachineSpec{Version: tc.spec}}
			if tc.release != "" {
				m.Annotations = map[string]string{inplacev1.UpgradeReleaseAnnotation: tc.release}
			}
			if got := RequiresUpgrade(m, target); got != tc.wantRequire {
				t.Fatalf("RequiresUpgrade(%s, release %q) = %v; want %v", tc.spec, tc.release, got, tc.wantRequire)
			}
		})
	}
}

func TestReachedInPlace(t *testing.T) {
	target := version.MustParseSemantic("v1.34.1+rke2r2")
	for _, tc := range []struct {
		name, release, kubelet string
		want                   bool
	}{
		{"release annotation at the target", "v1.34.1+rke2r2", "", true},
		{"kubelet at the target", "", "v1.34.1+rke2r2", true},
		{"kubelet at an older build", "", "v1.34.1+rke2r1", false},
		{"kubelet at a newer build", "", "v1.34.1+rke2r3", false},
		{"kubelet with build metadata without an order", "", "v1.34.1+foo", false},
		{"only spec.version, which Cluster API writes before the update", "", "", false},
		{"kubelet at the target, release annotation of an earlier upgrade (soak seed 235)", "v1.34.1+rke2r1", "v1.34.1+rke2r2", true},
		{"release annotation at the target, kubelet not reported again yet", "v1.34.1+rke2r2", "v1.34.1+rke2r1", true},
		{"neither at the target", "v1.34.1+rke2r1", "v1.34.1+rke2r1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: clusterv1.MachineSpec{Version: target.String()}}
			if tc.release != "" {
				m.Annotations = map[string]string{inplacev1.UpgradeReleaseAnnotation: tc.release}
			}
			if tc.kubelet != "" {
				m.Status.NodeInfo = &corev1.NodeSystemInfo{KubeletVersion: tc.kubelet}
			}
			if got := ReachedInPlace(m, target); got != tc.want {
				t.Fatalf("ReachedInPlace(release %q, kubelet %q) = %v; want %v", tc.release, tc.kubelet, got, tc.want)
			}
		})
	}
}

// CurrentVersion takes the newer of the two records, so that selection (RequiresUpgrade)
// never starts a node whose kubelet already runs the target because an older release
// annotation was not brought up to date (soak seed 2).
func TestCurrentVersionIsTheNewerRecord(t *testing.T) {
	target := version.MustParseSemantic("v1.34.1+rke2r2")
	for _, tc := range []struct {
		name, release, kubelet, spec, want string
		requires                           bool
	}{
		{"kubelet newer than the release annotation (soak seed 2)", "v1.34.1+rke2r1", "v1.34.1+rke2r2", "v1.34.1+rke2r2", "v1.34.1+rke2r2", false},
		{"release annotation newer than a kubelet not reported again yet", "v1.34.1+rke2r2", "v1.34.1+rke2r1", "v1.34.1+rke2r2", "v1.34.1+rke2r2", false},
		{"both older", "v1.34.1+rke2r1", "v1.33.3+rke2r1", "v1.34.1+rke2r2", "v1.34.1+rke2r1", true},
		{"records without an order between them: the annotation", "v1.34.1+rke2r1", "v1.34.1+foo", "v1.34.1+rke2r2", "v1.34.1+rke2r1", true},
		{"only the kubelet", "", "v1.33.3+rke2r1", "v1.34.1+rke2r2", "v1.33.3+rke2r1", true},
		{"neither: spec.version", "", "", "v1.33.3+rke2r1", "v1.33.3+rke2r1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: clusterv1.MachineSpec{Version: tc.spec}}
			if tc.release != "" {
				m.Annotations = map[string]string{inplacev1.UpgradeReleaseAnnotation: tc.release}
			}
			if tc.kubelet != "" {
				m.Status.NodeInfo = &corev1.NodeSystemInfo{KubeletVersion: tc.kubelet}
			}
			if got := CurrentVersion(m); got != tc.want {
				t.Fatalf("CurrentVersion(release %q, kubelet %q) = %q; want %q", tc.release, tc.kubelet, got, tc.want)
			}
			if got := RequiresUpgrade(m, target); got != tc.requires {
				t.Fatalf("RequiresUpgrade(release %q, kubelet %q) = %v; want %v", tc.release, tc.kubelet, got, tc.requires)
			}
		})
	}
}

func TestNodeUpdateNameIsDeterministicAndValid(t *testing.T) {
	if NodeUpdateName("t", "m") != "t-m" {
		t.Fatal("short names are joined")
	}
	long := NodeUpdateName(strings.Repeat("t", 63), strings.Repeat("m", 240))
	if long != NodeUpdateName(strings.Repeat("t", 63), strings.Repeat("m", 240)) || len(long) > 253 {
		t.Fatalf("long names must be shortened deterministically: %q", long)
	}
	if LabelValue(strings.Repeat("a", 70)) == LabelValue(strings.Repeat("a", 71)) {
		t.Fatal("shortened label values must differ for different names")
	}
}
