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
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// A Harvester cluster whose RKE2 Rancher provisions (fleet-local/local and a machine-plan
// Secret per node), played by the RancherPlanner simulator (harvester-release-steps.md
// section E, facts 58-63; node sheet facts 11 and 38-39): the nodes' Kubernetes upgrade
// goes through Rancher, each node's turn behind its NodeUpdate at Rancher's drain hooks.
var _ = Describe("RKE2 through Rancher's provisioning", func() {
	It("declares the release's RKE2 on fleet-local/local and lets Rancher restart each node only behind its NodeUpdate, so a later plan change downgrades nothing", func() {
		wl := startRancherWorkload()
		const newRKE2 = rancherNewRKE2
		c := newRancherCluster(wl)
		rancherMachines(c, 3, 1)
		planner := startPlanner(wl, c, nil)
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
		plan := runRancherTasks(c)

		By("the UpgradePlan lists what it did itself around the cluster upgrade Job: the guard placed on every node, the descheduler turned off")
		steps := map[string]harvesterv1.ClusterUpgradeStep{}
		for _, s := range plan.Status.ClusterUpgrade {
			steps[s.Name] = s
		}
		Expect(steps[upgradeplan.PlanStepPlaceRestartGuard].State).To(Equal("Done"))
		Expect(steps[upgradeplan.PlanStepPlaceRestartGuard].Message).To(MatchRegexp(`SUC plan \S*restart-guard\S* completed on all %d nodes`, len(c.nodes)))
		Expect(steps[upgradeplan.PlanStepDisableDescheduler].State).To(Equal("Done"))
		Expect(steps[upgradeplan.PlanStepDisableDescheduler].Message).To(ContainSubstring("descheduler add-on %s turned off for the nodes", upgradeplan.DeschedulerAddon))

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
		released, err := sim.ReleaseAddon(upgradeplan.DeschedulerAddon.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(addon.Spec.Version).To(Equal(released.Spec.Version), "the cluster step brought it to the release's add-on file, taken from the release's upgrade image by the Job (fact 29)")

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
