package sim_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

const longhornNS = "longhorn-system"

// podOn creates a running pod on node, owned (as its controller) by owner when its kind is
// set, with the PVC claim mounted when it is set.
func podOn(ns, name, node string, owner metav1.OwnerReference, claim string, mutate func(*corev1.Pod)) *corev1.Pod {
	GinkgoHelper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1"}},
		},
	}
	if owner.Kind != "" {
		owner.Controller = ptr.To(true)
		p.OwnerReferences = []metav1.OwnerReference{owner}
	}
	if claim != "" {
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	if mutate != nil {
		mutate(p)
	}
	Expect(env.Client.Create(ctx, p)).To(Succeed())
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	Expect(env.Client.Status().Update(ctx, p)).To(Succeed())
	return p
}

func podGone(p *corev1.Pod) func() bool {
	return func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{}))
	}
}

func longhornVolume(name string) func(Gomega) map[string]string {
	return func(g Gomega) map[string]string {
		st, err := sim.ReadLonghornVolume(ctx, env.Client, longhornNS, name)
		g.Expect(err).NotTo(HaveOccurred())
		return map[string]string{"state": st.State, "node": st.Node, "engineNode": st.EngineNode,
			"engineState": st.EngineState, "lastPodRefAt": st.LastPodRefAt}
	}
}

var _ = Describe("The SUC simulator's kubectl drain (k8s.io/kubectl v0.36.3 pkg/drain)", func() {
	BeforeEach(func() {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhornNS}})
	})
	drainPlan := func(c *cluster, node string, d sucv1.DrainSpec) *sucv1.Plan {
		return c.onePlan("drain", node, func(p *sucv1.Plan) { p.Spec.Drain = &d })
	}

	It("evicts the node's replicated pods, leaves its DaemonSet and mirror pods, and the volume a pod alone used detaches", func() {
		c := newCluster(2)
		node, other := c.pool+"-node-1", c.pool+"-node-2"
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: c.ns},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "registry.example/agent:1"}}}},
			},
		}
		Expect(env.Client.Create(ctx, ds)).To(Succeed())
		rs := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "db-5d8f", UID: types.UID("rs-uid")}
		db := podOn(c.ns, "db-5d8f-x1", node, rs, "db-data", nil)
		elsewhere := podOn(c.ns, "db-5d8f-x2", other, rs, "", nil)
		agent := podOn(c.ns, "agent-x1", node, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: ds.UID}, "", nil)
		mirror := podOn(c.ns, "etcd-"+node, node, metav1.OwnerReference{}, "", func(p *corev1.Pod) {
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
		})
		volume := "pvc-" + c.ns
		Expect(sim.CreateLonghornV2Volume(ctx, env.Client, longhornNS, sim.LonghornV2Volume{
			Name: volume, ReplicaNodes: []string{node, other}, EngineNode: node,
			PVC: client.ObjectKey{Namespace: c.ns, Name: "db-data"}, Users: []sim.LonghornVolumeUser{{Pod: db.Name, WorkloadName: "db-5d8f", WorkloadType: "ReplicaSet"}},
		})).To(Succeed())

		p := drainPlan(c, node, sucv1.DrainSpec{})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(podGone(db)()).To(BeTrue(), "the ReplicaSet's pod is evicted")
		for _, kept := range []*corev1.Pod{agent, mirror, elsewhere} {
			Expect(podGone(kept)()).To(BeFalse(), "%s stays", kept.Name)
		}
		Eventually(longhornVolume(volume)).WithPolling(50 * time.Millisecond).Should(And(
			HaveKeyWithValue("state", "detached"), HaveKeyWithValue("engineState", "stopped"), HaveKeyWithValue("lastPodRefAt", Not(BeEmpty()))))
	})

	It("fails at once, touching no pod, on a pod with no controller without --force", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		lone := podOn(c.ns, "lone", node, metav1.OwnerReference{}, "", nil)
		rs := podOn(c.ns, "web-1", node, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "web-uid"}, "", nil)
		p := drainPlan(c, node, sucv1.DrainSpec{})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.rec.Runs()[0].Message).To(Equal(fmt.Sprintf("container drain: error: unable to drain node %q due to error: cannot delete Pods that declare no controller (use --force to override): %s/lone, continuing command...", node, c.ns)))
		Expect(podGone(lone)()).To(BeFalse())
		Expect(podGone(rs)()).To(BeFalse(), "kubectl checks every pod before it evicts any")
	})

	It("retries an eviction a PodDisruptionBudget refuses until --timeout, then fails naming the pod", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		guarded := podOn(c.ns, "quorum-0", node, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "quorum", UID: "sts-uid"}, "", nil)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "quorum", Namespace: c.ns},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "quorum-0"}}},
		}
		Expect(env.Client.Create(ctx, pdb)).To(Succeed())
		// What the disruption controller, which this API server does not run, reports.
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		Expect(env.Client.Status().Update(ctx, pdb)).To(Succeed())
		p := drainPlan(c, node, sucv1.DrainSpec{Timeout: ptr.To(intstr.FromString("1s"))})
		Eventually(planComplete(p)).WithPolling(20 * time.Millisecond).Should(Equal("False/SyncJob"))
		Consistently(planComplete(p), 600*time.Millisecond, 50*time.Millisecond).ShouldNot(Equal("False/JobFailed"), "kubectl keeps retrying before its timeout")
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.rec.Runs()[0].Message).To(And(
			ContainSubstring(fmt.Sprintf("unable to drain node %q", node)),
			ContainSubstring(fmt.Sprintf("error when evicting pods/%q -n %q", guarded.Name, c.ns)),
			ContainSubstring("global timeout reached: 1s")))
		Expect(podGone(guarded)()).To(BeFalse(), "the budget kept the pod")
	})
})

var _ = Describe("The KubeVirt simulator and a VM's Longhorn volumes (LH fact 38)", func() {
	It("moves a volume's attachment with its VM's live migration, and detaches it when the VM stops", func() {
		c := newCluster(2)
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhornNS}})
		kv := &sim.KubeVirt{Client: env.Client, Namespace: c.ns, NodeSelector: map[string]string{"pool": c.pool}, MigrationDelay: 100 * time.Millisecond}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); kv.Run(runCtx) }()
		DeferCleanup(func() { cancel(); <-done })

		first := c.pool + "-node-1"
		kv.PlaceOn(c.ns, "vm-1", first)
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: c.ns},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
				Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		Expect(env.Client.Create(ctx, vm)).To(Succeed())
		Eventually(func() string { return kv.NodeOf(c.ns + "/vm-1") }).WithPolling(20 * time.Millisecond).Should(Equal(first))
		volume := "pvc-vm-" + c.ns
		Expect(sim.CreateLonghornV2Volume(ctx, env.Client, longhornNS, sim.LonghornV2Volume{
			Name: volume, ReplicaNodes: []string{first}, EngineNode: first,
			PVC: client.ObjectKey{Namespace: c.ns, Name: "vm-1-disk-0"}, Users: []sim.LonghornVolumeUser{{Pod: "virt-launcher-vm-1-abcde", WorkloadName: "vm-1", WorkloadType: "VirtualMachineInstance"}},
		})).To(Succeed())

		Expect(env.Client.Create(ctx, &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Name: "move-vm-1", Namespace: c.ns},
			Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm-1"},
		})).To(Succeed())
		second := c.pool + "-node-2"
		Eventually(longhornVolume(volume)).WithPolling(20 * time.Millisecond).Should(And(
			HaveKeyWithValue("state", "attached"), HaveKeyWithValue("node", second), HaveKeyWithValue("engineNode", second)))

		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
		vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyHalted)
		Expect(env.Client.Update(ctx, vm)).To(Succeed())
		Eventually(longhornVolume(volume)).WithPolling(20 * time.Millisecond).Should(And(
			HaveKeyWithValue("state", "detached"), HaveKeyWithValue("engineState", "stopped")))
	})
})
