package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// maxRetryWait is the wait between two UpdateMachine calls for one machine. Cluster API
// waits the RetryAfterSeconds the extension answers; the demo may call sooner, which the
// hook allows (it is idempotent), so the live view follows the node closely.
const maxRetryWait = time.Second

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
	tlsConfig, err := manager.ClientTLSConfig(s.Certs.Dir)
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
	kcp.Spec.Version = s.Options.Hop.ToKubernetes
	if err := mc.Patch(ctx, kcp, patch); err != nil {
		return fmt.Errorf("bump the KubeadmControlPlane's version: %w", err)
	}
	md := &clusterv1.MachineDeployment{}
	if err := mc.Get(ctx, client.ObjectKeyFromObject(s.MachineDeployment), md); err != nil {
		return err
	}
	patch = client.MergeFrom(md.DeepCopy())
	md.Spec.Template.Spec.Version = s.Options.Hop.ToKubernetes
	if err := mc.Patch(ctx, md, patch); err != nil {
		return fmt.Errorf("bump the MachineDeployment's version: %w", err)
	}
	v.step(fmt.Sprintf("kubectl patch kubeadmcontrolplane %s and machinedeployment %s: version %s", kcp.Name, md.Name, s.Options.Hop.ToKubernetes))
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
	desired.Spec.Version = c.s.Options.Hop.ToKubernetes
	req := &runtimehooksv1.CanUpdateMachineRequest{
		Current: runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine: capisim.SpecOnly(m), InfrastructureMachine: infraMachine(m, false), BootstrapConfig: kubeadmConfig(m, false),
		},
		Desired: runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine: capisim.SpecOnly(desired), InfrastructureMachine: infraMachine(desired, false), BootstrapConfig: kubeadmConfig(desired, false),
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
	inPlace, left, err := capisim.VerdictMachine(req, resp)
	if err != nil {
		return fmt.Errorf("CanUpdateMachine for machine %s: apply its patches: %w", m.Name, err)
	}
	if !inPlace {
		return fmt.Errorf("CanUpdateMachine for machine %s: its patches leave %s different, so Cluster API would replace the machine instead of updating it in place",
			m.Name, strings.Join(left, ", "))
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
	desired.Name = ms.Name + "-" + strings.NewReplacer(".", "-", "+", "-").Replace(c.s.Options.Hop.ToKubernetes)
	desired.Spec.Template.Spec.Version = c.s.Options.Hop.ToKubernetes
	req := &runtimehooksv1.CanUpdateMachineSetRequest{
		Current: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: capisim.SpecOnlySet(ms), InfrastructureMachineTemplate: infraTemplate(ms)},
		Desired: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: capisim.SpecOnlySet(desired), InfrastructureMachineTemplate: infraTemplate(desired)},
	}
	resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
	if err := c.hooks.Call(ctx, runtimehooksv1.CanUpdateMachineSet, extension.CanUpdateMachineSetHandlerName, req, resp); err != nil {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: %w", ms.Name, err)
	}
	if resp.Status != runtimehooksv1.ResponseStatusSuccess {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s answered %s: %s", ms.Name, resp.Status, resp.Message)
	}
	inPlace, left, err := capisim.VerdictMachineSet(req, resp)
	if err != nil {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: apply its patches: %w", ms.Name, err)
	}
	if !inPlace {
		return fmt.Errorf("CanUpdateMachineSet for MachineSet %s: its patches leave %s different, so Cluster API would roll the machines out (replace them) instead",
			ms.Name, strings.Join(left, ", "))
	}
	c.v.step(fmt.Sprintf("CanUpdateMachineSet %s -> %s: in place (%s)", ms.Name, desired.Name, describePatch(resp.MachineSetPatch)))
	return nil
}

// updateMachine does what KCP or the MachineSet controller and then the Machine
// controller do for one machine (capisim.UpdateMachineWith): mark it, write the desired
// spec, mark the UpdateMachine hook pending, call it until it answers done, and clear the
// marks.
func (c *capiPlayer) updateMachine(ctx context.Context, name string, controlPlane bool) error {
	key := client.ObjectKey{Namespace: c.s.Cluster.Namespace, Name: name}
	calls := 0
	c.v.step(fmt.Sprintf("Machine %s: spec.version=%s, in-place update in progress; UpdateMachine until done", name, c.s.Options.Hop.ToKubernetes))
	err := capisim.UpdateMachineWith(ctx, c.s.Management.Client, c.callUpdateMachine, key, c.s.Options.Hop.ToKubernetes, capisim.UpdateOptions{
		Poll:        maxRetryWait,
		Progress:    func(*runtimehooksv1.UpdateMachineResponse) { calls++ },
		Annotations: map[string]string{runtimev1.PendingHooksAnnotation: runtimecatalog.HookName(runtimehooksv1.UpdateMachine)},
		Objects: func(m *clusterv1.Machine, desired *runtimehooksv1.UpdateMachineRequestObjects) {
			desired.InfrastructureMachine = infraMachine(m, true)
			if controlPlane {
				desired.BootstrapConfig = kubeadmConfig(m, true)
			}
		},
		CallErrors: maxCallErrors - 1,
	})
	if err != nil {
		return err
	}
	c.v.step(fmt.Sprintf("UpdateMachine %s: done, after %d calls", name, calls))
	return nil
}

// callUpdateMachine calls the hook once, as Cluster API does: the manager reads a Machine
// its cache shows unmarked again from the API server, so the marks the demo has just
// written are seen.
func (c *capiPlayer) callUpdateMachine(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) error {
	return c.hooks.Call(ctx, runtimehooksv1.UpdateMachine, extension.UpdateMachineHandlerName, req, resp)
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

func describePatch(p runtimehooksv1.Patch) string {
	if !p.IsDefined() {
		return "no patch"
	}
	return fmt.Sprintf("%s %s", p.PatchType, p.Patch)
}
