package harvesteradapter_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// These specs hold the Plans the updater writes against the SUC simulator, which builds
// and runs Jobs as System Upgrade Controller does (shared/facts/suc.md). Each was seen
// to fail against the Plans written before issue 20.

// planOutcome says where a Plan stands on node under the simulator: "done" once the node
// carries the Plan's hash, else the Job's rejection, its pull error or its failure.
func planOutcome(c *harvesterCluster, plan *sucv1.Plan, node string) func() string {
	return func() string {
		for _, r := range c.rec.Rejections() {
			if r.Plan == plan.Name && r.Node == node {
				return "rejected: " + r.Error
			}
		}
		for _, r := range runsOn(c.rec, node) {
			if r.Plan != plan.Name {
				continue
			}
			switch {
			case r.Failed:
				return "failed: " + r.Message
			case strings.Contains(r.Message, "ImagePullBackOff"):
				return "pulling: " + r.Message
			}
		}
		got := &sucv1.Plan{}
		if err := workload.Client.Get(ctx, client.ObjectKeyFromObject(plan), got); err != nil {
			return err.Error()
		}
		n := &corev1.Node{}
		if err := workload.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return err.Error()
		}
		if got.Status.LatestHash != "" && n.Labels[sim.NodePlanPrefix+got.Name] == got.Status.LatestHash {
			return "done"
		}
		return "running"
	}
}

// jobOf returns the Job of plan on node.
func jobOf(plan *sucv1.Plan, node string) batchv1.Job {
	GinkgoHelper()
	jobs := &batchv1.JobList{}
	Expect(workload.Client.List(ctx, jobs, client.InNamespace(plan.Namespace), client.MatchingLabels{sim.LabelPlan: plan.Name, sim.LabelNode: node})).To(Succeed())
	Expect(jobs.Items).NotTo(BeEmpty())
	return jobs.Items[0]
}

var _ = Describe("Each Plan the updater writes, run as SUC runs it", func() {
	DescribeTable("becomes a Job the API server accepts, whose images exist, with the step's timeout as its deadline",
		func(kind string, deadline time.Duration, nodeProgram map[string]string) {
			c := newHarvesterCluster(1, "Harvester v1.7.1", nil)
			node := c.nodes[0]
			nu := c.nodeUpdate(node)
			plan := harvesteradapter.PlanForNode(c.updater, c.config, nu, kind, c.repository.URL())
			Expect(workload.Client.Create(ctx, plan)).To(Succeed())
			Eventually(planOutcome(c, plan, node)).WithPolling(50 * time.Millisecond).Should(Equal("done"))
			job := jobOf(plan, node)
			Expect(job.Spec.ActiveDeadlineSeconds).To(HaveValue(Equal(int64(deadline.Seconds()))), "jobActiveDeadlineSecs from the step's timeout, not SUC's 600 s")
			ran := map[string]string{}
			for _, ctr := range append(job.Spec.Template.Spec.InitContainers, job.Spec.Template.Spec.Containers...) {
				Expect(ctr.Image).To(MatchRegexp(`:[^/]+$`), "container %s: every image is tagged", ctr.Name)
				if ctr.Image != managerNodeImage || len(ctr.Command) == 0 || ctr.Command[0] != "/capi-inplace" {
					continue // not the node program (the drain Plan's evacuation is another change's)
				}
				// The node program's containers as SUC built them: the manager's own
				// image at its version, root (the image's user is 65532; SUC keeps a
				// Plan's securityContext as given, fact 37), the host's / at /host.
				Expect(ctr.SecurityContext).NotTo(BeNil(), "container %s", ctr.Name)
				Expect(ctr.SecurityContext.RunAsUser).To(HaveValue(BeZero()), "container %s runs as root", ctr.Name)
				Expect(ctr.VolumeMounts).To(ContainElement(And(HaveField("Name", "host-root"), HaveField("MountPath", "/host"))), "container %s", ctr.Name)
				Expect(ctr.Args).To(ContainElement("--host-root=/host"), "container %s", ctr.Name)
				if len(ctr.Args) > 1 {
					ran[ctr.Name] = ctr.Args[1]
				}
				if ctr.Name == "upgrade" {
					Expect(ctr.SecurityContext.Privileged).To(HaveValue(BeTrue()), "container %s mounts and runs host tools", ctr.Name)
				}
			}
			Expect(ran).To(Equal(nodeProgram), "the node program's subcommands, by container")
		},
		Entry("image preload: capi-inplace node preload", "preload", 30*time.Minute, map[string]string{"upgrade": "preload"}),
		Entry("drain: kubectl drain as the upgrade container, with a tag of its own", "drain", time.Hour, map[string]string{}),
		Entry("RKE2: the release's pre-drain RKE2 settings, then rancher/rke2-upgrade at the target, tagged by the updater", "rke2", time.Hour,
			map[string]string{"prepare": "rke2-settings"}),
		Entry("OS: remove-archives then os-upgrade; SUC adds host-root itself, a second one makes the Job invalid", "os", 45*time.Minute,
			map[string]string{"prepare": "remove-archives", "upgrade": "os-upgrade"}),
	)

	It("lets an image preload run longer than SUC's default 600 s deadline", func() {
		clk := clocktesting.NewFakeClock(time.Now())
		c := newHarvesterCluster(1, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false) // only the Plan the spec creates runs
		}, func(s *sim.SUC) {
			s.Clock = clk
			s.Work = func(*sucv1.Plan) time.Duration { return 15 * time.Minute }
		})
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		plan := harvesteradapter.PlanForNode(c.updater, c.config, nu, "preload", c.repository.URL())
		Expect(workload.Client.Create(ctx, plan)).To(Succeed())
		Eventually(func() []sim.PlanRun { return runsOn(c.rec, node) }).WithPolling(50 * time.Millisecond).ShouldNot(BeEmpty())
		clk.Step(11 * time.Minute)
		Consistently(planOutcome(c, plan, node), time.Second, 50*time.Millisecond).Should(Equal("running"))
		clk.Step(5 * time.Minute)
		Eventually(planOutcome(c, plan, node)).WithPolling(50 * time.Millisecond).Should(Equal("done"))
	})
})

var _ = Describe("A node's drain", func() {
	It("reads a numeric drain timeout as seconds and sends SUC a duration", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
			h.Spec.Drain.Timeout = ptr.To(intstr.FromInt32(900))
		}, func(s *sim.SUC) { s.DrainDuration = 5 * time.Minute })
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		err := drive(c.updater, nu, 90*time.Second)
		for _, r := range runsOn(c.rec, node) {
			Expect(r.Message).NotTo(ContainSubstring("global timeout reached"), "run of %s", r.Plan)
		}
		Expect(err).NotTo(HaveOccurred())
		Expect(c.rec.Drains(node)).To(HaveLen(1))
	})

	It("happens once per node, and SUC never uncordons the node between its steps", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		err := drive(c.updater, nu, 90*time.Second)
		Expect(c.rec.UncordonsBySUC(node)).To(BeEmpty(), "SUC uncordons after a Plan that cordons or drains (fact 46)")
		Expect(c.rec.Drains(node)).To(HaveLen(1), "one drain, so every virtual machine migrates once")
		Expect(err).NotTo(HaveOccurred())
		Expect(unschedulable(node)).To(BeFalse(), "the updater lifts its own cordon at Finish")
	})

	It("holds a node cordoned by someone else, and leaves the cordon", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
		})
		node := c.nodes[0]
		Expect(c.kubelet.SetUnschedulable(ctx, node, true)).To(Succeed(), "an operator cordons the node")
		nu := c.nodeUpdate(node)
		// Until the node reaches its drain (after the cluster step), then a while longer.
		Expect(driveUntil(c.updater, nu, 60*time.Second, heldWith("node "+node+" is cordoned by someone else"))).To(Succeed())
		err := drive(c.updater, nu, 2*time.Second)
		Expect(unschedulable(node)).To(BeTrue(), "the operator's cordon stays")
		Expect(c.rec.Drains(node)).To(BeEmpty())
		Expect(err).To(MatchError(ContainSubstring("not done within")), "held, not failed")
		Expect(nu.Status.Steps).To(ContainElement(And(
			HaveField("State", inplacev1.StepStateRunning),
			HaveField("Message", ContainSubstring("node "+node+" is cordoned by someone else")))))
	})

	It("holds a node in Harvester maintenance mode", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
		})
		node := c.nodes[0]
		n := &corev1.Node{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		n.Annotations = map[string]string{"harvesterhci.io/maintain-status": "running"}
		Expect(workload.Client.Update(ctx, n)).To(Succeed())
		nu := c.nodeUpdate(node)
		message := "node " + node + " is in Harvester maintenance mode (harvesterhci.io/maintain-status=running)"
		Expect(driveUntil(c.updater, nu, 60*time.Second, heldWith(message))).To(Succeed())
		err := drive(c.updater, nu, 2*time.Second)
		Expect(c.rec.Drains(node)).To(BeEmpty(), "a node in maintenance mode is not drained")
		Expect(err).To(MatchError(ContainSubstring("not done within")), "held, not failed")
		Expect(nu.Status.Steps).To(ContainElement(HaveField("Message", ContainSubstring(message))))
	})
})

var _ = Describe("A node's post-drain with upgradeOS false", func() {
	It("still removes RKE2's archives and writes the release's post-drain settings, as the release's post-drain does whether or not it installs the OS, and neither installs nor reboots", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
		})
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		var post []sim.PlanRun
		for _, r := range nodeRunsOn(c.rec, node) {
			if strings.HasPrefix(r.Plan, "capi-inplace-os-") {
				post = append(post, r)
			}
		}
		Expect(post).To(HaveLen(1), "upgradeOS false dropped the post-drain: no os Plan ran on the node")
		Expect(post[0].Commands).To(Equal([]string{"remove-archives", "rke2-settings --stage=post-drain"}), "the archives removed, then the post-drain settings; no os-upgrade")
		Expect(c.rec.Reboots(node)).To(BeEmpty(), "nothing installed, no reboot")
		Expect(nodeOf(workload, node).Status.NodeInfo.OSImage).To(Equal("Harvester v1.7.1"), "the OS stays")
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade)).To(Equal(inplacev1.StepStateSucceeded))
		Expect(nodeupdater.Step(nu, harvesteradapter.StepOSUpgrade).Message).To(ContainSubstring("upgradeOS is false in the HarvesterUpgrader: RKE2's archives removed and the release's post-drain settings written"))
	})
})

var _ = Describe("A node's Plan that System Upgrade Controller never turns into a Job", func() {
	It("is named on its step once it has waited longer than the bound: SUC is silent, since when, what to look at", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
		}, func(s *sim.SUC) {
			s.NoJobs = func(p *sucv1.Plan) bool { return strings.HasPrefix(p.Name, "capi-inplace-drain-") }
		})
		c.updater.NoJobAfter = 2 * time.Second
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		silent := "System Upgrade Controller has made no Job of plan cattle-system/capi-inplace-drain-"
		Expect(driveUntil(c.updater, nu, 90*time.Second, heldWith(silent))).To(Succeed(), "the step says only that SUC is applying the Plan")
		step := nodeupdater.Step(nu, harvesteradapter.StepDrain)
		Expect(step.State).To(Equal(inplacev1.StepStateRunning))
		Expect(step.Message).To(And(ContainSubstring("for node "+node+" in "), ContainSubstring("it is not acting on the Plan"), ContainSubstring("kubectl -n cattle-system logs deploy/system-upgrade-controller")))
		Expect(c.rec.Drains(node)).To(BeEmpty())
	})
})

// heldWith says whether a step of the NodeUpdate runs with a message that says message.
func heldWith(message string) func(*inplacev1.NodeUpdate) bool {
	return func(nu *inplacev1.NodeUpdate) bool {
		for _, s := range nu.Status.Steps {
			if s.State == inplacev1.StepStateRunning && strings.Contains(s.Message, message) {
				return true
			}
		}
		return false
	}
}

var _ = Describe("Editing the HarvesterUpgrader while a node is upgraded", func() {
	It("does not change the node's running Plans: SUC would delete their Jobs", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.UpgradeOS = ptr.To(false)
			h.Spec.ImagePreload.Concurrency = ptr.To[int32](-1) // each node preloads in its turn, with its own Plan
		}, func(s *sim.SUC) { s.JobDuration = 2 * time.Second })
		_ = workload.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "other-sa", Namespace: "cattle-system"}})
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		done := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			done <- drive(c.updater, nu, 60*time.Second)
		}()
		// The cluster step comes first; on a loaded machine that takes more than 20 s.
		Eventually(func() []sim.PlanRun { return nodeRunsOn(c.rec, node) }, 60*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty(), func() string {
			cur := &inplacev1.NodeUpdate{}
			_ = env.Client.Get(ctx, client.ObjectKeyFromObject(nu), cur)
			return fmt.Sprintf("the NodeUpdate is at %s: %s", cur.Status.CurrentStep, nodeupdater.Step(cur, cur.Status.CurrentStep).Message)
		})

		cfg := &harvesterv1.HarvesterUpgrader{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.config), cfg)).To(Succeed())
		cfg.Spec.Release.Version = "v1.8.2"
		cfg.Spec.SystemUpgradeController.ServiceAccountName = "other-sa"
		Expect(env.Client.Update(ctx, cfg)).To(Succeed())

		var err error
		Eventually(done, 70*time.Second).Should(Receive(&err))
		for _, r := range runsOn(c.rec, node) {
			Expect(r.Deleted).To(BeEmpty(), "SUC deleted the Job of %s", r.Plan)
		}
		Expect(err).NotTo(HaveOccurred())
		for _, kind := range []string{"preload", "drain", "rke2"} {
			Expect(c.rec.RunsOf(harvesteradapter.PlanName(kind, nu))).To(Equal(map[string]int{node: 1}), "plan %s ran once", kind)
		}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
		Expect(nu.Status.UpdaterConfig).NotTo(BeNil())
		Expect(string(nu.Status.UpdaterConfig.Raw)).To(And(
			ContainSubstring(`"name":"default"`), ContainSubstring(`"generation":1`),
			ContainSubstring(`"version":"v1.8.1"`), ContainSubstring(`"serviceAccountName":"system-upgrade-controller"`)),
			"the NodeUpdate shows what its node was upgraded with")

		// A node not started yet is upgraded with the edited configuration.
		next := c.nodeUpdate(c.nodes[1])
		_, _ = c.updater.Reconcile(ctx, next)
		Expect(next.Status.UpdaterConfig).NotTo(BeNil())
		Expect(string(next.Status.UpdaterConfig.Raw)).To(And(ContainSubstring(`"generation":2`), ContainSubstring(`"version":"v1.8.2"`), ContainSubstring(`"serviceAccountName":"other-sa"`)))
	})
})

var _ = Describe("Upgrading the manager while a node is upgraded", func() {
	It("keeps the node on the node image it started with, and starts the next node on the new manager's", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.ImagePreload.Concurrency = ptr.To[int32](-1) // each node preloads in its turn, with its own Plan
		}, func(s *sim.SUC) { s.JobDuration = 500 * time.Millisecond })
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		// The old manager starts the node: its preload Plan runs. The node's turn comes
		// after the whole cluster step (about 10 s here on an idle machine, more on a
		// loaded one), hence the wait.
		Eventually(func() []sim.PlanRun {
			_, _ = c.updater.Reconcile(ctx, nu)
			Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
			return nodeRunsOn(c.rec, node)
		}, 60*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty())

		// The new manager: another version, so another --harvester-node-image.
		upgraded := *c.updater
		upgraded.NodeImage, upgraded.Version = "ghcr.io/capi-inplace/capi-inplace:v0.5.0", "v0.5.0"
		Expect(drive(&upgraded, nu, 60*time.Second)).To(Succeed())
		for _, r := range runsOn(c.rec, node) {
			Expect(r.Deleted).To(BeEmpty(), "SUC deleted the Job of %s", r.Plan)
		}
		for _, kind := range []string{"preload", "os"} {
			Expect(c.rec.RunsOf(harvesteradapter.PlanName(kind, nu))).To(Equal(map[string]int{node: 1}), "plan %s ran once", kind)
		}
		Expect(imagesOn(c, node)).To(ContainElement(managerNodeImage))
		Expect(imagesOn(c, node)).NotTo(ContainElement(upgraded.NodeImage), "the node started on %s", managerNodeImage)

		next := c.nodeUpdate(c.nodes[1])
		Expect(drive(&upgraded, next, 60*time.Second)).To(Succeed())
		Expect(imagesOn(c, c.nodes[1])).To(ContainElement(upgraded.NodeImage))
		Expect(imagesOn(c, c.nodes[1])).NotTo(ContainElement(managerNodeImage))
	})
})

// imagesOn are the images of every pod SUC's Jobs of the node's own Plans ran on node
// (the cluster phase's Plans for every node run the image of the manager that created
// the UpgradePlan).
func imagesOn(c *harvesterCluster, node string) []string {
	var images []string
	for _, r := range nodeRunsOn(c.rec, node) {
		images = append(images, r.Images...)
	}
	return images
}

var _ = Describe("Deleting the UpgradePlan while a node's OS upgrade runs", func() {
	It("does not change the node's os Plan: SUC would delete its Job and install and reboot again (rancher soak seed 192)", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
		}, func(s *sim.SUC) {
			// The OS install outlasts the UpgradePlan's deletion and clean-up.
			s.Work = func(p *sucv1.Plan) time.Duration {
				if sim.PlanSubcommand(p) == "os-upgrade" {
					return 20 * time.Second
				}
				return 100 * time.Millisecond
			}
		})
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		done := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			done <- drive(c.updater, nu, 150*time.Second)
		}()
		osPlan := harvesteradapter.PlanName("os", nu)
		Eventually(func() map[string]int { return c.rec.RunsOf(osPlan) }, 90*time.Second, 50*time.Millisecond).Should(HaveKey(node),
			"the node's OS install runs")
		plan := &sucv1.Plan{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: "cattle-system", Name: osPlan}, plan)).To(Succeed())
		Expect(suc.PreviousVersionOf(plan)).To(Equal("v1.7.1"), "made with the UpgradePlan's previous version")

		// The operator deletes the UpgradePlan (allowed): the node goes on without it.
		up := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), up)).To(Succeed())
		patch := client.MergeFrom(up.DeepCopy())
		if up.Annotations == nil {
			up.Annotations = map[string]string{}
		}
		up.Annotations[upgradeplan.AnnotationAllowDeletion] = "true"
		Expect(env.Client.Patch(ctx, up, patch)).To(Succeed())
		Expect(env.Client.Delete(ctx, up)).To(Succeed())
		Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(up), up) }, 30*time.Second, 100*time.Millisecond).
			Should(Satisfy(apierrors.IsNotFound), "the UpgradePlan's clean-up ends while the OS install runs")
		Expect(c.rec.RunsOf(osPlan)).To(Equal(map[string]int{node: 1}), "the OS install still runs")

		var err error
		Eventually(done, 160*time.Second).Should(Receive(&err))
		Expect(err).NotTo(HaveOccurred())
		for _, r := range runsOn(c.rec, node) {
			Expect(r.Deleted).To(BeEmpty(), "SUC deleted the Job of %s", r.Plan)
		}
		Expect(c.rec.RunsOf(osPlan)).To(Equal(map[string]int{node: 1}), "the OS was installed once")
		Expect(c.rec.Reboots(node)).To(HaveLen(1), "the node rebooted once")
	})
})
