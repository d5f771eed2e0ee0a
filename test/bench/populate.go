package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// populateWorkers is how many objects are created at once. Creating thousands of Machines
// and Nodes one after another would take minutes of the bench's budget; the API server
// takes this many in parallel without trouble.
const populateWorkers = 16

// clusterShape is one bench cluster: a Cluster with one MachineDeployment (and its
// MachineSet) of machines at version, each with a Ready Node, as Cluster API and the
// kubelets would have left them. Unlike test/fixtures, the objects carry the status a
// real Cluster API leaves (conditions, addresses, node info), so that what the manager
// caches is as large as in a real management cluster, and they are created in parallel.
type clusterShape struct {
	namespace string
	name      string
	machines  int
	version   string
	// annotations of the Cluster (the updater annotation).
	annotations map[string]string
	// updating marks every machine as Cluster API marks a machine it updates in place
	// (update-in-progress, UpdateMachine pending: facts/capi-inplace-updates.md 17-19).
	updating bool
}

// nodeSetLabel on every Node the bench creates names the namespace of its Cluster, so
// that a run can delete its Nodes: Nodes are cluster-scoped, and an uncached workload
// client lists every Node of the test API server, not only those of its Cluster.
const nodeSetLabel = "bench.capi-inplace.io/namespace"

// deleteNodes deletes the Nodes of the bench cluster in namespace.
func deleteNodes(ctx context.Context, c client.Client, namespace string) error {
	if err := c.DeleteAllOf(ctx, &corev1.Node{}, client.MatchingLabels{nodeSetLabel: namespace}); err != nil {
		return fmt.Errorf("delete the Nodes of namespace %s: %w", namespace, err)
	}
	return nil
}

// deleteRun deletes what a run left in namespace: its Nodes, and its Clusters, Machines,
// MachineSets, MachineDeployments, UpgradeTasks, NodeUpdates and Events, their finalizers
// taken off first (nothing else is left to take them off: the run's manager has stopped,
// and Cluster API's controllers do not run here). A later run of the same API server then
// meets only its own objects, in the API server's store and heap.
func deleteRun(ctx context.Context, c client.Client, namespace string) error {
	if err := deleteNodes(ctx, c, namespace); err != nil {
		return err
	}
	lists := []client.ObjectList{&inplacev1.UpgradeTaskList{}, &inplacev1.NodeUpdateList{}, &clusterv1.MachineList{},
		&clusterv1.MachineSetList{}, &clusterv1.MachineDeploymentList{}, &clusterv1.ClusterList{}}
	for _, list := range lists {
		if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return fmt.Errorf("list %T of namespace %s: %w", list, namespace, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return err
		}
		err = parallel(ctx, len(items), func(i int) error {
			obj := items[i].(client.Object)
			if len(obj.GetFinalizers()) == 0 {
				return nil
			}
			patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
			obj.SetFinalizers(nil)
			return client.IgnoreNotFound(c.Patch(ctx, obj, patch))
		})
		if err != nil {
			return fmt.Errorf("take the finalizers off %T of namespace %s: %w", list, namespace, err)
		}
	}
	for _, obj := range []client.Object{&inplacev1.UpgradeTask{}, &inplacev1.NodeUpdate{}, &clusterv1.Machine{}, &clusterv1.MachineSet{},
		&clusterv1.MachineDeployment{}, &clusterv1.Cluster{}, &corev1.Event{}, &eventsv1.Event{}} {
		if err := c.DeleteAllOf(ctx, obj, client.InNamespace(namespace)); err != nil {
			return fmt.Errorf("delete the %T of namespace %s: %w", obj, namespace, err)
		}
	}
	return nil
}

// mdName is the name of the bench clusters' MachineDeployment.
const mdName = "workers"

// machineName is the name of the i-th machine (from 1) of the MachineDeployment.
func machineName(i int) string { return fmt.Sprintf("%s-%d", mdName, i) }

// createCluster creates the Cluster, its MachineDeployment and MachineSet, and the
// machines with their Nodes.
func createCluster(ctx context.Context, c client.Client, shape clusterShape) error {
	if _, err := fixtures.Cluster(ctx, c, shape.namespace, shape.name, "", shape.annotations); err != nil {
		return err
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: shape.name, clusterv1.MachineDeploymentNameLabel: mdName}
	template := clusterv1.MachineTemplateSpec{
		ObjectMeta: clusterv1.ObjectMeta{Labels: labels},
		Spec:       benchMachineSpec(shape.name, "template", shape.version),
	}
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: shape.namespace, Name: mdName, Labels: map[string]string{clusterv1.ClusterNameLabel: shape.name}},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: shape.name,
			Replicas:    ptr.To(int32(shape.machines)),
			Selector:    metav1.LabelSelector{MatchLabels: labels},
			Template:    template,
		},
	}
	if err := c.Create(ctx, md); err != nil {
		return fmt.Errorf("create MachineDeployment %s/%s: %w", shape.namespace, mdName, err)
	}
	msLabels := copyLabels(labels)
	msLabels[clusterv1.MachineDeploymentUniqueLabel] = "5d8f7c9b4"
	ms := &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: shape.namespace, Name: mdName + "-5d8f7c9b4", Labels: msLabels},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: shape.name,
			Replicas:    ptr.To(int32(shape.machines)),
			Selector:    metav1.LabelSelector{MatchLabels: msLabels},
			Template:    clusterv1.MachineTemplateSpec{ObjectMeta: clusterv1.ObjectMeta{Labels: msLabels}, Spec: template.Spec},
		},
	}
	if err := controllerutil.SetControllerReference(md, ms, c.Scheme()); err != nil {
		return err
	}
	if err := c.Create(ctx, ms); err != nil {
		return fmt.Errorf("create MachineSet %s/%s: %w", shape.namespace, ms.Name, err)
	}
	return parallel(ctx, shape.machines, func(i int) error {
		name := machineName(i + 1)
		nodeName := fixtures.NodeName(shape.namespace, name)
		if err := createNode(ctx, c, nodeName, shape.namespace, shape.version); err != nil {
			return err
		}
		return createMachine(ctx, c, ms, shape, name, nodeName, msLabels)
	})
}

func benchMachineSpec(cluster, name, version string) clusterv1.MachineSpec {
	return clusterv1.MachineSpec{
		ClusterName: cluster,
		Version:     version,
		Bootstrap: clusterv1.Bootstrap{
			ConfigRef:      clusterv1.ContractVersionedObjectReference{APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfig", Name: name},
			DataSecretName: ptr.To(name),
		},
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "DockerMachine", Name: name},
		FailureDomain:     "zone-a",
		Deletion: clusterv1.MachineDeletionSpec{
			NodeDrainTimeoutSeconds:        ptr.To(int32(600)),
			NodeVolumeDetachTimeoutSeconds: ptr.To(int32(300)),
			NodeDeletionTimeoutSeconds:     ptr.To(int32(10)),
		},
	}
}

// createMachine creates a Machine owned by ms and gives it the status Cluster API keeps
// on a running machine.
func createMachine(ctx context.Context, c client.Client, ms *clusterv1.MachineSet, shape clusterShape, name, nodeName string, labels map[string]string) error {
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   shape.namespace,
			Name:        name,
			Labels:      copyLabels(labels),
			Annotations: map[string]string{"controlplane.cluster.x-k8s.io/kubeadm-cluster-configuration": "", "machine.cluster.x-k8s.io/certificates-expiry": "2027-01-01T00:00:00Z"},
			Finalizers:  []string{clusterv1.MachineFinalizer},
		},
		Spec: benchMachineSpec(shape.name, name, shape.version),
	}
	if shape.updating {
		m.Annotations[clusterv1.UpdateInProgressAnnotation] = ""
		m.Annotations[runtimev1.PendingHooksAnnotation] = runtimecatalog.HookName(runtimehooksv1.UpdateMachine)
	}
	m.Spec.ProviderID = "docker:////" + nodeName
	if err := controllerutil.SetControllerReference(ms, m, c.Scheme()); err != nil {
		return err
	}
	if err := c.Create(ctx, m); err != nil {
		return fmt.Errorf("create Machine %s/%s: %w", shape.namespace, name, err)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(t string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: t, Status: status, Reason: reason, LastTransitionTime: now, ObservedGeneration: m.Generation}
	}
	m.Status = clusterv1.MachineStatus{
		Conditions: []metav1.Condition{
			cond(clusterv1.AvailableCondition, metav1.ConditionTrue, "Available"),
			cond(clusterv1.ReadyCondition, metav1.ConditionTrue, "Ready"),
			cond(clusterv1.MachineUpToDateCondition, metav1.ConditionTrue, "UpToDate"),
			cond(clusterv1.MachineBootstrapConfigReadyCondition, metav1.ConditionTrue, "Ready"),
			cond(clusterv1.MachineInfrastructureReadyCondition, metav1.ConditionTrue, "Ready"),
			cond(clusterv1.MachineNodeReadyCondition, metav1.ConditionTrue, "NodeReady"),
			cond(clusterv1.MachineNodeHealthyCondition, metav1.ConditionTrue, "NodeHealthy"),
			cond(clusterv1.MachineUpdatingCondition, metav1.ConditionFalse, "NotUpdating"),
			cond(clusterv1.DeletingCondition, metav1.ConditionFalse, "NotDeleting"),
			cond(clusterv1.PausedCondition, metav1.ConditionFalse, "NotPaused"),
		},
		Initialization: clusterv1.MachineInitializationStatus{InfrastructureProvisioned: ptr.To(true), BootstrapDataSecretCreated: ptr.To(true)},
		NodeRef:        clusterv1.MachineNodeReference{Name: nodeName},
		NodeInfo:       nodeInfo(nodeName, shape.version),
		LastUpdated:    now,
		Addresses: clusterv1.MachineAddresses{
			{Type: clusterv1.MachineInternalIP, Address: "10.0.12.34"},
			{Type: clusterv1.MachineHostName, Address: nodeName},
			{Type: clusterv1.MachineInternalDNS, Address: nodeName + ".cluster.local"},
		},
		Phase:                  string(clusterv1.MachinePhaseRunning),
		CertificatesExpiryDate: metav1.NewTime(now.AddDate(1, 0, 0)),
		ObservedGeneration:     m.Generation,
	}
	if err := c.Status().Update(ctx, m); err != nil {
		return fmt.Errorf("set status of Machine %s/%s: %w", shape.namespace, name, err)
	}
	return nil
}

func nodeInfo(name, version string) *corev1.NodeSystemInfo {
	return &corev1.NodeSystemInfo{
		MachineID: "4c4c4544003" + fmt.Sprintf("%021x", len(name)), SystemUUID: "ec2a1b2c-" + name, BootID: "9b1f0c2e-6d1e-4a44-a9a1-3f0a1c2d3e4f",
		KernelVersion: "6.4.0-150600.23.53-default", OSImage: "SUSE Linux Enterprise Micro 5.5",
		ContainerRuntimeVersion: "containerd://1.7.27-k3s1", KubeletVersion: version, KubeProxyVersion: version,
		OperatingSystem: "linux", Architecture: "amd64",
	}
}

// createNode creates a Ready Node with the status a kubelet reports (conditions,
// addresses, capacity, node info, a few images).
func createNode(ctx context.Context, c client.Client, name, namespace, version string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", "node-role.kubernetes.io/worker": "true",
		"topology.kubernetes.io/zone": "zone-a", nodeSetLabel: namespace,
	}}}
	if err := c.Create(ctx, node); err != nil {
		return fmt.Errorf("create Node %s: %w", name, err)
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, status corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: status, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods: resource.MustParse("200"), corev1.ResourceEphemeralStorage: resource.MustParse("200Gi"),
	}
	node.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
		},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.12.34"}, {Type: corev1.NodeHostName, Address: name}},
		NodeInfo:  *nodeInfo(name, version),
	}
	for i, img := range []string{"rancher/rke2-runtime", "rancher/hardened-kubernetes", "rancher/hardened-coredns", "rancher/hardened-calico", "longhornio/longhorn-manager", "longhornio/longhorn-engine", "rancher/harvester", "rancher/system-upgrade-controller"} {
		node.Status.Images = append(node.Status.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("docker.io/%s@sha256:%064x", img, i+1), "docker.io/" + img + ":" + version},
			SizeBytes: int64(50_000_000 + i*1_000_000),
		})
	}
	if err := c.Status().Update(ctx, node); err != nil {
		return fmt.Errorf("set status of Node %s: %w", name, err)
	}
	return nil
}

// parallel runs fn(0..n-1) on populateWorkers goroutines and returns the first error.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan int)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range min(populateWorkers, n) {
		wg.Go(func() {
			for i := range work {
				if err := fn(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
						cancel()
					}
					mu.Unlock()
				}
			}
		})
	}
loop:
	for i := range n {
		select {
		case work <- i:
		case <-ctx.Done():
			break loop
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func copyLabels(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}
