package harvesteradapter_test

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// The Rancher route under randomized endings (issue #52): a Harvester cluster whose RKE2
// Rancher provisions is upgraded by UpgradeTasks (the control plane's and the workers',
// together or one after the other) through the real UpgradeTask, NodeUpdate and
// UpgradePlan controllers, while a seed picks the endings and where they strike: a task
// aborted or deleted, the UpgradePlan deleted (allow-deletion), the manager restarted,
// rancher-system-agent failing a node's plan and retrying it (for a while, or until the
// node's update ended), each at a point of a node's Rancher route (hooks set, cordoned
// by Rancher, pre-drain answered and the plan applying, RKE2 restarted, post-drain
// answered, OS Job running, reboot armed, node down) or at a random moment; some seeds
// give nodes a timeout short enough to end some of them on its own; a third of the seeds
// also stop rancher-system-agent on a node (a silent component: for a while, or until an
// operator starts it again once the faulty phase's tasks ended), with Rancher's
// KubernetesUpgrade step bounded so that what waits for it ends. Then new tasks finish
// the job. Over the whole run, recorded by watches and the simulators:
//   - never more than one node of the cluster down (cordoned or NotReady) at once: the
//     Harvester updater and Rancher (concurrency 1) take one node at a time;
//   - no RKE2 restart by Rancher, no host reboot and no cordon by Rancher on a node but
//     inside a NodeUpdate of that node (from its creation until it was seen final or
//     deleted);
//   - once every task of the faulty phase ended, every node back in service, with no
//     drain of Rancher's left on its plan Secret;
//   - after the finishing tasks, every node at the release's RKE2, no node guarded,
//     Rancher's roll handed back settled (expectRancherSettled).
//
// make test-e2e runs the fixed seeds; make soak runs SAFETY_SEEDS seeds from
// SAFETY_SEED_BASE (the test/safety variables), SAFETY_SEED one; a failing seed writes
// its whole history to GinkgoWriter, and every seed to
// $TMPDIR/rancher-soak/seed-<seed>-<passed|failed>-<start>.log.
var _ = Describe("The Rancher route under randomized endings", testsuite.E2E, Label("rancher-soak"), func() {
	for _, seed := range rancherSoakSeeds() {
		It(fmt.Sprintf("seed %d: settles the cluster after every ending and finishes the job, one node down at a time, nothing restarted outside a NodeUpdate", seed), func() {
			runRancherSoak(seed)
		})
	}
})

// rancherSoakFixedSeeds are the seeds make test-e2e runs: seed 3 deletes the UpgradePlan
// after a node's RKE2 restarted, which left two nodes guarded for good before releaseGuards.
// Seeds 1 and 29, which struck Rancher taking the next node right after a post-drain
// answer, have their own specs ("pauses Rancher's planner before a node's post-drain hook
// is answered", rancher_cells_test.go); make soak runs them.
var rancherSoakFixedSeeds = []int64{3}

// rancherSoakSeeds are the seeds to run: SAFETY_SEED alone, SAFETY_SEEDS from
// SAFETY_SEED_BASE (default 1), or the fixed seeds.
func rancherSoakSeeds() []int64 {
	if s, err := strconv.ParseInt(os.Getenv("SAFETY_SEED"), 10, 64); err == nil {
		return []int64{s}
	}
	n, err := strconv.Atoi(os.Getenv("SAFETY_SEEDS"))
	if err != nil || n <= 0 {
		return rancherSoakFixedSeeds
	}
	base, err := strconv.ParseInt(os.Getenv("SAFETY_SEED_BASE"), 10, 64)
	if err != nil {
		base = 1
	}
	seeds := make([]int64, n)
	for i := range seeds {
		seeds[i] = base + int64(i)
	}
	return seeds
}

// soakRun is one seed's world and its record.
type soakRun struct {
	seed int64
	rng  *rand.Rand
	// silentRng draws the silent agent's ending: a source of its own, so that the seeds'
	// other draws are what they were before it.
	silentRng *rand.Rand
	wl        *testenv.Environment
	c         *harvesterCluster
	planner   *sim.RancherPlanner
	start     time.Time

	stopLifecycle func()

	mu      sync.Mutex
	history []string
	// windows are each node's NodeUpdates, from creation to seen final or deleted (end
	// zero while neither).
	windows map[string][]soakWindow
	// down is each node down now and why; violations what broke an invariant when.
	down       map[string]string
	maxDown    int
	violations []string
	// steps is each NodeUpdate step's last state seen.
	steps map[string]inplacev1.StepState
	// setup says how the seed built its world; struck lists its endings and where.
	setup  string
	struck []string
	// tasks are the tasks created, in order; pending counts those still to be created.
	tasks   []string
	pending int
	// createMu orders the creation of a task still to come with the faulty phase's end
	// (noMoreTasks).
	createMu    sync.Mutex
	noMoreTasks bool
}

type soakWindow struct {
	name       string
	start, end time.Time
}

func (r *soakRun) log(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logLocked(format, args...)
}

func (r *soakRun) logLocked(format string, args ...any) {
	r.history = append(r.history, fmt.Sprintf("%8.3fs  %s", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...)))
}

func (r *soakRun) violate(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violateLocked(format, args...)
}

func (r *soakRun) violateLocked(format string, args ...any) {
	v := fmt.Sprintf(format, args...)
	r.violations = append(r.violations, v)
	r.logLocked("VIOLATION: %s", v)
}

// The endings a seed strikes with.
const (
	soakAbortTask      = "abort the task"
	soakDeleteTask     = "delete the task"
	soakDeletePlan     = "delete the UpgradePlan"
	soakRestartManager = "restart the manager"
	soakFailInstall    = "fail the node's plan, retried by the agent"
	soakSilentAgent    = "stop rancher-system-agent on the node"
)

// silentAgentBound is Rancher's KubernetesUpgrade bound (the HarvesterUpgrader's
// timeouts.kubernetesUpgrade) in the faulty phase of a seed that stops an agent: what
// waits for the silent agent ends after it (an ending holds a node until then, since the
// agent may still apply the plan), as an operator would shorten it from its hour.
const silentAgentBound = 15 * time.Second

var soakEndings = []string{soakAbortTask, soakDeleteTask, soakDeletePlan, soakRestartManager, soakFailInstall}

// soakPoint is a point of a node's Rancher route, seen on its running NodeUpdate, its
// Node and its plan Secret.
type soakPoint struct {
	name string
	at   func(r *soakRun, nu *inplacev1.NodeUpdate, node *corev1.Node, secret *corev1.Secret) bool
}

var soakPoints = []soakPoint{
	{"hooks set, node not yet cordoned", func(_ *soakRun, nu *inplacev1.NodeUpdate, node *corev1.Node, _ *corev1.Secret) bool {
		return nodeupdater.StepState(nu, harvesteradapter.StepRancherPreDrain) == inplacev1.StepStateRunning && !node.Spec.Unschedulable
	}},
	{"cordoned by Rancher, pre-drain not answered", func(_ *soakRun, _ *inplacev1.NodeUpdate, _ *corev1.Node, s *corev1.Secret) bool {
		return rancher.Asked(s, rancher.PreDrainRequest) != "" && !rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook)
	}},
	{"pre-drain answered, plan applying", func(r *soakRun, _ *inplacev1.NodeUpdate, node *corev1.Node, s *corev1.Secret) bool {
		return rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) && r.applying(node.Name)
	}},
	{"RKE2 restarted, post-drain not answered", func(_ *soakRun, _ *inplacev1.NodeUpdate, _ *corev1.Node, s *corev1.Secret) bool {
		return rancher.Asked(s, rancher.PostDrainRequest) != "" && !rancher.Answered(s, rancher.PostDrainRequest, rancher.PostDrainHook)
	}},
	{"post-drain answered", func(_ *soakRun, nu *inplacev1.NodeUpdate, _ *corev1.Node, s *corev1.Secret) bool {
		return rancher.Answered(s, rancher.PostDrainRequest, rancher.PostDrainHook) ||
			nodeupdater.StepState(nu, harvesteradapter.StepRancherPostDrain) == inplacev1.StepStateSucceeded
	}},
	{"OS Job running", func(_ *soakRun, nu *inplacev1.NodeUpdate, _ *corev1.Node, _ *corev1.Secret) bool {
		return nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade) == inplacev1.StepStateRunning
	}},
	{"reboot armed", func(r *soakRun, _ *inplacev1.NodeUpdate, node *corev1.Node, _ *corev1.Secret) bool {
		return r.c.suc.RebootArmed(node.Name)
	}},
	{"node down", func(_ *soakRun, _ *inplacev1.NodeUpdate, node *corev1.Node, _ *corev1.Secret) bool {
		return !sim.NodeReady(node)
	}},
}

// applying says whether rancher-system-agent runs node's install instruction now.
func (r *soakRun) applying(node string) bool {
	for _, a := range r.planner.Applies() {
		if a.Node == node && a.End.IsZero() {
			return true
		}
	}
	return false
}

func runRancherSoak(seed int64) {
	r := &soakRun{seed: seed, rng: rand.New(rand.NewSource(seed)), silentRng: rand.New(rand.NewSource(seed*7919 + 2)),
		start: time.Now(), windows: map[string][]soakWindow{}, down: map[string]string{}, steps: map[string]inplacev1.StepState{}}
	DeferCleanup(r.report)

	cps, workers := 1+r.rng.Intn(3), 1+r.rng.Intn(2)
	jobDuration := []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}[r.rng.Intn(2)]
	install := []time.Duration{20 * time.Millisecond, 300 * time.Millisecond, time.Second}[r.rng.Intn(3)]
	var nodeTimeout time.Duration
	if r.rng.Intn(4) == 0 {
		nodeTimeout = time.Duration(8+r.rng.Intn(12)) * time.Second
	}
	together := r.rng.Intn(2) == 0
	faults := 1 + r.rng.Intn(3)
	// How late Rancher copies fleet-local/local into the RKEControlPlane its planner
	// reads, from a source of its own: the seeds' other draws stay as they were.
	copyDelay := []time.Duration{0, 200 * time.Millisecond, time.Second}[rand.New(rand.NewSource(seed*7919+1)).Intn(3)]
	silent := r.silentRng.Intn(3) == 0
	r.setup = fmt.Sprintf("%d management node(s), %d worker(s), SUC Jobs %s, Rancher's install %s, Rancher's copy into the RKEControlPlane %s, node timeout %s, tasks together %t, silent agent %t",
		cps, workers, jobDuration, install, copyDelay, orDefault(nodeTimeout), together, silent)
	r.log("seed %d: %s, %d ending(s)", seed, r.setup, faults)

	r.wl = startRancherWorkload()
	r.c = newRancherCluster(r.wl, func(s *sim.SUC) { s.JobDuration = jobDuration })
	if nodeTimeout > 0 || silent {
		patch := client.MergeFrom(r.c.config.DeepCopy())
		if nodeTimeout > 0 {
			r.c.config.Spec.Timeouts.Node = &metav1.Duration{Duration: nodeTimeout}
		}
		if silent {
			r.c.config.Spec.Timeouts.KubernetesUpgrade = &metav1.Duration{Duration: silentAgentBound}
		}
		Expect(env.Client.Patch(ctx, r.c.config, patch)).To(Succeed())
	}
	rancherMachines(r.c, cps, workers)
	r.planner = startPlannerWith(r.wl, r.c, nil, func(p *sim.RancherPlanner) { p.InstallDuration, p.CopyDelay = install, copyDelay })
	r.watch()
	r.copyNodeInfo()
	r.stopLifecycle = runLifecycle(r.c, true)
	DeferCleanup(func() { r.stopLifecycle() })

	By("the faulty phase: tasks struck by the seed's endings")
	r.startTasks(together, "1")
	if silent {
		// First, so that the seed's other endings may strike while the agent is silent.
		r.strike(r.silentRng, soakSilentAgent, faults)
	}
	for i := 0; i < faults; i++ {
		r.strike(r.rng, r.soakEnding(), i)
	}
	// The endings play out until the tasks ended or no node moved for a while; then an
	// operator ends what they left running (a workers' task waits for the control plane
	// nodes an aborted control plane task left) and starts no task still to come.
	r.waitQuiet(240 * time.Second)
	r.createMu.Lock()
	r.noMoreTasks = true
	r.createMu.Unlock()
	r.fire(soakAbortTask, "", nil)
	r.waitTasksEnded(300 * time.Second)
	r.clearFailures()
	r.expectEveryNodeInService()

	By("the finishing phase: the failure budget lifted, new tasks finish every node not at the target")
	r.liftFailureBudget()
	r.createMu.Lock()
	r.noMoreTasks = false
	r.createMu.Unlock()
	if nodeTimeout > 0 || silent {
		patch := client.MergeFrom(r.c.config.DeepCopy())
		r.c.config.Spec.Timeouts.Node, r.c.config.Spec.Timeouts.KubernetesUpgrade = nil, nil
		Expect(env.Client.Patch(ctx, r.c.config, patch)).To(Succeed())
	}
	r.startTasks(false, "2")
	r.waitTasksEnded(300 * time.Second)
	for _, name := range r.tasksOf("2") {
		t := &inplacev1.UpgradeTask{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: r.c.ns, Name: name}, t)).To(Succeed())
		Expect(t.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted), "finishing task %s: %s", name, describe(t))
	}
	for _, n := range r.c.nodes {
		Expect(nodeOf(r.wl, n).Status.NodeInfo.KubeletVersion).To(Equal(rancherNewRKE2), "node %s", n)
	}
	expectRancherSettled(r.wl, r.c)
	Eventually(func() []string {
		var guarded []string
		for _, n := range r.c.nodes {
			if r.c.suc.Guarded(n) {
				guarded = append(guarded, n)
			}
		}
		return guarded
	}).WithPolling(100*time.Millisecond).Should(BeEmpty(), "nodes left with the restart guard after the release's RKE2 ran everywhere")
	r.checkRecords()
	r.mu.Lock()
	violations := slices.Clone(r.violations)
	r.mu.Unlock()
	Expect(violations).To(BeEmpty())
}

func orDefault(d time.Duration) string {
	if d == 0 {
		return "default"
	}
	return d.String()
}

// liftFailureBudget lifts the Cluster's failure budget as docs/upgradetask.md tells a
// person to (failure-budget-reset, to the second: a second later than every failure).
func (r *soakRun) liftFailureBudget() {
	GinkgoHelper()
	time.Sleep(time.Second)
	cl := &clusterv1.Cluster{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: r.c.ns, Name: r.c.name}, cl)).To(Succeed())
	patch := client.MergeFrom(cl.DeepCopy())
	cl.Annotations[inplacev1.FailureBudgetResetAnnotation] = time.Now().UTC().Format(time.RFC3339)
	Expect(env.Client.Patch(ctx, cl, patch)).To(Succeed())
	r.log("failure budget lifted")
}

// soakEnding picks an ending.
func (r *soakRun) soakEnding() string { return soakEndings[r.rng.Intn(len(soakEndings))] }

// startTasks creates the control plane's and the workers' tasks, named with suffix:
// together, or the workers' once the control plane's ended.
func (r *soakRun) startTasks(together bool, suffix string) {
	GinkgoHelper()
	cp := r.createTask("cp-"+suffix, func(s *inplacev1.UpgradeTaskSpec) {
		s.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
	})
	workers := func() {
		r.createTask("workers-"+suffix, func(s *inplacev1.UpgradeTaskSpec) {
			s.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "workers"}
		})
	}
	if together {
		workers()
		return
	}
	// The workers' task follows the control plane's, as an operator or the annotation
	// cascade starts it; pending counts it as a task until it is created.
	r.mu.Lock()
	r.pending++
	r.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	go func() {
		defer GinkgoRecover()
		for !r.taskEnded(cp) {
			select {
			case <-wctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		// Under createMu: the faulty phase's end either finds the task created, and
		// aborts it, or keeps it from being created.
		r.createMu.Lock()
		defer r.createMu.Unlock()
		if r.noMoreTasks {
			r.log("the workers' task is not created: the faulty phase ended")
		} else {
			workers()
		}
		r.mu.Lock()
		r.pending--
		r.mu.Unlock()
	}()
}

func (r *soakRun) createTask(name string, ref func(*inplacev1.UpgradeTaskSpec)) string {
	GinkgoHelper()
	t := &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.c.ns, Name: name},
		Spec: inplacev1.UpgradeTaskSpec{ClusterName: r.c.name, Version: rancherNewRKE2,
			UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"}},
	}
	ref(&t.Spec)
	Expect(env.Client.Create(ctx, t)).To(Succeed())
	r.mu.Lock()
	r.tasks = append(r.tasks, name)
	r.logLocked("task %s created", name)
	r.mu.Unlock()
	return name
}

func (r *soakRun) tasksOf(suffix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, t := range r.tasks {
		if strings.HasSuffix(t, "-"+suffix) {
			out = append(out, t)
		}
	}
	return out
}

// taskEnded says whether the task is in a final phase or gone.
func (r *soakRun) taskEnded(name string) bool {
	t := &inplacev1.UpgradeTask{}
	err := env.Client.Get(ctx, client.ObjectKey{Namespace: r.c.ns, Name: name}, t)
	return apierrors.IsNotFound(err) || err == nil && t.Status.Phase.IsFinal()
}

// waitTasksEnded waits until every task created ended and every NodeUpdate is final.
func (r *soakRun) waitTasksEnded(limit time.Duration) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		r.mu.Lock()
		tasks, pending := slices.Clone(r.tasks), r.pending
		r.mu.Unlock()
		g.Expect(pending).To(BeZero(), "a task still to be created")
		for _, t := range tasks {
			g.Expect(r.taskEnded(t)).To(BeTrue(), "task %s still running", t)
		}
		nus := &inplacev1.NodeUpdateList{}
		g.Expect(env.Client.List(ctx, nus, client.InNamespace(r.c.ns))).To(Succeed())
		for _, nu := range nus.Items {
			g.Expect(nu.Status.Phase.IsFinal()).To(BeTrue(), "NodeUpdate %s in phase %q", nu.Name, nu.Status.Phase)
		}
	}, limit, 100*time.Millisecond).Should(Succeed())
	r.log("every task ended")
}

// waitQuiet waits, at most limit, until every task ended or no NodeUpdate ran for 10 s.
func (r *soakRun) waitQuiet(limit time.Duration) {
	deadline, idleSince := time.Now().Add(limit), time.Now()
	for time.Now().Before(deadline) && time.Since(idleSince) < 10*time.Second {
		if r.allEnded() {
			return
		}
		if _, _, running := r.nodeAt(soakPoint{at: func(*soakRun, *inplacev1.NodeUpdate, *corev1.Node, *corev1.Secret) bool { return false }}); running {
			idleSince = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.log("the endings played out")
}

// allEnded says whether every task ended and none is still to be created.
func (r *soakRun) allEnded() bool {
	r.mu.Lock()
	tasks, pending := slices.Clone(r.tasks), r.pending
	r.mu.Unlock()
	if pending > 0 {
		return false
	}
	for _, t := range tasks {
		if !r.taskEnded(t) {
			return false
		}
	}
	return true
}

// strike waits for a point of a node's route (or a random moment) drawn from rng, then
// ends something there.
func (r *soakRun) strike(rng *rand.Rand, ending string, i int) {
	GinkgoHelper()
	if rng.Intn(5) == 0 {
		d := time.Duration(rng.Intn(20000)) * time.Millisecond
		r.log("ending %d (%s) at a random moment, %s from now", i, ending, d)
		r.struck = append(r.struck, ending+" at a random moment")
		time.Sleep(d)
		r.fire(ending, "", nil)
		return
	}
	point := soakPoints[rng.Intn(len(soakPoints))]
	r.log("ending %d (%s) waits for a node at %q", i, ending, point.name)
	// A node's route is a few seconds here: no NodeUpdate running for 10 s (the tasks
	// ended, or wait on nodes an earlier ending left) means no node will get there.
	deadline, idleSince := time.Now().Add(90*time.Second), time.Now()
	for time.Now().Before(deadline) && time.Since(idleSince) < 10*time.Second {
		node, nu, running := r.nodeAt(point)
		if node != "" {
			r.log("node %s at %q (NodeUpdate %s)", node, point.name, nu.Name)
			r.struck = append(r.struck, fmt.Sprintf("%s at %q", ending, point.name))
			r.fire(ending, node, nu)
			return
		}
		if running {
			idleSince = time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.log("no node reached %q: ending %d (%s) strikes now", point.name, i, ending)
	r.struck = append(r.struck, fmt.Sprintf("%s (no node reached %q)", ending, point.name))
	r.fire(ending, "", nil)
}

// nodeAt returns a node whose running NodeUpdate is at point, and the NodeUpdate;
// running says whether any NodeUpdate runs.
func (r *soakRun) nodeAt(point soakPoint) (node string, at *inplacev1.NodeUpdate, running bool) {
	nus := &inplacev1.NodeUpdateList{}
	if env.Client.List(ctx, nus, client.InNamespace(r.c.ns)) != nil {
		return "", nil, true
	}
	for i := range nus.Items {
		nu := &nus.Items[i]
		if nu.Status.Phase.IsFinal() || nu.DeletionTimestamp != nil {
			continue
		}
		running = true
		n := &corev1.Node{}
		if r.wl.Client.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, n) != nil {
			continue
		}
		secret, err := rancher.MachinePlan(ctx, r.wl.Client, n)
		if err != nil || secret == nil {
			continue
		}
		if point.at(r, nu, n, secret) {
			return n.Name, nu, true
		}
	}
	return "", nil, running
}

// fire ends something: the task of nu (or every running task), the cluster's
// UpgradePlan, the manager, node's plan, or node's rancher-system-agent.
func (r *soakRun) fire(ending, node string, nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	switch ending {
	case soakAbortTask, soakDeleteTask:
		for _, name := range r.runningTasks(nu) {
			t := &inplacev1.UpgradeTask{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: r.c.ns, Name: name}, t); err != nil {
				continue
			}
			if ending == soakDeleteTask {
				Expect(client.IgnoreNotFound(env.Client.Delete(ctx, t))).To(Succeed())
				r.log("task %s deleted", name)
				continue
			}
			patch := client.MergeFrom(t.DeepCopy())
			t.Spec.Phase = inplacev1.TaskActionAbort
			Expect(client.IgnoreNotFound(env.Client.Patch(ctx, t, patch))).To(Succeed())
			r.log("task %s aborted", name)
		}
	case soakDeletePlan:
		plans := &harvesterv1.UpgradePlanList{}
		Expect(env.Client.List(ctx, plans, client.InNamespace(r.c.ns))).To(Succeed())
		for i := range plans.Items {
			p := &plans.Items[i]
			patch := client.MergeFrom(p.DeepCopy())
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[annotationAllowDeletion] = "true"
			Expect(client.IgnoreNotFound(env.Client.Patch(ctx, p, patch))).To(Succeed())
			Expect(client.IgnoreNotFound(env.Client.Delete(ctx, p))).To(Succeed())
			r.log("UpgradePlan %s (phase %s) deleted", p.Name, p.Status.Phase)
		}
	case soakRestartManager:
		r.stopLifecycle()
		cellStopPlans(r.c.ns)
		down := time.Duration(r.rng.Intn(2000)) * time.Millisecond
		r.log("manager stopped for %s", down)
		time.Sleep(down)
		r.c.plans = startPlans(r.c.ns, r.c.updater)
		r.stopLifecycle = runLifecycle(r.c, true)
		r.log("manager started")
	case soakFailInstall:
		r.nodeFault(r.rng, node, func(node string) {
			r.planner.FailInstall(node, "failed to pull image rancher/system-agent-installer-rke2:"+strings.ReplaceAll(rancherNewRKE2, "+", "-"))
			r.log("rancher-system-agent fails node %s's plan", node)
		}, func(node string, after time.Duration) {
			r.planner.ClearInstallFailure(node)
			r.log("rancher-system-agent applies node %s's plan again successfully (after %s)", node, after)
		}, "node %s's plan fails until the faulty phase ends")
	case soakSilentAgent:
		r.nodeFault(r.silentRng, node, func(node string) {
			r.planner.StopAgent(node)
			r.log("rancher-system-agent stops on node %s", node)
		}, func(node string, after time.Duration) {
			r.planner.StartAgent(node)
			r.log("rancher-system-agent starts again on node %s (after %s)", node, after)
		}, "rancher-system-agent on node %s stays stopped until the faulty phase's tasks ended")
	}
}

// nodeFault puts a fault on node (one drawn from rng when empty), then, by a draw, takes
// it back a random 0.5 to 8.5 s later or leaves it to the faulty phase's end
// (clearFailures), logging stays with the node's name.
func (r *soakRun) nodeFault(rng *rand.Rand, node string, put func(node string), takeBack func(node string, after time.Duration), stays string) {
	if node == "" {
		node = r.c.nodes[rng.Intn(len(r.c.nodes))]
	}
	put(node)
	if rng.Intn(2) == 0 {
		after := time.Duration(500+rng.Intn(8000)) * time.Millisecond
		go func() {
			time.Sleep(after)
			takeBack(node, after)
		}()
		return
	}
	r.log(stays, node)
}

// runningTasks are the task that started nu, or, without nu, every task not ended.
func (r *soakRun) runningTasks(nu *inplacev1.NodeUpdate) []string {
	if nu != nil && nu.Labels[inplacev1.UpgradeTaskLabel] != "" {
		return []string{nu.Labels[inplacev1.UpgradeTaskLabel]}
	}
	r.mu.Lock()
	tasks := slices.Clone(r.tasks)
	r.mu.Unlock()
	var out []string
	for _, t := range tasks {
		if !r.taskEnded(t) {
			out = append(out, t)
		}
	}
	return out
}

// clearFailures lets every node's plan apply again, and starts every rancher-system-agent
// stopped: as an operator would once the tasks ended. An agent started then applies the
// plan it finds delivered, after its node's update ended.
func (r *soakRun) clearFailures() {
	for _, n := range r.c.nodes {
		r.planner.ClearInstallFailure(n)
		r.planner.StartAgent(n)
	}
}

// expectEveryNodeInService asserts what an ending leaves: every node uncordoned and
// Ready, no drain of Rancher's on its plan Secret.
func (r *soakRun) expectEveryNodeInService() {
	GinkgoHelper()
	for _, n := range r.c.nodes {
		expectNodeSettled(r.wl, n)
		Eventually(func() bool { return sim.NodeReady(nodeOf(r.wl, n)) }).WithPolling(100*time.Millisecond).Should(BeTrue(), "node %s NotReady after every task ended", n)
	}
	r.log("every node in service")
}

// watch records the cluster's nodes going down and back, and its NodeUpdates' lifetimes.
func (r *soakRun) watch() {
	GinkgoHelper()
	wlw, err := client.NewWithWatch(r.wl.Config, client.Options{Scheme: r.wl.Scheme})
	Expect(err).NotTo(HaveOccurred())
	nodes, err := sim.Follow(ctx, wlw, &corev1.NodeList{}, func(ev watch.Event) {
		if n, ok := ev.Object.(*corev1.Node); ok {
			r.observeNode(ev.Type, n)
		}
	}, client.MatchingLabels{labelTestCluster: r.c.name})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(nodes.Stop)
	mw, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	nus, err := sim.Follow(ctx, mw, &inplacev1.NodeUpdateList{}, func(ev watch.Event) {
		if nu, ok := ev.Object.(*inplacev1.NodeUpdate); ok {
			r.observeNodeUpdate(ev.Type, nu)
		}
	}, client.InNamespace(r.c.ns))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(nus.Stop)
}

// copyNodeInfo plays Cluster API's Machine controller for the seed's Machines: each
// Machine's status.nodeInfo follows its Node's (cluster-api v1.14.2
// core/reconcilers/machine/machine_controller_noderef.go:119), which the task controller
// reads as the machine's version. Without it a node upgraded by a NodeUpdate whose task
// was deleted meanwhile (no release annotation written) would look behind for good, and
// the workers' task wait for a control plane that is done.
func (r *soakRun) copyNodeInfo() {
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	DeferCleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			machines := &clusterv1.MachineList{}
			if env.Client.List(cctx, machines, client.InNamespace(r.c.ns)) == nil {
				for i := range machines.Items {
					m := &machines.Items[i]
					node := &corev1.Node{}
					if !m.Status.NodeRef.IsDefined() || r.wl.Client.Get(cctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node) != nil {
						continue
					}
					if m.Status.NodeInfo != nil && *m.Status.NodeInfo == node.Status.NodeInfo {
						continue
					}
					patch := client.MergeFrom(m.DeepCopy())
					m.Status.NodeInfo = &node.Status.NodeInfo
					_ = env.Client.Status().Patch(cctx, m, patch)
				}
			}
			select {
			case <-cctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

func (r *soakRun) observeNode(t watch.EventType, n *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var why []string
	if t != watch.Deleted {
		if n.Spec.Unschedulable {
			why = append(why, "cordoned")
		}
		if !sim.NodeReady(n) {
			why = append(why, "NotReady")
		}
	}
	was := r.down[n.Name]
	now := strings.Join(why, ", ")
	if was == now {
		return
	}
	if now == "" {
		delete(r.down, n.Name)
		r.logLocked("node %s back in service", n.Name)
		return
	}
	r.down[n.Name] = now
	r.logLocked("node %s %s", n.Name, now)
	r.maxDown = max(r.maxDown, len(r.down))
	if len(r.down) > 1 {
		var all []string
		for node, w := range r.down {
			all = append(all, node+" ("+w+")")
		}
		slices.Sort(all)
		r.violateLocked("%d nodes down at once: %s", len(r.down), strings.Join(all, ", "))
	}
}

func (r *soakRun) observeNodeUpdate(t watch.EventType, nu *inplacev1.NodeUpdate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	node := nu.Spec.NodeName
	ws := r.windows[node]
	open := -1
	for i := range ws {
		if ws[i].name == nu.Name && ws[i].end.IsZero() {
			open = i
		}
	}
	now := time.Now()
	if open < 0 && t != watch.Deleted && !nu.Status.Phase.IsFinal() {
		r.windows[node] = append(ws, soakWindow{name: nu.Name, start: now})
		r.logLocked("NodeUpdate %s of node %s (task %s) started", nu.Name, node, nu.Labels[inplacev1.UpgradeTaskLabel])
		return
	}
	if t != watch.Deleted {
		for _, step := range nu.Status.Steps {
			key := nu.Name + "/" + step.Name
			if r.steps[key] != step.State {
				r.steps[key] = step.State
				if step.State != inplacev1.StepStatePending {
					r.logLocked("NodeUpdate %s: %s %s %s", nu.Name, step.Name, step.State, step.Message)
				}
			}
		}
	}
	if open >= 0 && (t == watch.Deleted || nu.Status.Phase.IsFinal()) {
		ws[open].end = now
		r.logLocked("NodeUpdate %s of node %s ended: %s %s", nu.Name, node, nu.Status.Phase, nu.Status.FailureMessage)
	}
}

// within says whether [from, to] lies in a NodeUpdate of node (to zero: still going, so
// the NodeUpdate must still run).
func (r *soakRun) within(node string, from, to time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.windows[node] {
		if w.start.After(from) {
			continue
		}
		if w.end.IsZero() || !to.IsZero() && !w.end.Before(to) {
			return true
		}
	}
	return false
}

// checkRecords checks the simulators' records against the NodeUpdates' lifetimes: every
// RKE2 restart, reboot and Rancher cordon of a node inside a NodeUpdate of that node.
func (r *soakRun) checkRecords() {
	for _, a := range r.planner.Restarts() {
		if !r.within(a.Node, a.Start, a.End) {
			r.violate("Rancher restarted RKE2 on node %s from %s to %s (%s → %s) outside any NodeUpdate of the node", a.Node, r.at(a.Start), r.at(a.End), a.From, a.To)
		}
	}
	for _, n := range r.c.nodes {
		for _, b := range r.c.rec.Reboots(n) {
			if !r.within(n, b.Start, b.End) {
				r.violate("node %s rebooted from %s to %s outside any NodeUpdate of the node", n, r.at(b.Start), r.at(b.End))
			}
		}
	}
	for _, e := range r.planner.HookEvents() {
		if e.Kind == "cordon" && !r.within(e.Node, e.At, e.At) {
			r.violate("Rancher cordoned node %s at %s, which no NodeUpdate asked for", e.Node, r.at(e.At))
		}
	}
}

func (r *soakRun) at(t time.Time) string {
	if t.IsZero() {
		return "(still going)"
	}
	return fmt.Sprintf("%.3fs", t.Sub(r.start).Seconds())
}

// report writes the seed's whole history, with the replay command, to a file, and a
// failed seed's to GinkgoWriter too.
func (r *soakRun) report() {
	failed := CurrentSpecReport().Failed()
	outcome := "passed"
	if failed {
		outcome = "failed"
	}
	r.mu.Lock()
	text := fmt.Sprintf("seed %d "+outcome+"; replay: SAFETY_SEED=%d go test ./harvesteradapter -run TestHarvesterAdapter -count=1 -v -args -ginkgo.label-filter=rancher-soak\nhistory:\n%s\n",
		r.seed, r.seed, strings.Join(r.history, "\n"))
	if failed {
		text += r.state()
	}
	summary := fmt.Sprintf("rancher-soak seed %d %s in %.1fs: %s; endings: %s; %d violation(s)",
		r.seed, outcome, time.Since(r.start).Seconds(), r.setup, strings.Join(r.struck, "; "), len(r.violations))
	r.mu.Unlock()
	// A line per seed on the test's output, for make soak's summary.
	fmt.Println("\n" + summary)
	if failed {
		GinkgoWriter.Print(text)
	}
	dir := filepath.Join(os.TempDir(), "rancher-soak")
	if os.MkdirAll(dir, 0o755) == nil {
		// Named by its outcome and start too: a replay, or another process, keeps it.
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d-%s-%d.log", r.seed, outcome, r.start.Unix())), []byte(text), 0o644)
	}
}

// state says where the seed's tasks, NodeUpdates and UpgradePlans are, for a failed seed.
func (r *soakRun) state() string {
	var b strings.Builder
	b.WriteString("state at the end:\n")
	tasks := &inplacev1.UpgradeTaskList{}
	if err := env.Client.List(ctx, tasks, client.InNamespace(r.c.ns)); err == nil {
		for i := range tasks.Items {
			fmt.Fprintf(&b, "  task %s %s: %s\n", tasks.Items[i].Name, tasks.Items[i].Status.Phase, describe(&tasks.Items[i]))
		}
	}
	nus := &inplacev1.NodeUpdateList{}
	if err := env.Client.List(ctx, nus, client.InNamespace(r.c.ns)); err == nil {
		for _, nu := range nus.Items {
			fmt.Fprintf(&b, "  NodeUpdate %s %s: %s\n", nu.Name, nu.Status.Phase, nu.Status.FailureMessage)
		}
	}
	plans := &harvesterv1.UpgradePlanList{}
	if err := env.Client.List(ctx, plans, client.InNamespace(r.c.ns)); err == nil {
		for _, p := range plans.Items {
			fmt.Fprintf(&b, "  UpgradePlan %s %s: %s\n", p.Name, p.Status.Phase, p.Status.Message)
		}
	}
	// The SUC Jobs that ran on the seed's nodes, and the reboots: what a node's record
	// violation is read against.
	b.WriteString("SUC runs and reboots:\n")
	for _, run := range r.c.rec.Runs() {
		if slices.Contains(r.c.nodes, run.Node) {
			fmt.Fprintf(&b, "  %s on %s (job %s): %s to %s, labelled %s, failed %t %s\n", run.Plan, run.Node, run.Job, r.at(run.Start), r.at(run.End), r.at(run.Labelled), run.Failed, run.Message)
		}
	}
	for _, n := range r.c.nodes {
		for _, rb := range r.c.rec.Reboots(n) {
			fmt.Fprintf(&b, "  reboot of %s: %s to %s\n", n, r.at(rb.Start), r.at(rb.End))
		}
	}
	return b.String()
}
