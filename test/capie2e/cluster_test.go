package capie2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// hold is how long the updater simulator keeps a node upgrading (NotReady).
const hold = 2 * time.Second

// workloadCluster is one ClusterClass Cluster of a spec, in a namespace of its own, with
// the updater simulator for its NodeUpdates and the witnesses of what happened to its
// machines and nodes.
type workloadCluster struct {
	ns, name string
	shape    capienv.ClusterShape
	updater  *sim.ExternalUpdater
	nus      *sim.NodeUpdateWitness
	machines *capienv.MachineWitness
	// before are the machines as provisioned, before any bump.
	before []clusterv1.Machine
}

// newWorkloadCluster creates the namespace, the ClusterClasses, the ExternalUpgrader the
// settings name, and the Cluster; Cluster API provisions it while the spec goes on.
func newWorkloadCluster(prefix string, shape capienv.ClusterShape) *workloadCluster {
	GinkgoHelper()
	return newWorkloadClusterWith(prefix, shape, nil)
}

// newWorkloadClusterWith is newWorkloadCluster with annotations on the Cluster.
func newWorkloadClusterWith(prefix string, shape capienv.ClusterShape, annotations map[string]string) *workloadCluster {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, env.Client, prefix)
	Expect(err).NotTo(HaveOccurred())
	Expect(capienv.CreateClasses(ctx, env.Client, ns)).To(Succeed())
	Expect(fixtures.ExternalUpdater(ctx, env.Client, ns)).To(Succeed())
	c := &workloadCluster{ns: ns, name: prefix, shape: shape}
	c.nus, err = sim.WatchNodeUpdates(ctx, watcher, ns)
	Expect(err).NotTo(HaveOccurred())
	c.machines, err = capienv.WatchMachines(ctx, watcher, ns)
	Expect(err).NotTo(HaveOccurred())
	c.updater = sim.RunExternalUpdater(ctx, env.Client, ns, hold, GinkgoWriter.Printf)
	c.updater.UseNodes(nodes)
	DeferCleanup(func() {
		c.updater.Stop()
		c.nus.Stop()
		c.machines.Stop()
	})
	_, err = capienv.CreateCluster(ctx, env.Client, ns, c.name, shape, annotations)
	Expect(err).NotTo(HaveOccurred())
	return c
}

func (c *workloadCluster) size() int { return int(c.shape.ControlPlane + c.shape.Workers) }

// waitProvisioned waits until Cluster API provisioned every machine at the first version.
func (c *workloadCluster) waitProvisioned() {
	GinkgoHelper()
	var err error
	c.before, err = capienv.WaitProvisioned(ctx, env.Client, c.ns, c.name, c.size(), c.shape.Version, 5*time.Minute)
	Expect(err).NotTo(HaveOccurred())
	// And KubeadmControlPlane sees every member healthy: bumped before that, it scales
	// down (replaces) the member that looks unhealthy rather than updating it in place.
	Eventually(func() string {
		machines, err := capienv.Machines(ctx, env.Client, c.ns, c.name)
		if err != nil {
			return err.Error()
		}
		for i := range machines {
			if cond := capienv.UnhealthyControlPlaneComponent(&machines[i]); cond != "" {
				return machines[i].Name + ": " + cond
			}
		}
		return ""
	}).WithTimeout(2*time.Minute).WithPolling(500*time.Millisecond).Should(BeEmpty(), "KubeadmControlPlane's view of its members")
}

// bump changes the Cluster's spec.topology.version, as a user does.
func (c *workloadCluster) bump(version string) {
	GinkgoHelper()
	cluster := &clusterv1.Cluster{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.name}, cluster)).To(Succeed())
	patch := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.Topology.Version = version
	Expect(env.Client.Patch(ctx, cluster, patch)).To(Succeed())
}

// waitAt waits until every machine runs version (spec and kubelet) and returns them.
func (c *workloadCluster) waitAt(version string, timeout time.Duration) []clusterv1.Machine {
	GinkgoHelper()
	machines, err := capienv.WaitProvisioned(ctx, env.Client, c.ns, c.name, c.size(), version, timeout)
	Expect(err).NotTo(HaveOccurred())
	return machines
}

// names returns the names of machines, and of their nodes, split by role.
func names(machines []clusterv1.Machine) (cp, workers, cpNodes, workerNodes []string) {
	for i := range machines {
		m := &machines[i]
		if capienv.IsControlPlane(m) {
			cp, cpNodes = append(cp, m.Name), append(cpNodes, m.Status.NodeRef.Name)
		} else {
			workers, workerNodes = append(workers, m.Name), append(workerNodes, m.Status.NodeRef.Name)
		}
	}
	return cp, workers, cpNodes, workerNodes
}

// expectAllInPlace asserts an in-place rollout of every machine: the same machines, none
// deleted, each upgraded by exactly one NodeUpdate that succeeded, and never more than one
// control plane node, or more workers than the MachineDeployment's maxUnavailable (1),
// down at once, by the NodeUpdates and by the nodes' readiness.
func (c *workloadCluster) expectAllInPlace(after []clusterv1.Machine, version string) {
	GinkgoHelper()
	beforeCP, beforeWorkers, cpNodes, workerNodes := names(c.before)
	afterCP, afterWorkers, _, _ := names(after)
	Expect(afterCP).To(Equal(beforeCP), "control plane machines kept")
	Expect(afterWorkers).To(Equal(beforeWorkers), "worker machines kept")
	Expect(c.machines.Deleted()).To(BeEmpty(), "no machine deleted")

	want := map[string]int{}
	for _, m := range append(append([]string{}, beforeCP...), beforeWorkers...) {
		want[m] = 1
	}
	Expect(c.nus.Creations()).To(Equal(want), "one NodeUpdate per machine")
	Expect(c.nus.RunTwice()).To(BeEmpty())
	list := &inplacev1.NodeUpdateList{}
	Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
	for _, nu := range list.Items {
		Expect(nu.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSucceeded), nu.Name)
		Expect(nu.Spec.Version).To(Equal(version), nu.Name)
	}
	Expect(c.nus.MaxRunningOf("control-plane")).To(BeNumerically("<=", 1), "control plane NodeUpdates at once")
	Expect(c.nus.MaxRunningOf("workers")).To(BeNumerically("<=", 1), "worker NodeUpdates at once")
	Expect(nodes.MaxNotReady(c.ns, c.name, cpNodes...)).To(BeNumerically("<=", 1), "control plane nodes down at once")
	Expect(nodes.MaxNotReady(c.ns, c.name, workerNodes...)).To(BeNumerically("<=", 1), "worker nodes down at once")
	Expect(nodes.MaxNotReady(c.ns, c.name, append(append([]string{}, cpNodes...), workerNodes...)...)).To(BeNumerically(">=", 1),
		"the updater took nodes down (else the safety figures above prove nothing)")

	kubelets, err := capienv.KubeletVersions(ctx, env.Client, env.Scheme, c.ns, c.name)
	Expect(err).NotTo(HaveOccurred())
	for _, n := range append(cpNodes, workerNodes...) {
		Expect(kubelets).To(HaveKeyWithValue(n, version))
	}
}

// countRunning tells the NodeUpdate witness the control plane and worker machines.
func (c *workloadCluster) countRunning() {
	cp, workers, _, _ := names(c.before)
	c.nus.CountRunning("control-plane", cp...)
	c.nus.CountRunning("workers", workers...)
}

// changeWorkerTemplate points the workers' class at a copy of their DevMachineTemplate
// with another provisioning time: a change of the infrastructure machine template that
// no updater declares, which Cluster API asks CanUpdateMachineSet about.
func (c *workloadCluster) changeWorkerTemplate() {
	GinkgoHelper()
	c.pointWorkersAt(c.createWorkerTemplateV2())
}

// createWorkerTemplateV2 creates that copy and returns a reference to it.
func (c *workloadCluster) createWorkerTemplateV2() inplacev1.PreviewTemplateRef {
	GinkgoHelper()
	tmpl := &unstructured.Unstructured{}
	tmpl.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
	tmpl.SetKind("DevMachineTemplate")
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: capienv.SmallControlPlaneClass + "-machine"}, tmpl)).To(Succeed())
	changed := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": tmpl.GetAPIVersion(), "kind": tmpl.GetKind(),
		"metadata": map[string]any{"namespace": c.ns, "name": capienv.SmallControlPlaneClass + "-machine-v2"},
		"spec":     tmpl.Object["spec"],
	}}
	Expect(unstructured.SetNestedField(changed.Object, "3s", "spec", "template", "spec", "backend", "inMemory", "vm", "provisioning", "startupDuration")).To(Succeed())
	Expect(env.Client.Create(ctx, changed)).To(Succeed())
	return inplacev1.PreviewTemplateRef{APIVersion: changed.GetAPIVersion(), Kind: changed.GetKind(), Name: changed.GetName()}
}

// pointWorkersAt makes the workers' class name the template, as a user changing the
// ClusterClass does.
func (c *workloadCluster) pointWorkersAt(ref inplacev1.PreviewTemplateRef) {
	GinkgoHelper()
	class := &clusterv1.ClusterClass{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: capienv.SmallControlPlaneClass}, class)).To(Succeed())
	patch := client.MergeFrom(class.DeepCopy())
	class.Spec.Workers.MachineDeployments[0].Infrastructure.TemplateRef.Name = ref.Name
	Expect(env.Client.Patch(ctx, class, patch)).To(Succeed())
}
