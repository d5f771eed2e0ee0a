package capisim

import (
	"reflect"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

func jsonPatch(p string) runtimehooksv1.Patch {
	return runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONPatchType, Patch: []byte(p)}
}

// TestVerdictMachine checks the in-place verdict as KCP reaches it: a patch that covers
// only the version leaves no difference when the version is all that changed, and leaves
// the machine spec different when more changed or when there is no patch.
func TestVerdictMachine(t *testing.T) {
	current := &clusterv1.Machine{Spec: clusterv1.MachineSpec{ClusterName: "c", Version: "v1.32.5", FailureDomain: "a"}}
	desired := current.DeepCopy()
	desired.Spec.Version = "v1.33.3"
	req := &runtimehooksv1.CanUpdateMachineRequest{
		Current: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: SpecOnly(current)},
		Desired: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: SpecOnly(desired)},
	}
	for _, tt := range []struct {
		name     string
		failure  string
		patch    runtimehooksv1.Patch
		inPlace  bool
		wantLeft []string
	}{
		{"a version-only change covered by a JSON patch", "a", jsonPatch(`[{"op":"replace","path":"/spec/version","value":"v1.33.3"}]`), true, nil},
		{"a version-only change covered by a merge patch", "a", runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONMergePatchType, Patch: []byte(`{"spec":{"version":"v1.33.3"}}`)}, true, nil},
		{"a failure domain change the patch does not cover", "b", jsonPatch(`[{"op":"replace","path":"/spec/version","value":"v1.33.3"}]`), false, []string{"Machine spec"}},
		{"no patch at all", "a", runtimehooksv1.Patch{}, false, []string{"Machine spec"}},
		{"a patch outside spec changes nothing that counts", "a", jsonPatch(`[{"op":"add","path":"/metadata/labels","value":{"x":"y"}}]`), false, []string{"Machine spec"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req.Desired.Machine.Spec.FailureDomain = tt.failure
			resp := &runtimehooksv1.CanUpdateMachineResponse{MachinePatch: tt.patch}
			inPlace, left, err := VerdictMachine(req, resp)
			if err != nil {
				t.Fatal(err)
			}
			if inPlace != tt.inPlace || !reflect.DeepEqual(left, tt.wantLeft) {
				t.Errorf("in place %v, left %v; want %v, %v", inPlace, left, tt.inPlace, tt.wantLeft)
			}
		})
	}
}

// TestVerdictPatchErrors checks that a patch Cluster API cannot apply is an error, not a
// verdict.
func TestVerdictPatchErrors(t *testing.T) {
	m := &clusterv1.Machine{Spec: clusterv1.MachineSpec{ClusterName: "c", Version: "v1.32.5"}}
	req := &runtimehooksv1.CanUpdateMachineRequest{
		Current: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: SpecOnly(m)},
		Desired: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: SpecOnly(m)},
	}
	for name, p := range map[string]runtimehooksv1.Patch{
		"a failed test operation":      jsonPatch(`[{"op":"test","path":"/spec/version","value":"v0"}]`),
		"a replace of a missing field": jsonPatch(`[{"op":"replace","path":"/spec/nope/deeper","value":1}]`),
		"an undecodable JSON patch":    jsonPatch(`{"op":"replace"}`),
		"an unknown patch type":        {PatchType: "Strategic", Patch: []byte(`{}`)},
	} {
		if _, _, err := VerdictMachine(req, &runtimehooksv1.CanUpdateMachineResponse{MachinePatch: p}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
