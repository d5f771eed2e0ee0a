package harvesteradapter_test

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// Every ending of a node's Rancher route leaves the cluster settled (issue #52): at each
// point of the route, a NodeUpdate that ends (failure, timeout, abort and deletion all
// come through the updater's Abort) or an UpgradePlan that ends (deleted with its
// allow-deletion annotation) leaves no node cordoned for the roll, no drain of Rancher's
// waiting on a hook nobody answers, no RKE2 restarted by Rancher after the node's update
// ended, and a next NodeUpdate that finishes the node. Rancher is played by the
// RancherPlanner simulator, which does what Rancher v2.14.4 does on these paths (the
// machine-drain controller stays in a drain until drain-done, the planner's pause,
// rancher-system-agent's unlimited retries, the install under the restart guard).
var _ = Describe("Every ending of a node's Rancher route", testsuite.E2E, func() {
	It("withdraws Rancher's drain of a node aborted at its pre-drain hook, takes no other node, and lets the node's next update go through the hooks", func() {
		wl, c, planner := rancherRoute(300*time.Millisecond, nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		driveToRancherTurn(c, nu)
		Expect(rancher.Asked(planSecret(wl, node), rancher.PreDrainRequest)).NotTo(BeEmpty(), "Rancher took the node")
		Expect(nodeOf(wl, node).Spec.Unschedulable).To(BeTrue(), "Rancher cordons the node it takes (machinedrain.go drain)")

		By("ended before its pre-drain hook is answered")
		ended := endNodeUpdate(c, nu)
		expectNodeSettled(wl, node)
		expectNoNodeTaken(wl, c, 3*time.Second)
		pause, err := rancher.ReadPlannerPause(ctx, wl.Client)
		Expect(err).NotTo(HaveOccurred())
		Expect(pause.By).To(Equal(upgradeplan.Name(c.name, "v1.8.1")), "the plan holds Rancher's planner while no NodeUpdate waits for it")
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty())

		By("the node's next NodeUpdate: Rancher takes it again and restarts RKE2 behind its hooks")
		next := renewNodeUpdate(c, nu)
		Expect(drive(c.updater, next, 180*time.Second)).To(Succeed())
		Expect(nodeOf(wl, node).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2))
		restarts := planner.Restarts()
		Expect(restarts).To(HaveLen(1))
		Expect(restarts[0].Node).To(Equal(node))
		Expect(restarts[0].InHooks).To(BeTrue(), "restarted between its answered pre-drain hook and its post-drain request")
		Expect(planner.MaxCordoned()).To(Equal(1))
	})

	It("keeps a node aborted at its pre-drain hook uncordoned when Rancher's machine-drain controller cordons it again from the plan Secret as it was before the withdrawal", func() {
		// The machine-drain controller acts on the Secret its cache held when the key came
		// out of its queue, DrainDelay before its cordon: a pass that read the Secret just
		// before the withdrawal cordons the node after it, finds its pre-drain request
		// there and writes nothing.
		wl, c, planner := rancherRoute(300*time.Millisecond, func(p *sim.RancherPlanner) { p.DrainDelay = 400 * time.Millisecond })
		c.updater.PlannerSettle = 2 * time.Second
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		driveToRancherWait(c, nu, nil)
		By("Rancher takes the node its update waits for; the update has not looked again (its own cordon not run)")
		Eventually(func() string { return rancher.Asked(planSecret(wl, node), rancher.PreDrainRequest) }).WithTimeout(30*time.Second).WithPolling(50*time.Millisecond).
			ShouldNot(BeEmpty(), "Rancher takes the node whose update waits for it")
		Expect(nodeOf(wl, node).Spec.Unschedulable).To(BeTrue(), "Rancher cordons the node it takes (machinedrain.go drain)")

		By("a pass of Rancher's reads the plan Secret, then the update ends before its pre-drain hook is answered")
		other := nodeOf(wl, c.nodes[1])
		touched := other.DeepCopy()
		touched.Labels["test.capi-inplace.io/touched"] = strconv.FormatInt(time.Now().UnixNano(), 10)
		Expect(wl.Client.Patch(ctx, touched, client.MergeFrom(other))).To(Succeed(), "a Node event starts a pass")
		time.Sleep(100 * time.Millisecond)
		ended := endNodeUpdate(c, nu)
		expectNodeSettled(wl, node)
		Consistently(func() bool { return nodeOf(wl, node).Spec.Unschedulable }, 3*time.Second, 100*time.Millisecond).Should(BeFalse(),
			"node %s cordoned again after its update ended:%s", node, hookHistory(planner))
		Expect(planSecret(wl, node).Annotations).NotTo(HaveKey(rancher.WithdrawnAtAnnotation), "the withdrawal's mark left on the plan Secret")
		for _, e := range planner.HookEvents() {
			Expect(e.Node == node && e.Kind == "cordon" && e.At.After(ended)).To(BeFalse(), "Rancher cordoned node %s at %s, after its update ended", node, e.At.Format("15:04:05.000"))
		}
	})

	It("puts the restart guard back on a node whose plan keeps failing when its update ends, so that the agent's later success restarts nothing, and restarts RKE2 in the node's next update", func() {
		wl, c, planner := rancherRoute(300*time.Millisecond, nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		driveToFailingPlan(wl, c, planner, nu, node)
		Expect(c.suc.Guarded(node)).To(BeFalse(), "RemoveRestartGuard took the guard off before the pre-drain hook was answered")

		By("ended while rancher-system-agent retries the plan")
		ended := endNodeUpdate(c, nu)
		Expect(c.suc.Guarded(node)).To(BeTrue(), "node %s left without its restart guard while the agent retries", node)
		Expect(nodeOf(wl, node).Spec.Unschedulable).To(BeFalse(), "node %s left cordoned by Rancher while its plan fails", node)

		By("the install succeeds later: under the guard, without a restart; the plan answers the post-drain request and Rancher uncordons")
		planner.ClearInstallFailure(node)
		Eventually(func() rancher.DeliveredPlan { return rancher.ReadDeliveredPlan(planSecret(wl, node)) }).WithPolling(100 * time.Millisecond).
			Should(Equal(rancher.DeliveredPlan{Version: rancherNewRKE2, Applied: true}))
		Expect(c.kubelet.InstalledRKE2(node)).To(Equal(rancherNewRKE2))
		expectNodeSettled(wl, node)
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty())

		By("the plan deleted: the roll is handed back settled, the node named as not running the declared RKE2")
		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		deleteRunningPlan(plan)
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}).WithPolling(100 * time.Millisecond).Should(BeTrue())
		expectRancherSettled(wl, c)
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty())

		By("the node's next NodeUpdate restarts the RKE2 installed under the guard, inside its own update")
		next := renewNodeUpdate(c, nu)
		Expect(drive(c.updater, next, 240*time.Second)).To(Succeed())
		Expect(nodeOf(wl, node).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2))
		Expect(c.kubelet.InstalledRKE2(node)).To(BeEmpty())
		Expect(nodeupdater.StepState(next, harvesteradapter.StepRancherPreDrain)).To(Equal(inplacev1.StepStateSkipped))
		Expect(stepMessage(next, harvesteradapter.StepKubernetesUpgrade)).To(ContainSubstring("runs Kubernetes " + rancherNewRKE2))
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty(), "Rancher restarted nothing: the node's own update did")
	})

	It("keeps Rancher's planner paused when a worker whose plan failed applies it after the deleted plan answered its hooks ahead: Rancher takes no other worker with the roll's drain (soak seed 1015)", func() {
		// A management node and two workers, the workers one tier: once the first worker's
		// plan is applied, Rancher's next node is the second. The management node's update
		// is older than the plan (created a second before it, as a task's first NodeUpdate
		// creates its plan), so the plan's end takes the guard off it with a SUC Plan after
		// it answered the hooks ahead; with SUC Jobs of 5 s, the agent's retry lands before
		// the strategy is restored.
		wl := startRancherWorkload()
		c := newRancherClusterWith(wl, nil, func(s *sim.SUC) { s.JobDuration = 5 * time.Second })
		for i, roles := range []map[string]string{serverRoles, nil, nil} {
			name := c.name + "-node-" + string(rune('1'+i))
			_, err := c.kubelet.CreateNode(ctx, name, rancherOldRKE2, roles)
			Expect(err).NotTo(HaveOccurred())
			c.nodes = append(c.nodes, name)
		}
		planner := startPlannerWith(wl, c, nil, nil)
		first := c.nodeUpdate(c.nodes[0])
		time.Sleep(1100 * time.Millisecond)
		Expect(drive(c.updater, first, 240*time.Second)).To(Succeed())
		succeededAsReconciled(first)
		node, other := c.nodes[1], c.nodes[2]
		nu := c.nodeUpdate(node)
		driveToFailingPlan(wl, c, planner, nu, node)

		By("the plan deleted while the worker's plan fails, then the worker's update ended")
		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		deleteRunningPlan(plan)
		ended := endNodeUpdate(c, nu)

		By("the plan answers our hooks ahead on the failing worker's plan Secret; then the agent's retry applies the plan")
		Eventually(func() bool {
			s := planSecret(wl, node)
			return s.Annotations[rancher.PostDrainHook] != "" && s.Annotations[rancher.PostDrainHook] == s.Annotations[rancher.DrainOptionsAnnotation]
		}).WithTimeout(60*time.Second).WithPolling(20*time.Millisecond).Should(BeTrue(), "the plan's end answered the worker's hooks ahead")
		planner.ClearInstallFailure(node)
		// From here every hook of ours Rancher could ask for is answered: let go while
		// fleet-local/local still carries them, the planner passes the worker's post-drain
		// hook at once and takes the next worker with the roll's cordon and drain.
		var letGo []string
		Eventually(func() bool {
			pause, perr := rancher.ReadPlannerPause(ctx, wl.Client)
			cl, cerr := rancher.ProvisioningCluster(ctx, wl.Client)
			if perr == nil && cerr == nil && cl != nil && pause.Served && !pause.Paused && rancher.HasOurHooks(cl) {
				letGo = append(letGo, time.Now().Format("15:04:05.000"))
			}
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}).WithTimeout(60 * time.Second).WithPolling(20 * time.Millisecond).Should(BeTrue())
		Expect(letGo).To(BeEmpty(), "Rancher's planner let go at %v while fleet-local/local carries the roll's hooks, answered ahead on worker %s:%s", letGo, node, hookHistory(planner))
		expectRancherSettled(wl, c)
		for _, e := range planner.HookEvents() {
			Expect(e.Node == other && e.At.After(ended)).To(BeFalse(), "Rancher took worker %s (%s at %s) after the other worker's update ended, with no NodeUpdate of its own:%s",
				other, e.Kind, e.At.Format("15:04:05.000"), hookHistory(planner))
		}
		Expect(nodeOf(wl, other).Spec.Unschedulable).To(BeFalse())
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty(), "Rancher restarted RKE2 after the worker's update ended")
	})

	It("holds a node's ending while Rancher restarts its RKE2 after the pre-drain answer, then answers the post-drain hook", func() {
		wl, c, planner := rancherRoute(300*time.Millisecond, func(p *sim.RancherPlanner) { p.InstallDuration = 3 * time.Second })
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		Expect(driveUntil(c.updater, nu, 120*time.Second, func(*inplacev1.NodeUpdate) bool {
			return rancher.Answered(planSecret(wl, node), rancher.PreDrainRequest, rancher.PreDrainHook)
		})).To(Succeed())

		By("ended while the plan's install runs")
		ended := endNodeUpdate(c, nu)
		restarts := planner.Restarts()
		Expect(restarts).To(HaveLen(1), "the ending waited for the restart")
		Expect(restarts[0].End).To(BeTemporally("<=", ended))
		expectNodeSettled(wl, node)
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty())
	})

	It("holds a node's ending while its OS Job runs after Rancher restarted RKE2, and its reboot, then answers the post-drain hook", func() {
		wl, c, planner := rancherRoute(2*time.Second, nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		Expect(driveUntil(c.updater, nu, 180*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade) == inplacev1.StepStateRunning && cellPlanKinds(wl, nu)[string(suc.PlanOS)]
		})).To(Succeed())
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade)).To(Equal(inplacev1.StepStateRunning), "the update finished before its OS Job ran")
		Expect(c.suc.RebootArmed(node)).To(BeFalse(), "the OS Job had armed the reboot already")
		Expect(rancher.Asked(planSecret(wl, node), rancher.PostDrainRequest)).NotTo(BeEmpty(), "Rancher restarted RKE2 and waits at the post-drain hook")
		Expect(nodeOf(wl, node).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2))

		By("ended while the OS Job runs")
		ended := endNodeUpdate(c, nu)
		Expect(c.suc.RebootArmed(node)).To(BeFalse(), "the ending waited for the OS Job and the reboot it armed")
		expectNodeSettled(wl, node)
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty())
		Expect(planner.Restarts()).To(HaveLen(1), "Rancher restarted RKE2 once, inside the node's update")
	})

	It("ends a node's update aborted before Rancher took it only once the planner, let go for that node, is held and a pass already under way has landed: the take is withdrawn inside the update", func() {
		// Rancher's pass reads the pause at its start and writes the take later (TakeDelay):
		// the abort comes while a pass that read the planner let go is under way.
		wl, c, planner := rancherRoute(300*time.Millisecond, func(p *sim.RancherPlanner) { p.TakeDelay = 1500 * time.Millisecond })
		c.updater.PlannerSettle = 3 * time.Second
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		driveToRancherWait(c, nu, func() bool { return planner.Taking() == node })
		Expect(planSecret(wl, node).Annotations).NotTo(HaveKey(rancher.DrainOptionsAnnotation), "Rancher has not taken the node yet")

		By("ended while the planner's pass is under way")
		ended := endNodeUpdate(c, nu)
		expectNodeSettled(wl, node)
		expectNoNodeTaken(wl, c, 2*time.Second)
		cordons := 0
		for _, e := range planner.HookEvents() {
			if e.Node == node && e.Kind == "cordon" {
				cordons++
				Expect(e.At).To(BeTemporally("<", ended), "Rancher cordoned node %s after its update ended", node)
			}
		}
		Expect(cordons).To(Equal(1), "the pass under way took the node, inside its update")
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty())
	})

	It("hands the roll back settled when the plan is deleted while Rancher waits at the pre-drain hook of a node whose update ended without settling it: the node's drain finished under the guard, nothing restarted", func() {
		wl, c, planner := rancherRoute(300*time.Millisecond, nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		driveToRancherTurn(c, nu)
		Expect(rancher.Asked(planSecret(wl, node), rancher.PreDrainRequest)).NotTo(BeEmpty())
		By("the update ends without its updater's abort, as when its HarvesterUpgrader is gone: nothing of Rancher's settled")
		nu.Status.Phase = inplacev1.NodeUpdatePhaseFailed
		Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())

		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		deleted := time.Now()
		deleteRunningPlan(plan)
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}).WithPolling(100 * time.Millisecond).Should(BeTrue())
		expectRancherSettled(wl, c)
		for _, n := range c.nodes {
			Expect(c.suc.Guarded(n)).To(BeTrue(), "node %s, behind the declared RKE2, left without the guard", n)
		}
		Eventually(func() string { return c.kubelet.InstalledRKE2(node) }).WithPolling(100*time.Millisecond).Should(Equal(rancherNewRKE2),
			"Rancher installs the declared RKE2 under the guard")
		Consistently(func() []sim.PlanApply { return rancherRestartsAfter(planner, deleted) }, 2*time.Second, 100*time.Millisecond).Should(BeEmpty())
	})

	// Seeds 155 and 177 of the Rancher soak: the plan ended while Rancher had a node in
	// hand with its pre-drain hook answered. The hand-back let the planner go to finish
	// that node's RKE2 restart with our hooks still in the strategy, and the moment the
	// node's post-drain hook was answered (by its ending, or ahead by the hand-back) Rancher
	// uncordoned it and took the next node: a cordon no NodeUpdate asked for, beside a node
	// still in its OS reboot.
	DescribeTable("hands the roll back when the plan is deleted while Rancher has a node in hand and its update runs, without Rancher taking another node or uncordoning that one before its update answers",
		func(point string, restarting, endNode bool) {
			wl, c, planner := rancherRoute(300*time.Millisecond, func(p *sim.RancherPlanner) { p.InstallDuration = 2 * time.Second })
			node, worker := c.nodes[0], c.nodes[1]
			nu := c.nodeUpdate(node)
			if restarting {
				Expect(driveUntil(c.updater, nu, 120*time.Second, func(*inplacev1.NodeUpdate) bool {
					return rancher.Answered(planSecret(wl, node), rancher.PreDrainRequest, rancher.PreDrainHook)
				})).To(Succeed())
				Expect(rancher.Asked(planSecret(wl, node), rancher.PostDrainRequest)).To(BeEmpty(), "Rancher finished the restart before the plan was deleted")
			} else {
				driveToRancherTurn(c, nu)
				Expect(rancher.Answered(planSecret(wl, node), rancher.PreDrainRequest, rancher.PreDrainHook)).To(BeFalse(), "the update answered the pre-drain hook already")
			}

			By("the plan deleted: " + point)
			plan := &harvesterv1.UpgradePlan{}
			Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
			deleteRunningPlan(plan)
			var ended time.Time
			if endNode {
				By("and the node's update ended then")
				ended = endNodeUpdate(c, nu)
			} else {
				By("and the node's update going on to its end")
				Expect(drive(c.updater, nu, 240*time.Second)).To(Succeed())
				ended = time.Now()
				Expect(nu.Status.Phase).NotTo(Equal(inplacev1.NodeUpdatePhaseFailed), "the node's update failed: %+v", nu.Status.Steps)
				Expect(nodeOf(wl, node).Status.NodeInfo.OSImage).To(Equal("Harvester v1.8.1"))
				reboots := c.rec.Reboots(node)
				Expect(reboots).To(HaveLen(1), "the OS upgrade rebooted the node once")
				for _, e := range planner.HookEvents() {
					if e.Node == node && e.Kind == "uncordon" {
						Expect(e.At).To(BeTemporally(">=", reboots[0].End),
							"Rancher uncordoned node %s at %s, before its update's OS reboot was over (%s)", node, e.At.Format("15:04:05.000"), reboots[0].End.Format("15:04:05.000"))
					}
				}
			}
			Eventually(func() bool {
				return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
			}).WithPolling(100*time.Millisecond).WithTimeout(60*time.Second).Should(BeTrue(), "the plan's finalizer handed the roll back")
			expectRancherSettled(wl, c)
			Consistently(func() int { return len(rancherRestartsAfter(planner, ended)) }, 2*time.Second, 100*time.Millisecond).Should(BeZero(),
				"an RKE2 restart by Rancher after the node's update ended")
			for _, e := range planner.HookEvents() {
				Expect(e.Node == worker && e.Kind == "cordon").To(BeFalse(),
					"Rancher cordoned the worker at %s, which no NodeUpdate asked for:%s", e.At.Format("15:04:05.000"), hookHistory(planner))
			}
			Expect(c.suc.Guarded(worker)).To(BeTrue(), "the worker, behind the declared RKE2, left without the guard")
			Eventually(func() string { return c.kubelet.InstalledRKE2(worker) }).WithPolling(100*time.Millisecond).Should(Equal(rancherNewRKE2),
				"Rancher installs the declared RKE2 on the worker under the guard")
		},
		Entry("Rancher waits at the pre-drain hook, the node's update goes on to its end (soak seed 177)", "Rancher waits at the pre-drain hook", false, false),
		Entry("RKE2 restarting, the node's update goes on to its end", "RKE2 restarting after the pre-drain answer", true, false),
		Entry("RKE2 restarting, the node's update ends at once (soak seed 155)", "RKE2 restarting after the pre-drain answer", true, true),
	)
})

// driveToRancherTurn drives nu until Rancher took its node: its pre-drain request came
// (RancherPreDrain done).
func driveToRancherTurn(c *harvesterCluster, nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
		return nodeupdater.StepState(nu, harvesteradapter.StepRancherPreDrain) == inplacev1.StepStateSucceeded
	})).To(Succeed())
}

// driveToFailingPlan drives nu to Rancher's turn, has rancher-system-agent fail node's
// plan, and drives nu until its pre-drain hook is answered and the agent has failed the
// plan at least twice.
func driveToFailingPlan(wl *testenv.Environment, c *harvesterCluster, planner *sim.RancherPlanner, nu *inplacev1.NodeUpdate, node string) {
	GinkgoHelper()
	driveToRancherTurn(c, nu)
	planner.FailInstall(node, "failed to pull image rancher/system-agent-installer-rke2:v1.35.6-rke2r1")
	Expect(driveUntil(c.updater, nu, 120*time.Second, func(*inplacev1.NodeUpdate) bool {
		s := planSecret(wl, node)
		n, _ := strconv.Atoi(string(s.Data[rancher.FailureCountKey]))
		return rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) && n >= 2
	})).To(Succeed())
}

// driveToRancherWait drives nu until it waits for Rancher to take its node
// (RancherPreDrain running) and also, when set, until says so.
func driveToRancherWait(c *harvesterCluster, nu *inplacev1.NodeUpdate, until func() bool) {
	GinkgoHelper()
	Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
		return nodeupdater.StepState(nu, harvesteradapter.StepRancherPreDrain) == inplacev1.StepStateRunning && (until == nil || until())
	})).To(Succeed())
}

// rancherRoute is a Harvester cluster whose RKE2 Rancher provisions, with a management
// node (etcd and control plane: Rancher's first) and a worker, SUC's Jobs taking
// jobDuration, and the planner simulator running, configured first by configure.
func rancherRoute(jobDuration time.Duration, configure func(*sim.RancherPlanner)) (*testenv.Environment, *harvesterCluster, *sim.RancherPlanner) {
	GinkgoHelper()
	return cellRancherRoute(func(s *sim.SUC) { s.JobDuration = jobDuration }, nil, configure)
}

// endNodeUpdate ends nu as the NodeUpdate reconciler does after a failure, a timeout, an
// abort or a deletion: abortStartTime set, the updater's Abort called until it is done,
// then the phase Failed. It returns when it ended.
func endNodeUpdate(c *harvesterCluster, nu *inplacev1.NodeUpdate) time.Time {
	GinkgoHelper()
	Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
	nu.Status.AbortStartTime = &metav1.MicroTime{Time: time.Now()}
	Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
	abortUntilDone(c, nu)
	nu.Status.Phase = inplacev1.NodeUpdatePhaseFailed
	Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
	return time.Now()
}

// renewNodeUpdate replaces an ended NodeUpdate by a new one for its node, as a task's
// retry does.
func renewNodeUpdate(c *harvesterCluster, nu *inplacev1.NodeUpdate) *inplacev1.NodeUpdate {
	GinkgoHelper()
	Expect(env.Client.Delete(ctx, nu)).To(Succeed())
	Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{}))
	}).WithPolling(50 * time.Millisecond).Should(BeTrue())
	return c.nodeUpdate(nu.Spec.NodeName)
}

// rancherRestartsAfter are the RKE2 restarts by Rancher's planner that were still going
// at t or came later.
func rancherRestartsAfter(planner *sim.RancherPlanner, t time.Time) []sim.PlanApply {
	var out []sim.PlanApply
	for _, a := range planner.Restarts() {
		if a.End.After(t) {
			out = append(out, a)
		}
	}
	return out
}

func planSecret(wl *testenv.Environment, node string) *corev1.Secret {
	GinkgoHelper()
	s, err := rancher.MachinePlan(ctx, wl.Client, nodeOf(wl, node))
	Expect(err).NotTo(HaveOccurred())
	Expect(s).NotTo(BeNil())
	return s
}

func nodeOf(wl *testenv.Environment, name string) *corev1.Node {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(wl.Client.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
	return n
}

// expectNoNodeTaken asserts that, for d, Rancher takes none of c's nodes (no
// drain-options on its plan Secret) and none is cordoned.
func expectNoNodeTaken(wl *testenv.Environment, c *harvesterCluster, d time.Duration) {
	GinkgoHelper()
	Consistently(func(g Gomega) {
		for _, n := range c.nodes {
			g.Expect(planSecret(wl, n).Annotations).NotTo(HaveKey(rancher.DrainOptionsAnnotation), "Rancher took node %s, which no NodeUpdate asked for", n)
			g.Expect(nodeOf(wl, n).Spec.Unschedulable).To(BeFalse(), "node %s cordoned", n)
		}
	}, d, 100*time.Millisecond).Should(Succeed())
}

// expectNodeSettled asserts that the node comes out of Rancher's drain: uncordoned, and
// its plan Secret without drain annotations or requests.
func expectNodeSettled(wl *testenv.Environment, node string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		n := &corev1.Node{}
		g.Expect(wl.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		g.Expect(n.Spec.Unschedulable).To(BeFalse(), "node %s left cordoned", node)
		s, err := rancher.MachinePlan(ctx, wl.Client, n)
		g.Expect(err).NotTo(HaveOccurred())
		for _, key := range []string{rancher.DrainOptionsAnnotation, rancher.PreDrainRequest, rancher.PostDrainRequest, rancher.UnCordonAnnotation} {
			g.Expect(s.Annotations).NotTo(HaveKey(key), "node %s's plan Secret left in a drain", node)
		}
	}).WithPolling(100 * time.Millisecond).Should(Succeed())
}
