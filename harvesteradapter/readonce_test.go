package harvesteradapter_test

import (
	"context"
	"fmt"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// countingClient counts the reads that reach the API server.
type countingClient struct {
	client.Client
	gets, lists atomic.Int32
}

func (c *countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *countingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.lists.Add(1)
	return c.Client.List(ctx, list, opts...)
}

var _ = Describe("The workload client of one reconcile", func() {
	It("answers a read again from what it read, until it writes that kind", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "readonce-"}}
		Expect(workload.Client.Create(ctx, ns)).To(Succeed())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: ns.Name}, Data: map[string]string{"v": "1"}}
		Expect(workload.Client.Create(ctx, cm)).To(Succeed())

		server := &countingClient{Client: workload.Client}
		c := harvesteradapter.NewReadOnce(server)
		key := client.ObjectKeyFromObject(cm)

		first := &corev1.ConfigMap{}
		Expect(c.Get(ctx, key, first)).To(Succeed())
		first.Data["v"] = "changed by the caller"
		again := &corev1.ConfigMap{}
		Expect(c.Get(ctx, key, again)).To(Succeed())
		Expect(server.gets.Load()).To(BeEquivalentTo(1), "the second Get is answered from the first")
		Expect(again.Data).To(HaveKeyWithValue("v", "1"), "what a caller does with its copy changes nothing kept")

		lists := func() []string {
			l := &corev1.ConfigMapList{}
			Expect(c.List(ctx, l, client.InNamespace(ns.Name))).To(Succeed())
			var names []string
			for _, item := range l.Items {
				if item.Name != "kube-root-ca.crt" {
					names = append(names, item.Name)
				}
			}
			return names
		}
		Expect(lists()).To(Equal([]string{"a"}))
		Expect(lists()).To(Equal([]string{"a"}))
		Expect(server.lists.Load()).To(BeEquivalentTo(1), "the second List is answered from the first")

		// A write of another kind keeps what was read of ConfigMaps.
		Expect(c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: ns.Name}})).To(Succeed())
		Expect(c.Get(ctx, key, &corev1.ConfigMap{})).To(Succeed())
		Expect(server.gets.Load()).To(BeEquivalentTo(1))

		// A write of the kind: the next reads go to the API server and see it.
		again.Data["v"] = "2"
		Expect(c.Update(ctx, again)).To(Succeed())
		Expect(c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: ns.Name}})).To(Succeed())
		fresh := &corev1.ConfigMap{}
		Expect(c.Get(ctx, key, fresh)).To(Succeed())
		Expect(fresh.Data).To(HaveKeyWithValue("v", "2"))
		Expect(lists()).To(Equal([]string{"a", "b"}))
		Expect(server.gets.Load()).To(BeEquivalentTo(2), fmt.Sprintf("gets %d", server.gets.Load()))
		Expect(server.lists.Load()).To(BeEquivalentTo(2))

		// A status write of the kind drops it too.
		Expect(c.Get(ctx, client.ObjectKeyFromObject(ns), ns)).To(Succeed())
		Expect(c.Get(ctx, client.ObjectKeyFromObject(ns), ns)).To(Succeed())
		Expect(server.gets.Load()).To(BeEquivalentTo(3))
		Expect(c.Status().Update(ctx, ns)).To(Succeed())
		Expect(c.Get(ctx, client.ObjectKeyFromObject(ns), ns)).To(Succeed())
		Expect(server.gets.Load()).To(BeEquivalentTo(4))
	})
	// Soak seed 183: a NodeUpdate ended just as Rancher took its node. Its reconcile read
	// the node uncordoned, Rancher's machine-drain controller cordoned it, and the
	// withdrawal's uncordon, answered from that first read, did nothing: the node stayed
	// cordoned with no roll of anyone's holding it.
	It("lets rancher.Uncordon act on the node as it is now: a cordon of Rancher's that landed after the reconcile read the node is lifted", func() {
		name := fmt.Sprintf("readonce-node-%d", GinkgoRandomSeed()%100000)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}}
		Expect(workload.Client.Create(ctx, node)).To(Succeed())
		DeferCleanup(func() { _ = workload.Client.Delete(ctx, node) })

		c := harvesteradapter.NewReadOnce(workload.Client)
		seen := &corev1.Node{}
		Expect(c.Get(ctx, client.ObjectKeyFromObject(node), seen)).To(Succeed())
		Expect(seen.Spec.Unschedulable).To(BeFalse())

		By("Rancher cordons the node after the reconcile read it")
		cordoned := node.DeepCopy()
		cordoned.Spec.Unschedulable = true
		Expect(workload.Client.Patch(ctx, cordoned, client.MergeFrom(node))).To(Succeed())

		changed, err := rancher.Uncordon(ctx, c, node.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(changed).To(BeTrue(), "the node was cordoned when the uncordon came")
		now := &corev1.Node{}
		Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(node), now)).To(Succeed())
		Expect(now.Spec.Unschedulable).To(BeFalse(), "the node is left cordoned")

		By("again, on a node that is not cordoned: nothing changes")
		before := now.ResourceVersion
		changed, err = rancher.Uncordon(ctx, c, node.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(changed).To(BeFalse())
		Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(node), now)).To(Succeed())
		Expect(now.ResourceVersion).To(Equal(before), "a node that is not cordoned was written")

		changed, err = rancher.Uncordon(ctx, c, name+"-missing")
		Expect(err).NotTo(HaveOccurred(), "a node that is gone has nothing to uncordon")
		Expect(changed).To(BeFalse())
	})
})
