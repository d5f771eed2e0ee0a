package capie2e

import (
	"encoding/json"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	"github.com/capi-inplace/capi-inplace/test/capienv"
)

// CanUpdateMachineSet and UpdateMachine share one judge (extension/judge.go): a worker
// version newer than the control plane is refused at Cluster API's first question, so
// Cluster API's own MachineDeployment and MachineSet controllers move and mark no
// machine that UpdateMachine would then decline.
var _ = Describe("A worker version skew on Cluster API's own controllers", func() {
	It("is refused at CanUpdateMachineSet: no machine is moved, marked or left Updating", func() {
		c := newWorkloadCluster("skew", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 1, Workers: 1})
		c.waitProvisioned()

		By("a MachineDeployment of its own (not the topology's, which follows the control plane), with md-0's templates")
		mds := &clusterv1.MachineDeploymentList{}
		Expect(env.Client.List(ctx, mds, client.InNamespace(c.ns))).To(Succeed())
		Expect(mds.Items).To(HaveLen(1))
		md0 := mds.Items[0]
		labels := map[string]string{clusterv1.ClusterNameLabel: c.name, "capi-inplace.test/md": "skew"}
		md := &clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "skew", Labels: map[string]string{clusterv1.ClusterNameLabel: c.name}},
			Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: c.name,
				Replicas:    ptr.To(int32(1)),
				Selector:    metav1.LabelSelector{MatchLabels: labels},
				Template:    clusterv1.MachineTemplateSpec{ObjectMeta: clusterv1.ObjectMeta{Labels: labels}, Spec: *md0.Spec.Template.Spec.DeepCopy()},
				Rollout:     *md0.Spec.Rollout.DeepCopy(),
			},
		}
		Expect(env.Client.Create(ctx, md)).To(Succeed())
		var machine clusterv1.Machine
		Eventually(func(g Gomega) {
			list := &clusterv1.MachineList{}
			g.Expect(env.Client.List(ctx, list, client.InNamespace(c.ns), client.MatchingLabels(labels))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(1))
			machine = list.Items[0]
			g.Expect(machine.Status.NodeRef.IsDefined()).To(BeTrue())
			g.Expect(machine.Status.NodeInfo).NotTo(BeNil())
			g.Expect(machine.Status.NodeInfo.KubeletVersion).To(Equal("v1.35.2"))
		}, 5*time.Minute, time.Second).Should(Succeed())

		By("its version goes past the control plane's (v1.35.2 to v1.36.3), as a user editing it does")
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(md), md)).To(Succeed())
		patch := client.MergeFrom(md.DeepCopy())
		md.Spec.Template.Spec.Version = "v1.36.3"
		Expect(env.Client.Patch(ctx, md, patch)).To(Succeed())

		By("Cluster API asks CanUpdateMachineSet and is refused, naming VersionSkew")
		Eventually(func(g Gomega) {
			refused := false
			for _, e := range exchangesOf(c.ns, "canupdatemachineset") {
				resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
				g.Expect(json.Unmarshal(e.Response, resp)).To(Succeed())
				if resp.Status == runtimehooksv1.ResponseStatusFailure && strings.Contains(resp.Message, "MachineDeployment skew in place (VersionSkew)") {
					refused = true
				}
			}
			g.Expect(refused).To(BeTrue(), "no refused CanUpdateMachineSet for MachineDeployment skew yet")
		}, 2*time.Minute, time.Second).Should(Succeed())

		By("no machine is moved, marked for an in-place update, or replaced while Cluster API retries")
		Consistently(func(g Gomega) {
			list := &clusterv1.MachineList{}
			g.Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
			for _, m := range list.Items {
				_, updating := m.Annotations[clusterv1.UpdateInProgressAnnotation]
				g.Expect(updating).To(BeFalse(), "machine %s is marked Updating", m.Name)
			}
			skew := &clusterv1.MachineList{}
			g.Expect(env.Client.List(ctx, skew, client.InNamespace(c.ns), client.MatchingLabels(labels))).To(Succeed())
			g.Expect(skew.Items).To(HaveLen(1))
			g.Expect(skew.Items[0].Name).To(Equal(machine.Name), "the machine is kept, not replaced")
			g.Expect(skew.Items[0].Spec.Version).To(Equal("v1.35.2"), "the machine was not moved to the new version")
			g.Expect(exchangesOf(c.ns, "updatemachine")).To(BeEmpty(), "UpdateMachine is never called")
		}, 20*time.Second, time.Second).Should(Succeed())
	})
})
