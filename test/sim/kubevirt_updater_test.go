package sim_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// kubevirtCluster is three Ready nodes, a namespace with a KubeVirt CR deployed at
// v1.5.2 with the given workload update methods, and the KubeVirt simulator playing them.
type kubevirtCluster struct {
	ns string
	kv *sim.KubeVirt
}

func newKubeVirtCluster(methods []kubevirtv1.WorkloadUpdateMethod) *kubevirtCluster {
	GinkgoHelper()
	seq++
	pool, ns := fmt.Sprintf("kv-pool-%d", seq), fmt.Sprintf("kv-%d", seq)
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	kubelet := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord()}
	for i := 1; i <= 3; i++ {
		_, err := kubelet.CreateNode(ctx, fmt.Sprintf("%s-node-%d", pool, i), "v1.33.3+rke2r1", map[string]string{"pool": pool})
		Expect(err).NotTo(HaveOccurred())
	}
	cr := &kubevirtv1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: ns},
		Spec: kubevirtv1.KubeVirtSpec{
			WorkloadUpdateStrategy: kubevirtv1.KubeVirtWorkloadUpdateStrategy{WorkloadUpdateMethods: methods},
		},
	}
	Expect(env.Client.Create(ctx, cr)).To(Succeed())
	c := &kubevirtCluster{ns: ns, kv: &sim.KubeVirt{
		Client: env.Client, Namespace: ns, NodeSelector: map[string]string{"pool": pool},
		KubeVirtCR: client.ObjectKeyFromObject(cr), MigrationDelay: 150 * time.Millisecond, Interval: 30 * time.Millisecond,
	}}
	Expect(c.kv.UpgradeKubeVirt(ctx, "v1.5.2")).To(Succeed())
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.kv.Run(runCtx) }()
	DeferCleanup(func() { cancel(); <-done })
	return c
}

// vms starts n VirtualMachines; hostDevice ones are not live-migratable.
func (c *kubevirtCluster) vms(prefix string, n int, hostDevice bool) []string {
	GinkgoHelper()
	var names []string
	for i := 1; i <= n; i++ {
		always := kubevirtv1.RunStrategyAlways
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: c.ns},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		if hostDevice {
			vm.Spec.Template.Spec.Domain.Devices.HostDevices = []kubevirtv1.HostDevice{{Name: "nic", DeviceName: "example.com/sriov"}}
		}
		Expect(env.Client.Create(ctx, vm)).To(Succeed())
		names = append(names, c.ns+"/"+vm.Name)
	}
	return names
}

// launcherImages maps each VMI (namespace/name) to its launcher image.
func (c *kubevirtCluster) launcherImages() func(Gomega) map[string]string {
	return func(g Gomega) map[string]string {
		list := &kubevirtv1.VirtualMachineInstanceList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
		out := map[string]string{}
		for _, vmi := range list.Items {
			out[vmi.Namespace+"/"+vmi.Name] = vmi.Status.LauncherContainerImageVersion
		}
		return out
	}
}

func allAt(names []string, image string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		out[n] = image
	}
	return out
}

func (c *kubevirtCluster) outdated() func(Gomega) int {
	return func(g Gomega) int {
		kv := &kubevirtv1.KubeVirt{}
		g.Expect(env.Client.Get(ctx, c.kv.KubeVirtCR, kv)).To(Succeed())
		g.Expect(kv.Status.OutdatedVirtualMachineInstanceWorkloads).NotTo(BeNil())
		return *kv.Status.OutdatedVirtualMachineInstanceWorkloads
	}
}

var _ = Describe("The KubeVirt simulator's workload updater (harvester-release-steps.md fact 13)", func() {
	It("with [LiveMigrate], live-migrates every running migratable VMI once after an upgrade, at most parallelMigrationsPerCluster (5) new ones per sync, and leaves the others outdated", func() {
		c := newKubeVirtCluster([]kubevirtv1.WorkloadUpdateMethod{kubevirtv1.WorkloadUpdateMethodLiveMigrate})
		migratable := c.vms("vm", 7, false)
		pinned := c.vms("gpu", 1, true)
		all := append(append([]string(nil), migratable...), pinned...)
		Eventually(c.launcherImages()).WithPolling(50 * time.Millisecond).Should(Equal(allAt(all, sim.LauncherImage("v1.5.2"))))
		Expect(c.kv.WorkloadUpdateMigrations()).To(BeEmpty(), "nothing is outdated before the upgrade")

		Expect(c.kv.UpgradeKubeVirt(ctx, "v1.6.0")).To(Succeed())
		want := allAt(migratable, sim.LauncherImage("v1.6.0"))
		want[pinned[0]] = sim.LauncherImage("v1.5.2")
		Eventually(c.launcherImages()).WithPolling(50 * time.Millisecond).Should(Equal(want))
		Eventually(c.outdated()).WithPolling(50*time.Millisecond).Should(Equal(1), "the VMI with a host device stays outdated")
		Consistently(func() int { return len(c.kv.WorkloadUpdateMigrations()) }, time.Second, 50*time.Millisecond).Should(Equal(len(migratable)))

		perSync := map[int]int{}
		migrated := map[string]int{}
		for _, m := range c.kv.WorkloadUpdateMigrations() {
			perSync[m.Sync]++
			migrated[m.VMI]++
			Expect(m.Version).To(Equal("v1.6.0"))
			Expect(m.Migration).To(HavePrefix(c.ns + "/" + sim.WorkloadUpdateMigrationPrefix))
		}
		Expect(migrated).To(Equal(allAtInt(migratable, 1)), "each migratable VMI once, the host-device one never")
		Expect(len(perSync)).To(BeNumerically(">=", 2), "7 VMIs need at least two syncs of at most 5: %v", perSync)
		for sync, n := range perSync {
			Expect(n).To(BeNumerically("<=", 5), "sync %d", sync)
		}
		for _, vmi := range migratable {
			Expect(c.kv.Migrations(vmi)).To(Equal(1), vmi)
		}

		list := &kubevirtv1.VirtualMachineInstanceMigrationList{}
		Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(len(migratable)))
		for _, m := range list.Items {
			Expect(m.Annotations).To(HaveKeyWithValue(kubevirtv1.WorkloadUpdateMigrationAnnotation, ""))
			Expect(m.Status.Phase).To(Equal(kubevirtv1.MigrationSucceeded))
			Expect(strings.HasPrefix(m.Name, sim.WorkloadUpdateMigrationPrefix)).To(BeTrue())
		}
	})

	It("with [] (as Harvester's upgrade empties it), counts the VMIs outdated after an upgrade and migrates none", func() {
		c := newKubeVirtCluster([]kubevirtv1.WorkloadUpdateMethod{})
		names := c.vms("vm", 4, false)
		Eventually(c.launcherImages()).WithPolling(50 * time.Millisecond).Should(Equal(allAt(names, sim.LauncherImage("v1.5.2"))))

		Expect(c.kv.UpgradeKubeVirt(ctx, "v1.6.0")).To(Succeed())
		Eventually(c.outdated()).WithPolling(50*time.Millisecond).Should(Equal(len(names)), "the updater saw them outdated")
		Consistently(func(g Gomega) int {
			list := &kubevirtv1.VirtualMachineInstanceMigrationList{}
			g.Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
			return len(list.Items) + len(c.kv.WorkloadUpdateMigrations())
		}, 1500*time.Millisecond, 50*time.Millisecond).Should(BeZero())
		Expect(c.launcherImages()(Default)).To(Equal(allAt(names, sim.LauncherImage("v1.5.2"))))
	})
})

func allAtInt(names []string, v int) map[string]int {
	out := map[string]int{}
	for _, n := range names {
		out[n] = v
	}
	return out
}
