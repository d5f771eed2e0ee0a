package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// A released Longhorn (up to 1.12.1) has no live upgrade of v2 instance managers: it keeps
// a node's old v2 instance manager while a v2 engine or replica runs there and starts the
// new one only then (harvester-release-steps.md facts 68 to 71; the Longhorn simulator
// plays it). Harvester's chart upgrade, which upgrades Longhorn, would wait for ever.
var _ = Describe("An UpgradePlan on a Longhorn without the live upgrade of v2 instance managers", func() {
	It("holds the cluster upgrade while a v2 volume is attached, naming the VM that uses it, and starts it once the volume is detached", func() {
		volume := "pvc-v2-held"
		attachV2Volume(volume, "db-1")

		c := newHarvesterCluster(2, "Harvester v1.7.1", nil)
		plan := &harvesterv1.UpgradePlan{}
		key := client.ObjectKeyFromObject(c.plan)
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			g.Expect(plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanClusterUpgrading))
			g.Expect(plan.Status.Message).To(ContainSubstring("volume pvc-v2-held (attached) used by VirtualMachineInstance vms/db-1"))
			g.Expect(meta.IsStatusConditionTrue(plan.Status.Conditions, harvesterv1.UpgradePlanDegraded)).To(BeTrue())
		}, 30*time.Second, 50*time.Millisecond).Should(Succeed())
		job := clusterupgrade.Job(clusterupgrade.JobInput{Plan: plan.Name, Namespace: repository.Namespace})
		Consistently(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			g.Expect(plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanClusterUpgrading))
			g.Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.Job{})).NotTo(Succeed(), "no cluster upgrade Job while the v2 volume is attached")
		}, time.Second, 100*time.Millisecond).Should(Succeed())

		By("its VM stopped, the volume detaches, and the cluster upgrade goes on")
		Expect(sim.DetachLonghornVolume(ctx, workload.Client, longhorn.Namespace, volume)).To(Succeed())
		Eventually(func(g Gomega) bool {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			return upgradeplan.PhaseReached(plan, harvesterv1.UpgradePlanNodeUpgrading)
		}, 60*time.Second, 100*time.Millisecond).Should(BeTrue(), "plan message: %s", plan.Status.Message)
	})
	It("with attachedV2Volumes StopVirtualMachines stops the VMs that use attached v2 volumes, records them, and starts them again once the cluster upgrade is done", func() {
		const vmNS, vmName, volume = "vms-v2-stop", "db-2", "pvc-v2-stopped"
		Expect(workload.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmNS}})).To(Succeed())
		always := kubevirtv1.RunStrategyAlways
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: vmNS, Name: vmName},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		Expect(workload.Client.Create(ctx, vm)).To(Succeed())
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: vmNS, Name: vmName,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vmName, UID: vm.UID}}}}
		Expect(workload.Client.Create(ctx, vmi)).To(Succeed())
		attachV2VolumeIn(volume, vmNS, vmName)

		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.ClusterUpgrade.AttachedV2Volumes = harvesterv1.AttachedV2VolumesStopVirtualMachines
		})
		plan := &harvesterv1.UpgradePlan{}
		key := client.ObjectKeyFromObject(c.plan)
		job := clusterupgrade.Job(clusterupgrade.JobInput{Plan: c.plan.Name, Namespace: repository.Namespace})

		By("the plan stops the VM, recorded with the plan's UID and its run strategy, and waits for the volume: no cluster upgrade Job yet")
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			g.Expect(plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanClusterUpgrading))
			g.Expect(plan.Status.Message).To(ContainSubstring("stopped the virtual machines " + vmNS + "/" + vmName))
			g.Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
			g.Expect(vm.Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyHalted)))
			g.Expect(vm.Labels).To(HaveKeyWithValue(kubevirt.LabelStoppedBy, string(plan.UID)))
			g.Expect(vm.Annotations).To(HaveKeyWithValue(kubevirt.AnnotationRunStrategyBeforeStop, string(kubevirtv1.RunStrategyAlways)))
		}, 30*time.Second, 50*time.Millisecond).Should(Succeed())
		Consistently(func(g Gomega) {
			g.Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.Job{})).NotTo(Succeed(), "no cluster upgrade Job while the v2 volume is attached")
		}, time.Second, 100*time.Millisecond).Should(Succeed())

		By("KubeVirt deletes the halted VM's VMI, Longhorn detaches its volume (as the KubeVirt and Longhorn simulators play it), and the cluster upgrade goes on")
		Expect(workload.Client.Delete(ctx, vmi)).To(Succeed())
		Expect(sim.DetachLonghornVolume(ctx, workload.Client, longhorn.Namespace, volume)).To(Succeed())
		Eventually(func(g Gomega) bool {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			return upgradeplan.PhaseReached(plan, harvesterv1.UpgradePlanNodeUpgrading)
		}, 60*time.Second, 100*time.Millisecond).Should(BeTrue(), "plan message: %s", plan.Status.Message)

		By("the cluster upgrade done, the VM runs again with the run strategy it had, and the record is gone")
		Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
		Expect(vm.Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyAlways)))
		Expect(vm.Labels).NotTo(HaveKey(kubevirt.LabelStoppedBy))
		Expect(vm.Annotations).NotTo(HaveKey(kubevirt.AnnotationRunStrategyBeforeStop))
	})

	It("starts the VMs it stopped for the cluster upgrade again when the plan is deleted before the cluster upgrade ran", func() {
		const vmNS, vmName, volume = "vms-v2-abort", "db-3", "pvc-v2-aborted"
		Expect(workload.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmNS}})).To(Succeed())
		rerun := kubevirtv1.RunStrategyRerunOnFailure
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: vmNS, Name: vmName},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &rerun, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		Expect(workload.Client.Create(ctx, vm)).To(Succeed())
		Expect(workload.Client.Create(ctx, &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: vmNS, Name: vmName,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vmName, UID: vm.UID}}}})).To(Succeed())
		attachV2VolumeIn(volume, vmNS, vmName)

		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.ClusterUpgrade.AttachedV2Volumes = harvesterv1.AttachedV2VolumesStopVirtualMachines
		})
		Eventually(func(g Gomega) {
			g.Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
			g.Expect(vm.Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyHalted)))
		}, 30*time.Second, 50*time.Millisecond).Should(Succeed())

		// The VMs are stopped as the cluster step starts: the plan is in ClusterUpgrading,
		// where only allow-deletion lets it be deleted.
		deleteRunningPlan(c.plan)
		Eventually(func(g Gomega) {
			g.Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
			g.Expect(vm.Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyRerunOnFailure)))
			g.Expect(vm.Labels).NotTo(HaveKey(kubevirt.LabelStoppedBy))
		}, 30*time.Second, 50*time.Millisecond).Should(Succeed())
	})
})

// attachV2Volume creates an attached Longhorn v2 volume in Longhorn's namespace, used by
// the virt-launcher pod of the VirtualMachineInstance vms/vmi, as Longhorn reports a VM's
// disk (status.kubernetesStatus.workloadsStatus: the pod's owner kind and name).
func attachV2Volume(volume, vmi string) {
	GinkgoHelper()
	attachV2VolumeIn(volume, "vms", vmi)
}

// attachV2VolumeIn is attachV2Volume for a VMI in namespace.
func attachV2VolumeIn(volume, namespace, vmi string) {
	GinkgoHelper()
	_ = workload.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}})
	Expect(sim.CreateLonghornV2Volume(ctx, workload.Client, longhorn.Namespace, sim.LonghornV2Volume{Name: volume, ReplicaNodes: []string{"elsewhere-1"}, EngineNode: "elsewhere-1"})).To(Succeed())
	DeferCleanup(func() {
		v := &unstructured.Unstructured{}
		v.SetAPIVersion("longhorn.io/v1beta2")
		v.SetKind("Volume")
		v.SetNamespace(longhorn.Namespace)
		v.SetName(volume)
		Expect(client.IgnoreNotFound(workload.Client.Delete(ctx, v))).To(Succeed())
	})
	v := &unstructured.Unstructured{}
	v.SetAPIVersion("longhorn.io/v1beta2")
	v.SetKind("Volume")
	Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: longhorn.Namespace, Name: volume}, v)).To(Succeed())
	Expect(unstructured.SetNestedField(v.Object, map[string]any{
		"namespace": namespace, "pvcName": "disk-0",
		"workloadsStatus": []any{map[string]any{"podName": "virt-launcher-" + vmi + "-abcde", "workloadName": vmi, "workloadType": "VirtualMachineInstance"}},
	}, "status", "kubernetesStatus")).To(Succeed())
	Expect(workload.Client.Status().Update(ctx, v)).To(Succeed())
}
