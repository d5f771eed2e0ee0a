package sim_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// Where the KubeVirt simulator sends a live-migrated VM: where kube-scheduler's default
// profile would bind its target pod (kubevirt_scheduler.go). The unit cases
// (kubevirt_scheduler_internal_test.go) hold the arithmetic; this spec holds the
// simulator's migrations to it on a real API server.
var _ = Describe("The KubeVirt simulator places a migration's target pod as kube-scheduler scores it", func() {
	It("sends a plain VM off the PreferNoSchedule node, a VM with preferences onto it, and keeps a migration within its addedNodeSelector", func() {
		seq++
		pool, ns := fmt.Sprintf("sched-pool-%d", seq), fmt.Sprintf("sched-%d", seq)
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		kubelet := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord()}
		source, pending, stays := pool+"-node-1", pool+"-node-2", pool+"-node-3"
		for _, name := range []string{source, pending, stays} {
			_, err := kubelet.CreateNode(ctx, name, "v1.34.3+rke2r3", map[string]string{"pool": pool})
			Expect(err).NotTo(HaveOccurred())
		}
		// pending is still to be upgraded (the UpgradeTask's taint) and has the SSDs;
		// stays is in no task, and is where an addedNodeSelector may send VMs.
		node := &corev1.Node{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: pending}, node)).To(Succeed())
		node.Labels["disk"] = "ssd"
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "inplace.cluster.x-k8s.io/upgrade-pending", Value: ns, Effect: corev1.TaintEffectPreferNoSchedule})
		Expect(env.Client.Update(ctx, node)).To(Succeed())
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: stays}, node)).To(Succeed())
		node.Labels["example.com/landing"] = "true"
		Expect(env.Client.Update(ctx, node)).To(Succeed())

		kv := &sim.KubeVirt{Client: env.Client, Namespace: ns, NodeSelector: map[string]string{"pool": pool}, MigrationDelay: 100 * time.Millisecond, Interval: 20 * time.Millisecond}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); kv.Run(runCtx) }()
		DeferCleanup(func() { cancel(); <-done })

		// Every VM is labelled as Harvester labels its VMs; picky ones carry the default
		// anti-affinity of Harvester's VM builder (harvester v1.8.2 pkg/builder/vm.go
		// DefaultPodAntiAffinity) and prefer SSDs.
		vm := func(name, on string, picky bool) string {
			always := kubevirtv1.RunStrategyAlways
			v := &kubevirtv1.VirtualMachine{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"harvesterhci.io/creator": "harvester"}},
				}},
			}
			if picky {
				v.Spec.Template.Spec.Affinity = &corev1.Affinity{
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
			kv.PlaceOn(ns, name, on)
			Expect(env.Client.Create(ctx, v)).To(Succeed())
			key := ns + "/" + name
			Eventually(kv.NodeOf).WithArguments(key).WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(on))
			return key
		}
		migrate := func(key string, added map[string]string) sim.VMIPlacement {
			name := key[len(ns)+1:]
			Expect(env.Client.Create(ctx, &kubevirtv1.VirtualMachineInstanceMigration{
				ObjectMeta: metav1.ObjectMeta{Name: "move-" + name, Namespace: ns},
				Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name, AddedNodeSelector: added},
			})).To(Succeed())
			Eventually(kv.Migrations).WithArguments(key).WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(1))
			history := kv.History()
			for i := len(history) - 1; i >= 0; i-- {
				if history[i].VMI == key {
					return history[i]
				}
			}
			Fail("no placement recorded for " + key)
			return sim.VMIPlacement{}
		}
		vm("load-1", stays, false)
		vm("load-2", stays, false)
		plain := vm("plain", source, false)
		picky := vm("picky", source, true)
		pinned := vm("picky-pinned", source, true)

		By("a plain VM: TaintToleration's 300 outweighs whatever the resource scores say")
		p := migrate(plain, nil)
		Expect(p.Node).To(Equal(stays), "%v", p)
		Expect(p.Scores).To(HaveLen(2))
		Expect(p.Scores[0].TaintToleration).To(Equal(int64(300)), "%v", p)
		Expect(p.Scores[1].TaintToleration).To(BeZero(), "%v", p)

		By("a VM that prefers SSDs and keeps away from other VMs: NodeAffinity's and InterPodAffinity's 200 each outweigh it")
		p = migrate(picky, nil)
		Expect(p.Node).To(Equal(pending), "%v", p)
		Expect(p.Scores[0]).To(And(
			HaveField("Node", pending), HaveField("TaintToleration", int64(0)),
			HaveField("NodeAffinity", int64(200)), HaveField("InterPodAffinity", int64(200))), "%v", p)
		Expect(p.Scores[1]).To(And(HaveField("Node", stays), HaveField("TaintToleration", int64(300))), "%v", p)
		Expect(p.Scores[0].Total).To(BeNumerically(">", p.Scores[1].Total), "%v", p)

		By("the same VM with the migration's addedNodeSelector: a filter, which no score outweighs")
		p = migrate(pinned, map[string]string{"example.com/landing": "true"})
		Expect(p.Node).To(Equal(stays), "%v", p)
		Expect(p.Scores).To(BeEmpty(), "one node passed the filters: nothing to score")
	})
})
