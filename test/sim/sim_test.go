package sim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env *testenv.Environment
	ctx = context.Background()
)

func TestSimulators(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "Simulators on a real API server")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// cluster is a set of simulated nodes with a running SUC simulator in its own namespace;
// nodes carry a pool label unique to the test so tests do not see each other's nodes.
type cluster struct {
	pool    string
	ns      string
	rec     *sim.Record
	kubelet *sim.Kubelet
	suc     *sim.SUC
}

var seq int

func newCluster(nodes int, options ...func(*sim.SUC)) *cluster {
	GinkgoHelper()
	seq++
	c := &cluster{pool: fmt.Sprintf("pool-%d", seq), ns: fmt.Sprintf("suc-%d", seq), rec: sim.NewRecord()}
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})).To(Succeed())
	c.kubelet = &sim.Kubelet{Client: env.Client, Record: c.rec}
	for i := 1; i <= nodes; i++ {
		_, err := c.kubelet.CreateNode(ctx, fmt.Sprintf("%s-node-%d", c.pool, i), "v1.32.5+rke2r1", map[string]string{"pool": c.pool})
		Expect(err).NotTo(HaveOccurred())
	}
	c.suc = &sim.SUC{Client: env.Client, Namespace: c.ns, Kubelet: c.kubelet, Record: c.rec, JobDuration: 150 * time.Millisecond, Interval: 20 * time.Millisecond}
	for _, o := range options {
		o(c.suc) // before the simulator runs: it reads its settings without a lock
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.suc.Run(runCtx) }()
	DeferCleanup(func() { cancel(); <-done })
	return c
}

func (c *cluster) plan(name string, concurrency int64, selector map[string]string) *sucv1.Plan {
	GinkgoHelper()
	p := &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: sucv1.PlanSpec{
			Concurrency:  concurrency,
			NodeSelector: &metav1.LabelSelector{MatchLabels: selector},
			Version:      "v1.33.3+rke2r1",
			Cordon:       true,
			Upgrade:      &sucv1.ContainerSpec{Image: "rancher/rke2-upgrade"},
		},
	}
	Expect(env.Client.Create(ctx, p)).To(Succeed())
	return p
}

func planComplete(p *sucv1.Plan) func(Gomega) string {
	return func(g Gomega) string {
		got := &sucv1.Plan{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		for _, cond := range got.Status.Conditions {
			if cond.Type == "Complete" {
				return string(cond.Status) + "/" + cond.Reason
			}
		}
		return ""
	}
}

var _ = Describe("The SUC simulator", func() {
	It("runs a Plan once per selected node, one node at a time, and signals completion with the plan hash label", func() {
		c := newCluster(3)
		p := c.plan("rke2", 1, map[string]string{"pool": c.pool})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))

		Expect(c.rec.RunsOf("rke2")).To(Equal(map[string]int{c.pool + "-node-1": 1, c.pool + "-node-2": 1, c.pool + "-node-3": 1}))
		Expect(c.rec.MaxConcurrentRuns()).To(Equal(1))
		Expect(c.rec.MaxDown()).To(Equal(1))

		got := &sucv1.Plan{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		Expect(got.Status.LatestVersion).To(Equal("v1.33.3-rke2r1"), "SUC turns '+' into '-' (fact 14)")
		Expect(got.Status.LatestHash).To(Equal(sim.LatestHash("v1.33.3-rke2r1", "", nil, nil)))
		for i := 1; i <= 3; i++ {
			node := &corev1.Node{}
			Expect(env.Client.Get(ctx, client.ObjectKey{Name: fmt.Sprintf("%s-node-%d", c.pool, i)}, node)).To(Succeed())
			Expect(node.Labels).To(HaveKeyWithValue(sim.NodePlanPrefix+"rke2", got.Status.LatestHash))
			Expect(node.Status.NodeInfo.KubeletVersion).To(Equal("v1.33.3+rke2r1"))
			Expect(node.Spec.Unschedulable).To(BeFalse(), "SUC uncordons after a successful cordoning plan")
			Expect(sim.NodeReady(node)).To(BeTrue())
		}
	})

	It("honours the Plan's concurrency", func() {
		c := newCluster(4)
		p := c.plan("rke2", 2, map[string]string{"pool": c.pool})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Expect(c.rec.MaxConcurrentRuns()).To(Equal(2))
		Expect(c.rec.MaxDown()).To(Equal(2))
	})

	It("fails a named node's Job with the given message and marks the Plan JobFailed", func() {
		c := newCluster(2)
		node := c.pool + "-node-1"
		c.suc.FailNode("rke2", node, "rke2 binary checksum mismatch")
		p := c.plan("rke2", 1, map[string]string{corev1.LabelHostname: node})
		Eventually(planComplete(p)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))

		jobs := &batchv1.JobList{}
		Expect(env.Client.List(ctx, jobs, client.InNamespace(c.ns), client.MatchingLabels{sim.LabelPlan: "rke2", sim.LabelNode: node})).To(Succeed())
		Expect(jobs.Items).To(HaveLen(1))
		var failed *batchv1.JobCondition
		for i := range jobs.Items[0].Status.Conditions {
			if jobs.Items[0].Status.Conditions[i].Type == batchv1.JobFailed {
				failed = &jobs.Items[0].Status.Conditions[i]
			}
		}
		Expect(failed).NotTo(BeNil())
		// The Job controller's words only; the node's are on the failed pod.
		Expect(failed.Reason).To(Equal(batchv1.JobReasonBackoffLimitExceeded))
		Expect(failed.Message).To(Equal("Job has reached the specified backoff limit"))
		pods := &corev1.PodList{}
		Expect(env.Client.List(ctx, pods, client.InNamespace(c.ns), client.MatchingLabels{sim.LabelJobName: jobs.Items[0].Name})).To(Succeed())
		Expect(pods.Items).To(HaveLen(1))
		pod := pods.Items[0]
		Expect(pod.Spec.NodeName).To(Equal(node))
		Expect(pod.Status.Phase).To(Equal(corev1.PodFailed))
		Expect(pod.Status.ContainerStatuses).To(ContainElement(And(
			HaveField("Name", "upgrade"),
			HaveField("State.Terminated.ExitCode", int32(1)),
			HaveField("State.Terminated.Message", "rke2 binary checksum mismatch"))))
		log, ok := c.suc.PodLog(c.ns, pod.Name, "upgrade")
		Expect(ok).To(BeTrue())
		Expect(log).To(Equal("rke2 binary checksum mismatch"))

		n := &corev1.Node{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Labels).NotTo(HaveKey(sim.NodePlanPrefix + "rke2"))
		Expect(n.Status.NodeInfo.KubeletVersion).To(Equal("v1.32.5+rke2r1"), "a failed upgrade leaves the old version")
		Expect(c.rec.RunsOf("rke2")).To(Equal(map[string]int{node: 1}), "only the selected node runs, and only once")
		Consistently(func() int { return len(c.rec.Runs()) }, 500*time.Millisecond, 50*time.Millisecond).Should(Equal(1), "a failed Job is not retried for the same hash")
	})

	It("fails a node's Job of the Plans carrying the given labels, and only of those", func() {
		c := newCluster(1)
		node := c.pool + "-node-1"
		c.suc.FailNodeLabelled(map[string]string{"example.com/kind": "os"}, node, "elemental upgrade failed")
		labelled := func(name, kind string) *sucv1.Plan {
			p := &sucv1.Plan{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: map[string]string{"example.com/kind": kind}},
				Spec: sucv1.PlanSpec{Concurrency: 1, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: node}},
					Version: "v1.33.3+rke2r1", Upgrade: &sucv1.ContainerSpec{Image: "rancher/rke2-upgrade"}},
			}
			Expect(env.Client.Create(ctx, p)).To(Succeed())
			return p
		}
		rke2, osPlan := labelled("upgrade-rke2-"+c.pool, "rke2"), labelled("upgrade-os-"+c.pool, "os")
		Eventually(planComplete(rke2)).WithPolling(50 * time.Millisecond).Should(Equal("True/Complete"))
		Eventually(planComplete(osPlan)).WithPolling(50 * time.Millisecond).Should(Equal("False/JobFailed"))
	})
})
