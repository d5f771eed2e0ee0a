// Package capisim plays Cluster API's side of the in-place update hooks for tests and the
// demo, where Cluster API's own code is internal to it: the verdict its MachineDeployment
// controller and KubeadmControlPlane draw from a CanUpdate answer, and the UpdateMachine
// sequence of its Machine controller.
package capisim

import (
	"encoding/json"
	"fmt"
	"reflect"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// The verdict is drawn the way Cluster API v1.14's MachineDeployment controller
// (canExtensionsUpdateMachineSet) and KubeadmControlPlane (canExtensionsUpdateMachine) do:
// apply each returned patch to the whole current object with the same JSON patch library,
// take back only the spec part (spec.template.spec for templates), and compare with
// desired, leaving out the machine spec fields Cluster API never decides on in place. The
// verdict is "in place" when nothing is left to compare.

// VerdictMachineSet is Cluster API's verdict on a CanUpdateMachineSet answer: whether it
// updates the MachineSet's machines in place, and else which objects still differ.
func VerdictMachineSet(req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) (bool, []string, error) {
	path := []string{"spec", "template", "spec"}
	var left []string
	ms, err := patchedDoc(req.Current.MachineSet, resp.MachineSetPatch, path)
	if err != nil {
		return false, nil, err
	}
	var patched clusterv1.MachineSet
	if err := remarshal(ms, &patched); err != nil {
		return false, nil, err
	}
	if !equality.Semantic.DeepEqual(cleanupMachineSpec(patched.Spec.Template.Spec), cleanupMachineSpec(req.Desired.MachineSet.Spec.Template.Spec)) {
		left = append(left, "MachineSet spec.template.spec")
	}
	for _, o := range []struct {
		name             string
		current, desired runtime.RawExtension
		patch            runtimehooksv1.Patch
	}{
		{"BootstrapConfigTemplate", req.Current.BootstrapConfigTemplate, req.Desired.BootstrapConfigTemplate, resp.BootstrapConfigTemplatePatch},
		{"InfrastructureMachineTemplate", req.Current.InfrastructureMachineTemplate, req.Desired.InfrastructureMachineTemplate, resp.InfrastructureMachineTemplatePatch},
	} {
		same, err := sameAfterPatch(o.current, o.desired, o.patch, path)
		if err != nil {
			return false, nil, fmt.Errorf("%s: %w", o.name, err)
		}
		if !same {
			left = append(left, o.name+" spec.template.spec")
		}
	}
	return len(left) == 0, left, nil
}

// VerdictMachine is Cluster API's verdict on a CanUpdateMachine answer: whether it updates
// the control plane machine in place, and else which objects still differ.
func VerdictMachine(req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) (bool, []string, error) {
	path := []string{"spec"}
	var left []string
	m, err := patchedDoc(req.Current.Machine, resp.MachinePatch, path)
	if err != nil {
		return false, nil, err
	}
	var patched clusterv1.Machine
	if err := remarshal(m, &patched); err != nil {
		return false, nil, err
	}
	if !equality.Semantic.DeepEqual(cleanupMachineSpec(patched.Spec), cleanupMachineSpec(req.Desired.Machine.Spec)) {
		left = append(left, "Machine spec")
	}
	for _, o := range []struct {
		name             string
		current, desired runtime.RawExtension
		patch            runtimehooksv1.Patch
	}{
		{"BootstrapConfig", req.Current.BootstrapConfig, req.Desired.BootstrapConfig, resp.BootstrapConfigPatch},
		{"InfrastructureMachine", req.Current.InfrastructureMachine, req.Desired.InfrastructureMachine, resp.InfrastructureMachinePatch},
	} {
		same, err := sameAfterPatch(o.current, o.desired, o.patch, path)
		if err != nil {
			return false, nil, fmt.Errorf("%s: %w", o.name, err)
		}
		if !same {
			left = append(left, o.name+" spec")
		}
	}
	return len(left) == 0, left, nil
}

// cleanupMachineSpec zeroes what Cluster API leaves out of the in-place comparison:
// references and identifiers that never change in place, and fields it changes itself
// without a rollout. Version and failure domain stay.
func cleanupMachineSpec(spec clusterv1.MachineSpec) clusterv1.MachineSpec {
	spec = *spec.DeepCopy()
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
	return spec
}

// sameAfterPatch applies patch to current and compares the part at path with desired's.
func sameAfterPatch(current, desired runtime.RawExtension, patch runtimehooksv1.Patch, path []string) (bool, error) {
	if len(current.Raw) == 0 && len(desired.Raw) == 0 {
		return true, nil
	}
	var cur map[string]any
	if err := json.Unmarshal(current.Raw, &cur); err != nil {
		return false, err
	}
	got, err := patchedDoc(cur, patch, path)
	if err != nil {
		return false, err
	}
	var want map[string]any
	if err := json.Unmarshal(desired.Raw, &want); err != nil {
		return false, err
	}
	return reflect.DeepEqual(at(got, path), at(want, path)), nil
}

// patchedDoc applies patch to obj and returns obj with only the part at path taken from
// the patched result, as Cluster API does.
func patchedDoc(obj any, patch runtimehooksv1.Patch, path []string) (map[string]any, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if !patch.IsDefined() {
		return doc, nil
	}
	var patchedRaw []byte
	switch patch.PatchType {
	case runtimehooksv1.JSONPatchType:
		p, err := jsonpatch.DecodePatch(patch.Patch)
		if err != nil {
			return nil, fmt.Errorf("decode JSON patch: %w", err)
		}
		if patchedRaw, err = p.Apply(raw); err != nil {
			return nil, fmt.Errorf("apply JSON patch: %w", err)
		}
	case runtimehooksv1.JSONMergePatchType:
		if patchedRaw, err = jsonpatch.MergePatch(raw, patch.Patch); err != nil {
			return nil, fmt.Errorf("apply merge patch: %w", err)
		}
	default:
		return nil, fmt.Errorf("unknown patch type %q", patch.PatchType)
	}
	var patched map[string]any
	if err := json.Unmarshal(patchedRaw, &patched); err != nil {
		return nil, err
	}
	parent := doc
	for _, p := range path[:len(path)-1] {
		next, ok := parent[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			parent[p] = next
		}
		parent = next
	}
	last := path[len(path)-1]
	if v := at(patched, path); v != nil {
		parent[last] = v
	} else {
		delete(parent, last)
	}
	return doc, nil
}

func at(doc map[string]any, path []string) any {
	var cur any = doc
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func remarshal(in, out any) error {
	raw, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}
