package sim_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

// onePlan creates a Plan for one node of c with spec; mutate, if given, edits it first.
func (c *cluster) onePlan(name, node string, mutate func(*sucv1.Plan)) *sucv1.Plan {
	GinkgoHelper()
	p := &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: sucv1.PlanSpec{
			Concurrency:  1,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: node}},
			Version:      "v1.33.3+rke2r1",
			Upgrade:      &sucv1.ContainerSpec{Image: "rancher/rke2-upgrade"},
		},
	}
	if mutate != nil {
		mutate(p)
	}
	Expect(env.Client.Create(ctx, p)).To(Succeed())
	return p
}

func (c *cluster) jobsOf(plan, node string) []batchv1.Job {
	GinkgoHelper()
	jobs := &batchv1.JobList{}
	Expect(env.Client.List(ctx, jobs, client.InNamespace(c.ns), client.MatchingLabels{sim.LabelPlan: plan, sim.LabelNode: node})).To(Succeed())
	return jobs.Items
}

// updatePlan edits a Plan; the simulator writes its status meanwhile, so a conflict is
// read again.
func updatePlan(p *sucv1.Plan, mutate func(*sucv1.Plan)) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		mutate(p)
		return env.Client.Update(ctx, p)
	})).To(Succeed())
}

func nodeLabel(node, key string) string {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	return n.Labels[key]
}

func latestHash(p *sucv1.Plan) string {
	GinkgoHelper()
	got := &sucv1.Plan{}
	Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
	return got.Status.LatestHash
}

var _ = Describe("The SUC simulator builds each Job as SUC does", func() {
	It("creates it on the API server, which rejects a Plan whose upgrade volumes repeat SUC's own host-root (fact 30)", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		// An OS Plan with the host-root volume the Harvester updater added before issue 20.
		p := c.onePlan("os", node, func(p *sucv1.Plan) {
			p.Spec.Version = "v1.6.0"
			p.Spec.Upgrade = &sucv1.ContainerSpec{
				Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Command: []string{"/capi-inplace"}, Args: []string{"node", "os-upgrade"},
				Volumes: []sucv1.VolumeSpec{{Name: "host-root", Source: "/", Destination: "/host"}},
			}
		})
		Eventually(c.rec.Rejections).WithPolling(50 * time.Millisecond).ShouldNot(BeEmpty())
		r := c.rec.Rejections()[0]
		Expect(r.Plan).To(Equal(p.Name))
		Expect(r.Error).To(ContainSubstring(`spec.template.spec.volumes[2].name: Duplicate value: "host-root"`))
		Expect(r.Error).To(ContainSubstring(`mountPath: Invalid value: "/host": must be unique`))
		Expect(c.jobsOf(p.Name, node)).To(BeEmpty(), "the Job is never created")
		Expect(c.rec.Runs()).To(BeEmpty())
	})

	It("with SUC's name, labels, containers, tags, mounts, env, deadline, backoff and TTL (facts 24 to 41)", func() {
		c := newCluster(1, func(s *sim.SUC) { s.JobDuration = time.Hour })
		node := c.pool + "-node-1"
		p := c.onePlan("rke2-with-a-long-plan-name-for-"+c.pool, node, func(p *sucv1.Plan) {
			p.Labels = map[string]string{"team.example.com/owner": "ops", "upgrade.cattle.io/ignored": "x"}
			p.Annotations = map[string]string{"team.example.com/ticket": "42", "kubectl.kubernetes.io/last-applied-configuration": "{}"}
			p.Spec.ServiceAccountName = "system-upgrade-controller"
			p.Spec.Prepare = &sucv1.ContainerSpec{Image: "ghcr.io/capi-inplace/capi-inplace", Args: []string{"node", "remove-archives"}}
			p.Spec.Cordon = true
			p.Spec.Drain = &sucv1.DrainSpec{Timeout: ptr.To(intstr.FromInt32(900)), Force: true}
			p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			p.Spec.Upgrade.Env = []corev1.EnvVar{{Name: "OWN", Value: "1"}}
		})
		var job batchv1.Job
		Eventually(func() []batchv1.Job { return c.jobsOf(p.Name, node) }).WithPolling(50 * time.Millisecond).Should(HaveLen(1))
		job = c.jobsOf(p.Name, node)[0]
		// SUC writes the Plan's status after it applied the Job.
		Eventually(func() string { return latestHash(p) }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		hash := latestHash(p)

		Expect(job.Name).To(HaveLen(63), "the 56-character hash makes every name too long: cut, with a digest (fact 24)")
		Expect(job.Name).To(Equal(sim.SafeConcatName("apply", p.Name, "on", node, "with", hash)))
		Expect(job.Labels).To(Equal(map[string]string{
			"upgrade.cattle.io/controller": "system-upgrade-controller", "upgrade.cattle.io/exclusive": "false",
			"upgrade.cattle.io/node": node, "upgrade.cattle.io/plan": p.Name, "upgrade.cattle.io/version": "v1.33.3-rke2r1",
			sim.NodePlanPrefix + p.Name: hash, "team.example.com/owner": "ops",
			"objectset.rio.cattle.io/hash": job.Labels["objectset.rio.cattle.io/hash"],
		}))
		Expect(job.Annotations).To(HaveKeyWithValue("upgrade.cattle.io/ttl-seconds-after-finished", "900"))
		Expect(job.Annotations).To(HaveKeyWithValue("team.example.com/ticket", "42"))
		Expect(job.Annotations).NotTo(HaveKey("kubectl.kubernetes.io/last-applied-configuration"))
		Expect(job.OwnerReferences).To(HaveLen(1))
		Expect(job.OwnerReferences[0].Name).To(Equal(p.Name))

		Expect(*job.Spec.BackoffLimit).To(Equal(int32(2)), "SUC's code default (fact 4)")
		Expect(*job.Spec.TTLSecondsAfterFinished).To(Equal(int32(900)))
		Expect(*job.Spec.ActiveDeadlineSeconds).To(Equal(int64(600)), "no jobActiveDeadlineSecs: the controller default (fact 36)")

		pod := job.Spec.Template.Spec
		Expect(pod.HostPID && pod.HostIPC && pod.HostNetwork).To(BeTrue())
		Expect(pod.Tolerations[0].Key).To(Equal(corev1.TaintNodeUnschedulable))
		Expect(pod.Tolerations).To(HaveLen(2))
		Expect(pod.Volumes[0].Name).To(Equal("host-root"))
		Expect(pod.Volumes[1].Name).To(Equal("pod-info"))
		Expect(pod.InitContainers).To(HaveLen(2), "drain replaces cordon (fact 34)")
		prepare, drain, upgrade := pod.InitContainers[0], pod.InitContainers[1], pod.Containers[0]
		Expect(prepare.Name).To(Equal("prepare"))
		Expect(prepare.Image).To(Equal("ghcr.io/capi-inplace/capi-inplace:v1.33.3-rke2r1"), "SUC tags an untagged prepare image with the Plan's version (fact 35)")
		Expect(prepare.SecurityContext).To(BeNil(), "prepare is not privileged unless the Plan says so (fact 37)")
		Expect(drain.Name).To(Equal("drain"))
		Expect(drain.Image).To(Equal("rancher/kubectl:v1.30.3"))
		Expect(strings.Join(drain.Args, " ")).To(Equal("drain "+node+" --pod-selector !upgrade.cattle.io/controller --ignore-daemonsets --delete-emptydir-data --force --timeout 900ns"),
			"an integer timeout is nanoseconds (fact 41)")
		Expect(upgrade.Image).To(Equal("rancher/rke2-upgrade:v1.33.3-rke2r1"))
		Expect(*upgrade.SecurityContext.Privileged).To(BeTrue())
		Expect(upgrade.VolumeMounts[0]).To(Equal(corev1.VolumeMount{Name: "host-root", MountPath: "/host"}))
		var names []string
		for _, e := range upgrade.Env {
			names = append(names, e.Name)
		}
		Expect(names).To(Equal([]string{"SYSTEM_UPGRADE_NODE_NAME", "SYSTEM_UPGRADE_POD_NAME", "SYSTEM_UPGRADE_POD_UID", "OWN",
			"SYSTEM_UPGRADE_PLAN_NAME", "SYSTEM_UPGRADE_PLAN_LATEST_HASH", "SYSTEM_UPGRADE_PLAN_LATEST_VERSION"}))
	})

	It("leaves a Job whose image the registry does not serve pulling until its deadline fails it (facts 35, 36)", func() {
		clk := clocktesting.NewFakeClock(time.Now())
		c := newCluster(1, func(s *sim.SUC) { s.Clock = clk })
		node := c.pool + "-node-1"
		p := c.onePlan("rke2", node, func(p *sucv1.Plan) {
			p.Spec.Prepare = &sucv1.ContainerSpec{Image: "ghcr.io/capi-inplace/capi-inplace", Args: []string{"node", "remove-archives"}}
		})
		Eventually(func() string {
			runs := c.rec.Runs()
			if len(runs) == 0 {
				return ""
			}
			return runs[0].Message
		}).WithPolling(50 * time.Millisecond).Should(Equal("container prepare: ImagePullBackOff: image ghcr.io/capi-inplace/capi-inplace:v1.33.3-rke2r1 not found"))
		clk.Step(601 * time.Second)
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		got := &sucv1.Plan{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		Expect(got.Status.Conditions).To(ContainElement(HaveField("Message", HaveSuffix("DeadlineExceeded: Job was active longer than specified deadline"))))
	})
})

var _ = Describe("The SUC simulator hashes as SUC does (fact 16)", func() {
	It("re-runs a node for a new version or service account, not for a new image, args or drain", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		p := c.onePlan("rke2", node, nil)
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		first := latestHash(p)
		Expect(nodeLabel(node, sim.NodePlanPrefix+"rke2")).To(Equal(first))

		updatePlan(p, func(p *sucv1.Plan) {
			p.Spec.Upgrade.Image = "rancher/rke2-upgrade:v1.33.3-rke2r1"
			p.Spec.Upgrade.Args = []string{"--debug"}
			p.Spec.Drain = &sucv1.DrainSpec{Timeout: ptr.To(intstr.FromString("5m"))}
		})
		Consistently(func() int { return len(c.rec.Runs()) }, time.Second, 50*time.Millisecond).Should(Equal(1), "the hash did not change: the node is done")
		Expect(latestHash(p)).To(Equal(first))

		updatePlan(p, func(p *sucv1.Plan) { p.Spec.ServiceAccountName = "other" })
		Eventually(func() map[string]int { return c.rec.RunsOf("rke2") }).WithPolling(50 * time.Millisecond).Should(Equal(map[string]int{node: 2}))
		Expect(latestHash(p)).To(Equal(sim.LatestHash("v1.33.3-rke2r1", "other", nil, nil)))
	})
})

var _ = Describe("The SUC simulator after a Job ends", func() {
	It("deletes a failed Job after its TTL, does not re-create it on a node event, and does on a Plan annotation (facts 45, 48, 49)", func() {
		clk := clocktesting.NewFakeClock(time.Now())
		c := newCluster(1, func(s *sim.SUC) { s.Clock = clk })
		node := c.pool + "-node-1"
		c.suc.FailNode("rke2", node, "rke2 failed")
		p := c.onePlan("rke2", node, nil)
		Eventually(func() []sim.PlanRun { return c.rec.Runs() }).WithPolling(50 * time.Millisecond).Should(HaveLen(1))
		clk.Step(time.Second) // the Job's work is done: it fails
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))

		clk.Step(899 * time.Second)
		Consistently(func() []batchv1.Job { return c.jobsOf("rke2", node) }, 500*time.Millisecond, 50*time.Millisecond).Should(HaveLen(1), "kept until its 900 s TTL")
		clk.Step(2 * time.Second)
		Eventually(func() []batchv1.Job { return c.jobsOf("rke2", node) }).WithPolling(50 * time.Millisecond).Should(BeEmpty())

		// A node event (a label, as a heartbeat would be) does not re-run it.
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n := &corev1.Node{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
				return err
			}
			n.Labels["example.com/touched"] = "yes"
			return env.Client.Update(ctx, n)
		})).To(Succeed())
		Consistently(func() []batchv1.Job { return c.jobsOf("rke2", node) }, time.Second, 50*time.Millisecond).Should(BeEmpty())
		Expect(planComplete(p)(Default)).To(Equal("False/JobFailed"), "the node stays applying, the Plan failed")

		// An annotation on the Plan changes the object: SUC applies again.
		updatePlan(p, func(p *sucv1.Plan) { p.Annotations = map[string]string{"example.com/retry": "1"} })
		Eventually(func() []batchv1.Job { return c.jobsOf("rke2", node) }).WithPolling(50 * time.Millisecond).Should(HaveLen(1))
	})

	It("deletes a running Job whose version is no longer the Plan's, without labelling the node (fact 43)", func() {
		c := newCluster(1, func(s *sim.SUC) { s.JobDuration = 2 * time.Second })
		node := c.pool + "-node-1"
		p := c.onePlan("rke2", node, nil)
		Eventually(func() []sim.PlanRun { return c.rec.Runs() }).WithPolling(50 * time.Millisecond).Should(HaveLen(1))
		updatePlan(p, func(p *sucv1.Plan) { p.Spec.Version = "v1.33.4+rke2r1" })

		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		runs := c.rec.Runs()
		Expect(runs).To(HaveLen(2))
		Expect(runs[0].Version).To(Equal("v1.33.3+rke2r1"))
		Expect(runs[0].Deleted).To(Equal("its version v1.33.3-rke2r1 is no longer the Plan's v1.33.4-rke2r1"))
		Expect(runs[1].Version).To(Equal("v1.33.4+rke2r1"))
		Expect(runs[1].Start).NotTo(BeTemporally("<", runs[0].End), "the new Job's pod waits for the old one (pod anti-affinity)")
		Expect(nodeLabel(node, sim.NodePlanPrefix+"rke2")).To(Equal(runs[1].Hash), "only the new version's hash labels the node")
		for _, j := range c.jobsOf("rke2", node) {
			Expect(j.Labels).To(HaveKeyWithValue(sim.LabelVersion, "v1.33.4-rke2r1"), "the old version's Job is gone before its TTL")
		}
	})

	It("uncordons after a cordoning Plan's Job completes, whoever cordoned the node (fact 46)", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		Expect(c.kubelet.SetUnschedulable(ctx, node, true)).To(Succeed(), "an operator's cordon")
		p := c.onePlan("rke2", node, func(p *sucv1.Plan) { p.Spec.Cordon = true })
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		n := &corev1.Node{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Spec.Unschedulable).To(BeFalse())
		Expect(c.rec.UncordonsBySUC(node)).To(HaveLen(1))

		other := c.onePlan("plain", node, func(p *sucv1.Plan) { p.Spec.Version = "v1.33.4+rke2r1" })
		Expect(c.kubelet.SetUnschedulable(ctx, node, true)).To(Succeed())
		Eventually(planComplete(other)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Spec.Unschedulable).To(BeTrue(), "a Plan with neither cordon nor drain never uncordons")
		Expect(c.rec.UncordonsBySUC(node)).To(HaveLen(1))
	})

	It("fails a drain whose integer timeout SUC passes as nanoseconds (fact 41)", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		p := c.onePlan("rke2", node, func(p *sucv1.Plan) { p.Spec.Drain = &sucv1.DrainSpec{Timeout: ptr.To(intstr.FromInt32(900))} })
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.rec.Runs()[0].Message).To(Equal(fmt.Sprintf("container drain: error: unable to drain node %q due to error: global timeout reached: 900ns", node)))
	})
})

var _ = Describe("The SUC simulator with informers", func() {
	It("acts on Plan, Job and Node events and when a pod's work ends, not only on its Interval (fact 50)", func() {
		informers, err := env.StartCache(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(informers.Stop)
		// One pass at the start, before the Plan exists; the next timed one an hour later.
		c := newCluster(2, func(s *sim.SUC) { s.Cache, s.Interval = informers, time.Hour })
		p := c.plan("events", 1, map[string]string{"pool": c.pool})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		runs := c.rec.Runs()
		Expect(runs).To(HaveLen(2))
		for _, r := range runs {
			Expect(r.Failed).To(BeFalse(), "run %+v", r)
			Expect(r.End.Sub(r.Start)).To(BeNumerically(">=", 150*time.Millisecond), "the work took its JobDuration")
			Expect(r.PlanSeen).NotTo(BeZero(), "run %+v", r)
			Expect(r.Start.Before(r.PlanSeen)).To(BeFalse(), "the pod started after SUC saw its Plan: run %+v", r)
			Expect(r.Labelled.Before(r.End)).To(BeFalse(), "the node was labelled once the Job completed: run %+v", r)
			Expect(nodeLabel(r.Node, sim.NodePlanPrefix+"events")).To(Equal(latestHash(p)))
		}
		Expect(runs[1].Start.Before(runs[0].End)).To(BeFalse(), "concurrency 1: one node at a time")
		Expect(runs[1].Start.Before(runs[0].Labelled)).To(BeFalse(), "the next node starts once SUC saw the first labelled")
	})
})

var _ = Describe("The SUC simulator plays the node program's subcommands", func() {
	It("runs remove-images, the image cleanup of every node, one node at a time (harvester-node-upgrade.md fact 55)", func() {
		c := newCluster(3)
		p := c.onePlan("image-cleanup", "", func(p *sucv1.Plan) {
			p.Spec.NodeSelector = &metav1.LabelSelector{
				MatchLabels:      map[string]string{"pool": c.pool},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpExists}},
			}
			p.Spec.Version = "v1.6.0"
			p.Spec.Upgrade = &sucv1.ContainerSpec{
				Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Command: []string{"/capi-inplace"},
				Args: []string{"node", "remove-images", "--previous-version=v1.5.1", "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.6.0"},
			}
		})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		runs := c.rec.Runs()
		Expect(runs).To(HaveLen(3))
		nodes := map[string]bool{}
		for i, r := range runs {
			Expect(r.Failed).To(BeFalse(), "run %+v", r)
			nodes[r.Node] = true
			for _, other := range runs[:i] {
				Expect(r.Start.Before(other.End) && other.Start.Before(r.End)).To(BeFalse(), "%s and %s ran at once", r.Node, other.Node)
			}
		}
		Expect(nodes).To(HaveLen(3))
		Expect(c.rec.MaxDown()).To(Equal(0), "removing images takes no node down")
	})

	It("fails the Job of a subcommand the node program does not have, as its exit code 2 does", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		p := c.onePlan("typo", node, func(p *sucv1.Plan) {
			p.Spec.Version = "v1.6.0"
			p.Spec.Upgrade = &sucv1.ContainerSpec{Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Args: []string{"node", "remove-image"}}
		})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.rec.Runs()).To(HaveLen(1))
		Expect(c.rec.Runs()[0].Message).To(Equal(`container upgrade: capi-inplace node: unknown subcommand "remove-image" (exit code 2)`))
	})

	// The os Plan of the v1.6 -> v1.7 hop (harvesteradapter/suc WithPreviousVersion): the
	// prepare container, an init container before upgrade in the same pod (fact 34),
	// places the node program on the host, and the upgrade container, of the release's
	// upgrade image, executes that copy from the host root SUC mounts at /host in both
	// (fact 31).
	hopPlan := func(place bool) func(p *sucv1.Plan) {
		return func(p *sucv1.Plan) {
			p.Spec.Version = "v1.7.1"
			prepare := []string{"node", "remove-archives", "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.7.1"}
			if place {
				prepare = append(prepare, "--place-program=/usr/local/upgrade_tmp/capi-inplace")
			}
			p.Spec.Prepare = &sucv1.ContainerSpec{Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Command: []string{"/capi-inplace"}, Args: prepare}
			p.Spec.Upgrade = &sucv1.ContainerSpec{
				Image: "rancher/harvester-upgrade:v1.7.1", Command: []string{"/host/usr/local/upgrade_tmp/capi-inplace"},
				Args: []string{"node", "os-upgrade", "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.7.1", "--previous-version=v1.6.1", "--glibc-libraries=container"},
			}
		}
	}

	// onOS makes node run osImage, the OS before the hop's release.
	onOS := func(c *cluster, node, osImage string) {
		GinkgoHelper()
		Expect(c.kubelet.SetVersion(ctx, node, "v1.32.5+rke2r1", osImage)).To(Succeed())
	}
	// osImageOf polls the OS image node reports.
	osImageOf := func(node string) func() string {
		return func() string {
			n := &corev1.Node{}
			Expect(env.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
			return n.Status.NodeInfo.OSImage
		}
	}

	It("runs the node program that prepare placed on the host in another image's upgrade container: the OS upgrade reboots the node into the release", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		onOS(c, node, "Harvester v1.6.1")
		p := c.onePlan("os-hop", node, hopPlan(true))
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Eventually(osImageOf(node)).WithPolling(50*time.Millisecond).Should(Equal("Harvester v1.7.1"), "the node rebooted into the release's OS")
		Expect(c.rec.Reboots(node)).To(HaveLen(1))
		runs := c.rec.Runs()
		Expect(runs).To(HaveLen(1))
		Expect(runs[0].Images).To(Equal([]string{"ghcr.io/capi-inplace/capi-inplace:v0.4.0", "rancher/harvester-upgrade:v1.7.1"}))
		Expect(runs[0].Commands).To(Equal([]string{
			"remove-archives --place-program=/usr/local/upgrade_tmp/capi-inplace",
			"os-upgrade --previous-version=v1.6.1 --glibc-libraries=container",
		}))
	})

	It("arms no reboot for an os-upgrade run again on a node that already runs the release's OS, as the node program installs nothing there", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		onOS(c, node, "Harvester v1.6.1")
		first := c.onePlan("os-first", node, hopPlan(true))
		Eventually(planComplete(first)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Eventually(func() []sim.Reboot { return c.rec.Reboots(node) }).WithPolling(50*time.Millisecond).Should(HaveLen(1), "the first run installs and reboots")
		Eventually(osImageOf(node)).WithPolling(50 * time.Millisecond).Should(Equal("Harvester v1.7.1"))

		again := c.onePlan("os-again", node, hopPlan(true))
		Eventually(planComplete(again)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Consistently(func() []sim.Reboot { return c.rec.Reboots(node) }, time.Second, 50*time.Millisecond).Should(HaveLen(1),
			"a run on the release's OS is done at once: no second reboot")
	})

	It("fails the Job whose upgrade container executes a program under /host that nothing placed, as the runtime cannot start it", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		p := c.onePlan("os-hop-unplaced", node, hopPlan(false))
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
		Expect(c.rec.Runs()).To(HaveLen(1))
		Expect(c.rec.Runs()[0].Message).To(ContainSubstring(`container upgrade: StartError: `))
		Expect(c.rec.Runs()[0].Message).To(ContainSubstring(`exec: "/host/usr/local/upgrade_tmp/capi-inplace": stat /host/usr/local/upgrade_tmp/capi-inplace: no such file or directory`))
		Expect(c.rec.Reboots(node)).To(BeEmpty())
	})
})
