package harvesteradapter_test

import (
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// Longhorn v2 volumes whose engine is on the node when it is picked, on a Longhorn
// without the live upgrade of v2 instance managers (every released one): a VM's live
// migration moves its volume's attachment, and the drain's eviction of a pod detaches the
// volume it alone used (test/sim/longhornusers.go; LH fact 38), so neither may keep the
// node from being picked; what neither frees still does.
var _ = Describe("Longhorn v2 volumes that the node's evacuation and drain free", func() {
	// longhornNodes gives each of the cluster's nodes its Longhorn node and running v1 and
	// v2 instance managers of the image Longhorn runs now, as a settled Longhorn with the
	// v2 data engine has; they leave with the spec.
	longhornNodes := func(c *vmCluster) {
		GinkgoHelper()
		image, err := sim.DeployedInstanceManagerImage(ctx, workload.Client)
		Expect(err).NotTo(HaveOccurred())
		for _, n := range c.nodes {
			for _, engine := range []longhornv1.DataEngineType{longhornv1.DataEngineTypeV1, longhornv1.DataEngineTypeV2} {
				Expect(sim.CreateLonghornInstanceManager(ctx, workload.Client, longhorn.Namespace, n, image, engine)).To(Succeed())
			}
			DeferCleanup(func() {
				Expect(workload.Client.DeleteAllOf(ctx, &longhornv1.InstanceManager{}, client.InNamespace(longhorn.Namespace), client.MatchingLabels{"longhorn.io/node": n})).To(Succeed())
				Expect(client.IgnoreNotFound(workload.Client.Delete(ctx, &longhornv1.Node{ObjectMeta: metav1.ObjectMeta{Namespace: longhorn.Namespace, Name: n}}))).To(Succeed())
			})
		}
	}
	// v2Volume attaches a v2 volume with its engine on node, a healthy replica on each of
	// the cluster's nodes, used by users of the PVC c.ns/pvc (none: attached by hand); it
	// leaves with the spec.
	v2Volume := func(c *vmCluster, name, node, pvc string, users ...sim.LonghornVolumeUser) {
		GinkgoHelper()
		v := sim.LonghornV2Volume{Name: name, ReplicaNodes: c.nodes, EngineNode: node, Users: users}
		if pvc != "" {
			v.PVC = client.ObjectKey{Namespace: c.ns, Name: pvc}
		}
		Expect(sim.CreateLonghornV2Volume(ctx, workload.Client, longhorn.Namespace, v)).To(Succeed())
		DeferCleanup(func() {
			for _, obj := range []client.Object{&longhornv1.Volume{}, &longhornv1.Engine{}, &longhornv1.Replica{}} {
				Expect(workload.Client.DeleteAllOf(ctx, obj, client.InNamespace(longhorn.Namespace), client.MatchingLabels{"longhornvolume": name})).To(Succeed())
			}
		})
	}
	// podOn runs a Ready pod on node, its controller owner, mounting the PVC claim.
	podOn := func(c *vmCluster, name, node string, owner metav1.OwnerReference, claim string) *corev1.Pod {
		GinkgoHelper()
		owner.Controller = ptr.To(true)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1"}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}},
		}
		Expect(workload.Client.Create(ctx, p)).To(Succeed())
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		Expect(workload.Client.Status().Update(ctx, p)).To(Succeed())
		return p
	}
	volumeOf := func(name string) *sim.LonghornVolumeState {
		GinkgoHelper()
		st, err := sim.ReadLonghornVolume(ctx, workload.Client, longhorn.Namespace, name)
		Expect(err).NotTo(HaveOccurred())
		return st
	}

	It("picks a node whose attached v2 volumes are its VM's and a replicated pod's, frees them by evacuation and drain, and checks the data engine after the drain", func() {
		c := newVMCluster(3, func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Timeouts.DataEngineUpgrade = &metav1.Duration{Duration: 20 * time.Second}
		})
		clusterUpgraded(c.harvesterCluster)
		longhornNodes(c)
		node := c.nodes[0]
		vm := c.vm("db", node, nil)
		v2Volume(c, "pvc-"+c.name+"-vm", node, "db-disk-0", sim.LonghornVolumeUser{Pod: "virt-launcher-db-x1", WorkloadName: "db", WorkloadType: "VirtualMachineInstance"})
		web := podOn(c, "web-5d8f-x1", node, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f", UID: types.UID("web-rs")}, "web-data")
		v2Volume(c, "pvc-"+c.name+"-pod", node, "web-data", sim.LonghornVolumeUser{Pod: web.Name, WorkloadName: "web-5d8f", WorkloadType: "ReplicaSet"})

		Expect(preflightFailures(c.harvesterCluster, node)).To(BeEmpty(), "the VM's evacuation and the drain free both volumes: nothing holds the node at pick time")

		nu := c.nodeUpdate(node)
		Expect(drive(c.updater, nu, 60*time.Second)).To(Succeed())
		Expect(c.kubevirt.Migrations(vm)).To(Equal(1), "the VM was live-migrated once")
		Expect(c.kubevirt.NodeOf(vm)).NotTo(Equal(node))
		Expect(volumeOf("pvc-"+c.name+"-vm")).To(And(
			HaveField("State", "attached"), HaveField("EngineNode", c.kubevirt.NodeOf(vm))), "the VM's volume moved with it")
		Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(web), &corev1.Pod{})).NotTo(Succeed(), "the drain evicted the pod")
		Expect(volumeOf("pvc-"+c.name+"-pod")).To(HaveField("State", "detached"), "the pod's volume detached")

		names := make([]string, 0, len(nu.Status.Steps))
		for _, s := range nu.Status.Steps {
			names = append(names, s.Name)
		}
		Expect(names).To(ContainElements(harvesteradapter.StepDrain, harvesteradapter.StepLonghornDataEngine))
		Expect(indexOf(names, harvesteradapter.StepLonghornDataEngine)).To(BeNumerically(">", indexOf(names, harvesteradapter.StepDrain)), "the data engine is checked after the drain")
		Expect(nodeupdater.Step(nu, harvesteradapter.StepLonghornDataEngine).State).To(Equal(inplacev1.StepStateSkipped),
			"after the drain no attached v2 volume has its engine on the node")
	})

	It("still holds at pick time a node where a v2 volume attached by hand, or used by a DaemonSet's pod the drain leaves, has its engine", func() {
		c := newVMCluster(3, nil)
		clusterUpgraded(c.harvesterCluster)
		longhornNodes(c)
		node := c.nodes[0]
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: c.ns},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "registry.example/agent:1"}}}},
			},
		}
		Expect(workload.Client.Create(ctx, ds)).To(Succeed())
		agent := podOn(c, "agent-x1", node, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: ds.UID}, "agent-data")
		v2Volume(c, "pvc-"+c.name+"-ds", node, "agent-data", sim.LonghornVolumeUser{Pod: agent.Name, WorkloadName: "agent", WorkloadType: "DaemonSet"})
		v2Volume(c, "pvc-"+c.name+"-hand", node, "")

		failures := preflightFailures(c.harvesterCluster, node)
		Expect(failures).To(HaveKeyWithValue(longhorn.CheckLonghornV2SwapAvailable, And(
			ContainSubstring("pvc-"+c.name+"-ds (PVC "+c.ns+"/agent-data, used by pod "+c.ns+"/"+agent.Name+", which the drain leaves on the node (a DaemonSet's pod))"),
			ContainSubstring("pvc-"+c.name+"-hand (attached with no pod using it)"))))
		Expect(preflightFailures(c.harvesterCluster, c.nodes[1])).NotTo(HaveKey(longhorn.CheckLonghornV2SwapAvailable))
	})
})

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}
