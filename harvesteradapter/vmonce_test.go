package harvesteradapter_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// vmRoll is a vmCluster with a MachineDeployment of workers nodes, each running one VM,
// and a node that is in no task (spare) running load VMs, with the UpgradeTask
// controller and the NodeUpdate lifecycle running.
type vmRoll struct {
	*vmCluster
	workers []string
	spare   string
	vms     []string
}

func newVMRoll(workers, load int) *vmRoll {
	GinkgoHelper()
	c := newVMCluster(0, nil)
	return newVMRollOn(c, workers, load)
}

func newVMRollOn(c *vmCluster, workers, load int) *vmRoll {
	GinkgoHelper()
	return newVMRollShaped(c, workers, load, nil)
}

// newVMRollShaped is newVMRollOn with every VM, the workers' and the load, shaped by
// shape (nil: plain VMs).
func newVMRollShaped(c *vmCluster, workers, load int, shape func(*kubevirtv1.VirtualMachine)) *vmRoll {
	GinkgoHelper()
	_, err := fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
	Expect(err).NotTo(HaveOccurred())
	_, machines, err := fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", "v1.34.3+rke2r3", workers)
	Expect(err).NotTo(HaveOccurred())
	// Named to sort after the workers: the UpgradePlan lets the nodes go in its order
	// (management, witness, workers, each by name), and no task upgrades this one.
	r := &vmRoll{vmCluster: c, spare: c.name + "-zz-spare"}
	for _, m := range machines {
		_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, "v1.34.3+rke2r3", nil)
		Expect(err).NotTo(HaveOccurred())
		r.workers = append(r.workers, m.Status.NodeRef.Name)
	}
	// A node of the cluster that this roll does not upgrade, busier than any worker:
	// KubeVirt's scheduler, by load alone, sends an evacuated VM to a worker.
	_, err = c.kubelet.CreateNode(ctx, r.spare, "v1.34.3+rke2r3", nil)
	Expect(err).NotTo(HaveOccurred())
	for i := 0; i < load; i++ {
		c.vm("load-"+string(rune('a'+i)), r.spare, func(vm *kubevirtv1.VirtualMachine) {
			if shape != nil {
				shape(vm)
			}
			pinned(r.spare)(vm)
		})
	}
	for i, node := range r.workers {
		r.vms = append(r.vms, c.vm("vm-"+string(rune('a'+i)), node, shape))
	}
	startLifecycle(c.harvesterCluster, true)
	return r
}

// task creates the workers' UpgradeTask.
func (r *vmRoll) task(mutate func(*inplacev1.UpgradeTaskSpec)) *inplacev1.UpgradeTask {
	GinkgoHelper()
	t := &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: r.ns},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName: r.name, MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
			Version: "v1.35.6+rke2r1", UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
		},
	}
	if mutate != nil {
		mutate(&t.Spec)
	}
	Expect(env.Client.Create(ctx, t)).To(Succeed())
	return t
}

func (r *vmRoll) phase(t *inplacev1.UpgradeTask) func(Gomega) inplacev1.TaskPhase {
	return func(g Gomega) inplacev1.TaskPhase {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(t), t)).To(Succeed())
		return t.Status.Phase
	}
}

// describe says where the task's machines are, for a spec that fails.
func describe(t *inplacev1.UpgradeTask) string {
	out := ""
	for _, m := range t.Status.Machines {
		out += fmt.Sprintf("%s %s: %s; ", m.Name, m.State, m.Message)
	}
	for _, c := range t.Status.Conditions {
		out += fmt.Sprintf("%s=%s %s; ", c.Type, c.Status, c.Message)
	}
	return out
}

// pendingTainted lists the nodes of the workload cluster that carry the upgrade-pending
// taint.
func pendingTainted() []string {
	GinkgoHelper()
	nodes := &corev1.NodeList{}
	Expect(workload.Client.List(ctx, nodes)).To(Succeed())
	var out []string
	for i := range nodes.Items {
		for _, t := range nodes.Items[i].Spec.Taints {
			if t.Key == inplacev1.UpgradePendingTaint {
				out = append(out, nodes.Items[i].Name)
			}
		}
	}
	return out
}

var _ = Describe("VMs move once over a roll", func() {
	It("evacuates each VM once over a 3-node roll: the nodes still to go carry a PreferNoSchedule taint, gone at the end", func() {
		r := newVMRoll(3, 3)
		t := r.task(nil)
		tainted := untilPhaseNotingTaints(r, t, inplacev1.TaskPhaseCompleted)
		for _, key := range r.vms {
			Expect(r.kubevirt.Migrations(key)).To(Equal(1), "%s migrated once over the roll (history %v)", key, r.kubevirt.History())
		}
		By("while the roll ran, the nodes still to go carried the taint, and the node that stays never did")
		Expect(tainted).To(HaveKey(r.workers[2]))
		Expect(tainted).NotTo(HaveKey(r.spare))
		Expect(r.kubevirt.RunningWhileDrained(r.rec)).To(BeEmpty())
		By("no node carries the taint, nor a landing label, once the task is done")
		Expect(pendingTainted()).To(BeEmpty())
		Expect(landingLabelled()).To(BeEmpty())
	})
})

// harvesterVM shapes a VM as Harvester's VM builder makes it (harvester v1.8.2
// pkg/builder/vm.go: the creator label, DefaultPodAntiAffinity's preferred anti-affinity
// of weight 100 to every other VM, per host) and gives it a preferred node affinity of
// weight 50 for nodes labelled disk=ssd.
func harvesterVM(vm *kubevirtv1.VirtualMachine) {
	vm.Spec.Template.ObjectMeta.Labels["harvesterhci.io/creator"] = "harvester"
	vm.Spec.Template.Spec.Affinity = &corev1.Affinity{
		NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight:     50,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "disk", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}},
		}}},
		PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "harvesterhci.io/creator", Operator: metav1.LabelSelectorOpExists}}},
				TopologyKey:   corev1.LabelHostname,
			},
		}}},
	}
}

// labelNode sets a label on a workload node.
func labelNode(name, key, value string) {
	GinkgoHelper()
	node := &corev1.Node{}
	Expect(workload.Client.Get(ctx, client.ObjectKey{Name: name}, node)).To(Succeed())
	orig := node.DeepCopy()
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	node.Labels[key] = value
	Expect(workload.Client.Patch(ctx, node, client.MergeFrom(orig))).To(Succeed())
}

var _ = Describe("VMs move once: a rule, not only a preference", func() {
	It("evacuates each VM once even when its own preferences outweigh the upgrade-pending taint", func() {
		c := newVMCluster(0, nil)
		// Every VM is Harvester's (anti-affinity between VMs) and prefers SSDs; the
		// workers have them, the spare does not and runs two VMs already. For the first
		// worker's VM, kube-scheduler's sum favours the next worker to go: NodeAffinity
		// 100*2 and InterPodAffinity 100*2 there against TaintToleration 100*3 on the
		// spare (test/sim/kubevirt_scheduler.go).
		r := newVMRollShaped(c, 3, 2, harvesterVM)
		for _, w := range r.workers {
			labelNode(w, "disk", "ssd")
		}
		t := r.task(nil)
		landed := map[string]bool{}
		var both []string
		Eventually(func(g Gomega) inplacev1.TaskPhase {
			pending := map[string]bool{}
			for _, n := range pendingTainted() {
				pending[n] = true
			}
			for n := range landingLabelled() {
				landed[n] = true
				if pending[n] {
					both = append(both, n)
				}
			}
			return r.phase(t)(g)
		}, 180*time.Second, 50*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted), func() string { return describe(t) })
		for _, key := range r.vms {
			Expect(r.kubevirt.Migrations(key)).To(Equal(1), "%s migrated once over the roll (history %v)", key, r.kubevirt.History())
		}
		Expect(r.kubevirt.NodeOf(r.vms[0])).To(Equal(r.spare), "the first node's VM went to the only node outside the roll")
		Expect(r.kubevirt.RunningWhileDrained(r.rec)).To(BeEmpty())
		By("every migration asked KubeVirt for the nodes no running roll has still to upgrade, and only such nodes were labelled")
		for key, ms := range migrationsOf(r.ns) {
			for _, m := range ms {
				Expect(m.Spec.AddedNodeSelector).To(HaveLen(1), "%s: %s", key, m.Name)
				for k, v := range m.Spec.AddedNodeSelector {
					Expect(k).To(HavePrefix(kubevirt.LandingLabelPrefix), "%s: %s", key, m.Name)
					Expect(v).To(Equal("true"))
				}
				Expect(m.Annotations).NotTo(HaveKey(kubevirt.AnnotationUnconfined), "%s: %s", key, m.Name)
			}
		}
		Expect(landed).To(HaveKey(r.spare))
		Expect(both).To(BeEmpty(), "no node was a landing node while still to be upgraded")
		By("nothing is left: no taint, no landing label")
		Expect(pendingTainted()).To(BeEmpty(), "no taint once the task is done")
		Expect(landingLabelled()).To(BeEmpty(), "no landing label once the task is done")
	})

	It("leaves a VM to the taint's preference when no node outside the rolls can take it, and the roll goes on", func() {
		c := newVMCluster(0, nil)
		r := newVMRollShaped(c, 3, 0, nil)
		// The spare is still to go in another running roll (its task's taint, which this
		// task leaves alone): for the first worker, every other node is pending. That task
		// exists and never ends (its Cluster does not exist, so it never reaches these
		// nodes): a taint whose task is gone or ended would be taken off as stray.
		otherTask := &inplacev1.UpgradeTask{
			ObjectMeta: metav1.ObjectMeta{Name: "other-roll", Namespace: r.ns},
			Spec: inplacev1.UpgradeTaskSpec{
				ClusterName: r.name + "-elsewhere", MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
				Version: "v1.35.6+rke2r1", UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
			},
		}
		Expect(env.Client.Create(ctx, otherTask)).To(Succeed())
		other := corev1.Taint{Key: inplacev1.UpgradePendingTaint, Value: r.ns + ".other-roll", Effect: corev1.TaintEffectPreferNoSchedule}
		node := &corev1.Node{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: r.spare}, node)).To(Succeed())
		orig := node.DeepCopy()
		node.Spec.Taints = append(node.Spec.Taints, other)
		Expect(workload.Client.Patch(ctx, node, client.MergeFrom(orig))).To(Succeed())
		DeferCleanup(func() {
			n := &corev1.Node{}
			if workload.Client.Get(ctx, client.ObjectKey{Name: r.spare}, n) == nil {
				o := n.DeepCopy()
				n.Spec.Taints = nil
				_ = workload.Client.Patch(ctx, n, client.MergeFrom(o))
			}
		})

		t := r.task(nil)
		untilPhaseNotingTaints(r, t, inplacev1.TaskPhaseCompleted)
		ms := migrationsOf(r.ns)
		By("the first worker's VM: no node qualified, so its migration carries no addedNodeSelector, and says why")
		var first *kubevirtv1.VirtualMachineInstanceMigration
		for i, m := range ms[r.vms[0]] {
			if m.Annotations[suc.AnnotationNode] == r.workers[0] {
				first = &ms[r.vms[0]][i]
			}
		}
		Expect(first).NotTo(BeNil(), "the migration off the first worker (history %v)", r.kubevirt.History())
		Expect(first.Spec.AddedNodeSelector).To(BeEmpty())
		Expect(first.Annotations).To(HaveKeyWithValue(kubevirt.AnnotationUnconfined, ContainSubstring("every other node that can take VMs is still to be upgraded")))
		By("the later workers' VMs land on the nodes already upgraded")
		for _, key := range r.vms[1:] {
			Expect(ms[key]).NotTo(BeEmpty(), key)
			Expect(ms[key][0].Spec.AddedNodeSelector).To(HaveLen(1), key)
			Expect(r.kubevirt.Migrations(key)).To(Equal(1), "%s migrated once (history %v)", key, r.kubevirt.History())
		}
		Expect(r.kubevirt.RunningWhileDrained(r.rec)).To(BeEmpty())
		Expect(landingLabelled()).To(BeEmpty(), "no landing label once the task is done")
		Expect(pendingTainted()).To(ConsistOf(r.spare), "only the other roll's taint is left")
	})

	It("takes the landing label off when the task is aborted while a confined migration runs", func() {
		c := newVMCluster(0, nil, func(k *sim.KubeVirt) { k.MigrationDelay = time.Hour })
		r := newVMRollShaped(c, 2, 0, nil)
		t := r.task(nil)
		Eventually(landingLabelled, 90*time.Second, 50*time.Millisecond).Should(HaveKey(r.spare), func() string { return describe(t) })
		Expect(landingLabelled()).NotTo(HaveKey(r.workers[1]), "the node still to go is no landing node")
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(t), t)).To(Succeed())
		orig := t.DeepCopy()
		t.Spec.Phase = inplacev1.TaskActionAbort
		Expect(env.Client.Patch(ctx, t, client.MergeFrom(orig))).To(Succeed())
		Eventually(r.phase(t), 120*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.TaskPhaseAborted), func() string { return describe(t) })
		Expect(landingLabelled()).To(BeEmpty(), "no landing label once the task was aborted")
		Expect(pendingTainted()).To(BeEmpty(), "no taint once the task was aborted")
	})
})

// landingLabelled lists the nodes of the workload cluster that carry an evacuation's
// landing label, each with the NodeUpdate UIDs of its labels.
func landingLabelled() map[string][]string {
	GinkgoHelper()
	nodes := &corev1.NodeList{}
	Expect(workload.Client.List(ctx, nodes)).To(Succeed())
	out := map[string][]string{}
	for i := range nodes.Items {
		for k := range nodes.Items[i].Labels {
			if uid, ok := strings.CutPrefix(k, kubevirt.LandingLabelPrefix); ok {
				out[nodes.Items[i].Name] = append(out[nodes.Items[i].Name], uid)
			}
		}
	}
	return out
}

// migrationsOf lists the live migrations of the namespace by the VMI they moved.
func migrationsOf(ns string) map[string][]kubevirtv1.VirtualMachineInstanceMigration {
	GinkgoHelper()
	list := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	Expect(workload.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	out := map[string][]kubevirtv1.VirtualMachineInstanceMigration{}
	for _, m := range list.Items {
		out[ns+"/"+m.Spec.VMIName] = append(out[ns+"/"+m.Spec.VMIName], m)
	}
	return out
}

// untilPhaseNotingTaints waits until task t reaches phase and returns the nodes seen
// carrying the upgrade-pending taint at any look on the way.
func untilPhaseNotingTaints(r *vmRoll, t *inplacev1.UpgradeTask, phase inplacev1.TaskPhase) map[string]bool {
	GinkgoHelper()
	tainted := map[string]bool{}
	Eventually(func(g Gomega) inplacev1.TaskPhase {
		for _, n := range pendingTainted() {
			tainted[n] = true
		}
		return r.phase(t)(g)
	}, 180*time.Second, 100*time.Millisecond).Should(Equal(phase), func() string { return describe(t) })
	return tainted
}

// askingMemory makes a VM request size of memory.
func askingMemory(size string) func(*kubevirtv1.VirtualMachine) {
	return func(vm *kubevirtv1.VirtualMachine) {
		vm.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(size)}
	}
}

var _ = Describe("VMs move once: the taint ends with the task", func() {
	It("takes the taint off every node when the task fails", func() {
		c := newVMCluster(0, nil)
		r := newVMRollOn(c, 3, 0)
		c.suc.FailNodeLabelled(map[string]string{suc.LabelPlanKind: "rke2"}, r.workers[1], "rke2 failed to start")
		t := r.task(nil)
		tainted := untilPhaseNotingTaints(r, t, inplacev1.TaskPhaseFailed)
		Expect(tainted).To(HaveKey(r.workers[2]), "the last node carried the taint while the task ran")
		Expect(pendingTainted()).To(BeEmpty(), "no taint once the task failed")
		Expect(landingLabelled()).To(BeEmpty(), "no landing label once the task failed")
	})

	It("takes the taint off every node when the task is aborted, and when it is deleted", func() {
		r := newVMRoll(3, 0)
		t := r.task(nil)
		Eventually(pendingTainted, 60*time.Second, 50*time.Millisecond).Should(ContainElement(r.workers[2]))
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(t), t)).To(Succeed())
		orig := t.DeepCopy()
		t.Spec.Phase = inplacev1.TaskActionAbort
		Expect(env.Client.Patch(ctx, t, client.MergeFrom(orig))).To(Succeed())
		Eventually(r.phase(t), 120*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.TaskPhaseAborted), func() string { return describe(t) })
		Expect(pendingTainted()).To(BeEmpty(), "no taint once the task was aborted")

		By("a task deleted while it runs leaves no taint either")
		t2 := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Name: "workers-again", Namespace: r.ns}, Spec: *orig.Spec.DeepCopy()}
		Expect(env.Client.Create(ctx, t2)).To(Succeed())
		Eventually(pendingTainted, 60*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty())
		Expect(env.Client.Delete(ctx, t2)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(t2), &inplacev1.UpgradeTask{}))
		}, 120*time.Second, 100*time.Millisecond).Should(BeTrue(), "the deleted task is gone")
		Expect(pendingTainted()).To(BeEmpty(), "no taint once the task was deleted")
		Expect(landingLabelled()).To(BeEmpty(), "no landing label once the task was deleted")
	})
})

var _ = Describe("VMs move once: room on the nodes that stay up", func() {
	It("holds the evacuation with the shortfall named, migrating nothing and draining nothing, until there is room", func() {
		c := newVMCluster(2, nil)
		node, other := c.nodes[0], c.nodes[1]
		// Each node has 64Gi allocatable (the simulated kubelet's): 40Gi taken on the
		// other node leaves 24Gi, short of the 40Gi VM.
		big := c.vm("vm-big", node, askingMemory("40Gi"))
		c.vm("vm-load", other, askingMemory("40Gi"))
		nu := c.nodeUpdate(node)
		// Up to 90 s: the node's cluster step waits for the UpgradePlan's cluster upgrade
		// first, slow on a loaded machine.
		driveVMsUntil(c.updater, nu, 90*time.Second, func() bool {
			st := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs)
			return st != nil && strings.Contains(st.Message, "have no room")
		})
		msg := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message
		Expect(msg).To(And(ContainSubstring(big+" (CPU 100m, memory 40Gi)"), ContainSubstring("memory 40Gi in all is missing"), ContainSubstring(other+": CPU")))
		By("while it holds, nothing is migrated, stopped or drained")
		for range 10 {
			_, err := c.updater.Reconcile(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
			time.Sleep(20 * time.Millisecond)
		}
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepEvacuateVMs)).To(Equal(inplacev1.StepStateRunning))
		Expect(c.kubevirt.Migrations(big)).To(BeZero())
		Expect(c.kubevirt.NodeOf(big)).To(Equal(node))
		Expect(c.rec.Drains(node)).To(BeEmpty())
		migrations := &kubevirtv1.VirtualMachineInstanceMigrationList{}
		Expect(workload.Client.List(ctx, migrations, client.InNamespace(c.ns))).To(Succeed())
		Expect(migrations.Items).To(BeEmpty())

		By("once the other node has room, the VM is migrated once and the node goes on")
		load := c.getVM("vm-load")
		halted := kubevirtv1.RunStrategyHalted
		load.Spec.RunStrategy = &halted
		Expect(workload.Client.Update(ctx, load)).To(Succeed())
		driveVMsUntil(c.updater, nu, 30*time.Second, func() bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepEvacuateVMs) == inplacev1.StepStateSucceeded
		})
		Expect(c.kubevirt.Migrations(big)).To(Equal(1))
		Expect(c.kubevirt.NodeOf(big)).To(Equal(other))
	})
})
