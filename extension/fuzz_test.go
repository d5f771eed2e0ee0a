package extension

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
)

// FuzzJudgeVersion checks the in-place verdict on a version change for any pair of
// strings: no panic, and a covered change is always a real upgrade by kubeversion.Compare
// (build metadata included: +rke2rN and +k3sN by N, any other build difference never),
// never decided by comparing strings.
func FuzzJudgeVersion(f *testing.F) {
	for _, seed := range [][2]string{
		{"v1.33.3+rke2r1", "v1.34.1+rke2r1"}, {"v1.34.1+rke2r1", "v1.33.3+rke2r1"},
		{"v1.9.0", "v1.10.0"}, {"v1.10.0", "v1.9.0"}, {"v1.33.3+rke2r1", "v1.33.3+rke2r2"},
		{"v1.33.3", "1.34"}, {"", "v1.2.3"}, {"v1.33.3-rc.1", "v1.33.3"}, {"v1.33.3", "v1.35.0"},
		{"v1.33.3+rke2r2", "v1.33.3+rke2r1"}, {"v1.33.3+rke2r9", "v1.33.3+rke2r10"}, {"v1.33.3+k3s2", "v1.33.3+k3s1"},
		{"v1.33.3+foo", "v1.33.3+bar"}, {"v1.33.3", "v1.33.3+rke2r1"}, {"v1.33.3+rke2r1", "v1.33.3"},
		{"v1.33.3+rke2r1", "v1.33.3+k3s1"}, {"v1.33.3+rke2r1", "v1.33.3+rke2r01"},
	} {
		f.Add(seed[0], seed[1], true)
		f.Add(seed[0], seed[1], false)
	}
	f.Fuzz(func(t *testing.T, current, desired string, controlPlane bool) {
		v := judgeVersion(current, desired, controlPlane)
		if v.changed != (current != desired) {
			t.Fatalf("changed=%v for %q -> %q", v.changed, current, desired)
		}
		if !v.changed {
			return
		}
		if v.covered == (v.reason != "") {
			t.Fatalf("covered=%v with reason %q for %q -> %q", v.covered, v.reason, current, desired)
		}
		if !v.covered {
			return
		}
		cur, err1 := version.ParseSemantic(current)
		want, err2 := version.ParseSemantic(desired)
		if err1 != nil || err2 != nil {
			t.Fatalf("covered a change with an unparsable version: %q -> %q", current, desired)
		}
		if want.LessThan(cur) {
			t.Fatalf("covered a downgrade %q -> %q", current, desired)
		}
		if want.EqualTo(cur) && want.BuildMetadata() != cur.BuildMetadata() {
			if order, err := kubeversion.Compare(want, cur); err != nil || order <= 0 {
				t.Fatalf("covered a build change that is not an upgrade: %q -> %q (order %d, %v)", current, desired, order, err)
			}
		}
		if controlPlane && (want.Major() != cur.Major() || want.Minor() > cur.Minor()+1) {
			t.Fatalf("covered a control plane minor skip %q -> %q", current, desired)
		}
	})
}

// FuzzCoverPatch checks the patch builder on any pair of JSON documents and any field
// path: no panic, and a patch, applied to current with Cluster API's JSON patch library,
// gives current with exactly that field taken from desired.
func FuzzCoverPatch(f *testing.F) {
	f.Add(`{"spec":{"version":"v1","a":{"b":1}}}`, `{"spec":{"version":"v2","a":{"b":2}}}`, "version")
	f.Add(`{"spec":{"clusterConfiguration":{"featureGates":{"G":true}}}}`, `{"spec":{"clusterConfiguration":{}}}`, "clusterConfiguration.featureGates.G")
	f.Add(`{"spec":{}}`, `{"spec":{"x":{"y":[1,2,{"z":null}]}}}`, "x.y")
	f.Add(`{"spec":"not a map"}`, `{"spec":{"x":1}}`, "x")
	f.Add(`[]`, `{}`, "a")
	f.Add(`{"spec":{"a/b":{"~c":1}}}`, `{"spec":{"a/b":{"~c":2}}}`, "a/b.~c")
	f.Fuzz(func(t *testing.T, current, desired, path string) {
		cur, err := decodeObject("current", runtime.RawExtension{Raw: []byte(current)})
		if err != nil {
			return
		}
		want, err := decodeObject("desired", runtime.RawExtension{Raw: []byte(desired)})
		if err != nil {
			return
		}
		fields := strings.Split(path, ".")
		patch, changed, err := coverPatch(cur, want, []string{"spec"}, [][]string{fields})
		if err != nil {
			t.Fatalf("coverPatch: %v", err)
		}
		if !patch.IsDefined() {
			if len(changed) > 0 {
				t.Fatalf("changed %v without a patch", changed)
			}
			return
		}
		ops, err := jsonpatch.DecodePatch(patch.Patch)
		if err != nil {
			t.Fatalf("our patch does not decode: %v\n%s", err, patch.Patch)
		}
		out, err := ops.Apply(cur.raw)
		if err != nil {
			t.Fatalf("our patch does not apply to current: %v\n%s", err, patch.Patch)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("patched document: %v", err)
		}
		full := append([]string{"spec"}, fields...)
		gv, gok := lookup(got, full)
		wv, wok := lookup(want.doc, full)
		if gok != wok || !reflect.DeepEqual(gv, wv) {
			t.Fatalf("after the patch %s is %v (present %v), desired has %v (present %v)\npatch: %s", path, gv, gok, wv, wok, patch.Patch)
		}
	})
}
