package clusterupgrade_test

import (
	"context"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// The wait for Longhorn's own upgrade (harvester-release-steps.md fact 25): the harvester
// chart carries Longhorn; once Fleet deploys it, longhorn-manager rolls out and replaces
// its instance managers, and the cluster upgrade ends only after that.
var _ = Describe("Run and Longhorn's upgrade", func() {
	const ns = "longhorn-system"
	oldLonghorn, newLonghorn := sim.LonghornOfChart("1.5.1"), sim.LonghornOfChart("1.6.0")
	oldIM, newIM := sim.LonghornInstanceManagerImage(oldLonghorn), sim.LonghornInstanceManagerImage(newLonghorn)

	// imsOf are, per node, the AllInOne instance managers of image and data engine, and
	// their states.
	imsOf := func(image, engine string) map[string][]string {
		GinkgoHelper()
		list := &longhornv1.InstanceManagerList{}
		Expect(env.Client.List(ctx, list, client.InNamespace(ns),
			client.MatchingLabels{"longhorn.io/instance-manager-image": clusterupgrade.InstanceManagerImageChecksum(image), "longhorn.io/data-engine": engine})).To(Succeed())
		out := map[string][]string{}
		for _, im := range list.Items {
			out[im.Spec.NodeID] = append(out[im.Spec.NodeID], string(im.Status.CurrentState))
		}
		return out
	}

	// cluster seeds Rancher at the old release (its longhorn-manager on the old Longhorn),
	// with two managed nodes and a witness and nothing else, each managed node's Longhorn
	// running its instance managers of engines on the old image, as a released Longhorn
	// (the default instance-manager image set), played by a Longhorn simulator.
	cluster := func(engines ...longhornv1.DataEngineType) (*sim.Kubelet, []string) {
		GinkgoHelper()
		seed(oldRelease, func(r *sim.Rancher) { r.RolloutDelay = 300 * time.Millisecond })
		settle()
		ds := &appsv1.DaemonSet{}
		Expect(env.Client.Get(ctx, clusterupgrade.LonghornManagerKey, ds)).To(Succeed())
		Expect(ds.Spec.Template.Spec.Containers[0].Image).To(Equal(sim.LonghornManagerImage(oldLonghorn)))

		Expect(env.Client.DeleteAllOf(ctx, &corev1.Node{})).To(Succeed())
		kubelet := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord(), Labels: sim.HarvesterNodeLabels(nil)}
		nodes := []string{"lh-a", "lh-b"}
		for _, n := range nodes {
			_, err := kubelet.CreateNode(ctx, n, "v1.34.3+rke2r3", nil)
			Expect(err).NotTo(HaveOccurred())
			for _, e := range engines {
				Expect(sim.CreateLonghornInstanceManager(ctx, env.Client, ns, n, oldIM, e)).To(Succeed())
			}
		}
		_, err := kubelet.CreateNode(ctx, "lh-witness", "v1.34.3+rke2r3", map[string]string{clusterupgrade.LabelWitnessNode: "true"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			Expect(env.Client.DeleteAllOf(ctx, &corev1.Node{})).To(Succeed())
			for _, obj := range []client.Object{&longhornv1.InstanceManager{}, &longhornv1.Node{}, &longhornv1.Setting{},
				&longhornv1.Volume{}, &longhornv1.Engine{}, &longhornv1.Replica{}} {
				Expect(env.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns))).To(Succeed())
			}
			_ = env.Client.Delete(ctx, &harvesterapi.Setting{ObjectMeta: metav1.ObjectMeta{Name: clusterupgrade.SettingV2DataEngineEnabled}})
		})
		Expect(sim.SetLonghornSetting(ctx, env.Client, ns, sim.SettingDefaultInstanceManagerImage, oldIM)).To(Succeed())
		lh := &sim.Longhorn{Client: env.Client, Namespace: ns, StateDuration: 300 * time.Millisecond, Interval: 20 * time.Millisecond}
		lhCtx, stop := context.WithCancel(ctx)
		DeferCleanup(stop)
		go lh.Run(lhCtx)
		return kubelet, nodes
	}
	// start runs the cluster upgrade until it waits for Longhorn.
	start := func(plan string) (clusterupgrade.Progress, chan error) {
		GinkgoHelper()
		p := newProgress()
		done := make(chan error, 1)
		go func() { done <- clusterupgrade.Run(ctx, env.Client, input(plan), p) }()
		Eventually(func(g Gomega) string {
			steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
			g.Expect(err).NotTo(HaveOccurred())
			return string(stepNamed(steps, clusterupgrade.StepWaitLonghorn).State)
		}, 40*time.Second, 20*time.Millisecond).Should(Equal(string(clusterupgrade.StateRunning)))
		return p, done
	}

	It("holds until longhorn-manager is ready on every managed non-witness node and each node runs the new v1 instance manager", func() {
		kubelet, nodes := cluster(longhornv1.DataEngineTypeV1)

		By("the second node is down when the chart is deployed: its longhorn-manager is not ready")
		Expect(kubelet.SetReady(ctx, nodes[1], false, "NodeStatusUnknown")).To(Succeed())
		p, done := start("up-lh")
		Consistently(done, time.Second, 50*time.Millisecond).ShouldNot(Receive(), "1 of 2 managers ready: the upgrade waits")
		ds := &appsv1.DaemonSet{}
		Expect(env.Client.Get(ctx, clusterupgrade.LonghornManagerKey, ds)).To(Succeed())
		Expect(ds.Spec.Template.Spec.Containers[0].Image).To(Equal(sim.LonghornManagerImage(newLonghorn)), "the chart's Longhorn was rendered")
		Expect(ds.Status.NumberReady).To(BeEquivalentTo(1))

		By("the node is back: the managers are ready, Longhorn replaces each node's v1 instance manager, and the run ends when both run")
		Expect(kubelet.SetReady(ctx, nodes[1], true, "KubeletReady")).To(Succeed())
		var runErr error
		Eventually(done, 40*time.Second).Should(Receive(&runErr))
		Expect(runErr).NotTo(HaveOccurred())
		Expect(imsOf(newIM, "v1")).To(Equal(map[string][]string{nodes[0]: {"running"}, nodes[1]: {"running"}}), "one running v1 instance manager of the new image on each node when the run ends")
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		step := stepNamed(steps, clusterupgrade.StepWaitLonghorn)
		Expect(step.State).To(Equal(clusterupgrade.StateDone))
		Expect(step.Message).To(And(ContainSubstring("longhorn-manager "+sim.LonghornManagerImage(newLonghorn)+" ready on 2 nodes"),
			ContainSubstring("instance manager "+newIM+" running on 2 Longhorn nodes for data engine v1")))
	})

	It("with Harvester's v2 data engine enabled, holds while an attached v2 volume keeps the old v2 instance managers (fact 70), and ends once it is detached", func() {
		_, nodes := cluster(longhornv1.DataEngineTypeV1, longhornv1.DataEngineTypeV2)
		Expect(env.Client.Create(ctx, &harvesterapi.Setting{ObjectMeta: metav1.ObjectMeta{Name: clusterupgrade.SettingV2DataEngineEnabled}, Value: "true"})).To(Succeed())
		Expect(sim.CreateLonghornV2Volume(ctx, env.Client, ns, sim.LonghornV2Volume{Name: "pvc-v2-attached", ReplicaNodes: nodes, EngineNode: nodes[0]})).To(Succeed())

		_, done := start("up-lh-v2")
		Consistently(done, 2*time.Second, 50*time.Millisecond).ShouldNot(Receive(), "the new v2 instance managers cannot start while the old ones run the volume")
		Expect(imsOf(newIM, "v1")).To(Equal(map[string][]string{nodes[0]: {"running"}, nodes[1]: {"running"}}), "v1 is upgraded meanwhile")
		Expect(imsOf(newIM, "v2")).NotTo(Equal(map[string][]string{nodes[0]: {"running"}, nodes[1]: {"running"}}))

		By("the volume's workload stops and the volume detaches: the new v2 instance managers start and the run ends")
		Expect(sim.DetachLonghornVolume(ctx, env.Client, ns, "pvc-v2-attached")).To(Succeed())
		var runErr error
		Eventually(done, 30*time.Second).Should(Receive(&runErr))
		Expect(runErr).NotTo(HaveOccurred())
		Expect(imsOf(newIM, "v2")).To(Equal(map[string][]string{nodes[0]: {"running"}, nodes[1]: {"running"}}))
	})
})
