package harvesteradapter_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
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

// The cells of issue #52's matrix that rancher_endings_test.go leaves: an ending before
// Rancher takes the node, after its post-drain hook, while its reboot is armed or runs,
// a manager restart at three points of the route, and an ending while
// rancher-system-agent is silent after our pre-drain answer. Same cluster as there
// (rancherRoute: a management node, Rancher's first, and a worker), same outcome asked
// of every ending: no node cordoned for the roll, no drain waiting on a hook nobody
// answers, no RKE2 restart or reboot after the NodeUpdate ended, and a next NodeUpdate
// that finishes the node.
var _ = Describe("Every ending of a node's Rancher route, the remaining cells", testsuite.E2E, func() {
	It("ends a node waiting for Rancher to take it (our hooks set, the node not cordoned) with nothing of Rancher's to settle, and the nodes' next updates go through the hooks in Rancher's order", func() {
		wl, c, planner := rancherRoute(300*time.Millisecond, nil)
		first, worker := c.nodes[0], c.nodes[1]

		By("the worker's NodeUpdate waits at RancherPreDrain while Rancher's first node, the management node, has none")
		nu := c.nodeUpdate(worker)
		Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepRancherPreDrain) == inplacev1.StepStateRunning
		})).To(Succeed())
		Eventually(func() string { return localStrategy(wl) }).WithPolling(100*time.Millisecond).Should(ContainSubstring(rancher.PreDrainHook),
			"the plan set our drain hooks on fleet-local/local")
		for _, n := range c.nodes {
			Expect(planSecret(wl, n).Annotations).NotTo(HaveKey(rancher.DrainOptionsAnnotation), "Rancher took node %s, which no running NodeUpdate waits for", n)
			Expect(nodeOf(wl, n).Spec.Unschedulable).To(BeFalse(), "node %s cordoned before Rancher took any node", n)
		}

		By("ended there")
		ended := endNodeUpdate(c, nu)
		expectNodeSettled(wl, worker)
		expectNoNodeTaken(wl, c, 3*time.Second)
		pause, err := rancher.ReadPlannerPause(ctx, wl.Client)
		Expect(err).NotTo(HaveOccurred())
		Expect(pause.By).To(Equal(upgradeplan.Name(c.name, "v1.8.1")), "the plan holds Rancher's planner while no NodeUpdate waits for it")
		Expect(planner.Restarts()).To(BeEmpty(), "no RKE2 restarted: Rancher took no node")
		Expect(c.suc.Guarded(worker)).To(BeTrue(), "the worker keeps the restart guard the cluster step placed")

		By("the management node's update, then the worker's next one: Rancher takes each in its order and restarts RKE2 behind its hooks")
		Expect(drive(c.updater, c.nodeUpdate(first), 180*time.Second)).To(Succeed())
		next := renewNodeUpdate(c, nu)
		Expect(drive(c.updater, next, 180*time.Second)).To(Succeed())
		restarts := planner.Restarts()
		Expect(restarts).To(HaveLen(2), "one RKE2 restart per node")
		for i, n := range []string{first, worker} {
			Expect(restarts[i].Node).To(Equal(n), "Rancher's order: the etcd tier, then the workers")
			Expect(restarts[i].InHooks).To(BeTrue(), "node %s restarted between its answered pre-drain hook and its post-drain request", n)
			Expect(nodeOf(wl, n).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2), "node %s finished", n)
		}
		Expect(rancherRestartsAfter(planner, ended)).To(HaveLen(2), "both restarts inside the later NodeUpdates")
		Expect(restarts[0].Start).To(BeTemporally(">", ended), "no restart before the next NodeUpdates")
		Expect(planner.MaxCordoned()).To(Equal(1), "Rancher held one node at a time")
		expectNodeSettled(wl, worker)
	})

	It("ends a node whose post-drain hook is answered with Rancher uncordoning it and nothing restarted after, and the plan deleted then hands the worker back under the guard for its next update to restart, the planner held until Rancher copied the given-back strategy into its RKEControlPlane", func() {
		// Rancher's provisioningcluster controller copies fleet-local/local's spec into
		// the RKEControlPlane the planner reads 2 s late here: let go before, the planner
		// would take the worker with our hooks, which no one answers once the plan is gone.
		wl, c, planner := rancherRoute(300*time.Millisecond, func(p *sim.RancherPlanner) { p.CopyDelay = 2 * time.Second })
		node, worker := c.nodes[0], c.nodes[1]
		nu := c.nodeUpdate(node)
		Expect(driveUntil(c.updater, nu, 180*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepRancherPostDrain) == inplacev1.StepStateSucceeded
		})).To(Succeed())

		By("ended after its post-drain hook is answered")
		ended := endNodeUpdate(c, nu)
		expectNodeSettled(wl, node)
		restarts := planner.Restarts()
		Expect(restarts).To(HaveLen(1), "Rancher restarted RKE2 once")
		Expect(restarts[0].InHooks).To(BeTrue(), "inside the node's hooks")
		Expect(restarts[0].End).To(BeTemporally("<=", ended))
		reboots := c.rec.Reboots(node)
		Expect(reboots).To(HaveLen(1), "the OS upgrade rebooted the node once")
		Expect(reboots[0].End).NotTo(BeZero(), "the node came back before its update ended")
		Expect(reboots[0].End).To(BeTemporally("<=", ended))
		Expect(nodeOf(wl, node).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2), "the node runs the release's RKE2: no next update needed")
		Expect(nodeOf(wl, node).Status.NodeInfo.OSImage).To(Equal("Harvester v1.8.1"), "the node runs the release's OS: no next update needed")

		By("the plan deleted: the roll is handed back settled, the worker behind the declared RKE2 under the guard")
		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		deleteRunningPlan(plan)
		Eventually(func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(plan), &harvesterv1.UpgradePlan{}))
		}).WithPolling(100*time.Millisecond).Should(BeTrue(), "the plan's finalizer gave back what it changed")
		expectRancherSettled(wl, c)
		Expect(c.suc.Guarded(worker)).To(BeTrue(), "the worker, behind the declared RKE2, left without the guard")
		Eventually(func() string { return c.kubelet.InstalledRKE2(worker) }).WithPolling(100*time.Millisecond).Should(Equal(rancherNewRKE2),
			"Rancher installs the declared RKE2 on the worker under the guard")
		Consistently(func() []sim.PlanApply { return rancherRestartsAfter(planner, ended) }, 2*time.Second, 100*time.Millisecond).Should(BeEmpty(),
			"an RKE2 restart by Rancher after the node's update ended")
		Expect(c.rec.Reboots(node)).To(HaveLen(1), "a reboot after the node's update ended")
		expectRancherSettled(wl, c)
		for _, e := range planner.HookEvents() {
			Expect(e.Node == worker && e.Kind == "cordon").To(BeFalse(),
				"Rancher took the worker at %s, with our hooks, which no one answers once the plan is gone", e.At.Format("15:04:05.000"))
		}

		By("the worker's NodeUpdate restarts the RKE2 installed under the guard, inside its own update")
		wnu := c.nodeUpdate(worker)
		Expect(drive(c.updater, wnu, 240*time.Second)).To(Succeed())
		Expect(nodeOf(wl, worker).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2))
		Expect(nodeupdater.StepState(wnu, harvesteradapter.StepRancherPreDrain)).To(Equal(inplacev1.StepStateSkipped), "Rancher takes nothing: its plan is applied")
		Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty(), "Rancher restarted nothing: the worker's own update did")
	})

	DescribeTable("holds a node's ending until the reboot its OS Job armed is over and the node is back, then answers the post-drain hook: nothing reboots or restarts after the update ended",
		func(point string, reached func(c *harvesterCluster, node string) bool) {
			wl, c, planner := cellRancherRoute(func(s *sim.SUC) {
				s.JobDuration = 300 * time.Millisecond
				s.RebootDelay = 2 * time.Second
				s.RebootDuration = 2 * time.Second
			}, nil, nil)
			node := c.nodes[0]
			nu := c.nodeUpdate(node)
			Expect(driveUntil(c.updater, nu, 180*time.Second, func(*inplacev1.NodeUpdate) bool { return reached(c, node) })).To(Succeed())
			Expect(reached(c, node)).To(BeTrue(), "the node's update finished before %s", point)
			Expect(rancher.Asked(planSecret(wl, node), rancher.PostDrainRequest)).NotTo(BeEmpty(), "Rancher restarted RKE2 and waits at the post-drain hook")

			By("ended: " + point)
			ended := endNodeUpdate(c, nu)
			reboots := c.rec.Reboots(node)
			Expect(reboots).To(HaveLen(1), "the armed reboot ran once")
			Expect(reboots[0].End).NotTo(BeZero(), "the ending waited for the node to come back")
			Expect(reboots[0].End).To(BeTemporally("<=", ended), "the node came back before its update ended")
			Expect(c.suc.RebootArmed(node)).To(BeFalse(), "a reboot still armed after the node's update ended")
			expectNodeSettled(wl, node)
			Consistently(func() int { return len(c.rec.Reboots(node)) }, 3*time.Second, 100*time.Millisecond).Should(Equal(1),
				"a reboot after the node's update ended")
			Expect(rancherRestartsAfter(planner, ended)).To(BeEmpty(), "an RKE2 restart after the node's update ended")
			restarts := planner.Restarts()
			Expect(restarts).To(HaveLen(1), "Rancher restarted RKE2 once")
			Expect(restarts[0].InHooks).To(BeTrue(), "inside the node's hooks")
			n := nodeOf(wl, node)
			Expect(n.Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2), "the node runs the release's RKE2: no next update needed")
			Expect(n.Status.NodeInfo.OSImage).To(Equal("Harvester v1.8.1"), "the node runs the release's OS: no next update needed")
			Expect(cellPlansOf(wl, nu)).To(BeEmpty(), "the ended update's Plans are gone")
		},
		Entry("the reboot armed, the node still up", "the reboot armed", func(c *harvesterCluster, node string) bool {
			return c.suc.RebootArmed(node) && len(c.rec.Reboots(node)) == 0
		}),
		Entry("the node down in its reboot", "the node down", func(c *harvesterCluster, node string) bool {
			rb := c.rec.Reboots(node)
			return len(rb) == 1 && rb[0].End.IsZero()
		}),
	)

	DescribeTable("a manager restarted while a node goes through Rancher's route finishes the node with one RKE2 restart, inside its hooks, and leaves nothing behind",
		func(point string, configure func(*sim.RancherPlanner), jobDuration time.Duration, reached func(wl *testenv.Environment, nu *inplacev1.NodeUpdate) bool) {
			wl, c, planner := rancherRoute(jobDuration, configure)
			node := c.nodes[0]
			nu := c.nodeUpdate(node)
			Expect(driveUntil(c.updater, nu, 180*time.Second, func(nu *inplacev1.NodeUpdate) bool { return reached(wl, nu) })).To(Succeed())
			Expect(reached(wl, nu)).To(BeTrue(), "the node's update finished before %s", point)

			By("the manager goes away (" + point + "), the simulators go on, and a new one starts")
			cellStopPlans(c.ns)
			time.Sleep(time.Second)
			restarted := *c.updater
			c.plans = startPlans(c.ns, &restarted)
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			Expect(drive(&restarted, nu, 240*time.Second)).To(Succeed())

			Expect(nodeOf(wl, node).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2))
			restarts := planner.Restarts()
			Expect(restarts).To(HaveLen(1), "one RKE2 restart")
			Expect(restarts[0].Node).To(Equal(node))
			Expect(restarts[0].InHooks).To(BeTrue(), "restarted between its answered pre-drain hook and its post-drain request")
			Expect(c.rec.Reboots(node)).To(HaveLen(1), "one reboot")
			Expect(planner.MaxCordoned()).To(Equal(1))
			expectNodeSettled(wl, node)
			Expect(cellPlansOf(wl, nu)).To(BeEmpty(), "the update's Plans are gone")
			Expect(nodeOf(wl, c.nodes[1]).Spec.Unschedulable).To(BeFalse(), "Rancher took the worker, which no NodeUpdate asked for")
		},
		Entry("at the pre-drain hook", "Rancher asks for the pre-drain hook", nil, 300*time.Millisecond,
			func(wl *testenv.Environment, nu *inplacev1.NodeUpdate) bool {
				return nodeupdater.StepState(nu, harvesteradapter.StepRancherPreDrain) == inplacev1.StepStateSucceeded
			}),
		Entry("while Rancher applies the plan", "pre-drain answered, the plan applying", func(p *sim.RancherPlanner) { p.InstallDuration = 3 * time.Second }, 300*time.Millisecond,
			func(wl *testenv.Environment, nu *inplacev1.NodeUpdate) bool {
				return rancher.Answered(planSecret(wl, nu.Spec.NodeName), rancher.PreDrainRequest, rancher.PreDrainHook)
			}),
		Entry("while the OS Job runs", "the OS Job running", nil, 2*time.Second,
			func(wl *testenv.Environment, nu *inplacev1.NodeUpdate) bool {
				return nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade) == inplacev1.StepStateRunning && cellPlanKinds(wl, nu)[string(suc.PlanOS)]
			}),
	)

	DescribeTable("reverses a node's ending once rancher-system-agent stays silent after the pre-drain answer for the KubernetesUpgrade timeout: guard back, drain withdrawn, node uncordoned and named; the agent's late install restarts nothing and the next update restarts RKE2",
		func(end func(c *harvesterCluster, nu *inplacev1.NodeUpdate) time.Time) {
			const bound = 12 * time.Second
			wl, c, planner := cellRancherRoute(func(s *sim.SUC) { s.JobDuration = 300 * time.Millisecond }, func(h *harvesterv1.HarvesterUpgrader) {
				h.Spec.Timeouts.KubernetesUpgrade = &metav1.Duration{Duration: bound}
			}, nil)
			recorder := events.NewFakeRecorder(100)
			c.updater.Recorder = recorder
			node := c.nodes[0]
			nu := c.nodeUpdate(node)
			driveToRancherTurn(c, nu)
			planner.StopAgent(node)
			Expect(driveUntil(c.updater, nu, 60*time.Second, func(*inplacev1.NodeUpdate) bool {
				s := planSecret(wl, node)
				return rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) &&
					rancher.ReadDeliveredPlan(s) == rancher.DeliveredPlan{Version: rancherNewRKE2}
			})).To(Succeed())
			Expect(c.suc.Guarded(node)).To(BeFalse(), "RemoveRestartGuard took the guard off before the pre-drain hook was answered")
			Expect(nodeOf(wl, node).Spec.Unschedulable).To(BeTrue(), "Rancher cordoned the node it took")
			answered := nodeupdater.Step(nu, harvesteradapter.StepKubernetesUpgrade).StartTime.Time

			By("ended while the agent is silent")
			ended := end(c, nu)
			Expect(ended.Sub(answered)).To(BeNumerically(">=", bound), "the ending held while the restart could still come")
			Expect(c.suc.Guarded(node)).To(BeTrue(), "node %s left without its restart guard while the agent may still apply the plan", node)
			expectNodeSettled(wl, node)
			Expect(strings.Join(drainEvents(recorder), "\n")).To(And(ContainSubstring(node), ContainSubstring("rancher-system-agent")),
				"the NodeUpdate's event names the node and the silent agent")
			Eventually(func(g Gomega) string {
				plan := &harvesterv1.UpgradePlan{}
				g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
				return plan.Status.Message
			}).WithPolling(100*time.Millisecond).Should(And(ContainSubstring(node), ContainSubstring("rancher-system-agent")),
				"the plan's status names the node and what to do")
			expectNoNodeTaken(wl, c, 2*time.Second)

			By("the agent starts again: it installs the plan under the guard, restarting nothing")
			planner.StartAgent(node)
			Eventually(func() rancher.DeliveredPlan { return rancher.ReadDeliveredPlan(planSecret(wl, node)) }).WithPolling(100*time.Millisecond).
				Should(Equal(rancher.DeliveredPlan{Version: rancherNewRKE2, Applied: true}), "the agent applied the plan")
			Expect(c.kubelet.InstalledRKE2(node)).To(Equal(rancherNewRKE2), "installed, not started")
			Consistently(func() []sim.PlanApply { return planner.Restarts() }, 2*time.Second, 100*time.Millisecond).Should(BeEmpty(),
				"an RKE2 restart after the node's update ended")
			expectNodeSettled(wl, node)

			By("the node's next NodeUpdate restarts the RKE2 installed under the guard, inside its own update")
			next := renewNodeUpdate(c, nu)
			Expect(drive(c.updater, next, 240*time.Second)).To(Succeed())
			Expect(nodeOf(wl, node).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2))
			Expect(nodeupdater.StepState(next, harvesteradapter.StepRancherPreDrain)).To(Equal(inplacev1.StepStateSkipped), "Rancher takes nothing: its plan is applied")
			Expect(planner.Restarts()).To(BeEmpty(), "Rancher restarted nothing: the node's own update did")
			expectNodeSettled(wl, node)
		},
		Entry("aborted soon after the answer: held until the bound, then reversed", func(c *harvesterCluster, nu *inplacev1.NodeUpdate) time.Time {
			return endNodeUpdate(c, nu)
		}),
		Entry("KubernetesUpgrade timed out: reversed at once", func(c *harvesterCluster, nu *inplacev1.NodeUpdate) time.Time {
			err := drive(c.updater, nu, 60*time.Second)
			perm, ok := nodeupdater.AsPermanent(err)
			Expect(ok).To(BeTrue(), "the step times out: %v", err)
			Expect(perm.Reason).To(Equal("StepTimedOut"))
			Expect(perm.Error()).To(And(ContainSubstring("rancher-system-agent on node "+nu.Spec.NodeName+" has not applied Rancher's plan (RKE2 "+rancherNewRKE2+") for "),
				ContainSubstring("systemctl status rancher-system-agent")), "the timeout names the silent agent, how long, and what to look at")
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStateFailed))
			return endNodeUpdate(c, nu)
		}),
	)

	DescribeTable("pauses Rancher's planner before a node's post-drain hook is answered, so that Rancher takes no node that no NodeUpdate waits for, however late the plan's own pass comes",
		func(ending bool) {
			wl, c, planner := rancherRoute(300*time.Millisecond, nil)
			node, worker := c.nodes[0], c.nodes[1]
			nu := c.nodeUpdate(node)
			Expect(driveUntil(c.updater, nu, 120*time.Second, func(*inplacev1.NodeUpdate) bool {
				return rancher.Answered(planSecret(wl, node), rancher.PreDrainRequest, rancher.PreDrainHook)
			})).To(Succeed())
			Eventually(func() (bool, error) {
				p, err := rancher.ReadPlannerPause(ctx, wl.Client)
				return p.Paused, err
			}).WithPolling(50*time.Millisecond).Should(BeFalse(), "the plan let the planner go for the node's RKE2 restart")

			By("the plan's controller looks no more (as a pass that comes late), and the node's post-drain hook is answered by " + map[bool]string{false: "its RancherPostDrain step", true: "its ending"}[ending])
			cellStopPlans(c.ns)
			if ending {
				endNodeUpdate(c, nu)
			} else {
				Expect(drive(c.updater, nu, 180*time.Second)).To(Succeed())
			}
			answered := time.Now()
			expectNodeSettled(wl, node)
			Consistently(func(g Gomega) {
				g.Expect(planSecret(wl, worker).Annotations).NotTo(HaveKey(rancher.DrainOptionsAnnotation), "Rancher took the worker, which no NodeUpdate waits for")
				g.Expect(nodeOf(wl, worker).Spec.Unschedulable).To(BeFalse(), "Rancher cordoned the worker, which no NodeUpdate waits for")
			}, 3*time.Second, 100*time.Millisecond).Should(Succeed())
			pause, err := rancher.ReadPlannerPause(ctx, wl.Client)
			Expect(err).NotTo(HaveOccurred())
			Expect(pause.By).To(Equal(upgradeplan.Name(c.name, "v1.8.1")), "the planner paused, for the plan, before the answer")

			By("the plan's controller back, the worker's NodeUpdate: Rancher takes the worker then, behind its hooks")
			c.plans = startPlans(c.ns, c.updater)
			Expect(drive(c.updater, c.nodeUpdate(worker), 240*time.Second)).To(Succeed())
			restarts := planner.Restarts()
			Expect(restarts).To(HaveLen(2), "one RKE2 restart per node")
			Expect(restarts[1].Node).To(Equal(worker))
			Expect(restarts[1].InHooks).To(BeTrue(), "the worker restarted between its answered pre-drain hook and its post-drain request")
			Expect(restarts[1].Start).To(BeTemporally(">", answered), "the worker restarted before its NodeUpdate")
			Expect(planner.MaxCordoned()).To(Equal(1), "Rancher held one node at a time")
			expectNodeSettled(wl, worker)
		},
		Entry("answered by the node's RancherPostDrain step", false),
		Entry("answered by the node's ending while Rancher restarts its RKE2", true),
	)

	It("holds Rancher's planner while another node's plan fails to apply with no NodeUpdate of its own, since Rancher drains such a node at once whatever its concurrency, and goes on once the plan applies", func() {
		wl := startRancherWorkload()
		c := newRancherClusterWith(wl, nil, func(s *sim.SUC) { s.JobDuration = 300 * time.Millisecond })
		for i := range 2 {
			name := c.name + "-node-" + string(rune('1'+i))
			_, err := c.kubelet.CreateNode(ctx, name, rancherOldRKE2, serverRoles)
			Expect(err).NotTo(HaveOccurred())
			c.nodes = append(c.nodes, name)
		}
		planner := startPlannerWith(wl, c, nil, nil)
		first, failing := c.nodes[0], c.nodes[1]
		planner.FailInstall(failing, "the agent's install fails (a seeded fault)")

		By("the first management node's NodeUpdate waits for Rancher while the second's plan fails (Rancher's re-rendered plans reach every node in the cluster step)")
		nu := c.nodeUpdate(first)
		Expect(driveUntil(c.updater, nu, 120*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepRancherPreDrain) == inplacev1.StepStateRunning
		})).To(Succeed())
		Eventually(func() bool { return planFailingOn(wl, failing) }).WithPolling(100*time.Millisecond).Should(BeTrue(), "the second node's plan fails")
		Expect(driveUntil(c.updater, nu, 4*time.Second, nil)).To(MatchError(ContainSubstring("not done within")))
		Expect(planner.MaxCordoned()).To(Equal(0), "Rancher cordoned a node while another's plan failed: node %s's drain has no NodeUpdate", failing)
		Expect(nodeOf(wl, failing).Spec.Unschedulable).To(BeFalse())
		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		Expect(plan.Status.Message).To(ContainSubstring("Rancher's planner stays paused while rancher-system-agent fails to apply Rancher's plan on node(s) " + failing))

		By("the agent there applies its plan: Rancher takes the first node, and later the second with its own NodeUpdate")
		planner.ClearInstallFailure(failing)
		Expect(drive(c.updater, nu, 180*time.Second)).To(Succeed())
		// Ended as the NodeUpdate reconciler ends it: until then its claim in the Cluster's
		// disruption ledger holds the other control plane node.
		succeededAsReconciled(nu)
		Expect(drive(c.updater, c.nodeUpdate(failing), 180*time.Second)).To(Succeed())
		Expect(planner.MaxCordoned()).To(Equal(1), "Rancher held one node at a time: %s", hookHistory(planner))
		for _, n := range c.nodes {
			Expect(nodeOf(wl, n).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2), "node %s finished", n)
			expectNodeSettled(wl, n)
		}
	})
})

// hookHistory is the planner's record of cordons, drains and hooks, for a failure's message.
func hookHistory(p *sim.RancherPlanner) string {
	var b strings.Builder
	for _, e := range p.HookEvents() {
		fmt.Fprintf(&b, "\n  %s %s %s", e.At.Format("15:04:05.000"), e.Node, e.Kind)
	}
	for _, a := range p.Applies() {
		fmt.Fprintf(&b, "\n  apply %s on %s %s-%s failed=%v restarted=%v guarded=%v", a.Plan, a.Node, a.Start.Format("15:04:05.000"), a.End.Format("15:04:05.000"), a.Failed, a.Restarted, a.Guarded)
	}
	return b.String()
}

// planFailingOn says whether rancher-system-agent failed to apply node's delivered plan.
func planFailingOn(wl *testenv.Environment, node string) bool {
	GinkgoHelper()
	s := planSecret(wl, node)
	v := string(s.Data[rancher.FailureCountKey])
	return v != "" && v != "0" && !rancher.ReadDeliveredPlan(s).Applied
}

// cellRancherRoute is rancherRoute with the SUC simulator, the HarvesterUpgrader and the
// planner simulator each configured first (each may be nil).
func cellRancherRoute(sucOptions func(*sim.SUC), mutate func(*harvesterv1.HarvesterUpgrader), configure func(*sim.RancherPlanner)) (*testenv.Environment, *harvesterCluster, *sim.RancherPlanner) {
	GinkgoHelper()
	wl := startRancherWorkload()
	var options []func(*sim.SUC)
	if sucOptions != nil {
		options = append(options, sucOptions)
	}
	c := newRancherClusterWith(wl, mutate, options...)
	for i, roles := range []map[string]string{serverRoles, nil} {
		name := c.name + "-node-" + string(rune('1'+i))
		_, err := c.kubelet.CreateNode(ctx, name, rancherOldRKE2, roles)
		Expect(err).NotTo(HaveOccurred())
		c.nodes = append(c.nodes, name)
	}
	return wl, c, startPlannerWith(wl, c, nil, configure)
}

// cellPlansOf are the SUC Plans of nu on the workload cluster wl.
func cellPlansOf(wl *testenv.Environment, nu *inplacev1.NodeUpdate) []sucv1.Plan {
	GinkgoHelper()
	plans := &sucv1.PlanList{}
	Expect(wl.Client.List(ctx, plans, client.InNamespace("cattle-system"), client.MatchingLabels{suc.LabelNodeUpdate: string(nu.UID)})).To(Succeed())
	return plans.Items
}

// cellPlanKinds are the kinds of nu's SUC Plans on wl.
func cellPlanKinds(wl *testenv.Environment, nu *inplacev1.NodeUpdate) map[string]bool {
	GinkgoHelper()
	kinds := map[string]bool{}
	for _, p := range cellPlansOf(wl, nu) {
		kinds[p.Labels[suc.LabelPlanKind]] = true
	}
	return kinds
}
