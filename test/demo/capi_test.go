package main

import (
	"encoding/json"
	"reflect"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

func TestApplyPatch(t *testing.T) {
	doc := `{"spec":{"version":"v1.32.5","list":["a","b"],"keep":1}}`
	tests := []struct {
		name  string
		patch runtimehooksv1.Patch
		want  string
		err   bool
	}{
		{"undefined patch changes nothing", runtimehooksv1.Patch{}, doc, false},
		{"JSON patch replace", jsonPatch(`[{"op":"replace","path":"/spec/version","value":"v1.33.3"}]`), `{"spec":{"version":"v1.33.3","list":["a","b"],"keep":1}}`, false},
		{"JSON patch add and remove", jsonPatch(`[{"op":"add","path":"/spec/new","value":{"x":1}},{"op":"remove","path":"/spec/keep"}]`), `{"spec":{"version":"v1.32.5","list":["a","b"],"new":{"x":1}}}`, false},
		{"JSON patch on arrays", jsonPatch(`[{"op":"add","path":"/spec/list/-","value":"c"},{"op":"replace","path":"/spec/list/0","value":"z"},{"op":"remove","path":"/spec/list/1"}]`), `{"spec":{"version":"v1.32.5","list":["z","c"],"keep":1}}`, false},
		{"JSON patch escaped key", jsonPatch(`[{"op":"add","path":"/spec/a~1b","value":true}]`), `{"spec":{"version":"v1.32.5","list":["a","b"],"keep":1,"a/b":true}}`, false},
		{"JSON patch test passes", jsonPatch(`[{"op":"test","path":"/spec/keep","value":1}]`), doc, false},
		{"JSON patch test fails", jsonPatch(`[{"op":"test","path":"/spec/keep","value":2}]`), "", true},
		{"JSON patch replace of a missing field fails", jsonPatch(`[{"op":"replace","path":"/spec/nope","value":1}]`), "", true},
		{"JSON patch below a missing field fails", jsonPatch(`[{"op":"add","path":"/status/x","value":1}]`), "", true},
		{"merge patch", runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONMergePatchType, Patch: []byte(`{"spec":{"version":"v1.33.3","keep":null}}`)}, `{"spec":{"version":"v1.33.3","list":["a","b"]}}`, false},
		{"unknown patch type", runtimehooksv1.Patch{PatchType: "Strategic", Patch: []byte(`{}`)}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := applyPatch([]byte(doc), tt.patch)
			if (err != nil) != tt.err {
				t.Fatalf("err = %v, want error %v", err, tt.err)
			}
			if tt.err {
				return
			}
			var a, b any
			_ = json.Unmarshal(got, &a)
			_ = json.Unmarshal([]byte(tt.want), &b)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func jsonPatch(p string) runtimehooksv1.Patch {
	return runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONPatchType, Patch: []byte(p)}
}

// TestMachinePatchVerdict checks the in-place verdict as KCP reaches it: a patch that
// covers only the version leaves no difference when the version is all that changed, and
// leaves the other field when more changed.
func TestMachinePatchVerdict(t *testing.T) {
	current := &clusterv1.Machine{Spec: clusterv1.MachineSpec{ClusterName: "c", Version: "v1.32.5", FailureDomain: "a"}}
	versionOnly := jsonPatch(`[{"op":"replace","path":"/spec/version","value":"v1.33.3"}]`)

	desired := current.DeepCopy()
	desired.Spec.Version = "v1.33.3"
	patched, err := applyToMachine(current, versionOnly)
	if err != nil {
		t.Fatal(err)
	}
	if d := specDiff(cleanMachineSpec(&patched.Spec), cleanMachineSpec(&desired.Spec)); len(d) != 0 {
		t.Errorf("a version-only change covered by the patch left %v", d)
	}

	desired.Spec.FailureDomain = "b"
	if d := specDiff(cleanMachineSpec(&patched.Spec), cleanMachineSpec(&desired.Spec)); !reflect.DeepEqual(d, []string{"spec.failureDomain"}) {
		t.Errorf("a failure domain change the patch does not cover: diff %v, want [spec.failureDomain]", d)
	}
	if d := specDiff(cleanMachineSpec(&current.Spec), cleanMachineSpec(&desired.Spec)); len(d) != 2 {
		t.Errorf("no patch at all: diff %v, want version and failure domain", d)
	}
}
