package harvesteradapter_test

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// unskipRuns names the nodes on which the UpgradePlan's Plan removing
// rke2-multus.yaml.skip ran (capi-inplace-manifest-unskip-<release>-<hash>).
func unskipRuns(rec *sim.Record) map[string]int {
	out := map[string]int{}
	for _, r := range rec.Runs() {
		if strings.HasPrefix(r.Plan, "capi-inplace-manifest-unskip-") && !r.End.IsZero() && !r.Failed {
			out[r.Node]++
		}
	}
	return out
}

// Harvester's skip-manifests Plans (harvester-release-steps.md fact 34): on a multi-node
// cluster, after the cluster upgrade and before the nodes, rke2-multus.yaml.skip goes on
// every RKE2 server, so that no node's RKE2 restart at the release re-deploys the multus
// chart (a failed helm-install there can delete the NAD CRD and every VM network, fact
// 9); the file comes off at the plan's end, and the chart is upgraded once.
var _ = Describe("rke2-multus.yaml.skip during the node phase", func() {
	It("keeps every node's RKE2 restart from running a helm operation on rke2-multus, and upgrades the chart once, after the last node, when the skip comes off", func() {
		wl, err := testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(wl.Stop)
		const oldRKE2, newRKE2 = "v1.34.3+rke2r3", "v1.35.6+rke2r1"
		Expect(sim.Seed(ctx, wl.Client, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1", Kubernetes: oldRKE2})).To(Succeed())
		rctx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		(&sim.Rancher{Client: wl.Client, ChartDelay: 50 * time.Millisecond, DownloadDelay: 20 * time.Millisecond, RolloutDelay: 20 * time.Millisecond,
			Interval: 20 * time.Millisecond, PlannerOwnsLocalCluster: true}).Start(rctx)
		(&sim.ClusterUpgradeJobs{Client: wl.Client}).Start(rctx)

		// RKE2's deploy controller and helm-controller for rke2-multus, the chart installed
		// at the running RKE2, the cluster's VM networks on it.
		var skipper *sim.SUC
		multus := &sim.Multus{Client: wl.Client, Skipped: func(node string) bool { return skipper != nil && skipper.ManifestSkipped(node) }}
		Expect(multus.RKE2Restarted(ctx, "seed", oldRKE2)).To(Succeed())
		var nads []string
		for _, name := range []string{"vlan10", "storage"} {
			nad := &unstructured.Unstructured{}
			nad.SetGroupVersionKind(sim.NADGVK)
			nad.SetNamespace("default")
			nad.SetName(name)
			Expect(unstructured.SetNestedField(nad.Object, `{"cniVersion":"0.3.1","type":"bridge"}`, "spec", "config")).To(Succeed())
			Expect(wl.Client.Create(ctx, nad)).To(Succeed())
			nads = append(nads, "default/"+name)
		}

		c := newClusterWith(wl, false, 0, "Harvester v1.7.1", nil, func(s *sim.SUC) { s.Multus, skipper = multus, s })
		Expect(sim.SetLonghornSetting(ctx, wl.Client, longhorn.Namespace, "replica-replenishment-wait-interval", "600")).To(Succeed())
		_, err = fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
		Expect(err).NotTo(HaveOccurred())
		_, cpMachines, err := fixtures.ControlPlane(ctx, env.Client, c.ns, c.name, "cp", oldRKE2, 3, true)
		Expect(err).NotTo(HaveOccurred())
		var servers []string
		for _, m := range cpMachines {
			_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, oldRKE2, map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"})
			Expect(err).NotTo(HaveOccurred())
			c.nodes = append(c.nodes, m.Status.NodeRef.Name)
			servers = append(servers, m.Status.NodeRef.Name)
		}
		_, workerMachines, err := fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", oldRKE2, 1)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range workerMachines {
			_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, oldRKE2, nil)
			Expect(err).NotTo(HaveOccurred())
			c.nodes = append(c.nodes, m.Status.NodeRef.Name)
		}

		planner := &sim.RancherPlanner{Client: wl.Client, Kubelet: c.kubelet, NodeSelector: map[string]string{labelTestCluster: c.name},
			Interval: 20 * time.Millisecond, RestartDuration: 150 * time.Millisecond, RetryDelay: 100 * time.Millisecond, Guarded: c.suc.Guarded, Multus: multus}
		Expect(planner.SeedMachines(ctx)).To(Succeed())
		pctx, pcancel := context.WithCancel(ctx)
		pdone := make(chan struct{})
		go func() { defer close(pdone); _ = planner.Run(pctx) }()
		DeferCleanup(func() { pcancel(); <-pdone })

		startLifecycle(c, true)
		for _, t := range []struct {
			name string
			ref  func(*inplacev1.UpgradeTaskSpec)
		}{
			{"cp", func(s *inplacev1.UpgradeTaskSpec) {
				s.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
			}},
			{"workers", func(s *inplacev1.UpgradeTaskSpec) {
				s.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "workers"}
			}},
		} {
			task := &inplacev1.UpgradeTask{
				ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: t.name},
				Spec: inplacev1.UpgradeTaskSpec{ClusterName: c.name, Version: newRKE2,
					UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"}},
			}
			t.ref(&task.Spec)
			Expect(env.Client.Create(ctx, task)).To(Succeed())
			Eventually(func(g Gomega) inplacev1.TaskPhase {
				g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(task), task)).To(Succeed())
				return task.Status.Phase
			}, 180*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted), "task %s: %+v", t.name, task.Status.Conditions)
		}
		plan := &harvesterv1.UpgradePlan{}
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
			return plan.Status.Phase
		}, 60*time.Second, 100*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanSucceeded), "plan message: %s", plan.Status.Message)

		By("each server node's RKE2 restart at the release ran no helm operation on rke2-multus: its manifest was skipped")
		var lastRestart time.Time
		for _, a := range planner.Restarts() {
			if a.To == newRKE2 && a.End.After(lastRestart) {
				lastRestart = a.End
			}
		}
		restarted := map[string]int{}
		var helm []sim.MultusInstall
		for _, in := range multus.Installs()[1:] {
			if in.Cause == sim.MultusOnRestart {
				restarted[in.Node]++
				Expect(in.Outcome).To(Equal("skipped"), "node %s's RKE2 restart at %s applied rke2-multus (%s, policy %q)", in.Node, in.Version, in.Outcome, in.Policy)
			}
			if in.Policy != "" {
				helm = append(helm, in)
			}
		}
		for _, n := range servers {
			Expect(restarted).To(HaveKeyWithValue(n, 1), "server %s restarted RKE2 once at the release", n)
		}
		Expect(restarted).To(HaveLen(len(servers)), "an agent node runs no deploy controller")

		By("the chart was upgraded exactly once, to the release's, after the last node, when the skip came off")
		Expect(helm).To(HaveLen(1), "helm operations on rke2-multus: %+v", helm)
		Expect(helm[0].Cause).To(Equal(sim.MultusOnSkipRemoved))
		Expect(helm[0].Outcome).To(Equal("upgraded"))
		Expect(helm[0].Version).To(Equal(newRKE2))
		Expect(helm[0].At).To(BeTemporally(">", lastRestart))

		By("no VM network lost, no node left with the skip file, the removal Plan ran on every node")
		Expect(multus.NetworksLost()).To(BeEmpty())
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(sim.NADGVK.GroupVersion().WithKind("NetworkAttachmentDefinitionList"))
		Expect(wl.Client.List(ctx, list, client.InNamespace("default"))).To(Succeed())
		Expect(list.Items).To(HaveLen(len(nads)))
		for _, n := range c.nodes {
			Expect(c.suc.ManifestSkipped(n)).To(BeFalse(), "node %s left with rke2-multus.yaml.skip", n)
		}
		ran := unskipRuns(c.rec)
		for _, n := range c.nodes {
			Expect(ran).To(HaveKeyWithValue(n, 1), "the removal Plan on %s", n)
		}
		plans := &sucv1.PlanList{}
		Expect(wl.Client.List(ctx, plans, client.MatchingLabels{upgradeplan.LabelUpgradePlan: plan.Name})).To(Succeed())
		Expect(plans.Items).To(BeEmpty(), "the plan's cleanup removed its Plans")
	})

	It("removes the skip file from every server node when the plan is deleted during the node phase", func() {
		c := newHarvesterCluster(3, "Harvester v1.7.1", nil)
		servers := c.nodes[:2]
		for _, n := range servers {
			node := &corev1.Node{}
			Expect(workload.Client.Get(ctx, client.ObjectKey{Name: n}, node)).To(Succeed())
			patch := client.MergeFrom(node.DeepCopy())
			node.Labels["node-role.kubernetes.io/control-plane"], node.Labels["node-role.kubernetes.io/etcd"] = "true", "true"
			Expect(workload.Client.Patch(ctx, node, patch)).To(Succeed())
		}
		plan := &harvesterv1.UpgradePlan{}
		key := client.ObjectKeyFromObject(c.plan)
		Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
			g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
			return plan.Status.Phase
		}, 60*time.Second, 50*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanNodeUpgrading), "plan message: %s", plan.Status.Message)
		for _, n := range servers {
			Expect(c.suc.ManifestSkipped(n)).To(BeTrue(), "server %s has rke2-multus.yaml.skip before the node phase", n)
		}
		Expect(c.suc.ManifestSkipped(c.nodes[2])).To(BeFalse(), "an agent node has no server manifests directory")

		By("the plan is deleted while its nodes wait: its finalizer removes the skip file from every node before it lets go")
		Expect(env.Client.Delete(ctx, plan)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, key, &harvesterv1.UpgradePlan{}))
		}, 60*time.Second, 50*time.Millisecond).Should(BeTrue())
		for _, n := range c.nodes {
			Expect(c.suc.ManifestSkipped(n)).To(BeFalse(), "node %s left with rke2-multus.yaml.skip", n)
		}
		ran := unskipRuns(c.rec)
		for _, n := range c.nodes {
			Expect(ran).To(HaveKeyWithValue(n, 1), "the removal Plan on %s", n)
		}
		plans := &sucv1.PlanList{}
		Expect(workload.Client.List(ctx, plans, client.MatchingLabels{upgradeplan.LabelUpgradePlan: plan.Name})).To(Succeed())
		Expect(plans.Items).To(BeEmpty(), "the finalizer removed the plan's Plans")
	})
})
