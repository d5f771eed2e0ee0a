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
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
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
			"namespace": "vms", "pvcName": "disk-0",
			"workloadsStatus": []any{map[string]any{"podName": "virt-launcher-db-1-abcde", "workloadName": "db-1", "workloadType": "VirtualMachineInstance"}},
		}, "status", "kubernetesStatus")).To(Succeed())
		Expect(workload.Client.Status().Update(ctx, v)).To(Succeed())

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
})
