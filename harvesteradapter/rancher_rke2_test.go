package harvesteradapter_test

import (
	"context"
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// A Harvester cluster whose RKE2 Rancher provisions (fleet-local/local and a machine-plan
// Secret per node), played by the RancherPlanner simulator (harvester-release-steps.md
// section E, facts 58-63; node sheet facts 11 and 38-39): the nodes' Kubernetes upgrade
// goes through Rancher, each node's turn behind its NodeUpdate at Rancher's drain hooks.
var _ = Describe("RKE2 through Rancher's provisioning", func() {
	It("declares the release's RKE2 on fleet-local/local and lets Rancher restart each node only behind its NodeUpdate, so a later plan change downgrades nothing", func() {
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

		c := newClusterWith(wl, false, 0, "Harvester v1.7.1", nil)
		Expect(sim.SetLonghornSetting(ctx, wl.Client, longhorn.Namespace, "replica-replenishment-wait-interval", "600")).To(Succeed())
		_, err = fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
		Expect(err).NotTo(HaveOccurred())
		_, cpMachines, err := fixtures.ControlPlane(ctx, env.Client, c.ns, c.name, "cp", oldRKE2, 3, true)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range cpMachines {
			_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, oldRKE2, map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"})
			Expect(err).NotTo(HaveOccurred())
			c.nodes = append(c.nodes, m.Status.NodeRef.Name)
		}
		_, workerMachines, err := fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", oldRKE2, 1)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range workerMachines {
			_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, oldRKE2, nil)
			Expect(err).NotTo(HaveOccurred())
			c.nodes = append(c.nodes, m.Status.NodeRef.Name)
		}

		planner := &sim.RancherPlanner{Client: wl.Client, Kubelet: c.kubelet, NodeSelector: map[string]string{labelTestCluster: c.name},
			Interval: 20 * time.Millisecond, RestartDuration: 150 * time.Millisecond, RetryDelay: 100 * time.Millisecond, Guarded: c.suc.Guarded}
		Expect(planner.SeedMachines(ctx)).To(Succeed())
		pctx, pcancel := context.WithCancel(ctx)
		pdone := make(chan struct{})
		go func() { defer close(pdone); _ = planner.Run(pctx) }()
		DeferCleanup(func() { pcancel(); <-pdone })
		strategyBefore := localStrategy(wl)

		// Harvester's descheduler add-on, enabled (fact 36): sampled with the plan's phase
		// over the whole run, plan first, so that a sample in NodeUpgrading saw the add-on
		// after the plan entered it.
		Expect(wl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: upgradeplan.DeschedulerAddon.Namespace}})).To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))
		Expect(wl.Client.Create(ctx, &harvesterapi.Addon{ObjectMeta: metav1.ObjectMeta{Namespace: upgradeplan.DeschedulerAddon.Namespace, Name: upgradeplan.DeschedulerAddon.Name},
			Spec: harvesterapi.AddonSpec{Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "descheduler", Version: "0.33.0", Enabled: true}})).To(Succeed())
		var deschedulerDuringNodes []string
		sctx, scancel := context.WithCancel(ctx)
		sdone := make(chan struct{})
		go func() {
			defer close(sdone)
			for sctx.Err() == nil {
				p := &harvesterv1.UpgradePlan{}
				a := &harvesterapi.Addon{}
				if env.Client.Get(sctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, p) == nil &&
					wl.Client.Get(sctx, upgradeplan.DeschedulerAddon, a) == nil &&
					p.Status.Phase == harvesterv1.UpgradePlanNodeUpgrading && a.Spec.Enabled {
					deschedulerDuringNodes = append(deschedulerDuringNodes, time.Now().Format(time.RFC3339Nano))
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		DeferCleanup(func() { scancel(); <-sdone })

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

		By("Rancher declares the release's RKE2, and the strategy it had is back (facts 59, 61)")
		cl := &provisioningv1.Cluster{}
		Expect(wl.Client.Get(ctx, rancher.LocalClusterKey, cl)).To(Succeed())
		Expect(cl.Spec.KubernetesVersion).To(Equal(newRKE2))
		Expect(localStrategy(wl)).To(MatchJSON(strategyBefore))

		By("Harvester's descheduler add-on was off for the whole node phase and is on again (facts 36, 37)")
		scancel()
		<-sdone
		Expect(deschedulerDuringNodes).To(BeEmpty(), "the descheduler add-on was enabled while the nodes were upgraded")
		addon := &harvesterapi.Addon{}
		Expect(wl.Client.Get(ctx, upgradeplan.DeschedulerAddon, addon)).To(Succeed())
		Expect(addon.Spec.Enabled).To(BeTrue(), "the descheduler add-on is enabled again")

		By("every node's RKE2 was restarted once, by Rancher, at the release, inside its answered drain hooks, one node at a time")
		byNode := map[string]int{}
		for _, a := range planner.Restarts() {
			if a.To == newRKE2 {
				byNode[a.Node]++
				Expect(a.InHooks).To(BeTrue(), "node %s restarted at %s outside its drain hooks", a.Node, a.To)
			}
		}
		for _, n := range c.nodes {
			Expect(byNode).To(HaveKeyWithValue(n, 1), "node %s", n)
		}
		Expect(planner.MaxRestarting()).To(Equal(1))

		By("the Rancher upgrade of the cluster step re-rendered every node's plan and restarted no RKE2: the guard was on every node (fact 12), and each node's own step took it off before its turn (fact 44)")
		Expect(planner.UnguardedRestartsOutsideDrain()).To(BeEmpty())
		guardedApplies := 0
		for _, a := range planner.Applies() {
			if a.Guarded {
				guardedApplies++
				Expect(a.Restarted).To(BeFalse(), "node %s restarted under the guard", a.Node)
			}
		}
		Expect(guardedApplies).To(BeNumerically(">=", len(c.nodes)), "Rancher's re-render reached every node under the guard")
		for _, n := range c.nodes {
			Expect(c.suc.Guarded(n)).To(BeFalse(), "node %s left guarded", n)
		}
		Expect(c.rec.MaxDown()).To(Equal(1), "one node down at a time")
		nus := &inplacev1.NodeUpdateList{}
		Expect(env.Client.List(ctx, nus, client.InNamespace(c.ns))).To(Succeed())
		Expect(nus.Items).To(HaveLen(len(c.nodes)))
		for i := range nus.Items {
			nu := &nus.Items[i]
			Expect(nu.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSucceeded))
			Expect(nodeupdaterStep(nu, harvesteradapter.StepRancherPreDrain).State).To(Equal(inplacev1.StepStateSucceeded), nu.Spec.NodeName)
			Expect(nodeupdaterStep(nu, harvesteradapter.StepRancherPostDrain).State).To(Equal(inplacev1.StepStateSucceeded), nu.Spec.NodeName)
			Expect(c.rec.RunsOf(harvesteradapter.PlanName("rke2", nu))).To(BeEmpty(), "no SUC rke2-upgrade Plan behind Rancher's back on %s", nu.Spec.NodeName)
		}
		for _, n := range c.nodes {
			node := &corev1.Node{}
			Expect(wl.Client.Get(ctx, client.ObjectKey{Name: n}, node)).To(Succeed())
			Expect(node.Spec.Unschedulable).To(BeFalse(), "%s back in service", n)
			Expect(node.Annotations).NotTo(HaveKey(inplacev1.UpgradeTurnAnnotation))
		}

		By("a later plan change of Rancher's (a re-render, a registry change) downgrades no node (fact 62b)")
		planner.Rerender()
		Consistently(func() []sim.PlanApply { return planner.Downgrades() }, 2*time.Second, 100*time.Millisecond).Should(BeEmpty())
	})
})

// localStrategy is fleet-local/local's spec.rkeConfig.upgradeStrategy as JSON ("null"
// when unset).
func localStrategy(wl *testenv.Environment) string {
	GinkgoHelper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("provisioning.cattle.io/v1")
	u.SetKind("Cluster")
	Expect(wl.Client.Get(ctx, rancher.LocalClusterKey, u)).To(Succeed())
	v, _, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "rkeConfig", "upgradeStrategy")
	Expect(err).NotTo(HaveOccurred())
	raw, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	return string(raw)
}
