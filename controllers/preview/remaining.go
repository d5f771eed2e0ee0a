package preview

// This file stands in for extension.RemainingMachineSet and extension.RemainingMachine
// until they are merged from main; it is removed then and the two calls below name those.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/runtime"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

func remainingMachineSet(req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) ([]string, error) {
	cur, err := json.Marshal(req.Current.MachineSet)
	if err != nil {
		return nil, err
	}
	want, err := json.Marshal(req.Desired.MachineSet)
	if err != nil {
		return nil, err
	}
	return remainingOf([]shimPair{
		{"MachineSet", runtime.RawExtension{Raw: cur}, runtime.RawExtension{Raw: want}, resp.MachineSetPatch},
		{"", req.Current.BootstrapConfigTemplate, req.Desired.BootstrapConfigTemplate, resp.BootstrapConfigTemplatePatch},
		{"", req.Current.InfrastructureMachineTemplate, req.Desired.InfrastructureMachineTemplate, resp.InfrastructureMachineTemplatePatch},
	})
}

func remainingMachine(req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) ([]string, error) {
	cur, err := json.Marshal(req.Current.Machine)
	if err != nil {
		return nil, err
	}
	want, err := json.Marshal(req.Desired.Machine)
	if err != nil {
		return nil, err
	}
	return remainingOf([]shimPair{
		{"Machine", runtime.RawExtension{Raw: cur}, runtime.RawExtension{Raw: want}, resp.MachinePatch},
		{"", req.Current.BootstrapConfig, req.Desired.BootstrapConfig, resp.BootstrapConfigPatch},
		{"", req.Current.InfrastructureMachine, req.Desired.InfrastructureMachine, resp.InfrastructureMachinePatch},
	})
}

type shimPair struct {
	kind          string
	current, want runtime.RawExtension
	patch         runtimehooksv1.Patch
}

// remainingOf applies each answer's JSON patch to current and lists the spec fields that
// still differ from desired.
func remainingOf(pairs []shimPair) ([]string, error) {
	var out []string
	for _, p := range pairs {
		cur, want := p.current.Raw, p.want.Raw
		if len(cur) == 0 && len(want) == 0 {
			continue
		}
		if len(cur) > 0 && len(p.patch.Patch) > 0 {
			patch, err := jsonpatch.DecodePatch(p.patch.Patch)
			if err != nil {
				return nil, fmt.Errorf("decode the answer's patch: %w", err)
			}
			if cur, err = patch.Apply(cur); err != nil {
				return nil, fmt.Errorf("apply the answer's patch: %w", err)
			}
		}
		var a, b map[string]any
		_ = json.Unmarshal(cur, &a)
		_ = json.Unmarshal(want, &b)
		kind := p.kind
		if kind == "" {
			kind, _ = b["kind"].(string)
		}
		for _, path := range diffPaths("spec", a["spec"], b["spec"]) {
			out = append(out, kind+" "+path)
		}
	}
	slices.Sort(out)
	return out, nil
}

func diffPaths(prefix string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if reflect.DeepEqual(a, b) {
			return nil
		}
		return []string{prefix}
	}
	var out []string
	keys := map[string]bool{}
	for k := range am {
		keys[k] = true
	}
	for k := range bm {
		keys[k] = true
	}
	for k := range keys {
		out = append(out, diffPaths(strings.Join([]string{prefix, k}, "."), am[k], bm[k])...)
	}
	return out
}
