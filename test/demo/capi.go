package main

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// maxRetryWait caps the wait between two UpdateMachine calls for one machine. Cluster
// API waits the RetryAfterSeconds the extension answers; the demo may call sooner, which
// the hook allows (it is idempotent), so the live view follows the node closely.
const maxRetryWait = 1

// maxCallErrors is how many failed calls in a row (no answer at all) end the demo; Cluster
// API would retry with backoff forever.
const maxCallErrors = 5

// upgradeByCAPI plays Cluster API v1.12+ with the InPlaceUpdates feature after a user
// bumped the version: discovery, then for the KubeadmControlPlane CanUpdateMachine and
// UpdateMachine one machine at a time, then for the MachineDeployment CanUpdateMachineSet
// once and UpdateMachine for its machines, at most maxUnavailable at once. Before the
// first UpdateMachine call of a machine it writes, as CAPI does, the desired Machine spec
// (spec.version) and the in-place update annotations; it removes the annotations when the
// hook answers done.
func upgradeByCAPI(ctx context.Context, s *scenario.Scenario, v *view) error {
	tlsConfig, err := manager.TLSConfig(s.Certs.CAPEM)
	if err != nil {
		return err
	}
	catalog := runtimecatalog.New()
	_ = runtimehooksv1.AddToCatalog(catalog)
	hooks := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", s.Manager.WebhookPort), tlsConfig, catalog)
	disc, err := hooks.Discover(ctx)
	if err != nil {
		return fmt.Errorf("discovery of the extension, as Cluster API calls it: %w", err)
	}
	var names []string
	for _, h := range disc.Handlers {
		names = append(names, h.Name)
	}
	sort.Strings(names)
	v.step("discovery (as Cluster API's ExtensionConfig controller): " + strings.Join(names, ", "))

	if err := bumpVersions(ctx, s, v); err != nil {
		return err
	}
	c := &capiPlayer{s: s, v: v, hooks: hooks}
	if err := c.controlPlane(ctx); err != nil {
		return err
	}
	return c.machineDeployment(ctx)
}

// bumpVersions is the user's action: the new version on the KubeadmControlPlane and the
// MachineDeployment's template (what a ClusterClass topology would write from
// Cluster.spec.topology.version).
func bumpVersions(ctx context.Context, s *scenario.Scenario, v *view) error {
	mc := s.Management.Client
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := mc.Get(ctx, client.ObjectKeyFromObject(s.ControlPlane), kcp); err != nil {
		return err
	}
	patch := client.MergeFrom(kcp.DeepCopy())
	kcp.Spec.Version = scenario.ToVersion
	if err := mc.Patch(ctx, kcp, patch); err != nil {
		return fmt.Errorf("bump the KubeadmControlPlane's version: %w", err)
	}
	md := &clusterv1.MachineDeployment{}
	if err := mc.Get(ctx, client.ObjectKeyFromObject(s.MachineDeployment), md); err != nil {
		return err
	}
	patch = client.MergeFrom(md.DeepCopy())
	md.Spec.Template.Spec.Version = scenario.ToVersion
	if err := mc.Patch(ctx, md, patch); err != nil {
		return fmt.Errorf("bump the MachineDeployment's version: %w", err)
	}
	v.step(fmt.Sprintf("kubectl patch kubeadmcontrolplane %s and machinedeployment %s: version %s", kcp.Name, md.Name, scenario.ToVersion))
	return nil
}

// capiPlayer plays Cluster API's KubeadmControlPlane, MachineDeployment and Machine
// controllers for one in-place rollout.
type capiPlayer struct {
	s     *scenario.Scenario
	v     *view
	hooks *hookclient.Client
}

func (c *capiPlayer) machines(ctx context.Context, labels client.MatchingLabels) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := c.s.Management.Client.List(ctx, list, client.InNamespace(c.s.Cluster.Namespace), labels); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return list.Items, nil
}

// controlPlane is KCP: one machine at a time, oldest first, each asked with
// CanUpdateMachine and then updated to the end before the next.
func (c *capiPlayer) controlPlane(ctx context.Context) error {
	machines, err := c.machines(ctx, client.MatchingLabels{clusterv1.MachineControlPlaneNameLabel: c.s.ControlPlane.Name})
	if err != nil {
		return err
	}
	for i := range machines {
		m := &machines[i]
		if err := c.canUpdateMachine(ctx, m); err != nil {
			return err
		}
		if err := c.updateMachine(ctx, m.Name, true); err != nil {
			return err
		}
	}
	return nil
}

func (c *capiPlayer) canUpdateMachine(ctx context.Context, m *clusterv1.Machine) error {
	desired := m.DeepCopy()
	desired.Spec.Version = scenario.ToVersion
	req := &runtimehooksv1.CanUpdateMachineRequest{
		Current: runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine: *specOnlyMachine(m), InfrastructureMachine: infraMachine(m, false), BootstrapConfig: kubeadmConfig(m, false),
		},
		Desired: runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine: *specOnlyMachine(desired), InfrastructureMachine: infraMachine(desired, false), BootstrapConfig: kubeadmConfig(desired, false),
		},
	}
	resp := &runtimehooksv1.CanUpdateMachineResponse{}
	if err := c.hooks.Call(ctx, runtimehooksv1.CanUpdateMachine, extension.CanUpdateMachineHandlerName, req, resp); err != nil {
		return fmt.Errorf("CanUpdateMachine for machine %s: %w", m.Name, err)
	}
	if resp.Status != runtimehooksv1.ResponseStatusSuccess {
		return fmt.Errorf("CanUpdateMachine for machine %s answered %s: %s", m.Name, resp.Status, resp.Message)
	}
	// As KCP does: apply the patches to the current objects; the machine is updated in
	// place only if that makes them equal to the desired ones.
	patched, err := applyToMachine(&req.Current.Machine, resp.MachinePatch)
	if err != nil {
		return fmt.Errorf("CanUpdateMachine for machine %s: apply its machine patch: %w", m.Name, err)
	}
	diffs := specDiff(cleanMachineSpec(&patched.Spec), cleanMachineSpec(&req.Desired.Machine.Spec))
	for _, obj := range []struct {
		name             string
		current, desired runtime.RawExtension
		patch            runtimehooksv1.Patch
	}{
		{"InfrastructureMachine", req.Current.InfrastructureMachine, req.Desired.InfrastructureMachine, resp.InfrastructureMachinePatch},
		{"KubeadmConfig", req.Current.BootstrapConfig, req.Desired.BootstrapConfig, resp.BootstrapConfigPatch},
	} {
		d, err := rawSpecDiff(obj.current, obj.desired, obj.patch, "spec")
		if err != nil {
			return fmt.Errorf("CanUpdateMachine for machine %s: %s: %w", m.Name, obj.name, err)
		}
		for _, f := range d {
			diffs = append(diffs, obj.name+"."+f)
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("CanUpdateMachine for machine %s: its patches leave %s different, so Cluster API would replace the machine instead of updating it in place",
			m.Name, strings.Join(diffs, ", "))
	}
	c.v.step(fmt.Sprintf("CanUpdateMachine %s: in place (%s)", m.Name, describePatch(resp.MachinePatch)))
	return nil
}

// machineDeployment is the MachineDeployment and MachineSet controllers: one
// CanUpdateMachineSet for the change of template, then the machines, at most
// maxUnavailable of them being updated at once.
func (c *capiPlayer) machineDeployment(ctx context.Context) error {
	mc := c.s.Management.Client
	md := &clusterv1.MachineDeployment{}
	if err := mc.Get(ctx, client.ObjectKeyFromObject(c.s.MachineDeployment), md); err != nil {
		return err
	}
	sets := &clusterv1.MachineSetList{}
	if err := mc.List(ctx, sets, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return err
	}
	if len(sets.Items) != 1 {
		return fmt.Errorf("MachineDeployment %s has %d MachineSets; the demo expects one", md.Name, len(sets.Items))
	}
	if err := c.canUpdateMachineSet(ctx, &sets.Items[0]); err != nil {
		return err
	}

	machines, err := c.machines(ctx, client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name})
	if err != nil {
		return err
	}
	limit := maxUnavailableOf(md, len(machines))
	c.v.step(fmt.Sprintf("MachineDeployment %s: updating %d machines in place, at most %d at once (maxUnavailable)", md.Name, len(machines), limit))
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range machines {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop {
			<-slots
			break
		}
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			defer func() { <-slots }()
			if err := c.updateMachine(ctx, name, false); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}(machines[i].Name)
	}
	wg.Wait()
	return firstErr
}

func (c *capiPlayer) canUpdateMachineSet(ctx context.Context, ms *clusterv1.MachineSet) error {
	desired := ms.DeepCopy()
	desired.Name = ms.Name + "-" + strings.NewReplacer(".", "-", "+", "-").Replace(scenario.ToVersion)
	desired.Spec.Template.Spec.Version = scenario.ToVersion
	req := &runtimehooksv1.CanUpdateMachineSetRequest{
		Current: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: *specOnlyMachineSet(ms), InfrastructureMachineTemplate: infraTemplate(ms)},
		Desired: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: *specOnlyMachineSet(desired), InfrastructureMachineTemplate: infraTemplate(desired)},
	}
	resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
	if err := c.hooks.Call(ctx, runtimehooksv1.CanUpdateMachineSet, extension.CanUpdateMachineSetHandlerName, req, resp); err != nil {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: %w", ms.Name, err)
	}
	if resp.Status != runtimehooksv1.ResponseStatusSuccess {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s answered %s: %s", ms.Name, resp.Status, resp.Message)
	}
	patched, err := applyToMachineSet(&req.Current.MachineSet, resp.MachineSetPatch)
	if err != nil {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: apply its patch: %w", ms.Name, err)
	}
	diffs := specDiff(cleanMachineSpec(&patched.Spec.Template.Spec), cleanMachineSpec(&req.Desired.MachineSet.Spec.Template.Spec))
	d, err := rawSpecDiff(req.Current.InfrastructureMachineTemplate, req.Desired.InfrastructureMachineTemplate, resp.InfrastructureMachineTemplatePatch, "spec", "template", "spec")
	if err != nil {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: %w", ms.Name, err)
	}
	diffs = append(diffs, d...)
	if len(diffs) > 0 {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: its patches leave %s different, so Cluster API would roll the machines out (replace them) instead",
			ms.Name, strings.Join(diffs, ", "))
	}
	c.v.step(fmt.Sprintf("CanUpdateMachineSet %s -> %s: in place (%s)", ms.Name, desired.Name, describePatch(resp.MachineSetPatch)))
	return nil
}

// updateMachine does what KCP or the MachineSet controller and then the Machine
// controller do for one machine: mark it, write the desired spec, mark the UpdateMachine
// hook pending, call it until it answers done, and clear the marks.
func (c *capiPlayer) updateMachine(ctx context.Context, name string, controlPlane bool) error {
	mc := c.s.Management.Client
	m := &clusterv1.Machine{}
	key := client.ObjectKey{Namespace: c.s.Cluster.Namespace, Name: name}
	if err := mc.Get(ctx, key, m); err != nil {
		return err
	}
	patch := client.MergeFrom(m.DeepCopy())
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.UpdateInProgressAnnotation] = ""
	m.Spec.Version = scenario.ToVersion
	if err := mc.Patch(ctx, m, patch); err != nil {
		return fmt.Errorf("write the desired spec of Machine %s: %w", name, err)
	}
	patch = client.MergeFrom(m.DeepCopy())
	m.Annotations[runtimev1.PendingHooksAnnotation] = runtimecatalog.HookName(runtimehooksv1.UpdateMachine)
	if err := mc.Patch(ctx, m, patch); err != nil {
		return fmt.Errorf("mark the UpdateMachine hook pending on Machine %s: %w", name, err)
	}
	c.v.step(fmt.Sprintf("Machine %s: spec.version=%s, in-place update in progress; UpdateMachine until done", name, scenario.ToVersion))

	failures, calls := 0, 0
	for {
		if err := mc.Get(ctx, key, m); err != nil {
			return err
		}
		req := &runtimehooksv1.UpdateMachineRequest{Desired: runtimehooksv1.UpdateMachineRequestObjects{
			Machine: *specOnlyMachine(m), InfrastructureMachine: infraMachine(m, true),
		}}
		if controlPlane {
			req.Desired.BootstrapConfig = kubeadmConfig(m, true)
		}
		resp := &runtimehooksv1.UpdateMachineResponse{}
		calls++
		if err := c.hooks.Call(ctx, runtimehooksv1.UpdateMachine, extension.UpdateMachineHandlerName, req, resp); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if failures++; failures >= maxCallErrors {
				return fmt.Errorf("UpdateMachine for machine %s: %w", name, err)
			}
			if err := sleep(ctx, pollEvery); err != nil {
				return err
			}
			continue
		}
		failures = 0
		if resp.Status != runtimehooksv1.ResponseStatusSuccess {
			return fmt.Errorf("UpdateMachine for machine %s answered %s: %s", name, resp.Status, resp.Message)
		}
		if resp.RetryAfterSeconds == 0 {
			break
		}
		if err := sleep(ctx, timeSeconds(min(resp.RetryAfterSeconds, maxRetryWait))); err != nil {
			return err
		}
	}

	// The Machine controller's completeInPlaceUpdate.
	patch = client.MergeFrom(m.DeepCopy())
	delete(m.Annotations, clusterv1.UpdateInProgressAnnotation)
	delete(m.Annotations, runtimev1.PendingHooksAnnotation)
	if err := mc.Patch(ctx, m, patch); err != nil {
		return fmt.Errorf("complete the in-place update of Machine %s: %w", name, err)
	}
	c.v.step(fmt.Sprintf("UpdateMachine %s: done, after %d calls", name, calls))
	return nil
}

// specOnlyMachine is a Machine as CAPI sends it to the hooks: identity, labels,
// annotations and spec, no status.
func specOnlyMachine(m *clusterv1.Machine) *clusterv1.Machine {
	return &clusterv1.Machine{
		TypeMeta: metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: m.Annotations,
		},
		Spec: *m.Spec.DeepCopy(),
	}
}

func specOnlyMachineSet(ms *clusterv1.MachineSet) *clusterv1.MachineSet {
	return &clusterv1.MachineSet{
		TypeMeta: metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name: ms.Name, Namespace: ms.Namespace, Labels: ms.Labels, Annotations: ms.Annotations,
		},
		Spec: *ms.Spec.DeepCopy(),
	}
}

// rawObject is an object as CAPI's cleanupUnstructured leaves it, serialized.
func rawObject(apiVersion, kind, name, namespace string, inProgress bool, spec map[string]any) runtime.RawExtension {
	meta := map[string]any{"name": name, "namespace": namespace}
	if inProgress {
		meta["annotations"] = map[string]any{clusterv1.UpdateInProgressAnnotation: ""}
	}
	data, _ := json.Marshal(map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta, "spec": spec})
	return runtime.RawExtension{Raw: data}
}

// infraMachine stands for the machine's infrastructure object (a HarvesterMachine in a
// real cluster); its spec does not change in this upgrade.
func infraMachine(m *clusterv1.Machine, inProgress bool) runtime.RawExtension {
	ref := m.Spec.InfrastructureRef
	return rawObject(ref.APIGroup+"/v1beta1", ref.Kind, m.Name, m.Namespace, inProgress,
		map[string]any{"providerID": "harvester://" + m.Status.NodeRef.Name})
}

func infraTemplate(ms *clusterv1.MachineSet) runtime.RawExtension {
	ref := ms.Spec.Template.Spec.InfrastructureRef
	return rawObject(ref.APIGroup+"/v1beta1", ref.Kind+"Template", ref.Name, ms.Namespace, false,
		map[string]any{"template": map[string]any{"spec": map[string]any{}}})
}

// kubeadmConfig stands for a control plane machine's KubeadmConfig; this upgrade leaves
// it as it is.
func kubeadmConfig(m *clusterv1.Machine, inProgress bool) runtime.RawExtension {
	return rawObject(bootstrapv1.GroupVersion.String(), "KubeadmConfig", m.Name, m.Namespace, inProgress,
		map[string]any{"joinConfiguration": map[string]any{"nodeRegistration": map[string]any{"name": m.Status.NodeRef.Name}}})
}

// cleanMachineSpec drops what CAPI ignores when it compares machine specs for an
// in-place update (CAPI's internal inplace.CleanupMachineSpecForDiff).
func cleanMachineSpec(spec *clusterv1.MachineSpec) *clusterv1.MachineSpec {
	spec = spec.DeepCopy()
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

// specDiff names the fields where two machine specs differ.
func specDiff(a, b *clusterv1.MachineSpec) []string {
	if equality.Semantic.DeepEqual(a, b) {
		return nil
	}
	return mapDiff("spec", toMap(a), toMap(b))
}

func toMap(v any) map[string]any {
	data, _ := json.Marshal(v)
	out := map[string]any{}
	_ = json.Unmarshal(data, &out)
	return out
}

func mapDiff(prefix string, a, b map[string]any) []string {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		if !reflect.DeepEqual(a[k], b[k]) {
			out = append(out, prefix+"."+k)
		}
	}
	sort.Strings(out)
	return out
}

func applyToMachine(current *clusterv1.Machine, p runtimehooksv1.Patch) (*clusterv1.Machine, error) {
	out := &clusterv1.Machine{}
	return out, applyToTyped(current, p, out)
}

func applyToMachineSet(current *clusterv1.MachineSet, p runtimehooksv1.Patch) (*clusterv1.MachineSet, error) {
	out := &clusterv1.MachineSet{}
	return out, applyToTyped(current, p, out)
}

func applyToTyped(current any, p runtimehooksv1.Patch, out any) error {
	data, err := json.Marshal(current)
	if err != nil {
		return err
	}
	patched, err := applyPatch(data, p)
	if err != nil {
		return err
	}
	return json.Unmarshal(patched, out)
}

// rawSpecDiff applies the patch to current and names the fields under path where it
// still differs from desired.
func rawSpecDiff(current, desired runtime.RawExtension, p runtimehooksv1.Patch, path ...string) ([]string, error) {
	if current.Raw == nil || desired.Raw == nil {
		return nil, nil
	}
	patched, err := applyPatch(current.Raw, p)
	if err != nil {
		return nil, err
	}
	var a, b map[string]any
	if err := json.Unmarshal(patched, &a); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(desired.Raw, &b); err != nil {
		return nil, err
	}
	for _, key := range path {
		a, _ = a[key].(map[string]any)
		b, _ = b[key].(map[string]any)
	}
	return mapDiff(strings.Join(path, "."), a, b), nil
}

func describePatch(p runtimehooksv1.Patch) string {
	if !p.IsDefined() {
		return "no patch"
	}
	return fmt.Sprintf("%s %s", p.PatchType, p.Patch)
}

// applyPatch applies an extension's patch as Cluster API does: RFC 6902 JSON Patch or
// RFC 7386 JSON Merge Patch. An undefined patch changes nothing.
func applyPatch(doc []byte, p runtimehooksv1.Patch) ([]byte, error) {
	if !p.IsDefined() {
		return doc, nil
	}
	var root any
	if err := json.Unmarshal(doc, &root); err != nil {
		return nil, err
	}
	switch p.PatchType {
	case runtimehooksv1.JSONPatchType:
		var ops []struct {
			Op    string          `json:"op"`
			Path  string          `json:"path"`
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(p.Patch, &ops); err != nil {
			return nil, fmt.Errorf("decode JSON patch: %w", err)
		}
		for _, op := range ops {
			var value any
			if op.Value != nil {
				if err := json.Unmarshal(op.Value, &value); err != nil {
					return nil, err
				}
			}
			var err error
			if root, err = applyOp(root, op.Op, pointer(op.Path), value); err != nil {
				return nil, fmt.Errorf("%s %s: %w", op.Op, op.Path, err)
			}
		}
	case runtimehooksv1.JSONMergePatchType:
		var patch any
		if err := json.Unmarshal(p.Patch, &patch); err != nil {
			return nil, fmt.Errorf("decode JSON merge patch: %w", err)
		}
		root = mergePatch(root, patch)
	default:
		return nil, fmt.Errorf("unknown patchType %q", p.PatchType)
	}
	return json.Marshal(root)
}

// pointer splits an RFC 6901 JSON pointer into its unescaped tokens.
func pointer(path string) []string {
	if path == "" {
		return nil
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, p := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(p)
	}
	return parts
}

// applyOp applies one add, replace, remove or test operation at path under node.
func applyOp(node any, op string, path []string, value any) (any, error) {
	if len(path) == 0 {
		switch op {
		case "add", "replace":
			return value, nil
		case "test":
			if !reflect.DeepEqual(node, value) {
				return nil, fmt.Errorf("test failed")
			}
			return node, nil
		}
		return nil, fmt.Errorf("cannot %s the whole document", op)
	}
	key, last := path[0], len(path) == 1
	switch n := node.(type) {
	case map[string]any:
		child, exists := n[key]
		if !last {
			if !exists {
				return nil, fmt.Errorf("no %q", key)
			}
			updated, err := applyOp(child, op, path[1:], value)
			n[key] = updated
			return n, err
		}
		switch op {
		case "add":
			n[key] = value
		case "replace", "remove", "test":
			if !exists {
				return nil, fmt.Errorf("no %q", key)
			}
			if op == "replace" {
				n[key] = value
			} else if op == "remove" {
				delete(n, key)
			} else if !reflect.DeepEqual(child, value) {
				return nil, fmt.Errorf("test failed")
			}
		default:
			return nil, fmt.Errorf("unsupported operation %q", op)
		}
		return n, nil
	case []any:
		i := len(n)
		if key != "-" {
			var err error
			if i, err = strconv.Atoi(key); err != nil || i < 0 || i > len(n) {
				return nil, fmt.Errorf("bad index %q", key)
			}
		}
		if !last || op != "add" {
			if i >= len(n) {
				return nil, fmt.Errorf("index %d out of range", i)
			}
		}
		if !last {
			updated, err := applyOp(n[i], op, path[1:], value)
			n[i] = updated
			return n, err
		}
		switch op {
		case "add":
			return append(n[:i], append([]any{value}, n[i:]...)...), nil
		case "replace":
			n[i] = value
		case "remove":
			return append(n[:i], n[i+1:]...), nil
		case "test":
			if !reflect.DeepEqual(n[i], value) {
				return nil, fmt.Errorf("test failed")
			}
		default:
			return nil, fmt.Errorf("unsupported operation %q", op)
		}
		return n, nil
	}
	return nil, fmt.Errorf("%q is not inside an object or array", key)
}

// mergePatch applies an RFC 7386 merge patch.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
		} else {
			t[k] = mergePatch(t[k], v)
		}
	}
	return t
}
