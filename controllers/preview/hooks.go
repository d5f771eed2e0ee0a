package preview

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// verdict is a hook's answer for a machine, judged as Cluster API judges it.
type verdict struct {
	outcome inplacev1.MachineOutcome
	reason  string
}

// judge turns a hook's answer into an outcome as Cluster API v1.14 does: a Failure stops
// the rollout (the Cluster is fail-closed, or the hook could not answer), fields that
// still differ after the answer's patches make Cluster API replace the machine, and none
// let it update the machine in place.
func judge(status runtimehooksv1.ResponseStatus, message string, remaining []string, err error) verdict {
	switch {
	case status == runtimehooksv1.ResponseStatusFailure:
		return verdict{inplacev1.MachineOutcomeRefused, "Cluster API would stop the rollout: the CanUpdate hook answers Failure: " + message}
	case err != nil:
		return verdict{inplacev1.MachineOutcomeRefused, "cannot judge the hook's answer as Cluster API would: " + err.Error()}
	case len(remaining) > 0:
		reason := "Cluster API would replace the machine: no updater covers " + strings.Join(remaining, ", ")
		if message != "" {
			reason += " (the hook: " + message + ")"
		}
		return verdict{inplacev1.MachineOutcomeReplaced, reason}
	}
	return verdict{inplacev1.MachineOutcomeInPlace, message}
}

// hookSettings are the settings the ExtensionConfig would pass: spec.updaterRef as the
// defaultUpdater setting, which the hooks use when the Cluster has no updater annotation.
func hookSettings(p *inplacev1.UpgradePreview) map[string]string {
	if p.Spec.UpdaterRef == nil {
		return nil
	}
	return map[string]string{extension.DefaultUpdaterSetting: p.Spec.UpdaterRef.String()}
}

// silentHooks is the manager's InPlaceHooks without its event recorder and its refusal
// log: a preview asks as Cluster API would, and must not record the refusal events of a
// fail-closed Cluster that only a real rollout should show, nor answers Cluster API
// never received (the preview reads the log, unasked.go).
func (r *Reconciler) silentHooks() *extension.InPlaceHooks {
	h := *r.Hooks
	h.Recorder = nil
	h.Refusals = nil
	return &h
}

// judgeMachineSets asks CanUpdateMachineSet once per MachineSet of a MachineDeployment,
// with the request Cluster API's MachineDeployment controller would send for the version
// and the template change, and returns the verdict by MachineSet name.
func (r *Reconciler) judgeMachineSets(ctx context.Context, s *previewScope, t *target) (map[string]verdict, error) {
	sets := &clusterv1.MachineSetList{}
	if err := r.Client.List(ctx, sets, client.InNamespace(s.cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: s.cluster.Name}); err != nil {
		return nil, fmt.Errorf("list MachineSets of Cluster %s/%s: %w", s.cluster.Namespace, s.cluster.Name, err)
	}
	change := templateChangeOf(s, t)
	out := map[string]verdict{}
	for i := range sets.Items {
		ms := &sets.Items[i]
		if !ownedByMachineDeployment(ms, t.ref.Name()) {
			continue
		}
		req := &runtimehooksv1.CanUpdateMachineSetRequest{CommonRequest: runtimehooksv1.CommonRequest{Settings: hookSettings(s.preview)}}
		req.Current.MachineSet = cleanMachineSet(ms)
		req.Current.BootstrapConfigTemplate = r.readRef(ctx, s, ms.Spec.Template.Spec.Bootstrap.ConfigRef)
		req.Current.InfrastructureMachineTemplate = r.readRef(ctx, s, ms.Spec.Template.Spec.InfrastructureRef)

		desired := cleanMachineSet(ms)
		desired.Spec.Template.Spec.Version = s.preview.Spec.Version
		req.Desired.BootstrapConfigTemplate = req.Current.BootstrapConfigTemplate
		req.Desired.InfrastructureMachineTemplate = req.Current.InfrastructureMachineTemplate
		if change != nil && change.BootstrapTemplate != nil {
			desired.Spec.Template.Spec.Bootstrap.ConfigRef = contractRef(*change.BootstrapTemplate)
			req.Desired.BootstrapConfigTemplate = r.readTemplate(ctx, s, *change.BootstrapTemplate)
		}
		if change != nil && change.InfrastructureTemplate != nil {
			desired.Spec.Template.Spec.InfrastructureRef = contractRef(*change.InfrastructureTemplate)
			req.Desired.InfrastructureMachineTemplate = r.readTemplate(ctx, s, *change.InfrastructureTemplate)
		}
		req.Desired.MachineSet = desired

		resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
		r.silentHooks().CanUpdateMachineSet(ctx, req, resp)
		remaining, err := extension.RemainingMachineSet(req, resp)
		out[ms.Name] = judge(resp.Status, resp.Message, remaining, err)
	}
	return out, nil
}

// judgeControlPlaneMachine asks CanUpdateMachine for one control plane machine, with the
// request KubeadmControlPlane would send: the Machine, its bootstrap config and
// infrastructure machine, desired at the version and, for a template change of the
// control plane, with the infrastructure machine's spec of the new template.
func (r *Reconciler) judgeControlPlaneMachine(ctx context.Context, s *previewScope, t *target, m *clusterv1.Machine) verdict {
	req := &runtimehooksv1.CanUpdateMachineRequest{CommonRequest: runtimehooksv1.CommonRequest{Settings: hookSettings(s.preview)}}
	req.Current.Machine = cleanMachine(m)
	req.Current.BootstrapConfig = r.readRef(ctx, s, m.Spec.Bootstrap.ConfigRef)
	req.Current.InfrastructureMachine = r.readRef(ctx, s, m.Spec.InfrastructureRef)
	req.Desired.Machine = cleanMachine(m)
	req.Desired.Machine.Spec.Version = s.preview.Spec.Version
	req.Desired.BootstrapConfig = req.Current.BootstrapConfig
	req.Desired.InfrastructureMachine = req.Current.InfrastructureMachine
	if change := templateChangeOf(s, t); change != nil && change.InfrastructureTemplate != nil {
		req.Desired.InfrastructureMachine = r.withTemplateSpec(ctx, s, req.Current.InfrastructureMachine, *change.InfrastructureTemplate)
	}
	resp := &runtimehooksv1.CanUpdateMachineResponse{}
	r.silentHooks().CanUpdateMachine(ctx, req, resp)
	remaining, err := extension.RemainingMachine(req, resp)
	return judge(resp.Status, resp.Message, remaining, err)
}

// templateChangeOf finds spec.templateChanges' entry for a target: machineDeployment empty
// for the control plane; the MachineDeployment's name or its name in the topology.
func templateChangeOf(s *previewScope, t *target) *inplacev1.PreviewTemplateChange {
	for i := range s.preview.Spec.TemplateChanges {
		c := &s.preview.Spec.TemplateChanges[i]
		switch {
		case t.ref.IsControlPlane() && c.MachineDeployment == "":
			return c
		case !t.ref.IsControlPlane() && c.MachineDeployment != "" && (c.MachineDeployment == t.ref.Name() || c.MachineDeployment == topologyName(t)):
			return c
		}
	}
	return nil
}

// topologyName is a MachineDeployment's name in the Cluster's topology, read from the
// label Cluster API's topology controller puts on its machines.
func topologyName(t *target) string {
	for i := range t.machines {
		if n := t.machines[i].Labels[clusterv1.ClusterTopologyMachineDeploymentNameLabel]; n != "" {
			return n
		}
	}
	return ""
}

func ownedByMachineDeployment(ms *clusterv1.MachineSet, name string) bool {
	for _, ref := range ms.OwnerReferences {
		if ref.Kind == "MachineDeployment" && ref.Name == name {
			return true
		}
	}
	return false
}

// cleanMachineSet keeps what Cluster API sends of a MachineSet: identity, labels,
// annotations and spec.
func cleanMachineSet(ms *clusterv1.MachineSet) clusterv1.MachineSet {
	return clusterv1.MachineSet{
		TypeMeta:   ms.TypeMeta,
		ObjectMeta: cleanMeta(ms.ObjectMeta),
		Spec:       *ms.Spec.DeepCopy(),
	}
}

func cleanMachine(m *clusterv1.Machine) clusterv1.Machine {
	return clusterv1.Machine{TypeMeta: m.TypeMeta, ObjectMeta: cleanMeta(m.ObjectMeta), Spec: *m.Spec.DeepCopy()}
}

func cleanMeta(in metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: in.Name, Namespace: in.Namespace, Labels: in.Labels, Annotations: in.Annotations}
}

func contractRef(t inplacev1.PreviewTemplateRef) clusterv1.ContractVersionedObjectReference {
	gv, _ := schema.ParseGroupVersion(t.APIVersion)
	return clusterv1.ContractVersionedObjectReference{APIGroup: gv.Group, Kind: t.Kind, Name: t.Name}
}

// readRef reads the object a Machine or MachineSet names, as the spec-only document
// Cluster API sends. An object that cannot be read is noted and sent empty, as the hook
// then judges the version alone.
func (r *Reconciler) readRef(ctx context.Context, s *previewScope, ref clusterv1.ContractVersionedObjectReference) runtime.RawExtension {
	if !ref.IsDefined() {
		return runtime.RawExtension{}
	}
	mapping, err := r.mapping(s, schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind})
	if err != nil {
		s.note("cannot read %s %s: kind %s.%s is not served (%v); judged without it", ref.Kind, ref.Name, ref.Kind, ref.APIGroup, err)
		return runtime.RawExtension{}
	}
	return r.readObject(ctx, s, mapping.GroupVersionKind, ref.Name)
}

// mapping maps a kind once per computation: a kind the API server does not serve makes
// the REST mapper ask discovery again on every call, for every machine that names it.
func (r *Reconciler) mapping(s *previewScope, gk schema.GroupKind) (*meta.RESTMapping, error) {
	if m, ok := s.mappings[gk]; ok {
		return m.mapping, m.err
	}
	mapping, err := r.Client.RESTMapper().RESTMapping(gk)
	if s.mappings == nil {
		s.mappings = map[schema.GroupKind]mappingResult{}
	}
	s.mappings[gk] = mappingResult{mapping, err}
	return mapping, err
}

type mappingResult struct {
	mapping *meta.RESTMapping
	err     error
}

// readTemplate reads a template spec.templateChanges names.
func (r *Reconciler) readTemplate(ctx context.Context, s *previewScope, t inplacev1.PreviewTemplateRef) runtime.RawExtension {
	return r.readObject(ctx, s, schema.FromAPIVersionAndKind(t.APIVersion, t.Kind), t.Name)
}

func (r *Reconciler) readObject(ctx context.Context, s *previewScope, gvk schema.GroupVersionKind, name string) runtime.RawExtension {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.cluster.Namespace, Name: name}, obj); err != nil {
		s.note("cannot read %s %s/%s: %v; judged without it", gvk.Kind, s.cluster.Namespace, name, err)
		return runtime.RawExtension{}
	}
	doc := map[string]any{"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(), "metadata": map[string]any{
		"name": obj.GetName(), "namespace": obj.GetNamespace(), "labels": obj.GetLabels(), "annotations": obj.GetAnnotations(),
	}}
	if spec, ok := obj.Object["spec"]; ok {
		doc["spec"] = spec
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		s.note("cannot encode %s %s: %v; judged without it", gvk.Kind, name, err)
		return runtime.RawExtension{}
	}
	return runtime.RawExtension{Raw: raw}
}

// withTemplateSpec is an infrastructure machine whose spec is the new template's
// spec.template.spec, as a machine created from that template would have.
func (r *Reconciler) withTemplateSpec(ctx context.Context, s *previewScope, current runtime.RawExtension, t inplacev1.PreviewTemplateRef) runtime.RawExtension {
	tmpl := r.readTemplate(ctx, s, t)
	if len(tmpl.Raw) == 0 || len(current.Raw) == 0 {
		return current
	}
	var cur, tdoc map[string]any
	if json.Unmarshal(current.Raw, &cur) != nil || json.Unmarshal(tmpl.Raw, &tdoc) != nil {
		return current
	}
	spec, _, _ := unstructured.NestedFieldNoCopy(tdoc, "spec", "template", "spec")
	cur["spec"] = spec
	raw, err := json.Marshal(cur)
	if err != nil {
		return current
	}
	return runtime.RawExtension{Raw: raw}
}

// atTarget reports whether the machine already runs the version, as the run judges it
// (the release annotation, else the kubelet confirmed by the updater).
func (r *Reconciler) atTarget(ctx context.Context, s *previewScope, t *target, m *clusterv1.Machine) (bool, error) {
	at, _, err := upgraderequest.AtTarget(ctx, r.Registry, nodeupdater.PreflightTarget{
		Namespace: s.cluster.Namespace, ClusterName: s.cluster.Name, MachineName: m.Name, NodeName: m.Status.NodeRef.Name,
		Version: s.preview.Spec.Version, UpdaterRef: s.updaterRef, ControlPlane: t.ref.IsControlPlane(),
	}, m, s.version)
	if err != nil {
		return false, fmt.Errorf("ask updater %s whether machine %s runs %s: %w", s.updaterRef, m.Name, s.preview.Spec.Version, err)
	}
	return at, nil
}
