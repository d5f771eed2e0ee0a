package harvesteradapter_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/sim"
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
		wl := startRancherWorkload()
		const oldRKE2, newRKE2 = rancherOldRKE2, rancherNewRKE2

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

		c := newRancherCluster(wl, func(s *sim.SUC) { s.Multus, skipper = multus, s })
		servers := rancherMachines(c, 3, 1)
		planner := startPlanner(wl, c, multus)

		startLifecycle(c, true)
		plan := runRancherTasks(c)

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

		By("the plan is deleted while its nodes wait (allowed by its annotation): its finalizer removes the skip file from every node before it lets go")
		deleteRunningPlan(plan)
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
