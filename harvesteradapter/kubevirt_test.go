package harvesteradapter_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// vmCluster is a Harvester cluster with KubeVirt: the KubeVirt simulator plays the
// virtual machines of the cluster's namespace on the workload API server. Nodes of
// earlier specs are removed, so that the updater and KubeVirt see this cluster's nodes
// only (how many non-witness nodes there are decides what can migrate).
type vmCluster struct {
	*harvesterCluster
	kubevirt *sim.KubeVirt
}

func newVMCluster(nodes int, mutate func(*harvesterv1.HarvesterUpgrader), simOptions ...func(*sim.KubeVirt)) *vmCluster {
	GinkgoHelper()
	return newVMClusterWith(true, nodes, mutate, simOptions...)
}

// newVMClusterWith is newVMCluster; with planByHand false no UpgradePlan is created ahead
// of the nodes (a spec that adds its nodes afterwards creates it with createPlan).
func newVMClusterWith(planByHand bool, nodes int, mutate func(*harvesterv1.HarvesterUpgrader), simOptions ...func(*sim.KubeVirt)) *vmCluster {
	GinkgoHelper()
	c := newClusterWith(workload, planByHand, nodes, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
		h.Spec.PreloadImages = ptr.To(false)
		h.Spec.UpgradeOS = ptr.To(false)
		if mutate != nil {
			mutate(h)
		}
	})
	all := &corev1.NodeList{}
	Expect(workload.Client.List(ctx, all)).To(Succeed())
	for i := range all.Items {
		mine := false
		for _, n := range c.nodes {
			mine = mine || all.Items[i].Name == n
		}
		if !mine {
			Expect(client.IgnoreNotFound(workload.Client.Delete(ctx, &all.Items[i]))).To(Succeed())
		}
	}
	Expect(workload.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})).To(Succeed())
	kv := &sim.KubeVirt{Client: workload.Client, Cache: simCache(workload), Namespace: c.ns, MigrationDelay: 100 * time.Millisecond, Interval: 20 * time.Millisecond}
	for _, o := range simOptions {
		o(kv) // before the simulator runs: it reads its settings without a lock
	}
	runCtx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	go kv.Run(runCtx)
	return &vmCluster{harvesterCluster: c, kubevirt: kv}
}

// vm creates a VirtualMachine that KubeVirt starts on node; mutate shapes it.
func (c *vmCluster) vm(name, node string, mutate func(*kubevirtv1.VirtualMachine)) string {
	GinkgoHelper()
	always := kubevirtv1.RunStrategyAlways
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{}}},
			},
		},
	}
	if mutate != nil {
		mutate(vm)
	}
	c.kubevirt.PlaceOn(c.ns, name, node)
	Expect(workload.Client.Create(ctx, vm)).To(Succeed())
	key := c.ns + "/" + name
	if s, _ := vm.RunStrategy(); s == kubevirtv1.RunStrategyAlways {
		Eventually(c.kubevirt.NodeOf).WithArguments(key).WithTimeout(5 * time.Second).Should(Equal(node))
	}
	return key
}

func (c *vmCluster) getVM(name string) *kubevirtv1.VirtualMachine {
	GinkgoHelper()
	vm := &kubevirtv1.VirtualMachine{}
	Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: name}, vm)).To(Succeed())
	return vm
}

func runStrategy(vm *kubevirtv1.VirtualMachine) kubevirtv1.VirtualMachineRunStrategy {
	s, err := vm.RunStrategy()
	Expect(err).NotTo(HaveOccurred())
	return s
}

// pinned gives a VM a nodeSelector for its node: Harvester counts it non-live-migratable.
func pinned(node string) func(*kubevirtv1.VirtualMachine) {
	return func(vm *kubevirtv1.VirtualMachine) {
		vm.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
}

// withGPU gives a VM a PCI host device, using the deprecated spec.running instead of a
// run strategy.
func withGPU(vm *kubevirtv1.VirtualMachine) {
	vm.Spec.RunStrategy = nil
	vm.Spec.Running = ptr.To(true)
	vm.Spec.Template.Spec.Domain.Devices.HostDevices = []kubevirtv1.HostDevice{{Name: "gpu0", DeviceName: "nvidia.com/GA102GL_A10"}}
}

// driveUntil reconciles like drive until done says so, and fails the spec when the
// updater ends or returns a permanent error first.
func driveVMsUntil(u *harvesteradapter.Updater, nu *inplacev1.NodeUpdate, limit time.Duration, done func() bool) {
	GinkgoHelper()
	deadline := time.Now().Add(limit)
	for !done() {
		Expect(time.Now().Before(deadline)).To(BeTrue(), "not reached within %s; steps %+v", limit, nu.Status.Steps)
		res, err := u.Reconcile(ctx, nu)
		Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
		if _, permanent := nodeupdater.AsPermanent(err); permanent {
			Fail(err.Error())
		}
		Expect(res.Done).To(BeFalse(), "the updater finished first")
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = Describe("Virtual machines on an upgraded node", func() {
	It("live-migrates the migratable ones before the drain, stops the others with a record, and starts those again once the node is back", func() {
		c := newVMCluster(3, nil)
		node := c.nodes[0]
		a := c.vm("vm-a", node, nil)
		b := c.vm("vm-b", node, nil)
		p := c.vm("vm-pinned", node, pinned(node))
		g := c.vm("vm-gpu", node, withGPU)
		other := c.vm("vm-other", c.nodes[1], nil)

		nu := c.nodeUpdate(node)
		driveVMsUntil(c.updater, nu, 30*time.Second, func() bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepEvacuateVMs) == inplacev1.StepStateSucceeded
		})
		By("the non-migratable VMs are stopped and recorded on themselves, with their run strategy")
		for _, name := range []string{"vm-pinned", "vm-gpu"} {
			vm := c.getVM(name)
			Expect(runStrategy(vm)).To(Equal(kubevirtv1.RunStrategyHalted), name)
			Expect(vm.Labels).To(HaveKeyWithValue(kubevirt.LabelStoppedBy, string(nu.UID)), name)
			Expect(vm.Annotations).To(HaveKeyWithValue(kubevirt.AnnotationRunStrategyBeforeStop, "Always"), name)
		}
		Expect(c.getVM("vm-gpu").Spec.Running).To(HaveValue(BeFalse()), "a VM that uses spec.running is stopped through it: KubeVirt refuses both fields")
		Expect(c.getVM("vm-gpu").Spec.RunStrategy).To(BeNil())
		Expect(nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message).To(And(
			ContainSubstring("live-migrated "+a), ContainSubstring(b), ContainSubstring("stopped "+g+", "+p)))

		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty(), "no VMI runs on a node when its drain starts")
		Expect(c.rec.Drains(node)).To(HaveLen(1))
		for _, key := range []string{a, b} {
			Expect(c.kubevirt.NodeOf(key)).NotTo(BeElementOf("", node), key)
			Expect(c.kubevirt.Migrations(key)).To(Equal(1), "%s migrated once", key)
			Expect(c.kubevirt.Starts(key)).To(Equal(1), "%s never stopped", key)
		}
		Expect(c.kubevirt.Migrations(other)).To(BeZero())

		By("the stopped VMs get their run strategy back and run on the node again once it is uncordoned")
		Expect(nodeupdater.Step(nu, harvesteradapter.StepRestoreVMs).Message).To(ContainSubstring("started " + g + ", " + p + " again"))
		Expect(runStrategy(c.getVM("vm-pinned"))).To(Equal(kubevirtv1.RunStrategyAlways))
		Expect(c.getVM("vm-gpu").Spec.Running).To(HaveValue(BeTrue()))
		// The pinned VM can run on its node only, so it waits there for Finish's uncordon;
		// the GPU VM has no node selector, and KubeVirt may start it on any node that can
		// take it if its own is still cordoned at that moment.
		Eventually(c.kubevirt.NodeOf).WithArguments(p).WithTimeout(5 * time.Second).Should(Equal(node))
		Eventually(c.kubevirt.NodeOf).WithArguments(g).WithTimeout(5 * time.Second).ShouldNot(BeEmpty())
		for _, key := range []string{p, g} {
			Expect(c.kubevirt.Starts(key)).To(Equal(2), "%s started once again, no more", key)
			Expect(c.kubevirt.Migrations(key)).To(BeZero())
		}
		Expect(c.getVM("vm-pinned").Labels).NotTo(HaveKey(kubevirt.LabelStoppedBy), "the record goes with the restore")
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty())
	})

	It("holds the node on a failed migration with the VM's name and KubeVirt's reason, never stops that VM, and goes on once the migration is retried", func() {
		c := newVMCluster(2, nil)
		node := c.nodes[0]
		a := c.vm("vm-a", node, nil)
		c.kubevirt.FailMigrations(c.ns, "vm-a", "target virt-launcher pod: insufficient memory")
		nu := c.nodeUpdate(node)
		driveVMsUntil(c.updater, nu, 30*time.Second, func() bool {
			st := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs)
			return st != nil && st.State == inplacev1.StepStateRunning && len(st.Message) > 8 && st.Message[:8] == "holding:"
		})
		msg := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message
		Expect(msg).To(And(ContainSubstring("VM "+a), ContainSubstring("target virt-launcher pod: insufficient memory"), ContainSubstring("delete the migration to try again")))
		Consistently(func() string {
			_, err := c.updater.Reconcile(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			return nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message
		}, time.Second, 50*time.Millisecond).Should(Equal(msg), "held, not failed, not going on")
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStatePending))
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "a VM that can migrate is not stopped by the updater")
		Expect(c.kubevirt.NodeOf(a)).To(Equal(node))

		By("the operator fixes the cause and deletes the failed migration; the updater creates it again under the same name")
		c.kubevirt.FailMigrations(c.ns, "vm-a", "")
		migrations := &kubevirtv1.VirtualMachineInstanceMigrationList{}
		Expect(workload.Client.List(ctx, migrations, client.InNamespace(c.ns))).To(Succeed())
		Expect(migrations.Items).To(HaveLen(1), "one migration per VM, however many reconciles")
		failed := migrations.Items[0]
		Expect(workload.Client.Delete(ctx, &failed)).To(Succeed())
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(workload.Client.List(ctx, migrations, client.InNamespace(c.ns))).To(Succeed())
		Expect(migrations.Items).To(HaveLen(1))
		Expect(migrations.Items[0].Name).To(Equal(failed.Name))
		Expect(c.kubevirt.NodeOf(a)).To(Equal(c.nodes[1]))
		Expect(c.kubevirt.Starts(a)).To(Equal(1))
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty())
	})

	It("holds the node, naming it, on a VM that a failed migration of Harvester's left pinned to another node, never stops it, and goes on once the VM is restarted", func() {
		c := newVMCluster(3, nil)
		node := c.nodes[0]
		a := c.vm("vm-a", node, nil)
		By("Harvester's migrate action (before v1.7.0) pinned the VMI to the third node, and that migration failed: the pin stays")
		vmi := &kubevirtv1.VirtualMachineInstance{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "vm-a"}, vmi)).To(Succeed())
		if vmi.Annotations == nil {
			vmi.Annotations = map[string]string{}
		}
		vmi.Annotations[kubevirt.MigrationTargetAnnotation] = c.nodes[2]
		vmi.Spec.NodeSelector = map[string]string{corev1.LabelHostname: c.nodes[2]}
		Expect(workload.Client.Update(ctx, vmi)).To(Succeed())

		nu := c.nodeUpdate(node)
		driveVMsUntil(c.updater, nu, 30*time.Second, func() bool {
			st := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs)
			return st != nil && st.State == inplacev1.StepStateRunning && strings.HasPrefix(st.Message, "holding:")
		})
		msg := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message
		Expect(msg).To(And(ContainSubstring("VMI "+a+" is pinned to node "+c.nodes[2]), ContainSubstring(kubevirt.MigrationTargetAnnotation),
			ContainSubstring("harvester/harvester#8147"), ContainSubstring("virtctl restart vm-a -n "+c.ns)))
		Consistently(func() string {
			_, err := c.updater.Reconcile(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			return nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message
		}, time.Second, 50*time.Millisecond).Should(Equal(msg), "held, not failed, not going on")
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "the pinned VM is not stopped")
		Expect(c.kubevirt.NodeOf(a)).To(Equal(node))
		Expect(c.kubevirt.Starts(a)).To(Equal(1))

		By("the operator restarts the VM: its new VMI has no pin, and is live-migrated off the node")
		Expect(workload.Client.Delete(ctx, vmi)).To(Succeed())
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(c.kubevirt.Starts(a)).To(Equal(2), "started again by its restart, once")
		Expect(c.kubevirt.NodeOf(a)).NotTo(BeEmpty(), "%+v", c.kubevirt.History())
		Expect(runStrategy(c.getVM("vm-a"))).To(Equal(kubevirtv1.RunStrategyAlways), "never stopped by the updater")
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty())
	})

	It("leaves the stopped VMs stopped when restoreVM is false, and never starts a VM its user stopped", func() {
		c := newVMCluster(2, func(h *harvesterv1.HarvesterUpgrader) { h.Spec.RestoreVM = ptr.To(false) })
		node := c.nodes[0]
		p := c.vm("vm-pinned", node, pinned(node))
		c.vm("vm-user-stopped", node, func(vm *kubevirtv1.VirtualMachine) {
			halted := kubevirtv1.RunStrategyHalted
			vm.Spec.RunStrategy = &halted
		})
		nu := c.nodeUpdate(node)
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepRestoreVMs)).To(Equal(inplacev1.StepStateSkipped))
		vm := c.getVM("vm-pinned")
		Expect(runStrategy(vm)).To(Equal(kubevirtv1.RunStrategyHalted))
		Expect(vm.Labels).To(HaveKeyWithValue(kubevirt.LabelStoppedBy, string(nu.UID)), "the record stays, for the operator to find")
		Expect(c.kubevirt.Starts(p)).To(Equal(1))
		Expect(runStrategy(c.getVM("vm-user-stopped"))).To(Equal(kubevirtv1.RunStrategyHalted))
		Expect(c.getVM("vm-user-stopped").Labels).NotTo(HaveKey(kubevirt.LabelStoppedBy))
		Expect(c.kubevirt.Starts(c.ns + "/vm-user-stopped")).To(BeZero())
	})

	It("starts the VMs it stopped after a manager restart between the stop and the restore", func() {
		c := newVMCluster(2, nil)
		node := c.nodes[0]
		p := c.vm("vm-pinned", node, pinned(node))
		nu := c.nodeUpdate(node)
		driveVMsUntil(c.updater, nu, 30*time.Second, func() bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepEvacuateVMs) == inplacev1.StepStateSucceeded
		})
		Expect(runStrategy(c.getVM("vm-pinned"))).To(Equal(kubevirtv1.RunStrategyHalted))

		By("a new manager: a new updater, the NodeUpdate read back from the API server")
		restarted := &harvesteradapter.Updater{Client: c.updater.Client, Workloads: c.updater.Workloads, Releases: c.updater.Releases,
			RepositoryURL: c.updater.RepositoryURL, PollInterval: c.updater.PollInterval}
		again := &inplacev1.NodeUpdate{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), again)).To(Succeed())
		Expect(drive(restarted, again, 90*time.Second)).To(Succeed())
		Expect(runStrategy(c.getVM("vm-pinned"))).To(Equal(kubevirtv1.RunStrategyAlways))
		Eventually(c.kubevirt.NodeOf).WithArguments(p).WithTimeout(5 * time.Second).Should(Equal(node))
		Expect(c.kubevirt.Starts(p)).To(Equal(2))
	})

	It("on abort deletes its migrations still under way and starts the VMs it stopped", func() {
		c := newVMCluster(2, nil, func(k *sim.KubeVirt) { k.MigrationDelay = time.Hour }) // the migration never ends by itself
		node := c.nodes[0]
		p := c.vm("vm-pinned", node, pinned(node))
		a := c.vm("vm-a", node, nil)
		nu := c.nodeUpdate(node)
		driveVMsUntil(c.updater, nu, 30*time.Second, func() bool {
			return runStrategy(c.getVM("vm-pinned")) == kubevirtv1.RunStrategyHalted && c.kubevirt.NodeOf(p) == ""
		})
		migrations := &kubevirtv1.VirtualMachineInstanceMigrationList{}
		Expect(workload.Client.List(ctx, migrations, client.InNamespace(c.ns))).To(Succeed())
		Expect(migrations.Items).To(HaveLen(1))

		Eventually(func() bool {
			done, err := c.updater.Abort(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			return done
		}).WithPolling(50 * time.Millisecond).Should(BeTrue())
		Eventually(func() []kubevirtv1.VirtualMachineInstanceMigration {
			Expect(workload.Client.List(ctx, migrations, client.InNamespace(c.ns))).To(Succeed())
			return migrations.Items
		}).Should(BeEmpty(), "the migration under way is deleted (KubeVirt aborts it)")
		Expect(runStrategy(c.getVM("vm-pinned"))).To(Equal(kubevirtv1.RunStrategyAlways))
		Expect(unschedulable(node)).To(BeFalse())
		Eventually(c.kubevirt.NodeOf).WithArguments(p).WithTimeout(5 * time.Second).Should(Equal(node))
		Expect(c.kubevirt.NodeOf(a)).To(Equal(node), "its migration never ran")
	})

	It("stops and restores every VM of a cluster with a single node: there is nowhere to migrate", func() {
		c := newVMCluster(1, nil)
		node := c.nodes[0]
		keys := []string{c.vm("vm-a", node, nil), c.vm("vm-b", node, nil)}
		nu := c.nodeUpdate(node)
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(c.kubevirt.RunningWhileDrained(c.rec)).To(BeEmpty())
		for _, key := range keys {
			Expect(c.kubevirt.Migrations(key)).To(BeZero(), key)
			Eventually(c.kubevirt.NodeOf).WithArguments(key).WithTimeout(5 * time.Second).Should(Equal(node))
			Expect(c.kubevirt.Starts(key)).To(Equal(2), key)
		}
		Expect(fmt.Sprint(nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message)).To(ContainSubstring("stopped " + keys[0] + ", " + keys[1]))
	})
})
