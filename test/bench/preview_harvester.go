package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/preview"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// The Harvester preview's workload: the demo's virtual machines (test/scenario
// createVMs), a few PodDisruptionBudgets and Longhorn v2 volumes.
const (
	previewVMNamespace  = "vms"
	previewAppNamespace = "apps"
	previewIMImage      = "longhornio/longhorn-instance-manager:v1.12.2"
)

// runHarvesterPreview times Reconciler.Compute with the Harvester updater, wired as
// main.go wires it (its preflight checks and disruption preview reach the workload
// cluster through the Cluster's kubeconfig Secret, Nodes from a Node cache, everything
// else from the workload API server), on a simulated Harvester cluster of 3 management
// and 3 worker nodes on a workload API server of its own, built like the demo's
// (test/scenario): Rancher provisions the nodes, KubeVirt runs the demo's three VMs on
// the workers (two live-migratable, one with a PCI device), each worker runs a database
// pod under a PodDisruptionBudget that allows no disruption, each node a Longhorn v2
// instance manager under Longhorn's own budget, and three Longhorn v2 volumes have their
// replicas on the workers (one on the third worker only).
func runHarvesterPreview(ctx context.Context, b *bench) (previewRow, error) {
	row := previewRow{updater: "Harvester updater", cluster: "3+3 simulated Harvester nodes, 3 VMs, 3 volumes, 9 PDBs", iterations: b.cfg.previewIterations}
	wl, err := testenv.Start()
	if err != nil {
		return row, err
	}
	defer func() { _ = wl.Stop() }()
	if err := warmUp(ctx, wl); err != nil {
		return row, err
	}
	mc, wc := b.client, wl.Client
	ns, err := fixtures.Namespace(ctx, mc, "preview-harvester")
	if err != nil {
		return row, err
	}
	nodes, err := createMakespanCluster(ctx, mc, wl, ns, 6)
	if err != nil {
		return row, err
	}
	if err := sim.Seed(ctx, wc, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}); err != nil {
		return row, fmt.Errorf("seed Rancher's objects: %w", err)
	}
	kubelet := &sim.Kubelet{Client: wc, Record: sim.NewRecord(), OSImage: makespanFromOS, Labels: sim.HarvesterNodeLabels(nil)}
	defer kubelet.Close()
	var workers []string
	for _, node := range nodes {
		labels := map[string]string{"node-role.kubernetes.io/worker": "true"}
		if node.management {
			labels = map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"}
		} else {
			workers = append(workers, node.name)
		}
		if _, err := kubelet.CreateNode(ctx, node.name, makespanFromVersion, labels); err != nil {
			return row, err
		}
	}
	// Rancher provisions every node's RKE2, as on the demo's cluster: the RancherTurn check
	// reads its machine-plan Secrets.
	if err := (&sim.RancherPlanner{Client: wc, Kubelet: kubelet}).SeedMachines(ctx); err != nil {
		return row, fmt.Errorf("seed Rancher's machine-plan Secrets: %w", err)
	}
	if err := createPreviewWorkload(ctx, wc, nodes, workers); err != nil {
		return row, err
	}
	if err := mc.Create(ctx, &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns},
		Spec: harvesterv1.HarvesterUpgraderSpec{
			Release: harvesterv1.Release{Version: makespanRelease, ISOURL: "https://releases.example/harvester-v1.8.1-amd64.iso", ISOChecksum: strings.Repeat("0", 127) + "1"},
		},
	}); err != nil {
		return row, fmt.Errorf("create HarvesterUpgrader: %w", err)
	}

	cache, err := b.env.StartCache(ctx)
	if err != nil {
		return row, err
	}
	defer cache.Stop()
	counter, workloadCounter := newRequestCounter(), newRequestCounter()
	cached, err := client.New(counter.wrap(managerRESTConfig(b.env.Config)), client.Options{Scheme: b.env.Scheme, Cache: &client.CacheOptions{Reader: cache}})
	if err != nil {
		return row, err
	}
	direct, err := client.New(counter.wrap(managerRESTConfig(b.env.Config)), client.Options{Scheme: b.env.Scheme})
	if err != nil {
		return row, err
	}
	cacheCtx, stopCaches := context.WithCancel(ctx)
	defer stopCaches()
	workloads := &workloadcluster.Clients{Reader: direct, Scheme: b.env.Scheme, Recheck: workloadcluster.SecretRecheck, Configure: workloadCounter.wrapInPlace}
	nodeCaches := &workloadcluster.NodeCaches{Clients: workloads}
	go func() { _ = nodeCaches.Start(cacheCtx) }()
	harvester := &harvesteradapter.Updater{Client: cached, Workloads: nodeCaches, PollInterval: b.cfg.makespanPoll, NodeImage: makespanNodeImage, Version: "v0.4.0"}
	registry := nodeupdater.NewRegistry()
	if err := registry.Register(harvester.Registration()); err != nil {
		return row, err
	}
	r := &preview.Reconciler{
		Client: cached, Workload: nodeCaches, Registry: registry, Checks: preflight.Default(registry),
		Hooks: &extension.InPlaceHooks{Client: cached, Registry: registry},
	}
	p := &inplacev1.UpgradePreview{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec:       inplacev1.UpgradePreviewSpec{ClusterName: makespanCluster, Version: makespanToVersion},
	}
	// Until the cache shows every Machine and every node's disruption is previewed.
	if err := warmPreview(ctx, r, p, func(st inplacev1.UpgradePreviewStatus) error {
		if st.InPlace != 6 {
			return fmt.Errorf("%d machines in place, not 6", st.InPlace)
		}
		for _, m := range st.Machines {
			if m.Disruption == nil {
				return fmt.Errorf("machine %s has no disruption preview: %s", m.Name, m.Reason)
			}
		}
		return nil
	}); err != nil {
		return row, err
	}
	counter.reset()
	workloadCounter.reset()
	if err := timePreview(ctx, r, p, &row); err != nil {
		return row, err
	}
	row.reads = perPreview(counter.snapshot(), row.iterations)
	row.workloadReads = perPreview(workloadCounter.snapshot(), row.iterations)
	return row, nil
}

// createPreviewWorkload creates what the preview judges: the demo's VMs run by the
// KubeVirt simulator (then stopped: the preview only reads), database pods under a
// PodDisruptionBudget, Longhorn's instance managers with their budgets, and Longhorn v2
// volumes.
func createPreviewWorkload(ctx context.Context, wc client.Client, nodes []makespanNode, workers []string) error {
	for _, name := range []string{previewVMNamespace, previewAppNamespace} {
		if err := wc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			return err
		}
	}
	simCtx, stop := context.WithCancel(ctx)
	defer stop()
	kv := &sim.KubeVirt{Client: wc, Namespace: previewVMNamespace}
	go kv.Run(simCtx)
	strategy := kubevirtv1.RunStrategyRerunOnFailure
	var vms []string
	for i, node := range workers {
		name := fmt.Sprintf("web-%d", i+1)
		spec := kubevirtv1.VirtualMachineInstanceSpec{}
		spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}
		if i == len(workers)-1 {
			name = "gpu-1"
			spec.Domain.Devices.HostDevices = []kubevirtv1.HostDevice{{Name: "gpu0", DeviceName: "nvidia.com/GA102GL_A10"}}
		}
		kv.PlaceOn(previewVMNamespace, name, node)
		if err := wc.Create(ctx, &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: previewVMNamespace},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &strategy, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: spec}},
		}); err != nil {
			return fmt.Errorf("create VirtualMachine %s: %w", name, err)
		}
		vms = append(vms, previewVMNamespace+"/"+name)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, key := range vms {
		for kv.NodeOf(key) == "" {
			if time.Now().After(deadline) {
				return fmt.Errorf("KubeVirt did not start VirtualMachine %s", key)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// A database replica on each worker under a budget that allows no disruption now.
	for i, node := range workers {
		if err := createRunningPod(ctx, wc, previewAppNamespace, fmt.Sprintf("db-%d", i), node, map[string]string{"app": "db"}); err != nil {
			return err
		}
	}
	if err := createBudget(ctx, wc, previewAppNamespace, "db", map[string]string{"app": "db"}, int32(len(workers))); err != nil {
		return err
	}
	// Longhorn's instance manager on every node, each under its own budget (minAvailable
	// 1), as Longhorn keeps them while the node holds a replica (fact 31).
	for _, node := range nodes {
		if err := sim.CreateLonghornV2InstanceManager(ctx, wc, longhorn.Namespace, node.name, previewIMImage); err != nil {
			return err
		}
		name := sim.InstanceManagerName(node.name, previewIMImage, longhornv1.DataEngineTypeV2)
		labels := map[string]string{"longhorn.io/component": "instance-manager", "longhorn.io/instance-manager-name": name}
		if err := createRunningPod(ctx, wc, longhorn.Namespace, name, node.name, labels); err != nil {
			return err
		}
		if err := createBudget(ctx, wc, longhorn.Namespace, name, labels, 1); err != nil {
			return err
		}
	}
	volumes := []sim.LonghornV2Volume{
		{Name: "pvc-web-1", ReplicaNodes: workers, EngineNode: workers[0]},
		{Name: "pvc-web-2", ReplicaNodes: workers[:2], EngineNode: workers[1]},
		{Name: "pvc-gpu-1", ReplicaNodes: workers[2:], EngineNode: workers[2]},
	}
	for _, v := range volumes {
		if err := sim.CreateLonghornV2Volume(ctx, wc, longhorn.Namespace, v); err != nil {
			return err
		}
	}
	return nil
}

// createRunningPod creates a Running, Ready pod bound to node.
func createRunningPod(ctx context.Context, wc client.Client, ns, name, node string, labels map[string]string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:v1"}}},
	}
	if err := wc.Create(ctx, pod); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := wc.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("set pod %s/%s running: %w", ns, name, err)
	}
	return nil
}

// createBudget creates a PodDisruptionBudget of minAvailable pods with the status the
// disruption controller would give it with exactly that many healthy: no disruption
// allowed.
func createBudget(ctx context.Context, wc client.Client, ns, name string, labels map[string]string, minAvailable int32) error {
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(minAvailable)), Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	if err := wc.Create(ctx, pdb); err != nil {
		return fmt.Errorf("create PodDisruptionBudget %s/%s: %w", ns, name, err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0,
		CurrentHealthy: minAvailable, DesiredHealthy: minAvailable, ExpectedPods: minAvailable,
	}
	if err := wc.Status().Update(ctx, pdb); err != nil {
		return fmt.Errorf("set the status of PodDisruptionBudget %s/%s: %w", ns, name, err)
	}
	return nil
}
