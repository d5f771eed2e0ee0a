package extension

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// What is left after an answer is what Cluster API v1.14 still sees differ once it applied
// the answer's patches: the MachineDeployment controller (canExtensionsUpdateMachineSet,
// matchesMachineSet) and KubeadmControlPlane (canExtensionsUpdateMachine, matchesMachine)
// apply each patch to the whole current object, take back only spec.template.spec (spec
// for a Machine and its objects), and compare with desired; the machine spec is compared
// without the fields CleanupMachineSpecForDiff zeroes (references, identifiers and fields
// Cluster API changes itself without a rollout). Anything left makes Cluster API replace
// the machines. capi-inplace names what is left, field by field, so that an operator reads
// why, and so that a fail-closed Cluster can refuse instead.

// RemainingMachineSet returns the fields that still differ after the answer's patches, as
// "<Kind> <dotted path>", sorted; none means Cluster API updates the MachineSet's machines
// in place.
func RemainingMachineSet(req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) ([]string, error) {
	return remainingOf(req.Current.MachineSet, req.Desired.MachineSet, "MachineSet", []string{"spec", "template", "spec"},
		[]remainingPair{
			{"BootstrapConfigTemplate", req.Current.BootstrapConfigTemplate, req.Desired.BootstrapConfigTemplate, resp.BootstrapConfigTemplatePatch},
			{"InfrastructureMachineTemplate", req.Current.InfrastructureMachineTemplate, req.Desired.InfrastructureMachineTemplate, resp.InfrastructureMachineTemplatePatch},
		}, resp.MachineSetPatch)
}

// RemainingMachine is RemainingMachineSet for a control plane Machine.
func RemainingMachine(req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) ([]string, error) {
	return remainingOf(req.Current.Machine, req.Desired.Machine, "Machine", []string{"spec"},
		[]remainingPair{
			{"BootstrapConfig", req.Current.BootstrapConfig, req.Desired.BootstrapConfig, resp.BootstrapConfigPatch},
			{"InfrastructureMachine", req.Current.InfrastructureMachine, req.Desired.InfrastructureMachine, resp.InfrastructureMachinePatch},
		}, resp.MachinePatch)
}

// remainingPair is one of a request's other objects, raw, with the answer's patch for it.
type remainingPair struct {
	fallbackKind     string
	current, desired runtime.RawExtension
	patch            runtimehooksv1.Patch
}

func remainingOf(current, desired any, object string, path []string, others []remainingPair, machinePatch runtimehooksv1.Patch) ([]string, error) {
	curDoc, err := typedDoc(current)
	if err != nil {
		return nil, fmt.Errorf("encode current %s: %w", object, err)
	}
	wantDoc, err := typedDoc(desired)
	if err != nil {
		return nil, fmt.Errorf("encode desired %s: %w", object, err)
	}
	out, err := remainingMachineSpec(curDoc, wantDoc, machinePatch, object, path)
	if err != nil {
		return nil, err
	}
	for _, o := range others {
		cur, err := decodeObject("current "+o.fallbackKind, o.current)
		if err != nil {
			return nil, err
		}
		want, err := decodeObject("desired "+o.fallbackKind, o.desired)
		if err != nil {
			return nil, err
		}
		left, err := remainingObject(cur, want, o.patch, o.fallbackKind, path)
		if err != nil {
			return nil, err
		}
		out = append(out, left...)
	}
	sort.Strings(out)
	return out, nil
}

// remainingMachineSpec compares the machine spec at path, after patch, without the fields
// Cluster API leaves out.
func remainingMachineSpec(current, desired objectDoc, patch runtimehooksv1.Patch, object string, path []string) ([]string, error) {
	patched, err := applyAnswerPatch(current, patch)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", object, err)
	}
	got, err := cleanMachineSpecDoc(valueAt(patched, path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", object, err)
	}
	want, err := cleanMachineSpecDoc(valueAt(desired.doc, path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", object, err)
	}
	return differingPaths(object+" "+strings.Join(path, "."), got, want), nil
}

// remainingObject compares a bootstrap config (template) or infrastructure machine
// (template) at path, after patch. A pair absent on both sides leaves nothing.
func remainingObject(current, desired objectDoc, patch runtimehooksv1.Patch, fallbackKind string, path []string) ([]string, error) {
	if current.doc == nil && desired.doc == nil {
		return nil, nil
	}
	kind := firstNonEmpty(current.kind(), desired.kind(), fallbackKind)
	if current.doc == nil || desired.doc == nil {
		return []string{kind + " (present on one side only)"}, nil
	}
	patched, err := applyAnswerPatch(current, patch)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	return differingPaths(kind+" "+strings.Join(path, "."), valueAt(patched, path), valueAt(desired.doc, path)), nil
}

// applyAnswerPatch applies an answer's patch to a whole object, with the JSON patch
// library Cluster API uses.
func applyAnswerPatch(obj objectDoc, patch runtimehooksv1.Patch) (map[string]any, error) {
	if !patch.IsDefined() || len(patch.Patch) == 0 {
		return obj.doc, nil
	}
	var patched []byte
	var err error
	switch patch.PatchType {
	case runtimehooksv1.JSONPatchType:
		p, derr := jsonpatch.DecodePatch(patch.Patch)
		if derr != nil {
			return nil, fmt.Errorf("decode JSON patch: %w", derr)
		}
		patched, err = p.Apply(obj.raw)
	case runtimehooksv1.JSONMergePatchType:
		patched, err = jsonpatch.MergePatch(obj.raw, patch.Patch)
	default:
		return nil, fmt.Errorf("unknown patch type %q", patch.PatchType)
	}
	if err != nil {
		return nil, fmt.Errorf("apply patch: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(patched, &doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// cleanMachineSpecDoc zeroes what Cluster API's CleanupMachineSpecForDiff leaves out of
// the comparison, and returns the spec as a document again.
func cleanMachineSpecDoc(v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var spec clusterv1.MachineSpec
	if v != nil {
		if err := json.Unmarshal(raw, &spec); err != nil {
			return nil, fmt.Errorf("machine spec: %w", err)
		}
	}
	spec.ClusterName = ""
	spec.Bootstrap = clusterv1.Bootstrap{}
	spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{}
	spec.ProviderID = ""
	spec.MinReadySeconds = nil
	spec.ReadinessGates = nil
	spec.Deletion.NodeDrainTimeoutSeconds = nil
	spec.Deletion.NodeVolumeDetachTimeoutSeconds = nil
	spec.Deletion.NodeDeletionTimeoutSeconds = nil
	spec.Taints = nil
	doc, err := typedDoc(spec)
	return doc.doc, err
}

// differingPaths lists, under prefix, the dotted paths where got and want differ, down to
// the first value that is not an object on both sides (a list is one value).
func differingPaths(prefix string, got, want any) []string {
	if reflect.DeepEqual(got, want) {
		return nil
	}
	gm, gok := got.(map[string]any)
	wm, wok := want.(map[string]any)
	if !gok || !wok {
		return []string{prefix}
	}
	keys := make([]string, 0, len(gm)+len(wm))
	for k := range gm {
		keys = append(keys, k)
	}
	for k := range wm {
		if _, ok := gm[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		out = append(out, differingPaths(prefix+"."+k, gm[k], wm[k])...)
	}
	return out
}

// valueAt is the value at path, nil when absent.
func valueAt(doc map[string]any, path []string) any {
	v, _ := lookup(doc, path)
	return v
}
