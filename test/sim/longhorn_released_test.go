package sim_test

import (
	"context"
	"fmt"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

const (
	lhOldIM = "longhornio/longhorn-instance-manager:v1.11.2"
	lhNewIM = "longhornio/longhorn-instance-manager:v1.12.1"
)

// These specs play a Longhorn chart upgrade (1.11.2 to 1.12.1, Harvester v1.8.2 to
// v1.9.0-rc6, shared/facts/harvester-release-steps.md fact 74) on a cluster that, like
// every released Longhorn, does not serve the live-upgrade kinds (fact 68): the test API
// server of this suite installs test/crds/longhorn only.
var _ = Describe("The Longhorn simulator, as released Longhorn across an upgrade of its instance-manager image", func() {
	var lhSeq int

	// released is a Longhorn namespace with nodes a, b and c, each with a running v1 and v2
	// instance manager on lhOldIM, a v2 volume attached with its engine on a and replicas
	// on a and b, and the simulator running. It returns the namespace, the node names and
	// the simulator.
	released := func(extra func(ns string, nodes []string)) (string, []string, *sim.Longhorn) {
		GinkgoHelper()
		lhSeq++
		ns := fmt.Sprintf("longhorn-released-%d", lhSeq)
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		var nodes []string
		for _, n := range []string{"a", "b", "c"} {
			node := fmt.Sprintf("lh%d-%s", lhSeq, n)
			nodes = append(nodes, node)
			Expect(sim.CreateLonghornV2InstanceManager(ctx, env.Client, ns, node, lhOldIM)).To(Succeed())
			Expect(sim.CreateLonghornInstanceManager(ctx, env.Client, ns, node, lhOldIM, longhornv1.DataEngineTypeV1)).To(Succeed())
		}
		Expect(sim.CreateLonghornV2Volume(ctx, env.Client, ns, sim.LonghornV2Volume{Name: "pvc-vm", ReplicaNodes: nodes[:2], EngineNode: nodes[0]})).To(Succeed())
		if extra != nil {
			extra(ns, nodes)
		}
		lh := &sim.Longhorn{Client: env.Client, Namespace: ns, StateDuration: 50 * time.Millisecond, Interval: 20 * time.Millisecond}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); lh.Run(runCtx) }()
		DeferCleanup(func() { cancel(); <-done })
		return ns, nodes, lh
	}

	// ims returns node's AllInOne instance managers of dataEngine as image -> state,
	// read from the API server.
	ims := func(ns, node string, dataEngine longhornv1.DataEngineType) func(Gomega) map[string]string {
		return func(g Gomega) map[string]string {
			list := &longhornv1.InstanceManagerList{}
			g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
			out := map[string]string{}
			for _, im := range list.Items {
				if im.Spec.NodeID == node && im.Spec.DataEngine == dataEngine && im.Spec.Type == longhornv1.InstanceManagerTypeAllInOne {
					out[im.Spec.Image] = string(im.Status.CurrentState)
				}
			}
			return out
		}
	}
	// aioWaitSatisfied is Harvester's wait_longhorn_instance_manager_aio for one node
	// (fact 25): exactly one running aio IM of dataEngine with the new image's checksum label.
	aioWaitSatisfied := func(ns, node string, dataEngine longhornv1.DataEngineType) func(Gomega) bool {
		return func(g Gomega) bool {
			list := &longhornv1.InstanceManagerList{}
			g.Expect(env.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{
				"longhorn.io/node": node, "longhorn.io/instance-manager-type": "aio", "longhorn.io/data-engine": string(dataEngine),
				sim.LabelIMImage: sim.InstanceManagerImageChecksum(lhNewIM),
			})).To(Succeed())
			running := 0
			for _, im := range list.Items {
				if im.Status.CurrentState == longhornv1.InstanceManagerStateRunning {
					running++
				}
			}
			return running == 1
		}
	}

	It("names and labels instance managers as Longhorn does", func() {
		// Computed outside Go: echo -n longhornio-longhorn-instance-manager-v1.12.1 | sha512sum,
		// and echo -n lh-node-alonghornio/longhorn-instance-manager:v1.12.1v2 | sha512sum.
		Expect(sim.InstanceManagerImageChecksum(lhNewIM)).To(Equal("imi-cb0c23ee"))
		Expect(sim.InstanceManagerName("lh-node-a", lhNewIM, longhornv1.DataEngineTypeV2)).To(Equal("instance-manager-ee34ad4f95c2bbb802b0f02bae36fb26"))
	})

	It("keeps the old v2 instance managers of the nodes with a v2 engine or replica while the volume is attached, the new ones stopped, and switches them once it is detached", func() {
		ns, nodes, lh := released(nil)
		a, b := nodes[0], nodes[1]
		Expect(lh.UpgradeLonghorn(ctx, lhNewIM)).To(Succeed())

		held := map[string]string{lhOldIM: "running", lhNewIM: "stopped"}
		for _, n := range []string{a, b} {
			Eventually(ims(ns, n, longhornv1.DataEngineTypeV2)).WithPolling(20*time.Millisecond).Should(Equal(held), "node %s", n)
		}
		// The old IMs list what they run, which is what the node controller reads.
		old := &longhornv1.InstanceManager{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: sim.InstanceManagerName(a, lhOldIM, longhornv1.DataEngineTypeV2)}, old)).To(Succeed())
		Expect(old.Status.InstanceEngines).To(HaveKey("pvc-vm-e-0"))
		Expect(old.Status.InstanceReplicas).To(HaveKey("pvc-vm-r-" + a))
		Consistently(func(g Gomega) {
			for _, n := range []string{a, b} {
				g.Expect(ims(ns, n, longhornv1.DataEngineTypeV2)(g)).To(Equal(held), "node %s", n)
				g.Expect(aioWaitSatisfied(ns, n, longhornv1.DataEngineTypeV2)(g)).To(BeFalse(), "Harvester's v2 wait does not end on node %s (fact 71)", n)
			}
		}, 2*time.Second, 50*time.Millisecond).Should(Succeed(), "for as long as the volume is attached")

		Expect(sim.DetachLonghornVolume(ctx, env.Client, ns, "pvc-vm")).To(Succeed())
		for _, n := range []string{a, b} {
			Eventually(ims(ns, n, longhornv1.DataEngineTypeV2)).WithPolling(20*time.Millisecond).Should(Equal(map[string]string{lhNewIM: "running"}), "node %s", n)
			Expect(aioWaitSatisfied(ns, n, longhornv1.DataEngineTypeV2)(Default)).To(BeTrue())
		}
		vol := &longhornv1.Volume{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pvc-vm"}, vol)).To(Succeed())
		Expect(vol.Status.State).To(Equal(longhornv1.VolumeStateDetached))
		r := &longhornv1.Replica{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pvc-vm-r-" + b}, r)).To(Succeed())
		Expect(r.Status.CurrentState).To(Equal(longhornv1.InstanceStateStopped))
	})

	It("switches the v2 instance manager of a node without v2 volumes at once", func() {
		ns, nodes, lh := released(nil)
		a, c := nodes[0], nodes[2]
		Expect(lh.UpgradeLonghorn(ctx, lhNewIM)).To(Succeed())
		Eventually(ims(ns, c, longhornv1.DataEngineTypeV2)).WithPolling(20 * time.Millisecond).Should(Equal(map[string]string{lhNewIM: "running"}))
		Expect(aioWaitSatisfied(ns, c, longhornv1.DataEngineTypeV2)(Default)).To(BeTrue())
		Expect(ims(ns, a, longhornv1.DataEngineTypeV2)(Default)).To(Equal(map[string]string{lhOldIM: "running", lhNewIM: "stopped"}), "while the node with the engine still holds")
	})

	It("replaces the v1 instance managers of every node, whatever v2 volumes are attached", func() {
		ns, nodes, lh := released(nil)
		Expect(lh.UpgradeLonghorn(ctx, lhNewIM)).To(Succeed())
		for _, n := range nodes {
			Eventually(ims(ns, n, longhornv1.DataEngineTypeV1)).WithPolling(20*time.Millisecond).Should(Equal(map[string]string{lhNewIM: "running"}), "node %s", n)
			Expect(aioWaitSatisfied(ns, n, longhornv1.DataEngineTypeV1)(Default)).To(BeTrue())
		}
		Expect(ims(ns, nodes[0], longhornv1.DataEngineTypeV2)(Default)).To(Equal(map[string]string{lhOldIM: "running", lhNewIM: "stopped"}))
	})

	It("gives a node where v2 is disabled no v2 instance manager", func() {
		var disabled string
		ns, _, lh := released(func(ns string, nodes []string) {
			disabled = nodes[2]
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: disabled, Labels: map[string]string{sim.LabelDisableV2DataEngine: "true"}}}
			Expect(env.Client.Create(ctx, node)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, node))).To(Succeed()) })
		})
		Expect(lh.UpgradeLonghorn(ctx, lhNewIM)).To(Succeed())
		Eventually(ims(ns, disabled, longhornv1.DataEngineTypeV1)).WithPolling(20 * time.Millisecond).Should(Equal(map[string]string{lhNewIM: "running"}))
		Eventually(ims(ns, disabled, longhornv1.DataEngineTypeV2)).WithPolling(20 * time.Millisecond).Should(BeEmpty())
		Consistently(ims(ns, disabled, longhornv1.DataEngineTypeV2), time.Second, 50*time.Millisecond).Should(BeEmpty())
	})

	It("does nothing to instance managers before the instance-manager image changes", func() {
		ns, nodes, _ := released(nil)
		Consistently(func(g Gomega) {
			for _, n := range nodes {
				g.Expect(ims(ns, n, longhornv1.DataEngineTypeV2)(g)).To(Equal(map[string]string{lhOldIM: "running"}))
				g.Expect(ims(ns, n, longhornv1.DataEngineTypeV1)(g)).To(Equal(map[string]string{lhOldIM: "running"}))
			}
		}, time.Second, 50*time.Millisecond).Should(Succeed())
	})
})
