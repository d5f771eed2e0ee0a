package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// nodePatches is the taint writer's workload client, as the specs see it: every patch of
// a Node is recorded (the node and whether it sends the taint), and patches can be held
// until released. Everything goes to the suite's API server.
type nodePatches struct {
	mu      sync.Mutex
	sent    []string
	hold    chan struct{}
	holding int
	// refuse names a node whose patches are refused (Forbidden), without reaching the
	// API server.
	refuse string
	// nodes, when set, are the only nodes whose patches are held: other tasks on the
	// suite's API server (earlier specs' tasks, which this spec's manager reconciles too)
	// write as usual.
	nodes map[string]bool
	// silent makes a held patch end only with its caller's context, as a workload API
	// server that took the request and never answers: the caller's deadline, or none.
	// A patch its caller gave up is applied when the hold is released (late), as a
	// server that answers again may still carry out what it took.
	silent bool
	late   sync.WaitGroup
	// landed are the late patches, as "node: the API server's answer".
	landed []string
}

func (p *nodePatches) client() client.Client {
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: k8s.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	return interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if n, ok := obj.(*corev1.Node); ok {
				p.mu.Lock()
				tainted := false
				for _, t := range n.Spec.Taints {
					tainted = tainted || t.Key == inplacev1.UpgradePendingTaint
				}
				p.sent = append(p.sent, n.Name+"="+map[bool]string{true: "tainted", false: "untainted"}[tainted])
				hold := p.hold
				if p.nodes != nil && !p.nodes[n.Name] {
					hold = nil
				}
				if hold != nil {
					p.holding++
				}
				refuse, silent := p.refuse, p.silent
				p.mu.Unlock()
				switch {
				case hold != nil && silent:
					select {
					case <-hold:
					case <-ctx.Done():
						// The server took the request: it may still apply it once it
						// answers again, after the caller gave up (with the
						// resourceVersion the patch carries, so only if the node did not
						// change since).
						data, err := patch.Data(obj)
						if err != nil {
							return err
						}
						late, typ := obj.DeepCopyObject().(client.Object), patch.Type()
						p.mu.Lock()
						p.late.Add(1)
						p.mu.Unlock()
						go func() {
							defer p.late.Done()
							<-hold
							err := c.Patch(context.Background(), late, client.RawPatch(typ, data))
							p.mu.Lock()
							p.landed = append(p.landed, fmt.Sprintf("%s: %v", late.GetName(), err))
							p.mu.Unlock()
						}()
						return ctx.Err()
					}
				case hold != nil:
					<-hold
				}
				if n.Name == refuse {
					return apierrors.NewForbidden(corev1.Resource("nodes"), n.Name, errors.New("refused by the spec"))
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
}

func (p *nodePatches) patches() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.sent...)
}

func (p *nodePatches) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holding
}

// nodeSet is the set of the world's nodes (nodePatches.nodes).
func (w *world) nodeSet() map[string]bool {
	set := map[string]bool{}
	for i := range w.machines {
		set[w.node(i)] = true
	}
	return set
}

// taintWriterWorld is a taint writer running on the suite's API server, with nodes of
// its own and a recorder of the retries it asks for.
type taintWriterWorld struct {
	w       *taintWriter
	patches *nodePatches
	nodes   []string
	task    types.NamespacedName
	taint   corev1.Taint
	retries chan types.NamespacedName
	wakes   chan types.NamespacedName
}

func newTaintWriterWorld(nodes int, hold bool) *taintWriterWorld {
	GinkgoHelper()
	suffix := rand.String(5)
	tw := &taintWriterWorld{patches: &nodePatches{}, task: types.NamespacedName{Namespace: "ns-" + suffix, Name: "task"}, retries: make(chan types.NamespacedName, 16), wakes: make(chan types.NamespacedName, 16)}
	tw.taint = corev1.Taint{Key: inplacev1.UpgradePendingTaint, Value: "ns-" + suffix + ".task", Effect: corev1.TaintEffectPreferNoSchedule}
	if hold {
		tw.patches.hold = make(chan struct{})
	}
	for i := range nodes {
		name := "tw-" + suffix + "-" + string(rune('a'+i))
		Expect(fixtures.CreateNode(ctx, k8s, name, true)).To(Succeed())
		tw.nodes = append(tw.nodes, name)
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}))).To(Succeed())
		})
	}
	wc := tw.patches.client()
	tw.w = newTaintWriter(func(context.Context, types.NamespacedName) (client.Client, error) { return wc, nil }, DefaultWorkloadWriteTimeout,
		func(key types.NamespacedName) { tw.retries <- key }, func(key types.NamespacedName) { tw.wakes <- key })
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(tw.w.Start(runCtx)).To(Succeed())
	}()
	Eventually(func() bool { tw.w.mu.Lock(); defer tw.w.mu.Unlock(); return tw.w.ctx != nil }).Should(BeTrue())
	DeferCleanup(func() {
		if tw.patches.hold != nil {
			select {
			case <-tw.patches.hold:
			default:
				close(tw.patches.hold)
			}
		}
		cancel()
		<-done
	})
	return tw
}

// written waits until the writer wrote every hand-over of the task (nothing pending or
// being written), and returns what it wrote. trySettle is not it: it drops a pending
// hand-over.
func (tw *taintWriterWorld) written() map[string]taintWritten {
	GinkgoHelper()
	Eventually(func() bool {
		tw.w.mu.Lock()
		defer tw.w.mu.Unlock()
		_, busy := tw.w.tasks[tw.task]
		return busy
	}).Should(BeFalse())
	written, settled := tw.w.trySettle(tw.task)
	Expect(settled).To(BeTrue())
	return written
}

// read returns the nodes as the API server has them, by name.
func (tw *taintWriterWorld) read() map[string]*corev1.Node {
	GinkgoHelper()
	out := map[string]*corev1.Node{}
	for _, name := range tw.nodes {
		n := &corev1.Node{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
		out[name] = n
	}
	return out
}

func (tw *taintWriterWorld) want(names ...string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

var _ = Describe("The upgrade-pending taint writer", func() {
	It("writes a hand-over off the caller's path: submit returns while the writes are held, trySettle does not wait for them and the task is woken once they are written", func() {
		tw := newTaintWriterWorld(3, true)
		nodes := tw.read()
		returned := make(chan struct{})
		go func() {
			tw.w.submit(tw.task, tw.task, tw.taint, nodes, tw.want(tw.nodes...), nil)
			close(returned)
		}()
		Eventually(returned).Should(BeClosed(), "submit does not wait for the workload cluster")
		Eventually(tw.patches.held).Should(Equal(3), "written side by side (TaintWriteConcurrency)")

		_, settled := tw.w.trySettle(tw.task)
		Expect(settled).To(BeFalse(), "not settled while the writes are in flight")
		Consistently(tw.wakes, 300*time.Millisecond).ShouldNot(Receive(), "no wake while the writes are held")
		close(tw.patches.hold)
		Eventually(tw.wakes).Should(Receive(Equal(tw.task)), "the task is woken once they are written")
		_, settled = tw.w.trySettle(tw.task)
		Expect(settled).To(BeTrue())
		Expect(pendingTainted(tw.nodes...)).To(ConsistOf(tw.nodes), "every node carries the taint once settled")
		Consistently(tw.wakes, 300*time.Millisecond).ShouldNot(Receive(), "woken once")
	})

	It("writes the last hand-over: one submitted while another is written replaces the one pending", func() {
		tw := newTaintWriterWorld(2, true)
		a, b := tw.nodes[0], tw.nodes[1]
		tw.w.submit(tw.task, tw.task, tw.taint, tw.read(), tw.want(a), nil)
		Eventually(tw.patches.held).Should(Equal(1))
		// Pending, then replaced before it is written: b is never tainted.
		tw.w.submit(tw.task, tw.task, tw.taint, tw.read(), tw.want(a, b), nil)
		tw.w.submit(tw.task, tw.task, tw.taint, tw.read(), tw.want(), nil)
		close(tw.patches.hold)
		Eventually(func() bool { _, settled := tw.w.trySettle(tw.task); return settled }).Should(BeTrue())
		// The last hand-over read a untainted (the first write had not ended) and wants
		// it untainted: nothing to write for it; the first write's taint stays for the
		// next reconcile, which reads it.
		Expect(tw.patches.patches()).To(Equal([]string{a + "=tainted"}), "the replaced hand-over wrote nothing")
	})

	It("does not write a node again that the caller's cache shows from before the writer's write, and a task that ends is told to read it again", func() {
		tw := newTaintWriterWorld(1, false)
		n := tw.nodes[0]
		before := tw.read()
		tw.w.submit(tw.task, tw.task, tw.taint, before, tw.want(n), nil)
		written := tw.written()
		Expect(tw.patches.patches()).To(Equal([]string{n + "=tainted"}))

		By("a reconcile whose cache lags hands the node over as it was: not written again")
		tw.w.submit(tw.task, tw.task, tw.taint, before, tw.want(n), nil)
		tw.written()
		Expect(tw.patches.patches()).To(HaveLen(1), "no write that could only conflict")

		By("the task's end, from the lagging cache: the taint it does not see is a conflict, not a node left tainted")
		wc := tw.patches.client()
		err := setPendingTaintNow(ctx, wc, written, before[n], tw.taint, false, DefaultWorkloadWriteTimeout)
		Expect(apierrors.IsConflict(err)).To(BeTrue(), "got %v", err)
		Expect(pendingTainted(n)).To(ConsistOf(n))
		Expect(setPendingTaintNow(ctx, wc, written, before[n], tw.taint, true, DefaultWorkloadWriteTimeout)).To(Succeed(), "already as wanted")
		Expect(tw.patches.patches()).To(HaveLen(1))

		By("from a fresh read it is written")
		Expect(setPendingTaintNow(ctx, wc, written, tw.read()[n], tw.taint, false, DefaultWorkloadWriteTimeout)).To(Succeed())
		Expect(pendingTainted(n)).To(BeEmpty())
	})

	It("asks for the task again when the workload cluster refuses a write, and leaves another task's taint alone", func() {
		tw := newTaintWriterWorld(3, false)
		a, b, c := tw.nodes[0], tw.nodes[1], tw.nodes[2]
		// b carries another task's taint (key and effect are unique on a node).
		other := corev1.Taint{Key: inplacev1.UpgradePendingTaint, Value: "other.task", Effect: corev1.TaintEffectPreferNoSchedule}
		node := &corev1.Node{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: b}, node)).To(Succeed())
		node.Spec.Taints = append(node.Spec.Taints, other)
		Expect(k8s.Update(ctx, node)).To(Succeed())

		tw.patches.mu.Lock()
		tw.patches.refuse = c
		tw.patches.mu.Unlock()
		nodes := tw.read()
		gone := nodes[a].DeepCopy()
		gone.Name = a + "-gone" // a Node that is gone meanwhile: not an error
		nodes[gone.Name] = gone
		tw.w.submit(tw.task, tw.task, tw.taint, nodes, tw.want(a, b, c, gone.Name), nil)
		Eventually(tw.retries).Should(Receive(Equal(tw.task)), "a refused write asks for the task again")
		Expect(tw.patches.patches()).To(ConsistOf(a+"=tainted", gone.Name+"=tainted", c+"=tainted"), "b is not written: another task holds the key")
		Expect(pendingTainted(a, c)).To(ConsistOf(a))
		Consistently(tw.retries, 300*time.Millisecond).ShouldNot(Receive(), "once")

		By("once accepted, the refused node is written; another task's taint is never taken off")
		tw.patches.mu.Lock()
		tw.patches.refuse = ""
		tw.patches.mu.Unlock()
		tw.w.submit(tw.task, tw.task, tw.taint, tw.read(), tw.want(a, b, c), nil)
		tw.written()
		Expect(pendingTainted(a, c)).To(ConsistOf(a, c))
		tw.w.submit(tw.task, tw.task, tw.taint, tw.read(), tw.want(), nil)
		tw.written()
		Expect(pendingTainted(a, c)).To(BeEmpty())
		Expect(k8s.Get(ctx, client.ObjectKey{Name: b}, node)).To(Succeed())
		Expect(node.Spec.Taints).To(ContainElement(other), "b keeps the other task's taint")
		Expect(node.Spec.Taints).NotTo(ContainElement(HaveField("Value", tw.taint.Value)), "and never got this task's")
	})
})

// A task that ends while its taint writes are held by a slow workload cluster: the end
// waits for them, then takes every taint off, and nothing is written after it.
var _ = Describe("An UpgradeTask that ends while its upgrade-pending taint writes are held", func() {
	var (
		patches *nodePatches
		w       *world
	)
	BeforeEach(func() {
		w = newMDWorld(3)
		patches = &nodePatches{hold: make(chan struct{}), nodes: w.nodeSet()}
		DeferCleanup(startReconciler(newManager(), &Reconciler{Workload: SameCluster{Management: patches.client()}, PollInterval: 100 * time.Millisecond}))
		// Before the manager stops (cleanups run last first): it waits for the writes.
		DeferCleanup(func() {
			select {
			case <-patches.hold:
			default:
				close(patches.hold)
			}
		})
		s := simulate(w.ns, time.Hour)
		s.SetAbortDelay(200 * time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(patches.held, timeout, poll).ShouldNot(BeZero(), "the first hand-over's taint writes are held")
	})
	nodes := func() []string { return []string{w.node(0), w.node(1), w.node(2)} }
	expectNoTaintFromNowOn := func() {
		GinkgoHelper()
		Expect(pendingTainted(nodes()...)).To(BeEmpty(), "a task that ended leaves no upgrade-pending taint")
		Consistently(func() []string { return pendingTainted(nodes()...) }, 1500*time.Millisecond, poll).Should(BeEmpty(),
			"nothing the writer held is written after the task ended")
	}

	It("aborted: says Aborting and does not end while the writes are held, then ends Aborted with no node tainted", func() {
		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborting), "the task says it is being aborted while it waits")
		Consistently(w.phaseOf("md"), 1500*time.Millisecond, poll).Should(Equal(inplacev1.TaskPhaseAborting), "the end waits for the held writes")
		close(patches.hold)
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		expectNoTaintFromNowOn()
	})

	It("deleted: is gone once the held writes are done, with no node tainted", func() {
		Expect(k8s.Delete(ctx, w.task("md"))).To(Succeed())
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "md"}, &inplacev1.UpgradeTask{})
		}, time.Second, poll).
			Should(Succeed(), "the deletion waits for the held writes")
		close(patches.hold)
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "md"}, &inplacev1.UpgradeTask{}))
		}, timeout, poll).Should(BeTrue())
		expectNoTaintFromNowOn()
	})
})

// startSilentTask starts a manager whose taint writes go through patches, which holds the
// writes of w's nodes only, and gives each write a second; then the task md of w, whose
// NodeUpdates run for an hour. Cleanups registered before it run after the manager stopped.
func startSilentTask(w *world, patches *nodePatches) {
	GinkgoHelper()
	patches.nodes = w.nodeSet()
	DeferCleanup(startReconciler(newManager(), &Reconciler{Workload: SameCluster{Management: patches.client()}, PollInterval: 100 * time.Millisecond,
		WorkloadWriteTimeout: time.Second}))
	s := simulate(w.ns, time.Hour)
	s.SetAbortDelay(200 * time.Millisecond)
	Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
}

// A workload API server that takes the taint writes and never answers them, then answers
// again: a write is given up after the Reconciler's WorkloadWriteTimeout, so the task's
// end is held only while the server is silent, and ends once it answers, with no node
// tainted. Without a deadline, a write held by a silent connection would hold the end for
// as long as that connection lives, the server answering again or not.
var _ = Describe("An UpgradeTask whose workload cluster goes silent while its taints are written", func() {
	It("aborted: says Aborting while the removals go unanswered, and ends Aborted with no node tainted once the server answers again", func() {
		silence := make(chan struct{})
		DeferCleanup(func() { close(silence) }) // what is still held ends, before the manager stops
		w := newMDWorld(3)
		patches := &nodePatches{silent: true}
		startSilentTask(w, patches)
		nodes := []string{w.node(0), w.node(1), w.node(2)}
		Eventually(func() []string { return pendingTainted(nodes...) }, timeout, poll).ShouldNot(BeEmpty(), "the first hand-over's taints are written")

		By("the server goes silent, and the task is aborted")
		patches.mu.Lock()
		patches.hold = silence
		patches.mu.Unlock()
		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborting))
		Consistently(w.phaseOf("md"), 2500*time.Millisecond, poll).Should(Equal(inplacev1.TaskPhaseAborting), "no taint can be taken off while the server is silent")
		Expect(patches.held()).NotTo(BeZero(), "the removals went unanswered")

		By("the server answers again: writes from now on go through; those it took while silent stay unanswered")
		patches.mu.Lock()
		patches.hold = nil
		patches.mu.Unlock()
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Expect(pendingTainted(nodes...)).To(BeEmpty(), "a task that ended leaves no upgrade-pending taint")
		Consistently(func() []string { return pendingTainted(nodes...) }, 1500*time.Millisecond, poll).Should(BeEmpty())
	})
})

// A write the silent server took may still be carried out after the writer gave it up.
// A task that ended meanwhile must not be left with its taint on a node: the end makes
// every node whose put went unanswered refuse such a late write (a write that moves the
// node's resourceVersion past the one the late patch carries), or takes the taint off if
// it landed first.
var _ = Describe("An UpgradeTask whose taint puts a silent workload cluster carries out after it gave them up", func() {
	It("aborted: no node carries its taint once it ended, whenever the puts it gave up land", func() {
		silence := make(chan struct{})
		var once sync.Once
		answer := func() { once.Do(func() { close(silence) }) }
		w := newMDWorld(3)
		patches := &nodePatches{hold: silence, silent: true}
		DeferCleanup(func() { answer(); patches.late.Wait() })
		startSilentTask(w, patches)
		nodes := []string{w.node(0), w.node(1), w.node(2)}
		Eventually(patches.held, timeout, poll).Should(BeNumerically(">=", 2), "the first hand-over's puts go unanswered")
		Expect(pendingTainted(nodes...)).To(BeEmpty())

		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Or(Equal(inplacev1.TaskPhaseAborting), Equal(inplacev1.TaskPhaseAborted)))

		By("the server answers again, and carries out the puts it took")
		patches.mu.Lock()
		patches.hold = nil
		patches.mu.Unlock()
		answer()
		patches.late.Wait()
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Consistently(func() []string { return pendingTainted(nodes...) }, 2*time.Second, poll).Should(BeEmpty(),
			"a put the writer gave up landed on a node after its task ended (late patches: %v)", patches.landed)
	})
})

// An upgrade-pending taint that no task that has not ended carries (a task deleted while
// its workload cluster could not be reached leaves its taints; so can a put carried out
// after its task ended, which a restarted manager could not fence) is taken off by the
// next task that runs on the cluster; a taint of another task that runs stays.
var _ = Describe("Upgrade-pending taints of tasks that ended or are gone", func() {
	It("are taken off by the next task on the workload cluster, which taints those nodes itself; another running task's stay", func() {
		w := newMDWorld(3)
		taintValues := func(node string) []string {
			n := &corev1.Node{}
			Expect(k8s.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
			var out []string
			for _, t := range n.Spec.Taints {
				if t.Key == inplacev1.UpgradePendingTaint {
					out = append(out, t.Value)
				}
			}
			return out
		}
		setTaint := func(node, value string) {
			n := &corev1.Node{}
			Expect(k8s.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
			patch := client.MergeFrom(n.DeepCopy())
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: inplacev1.UpgradePendingTaint, Value: value, Effect: corev1.TaintEffectPreferNoSchedule})
			Expect(k8s.Patch(ctx, n, patch)).To(Succeed())
		}
		By("a taint of a task that is gone, and one of a task of another namespace that has not ended")
		setTaint(w.node(0), "gone-"+w.ns+".old-task")
		otherNS := "other-" + w.ns
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: otherNS}})).To(Succeed())
		// Of a Cluster that does not exist: it never ends, and never reaches these nodes.
		other := w.mdTask("running", func(t *inplacev1.UpgradeTask) {
			t.Namespace, t.Spec.ClusterName, t.Labels = otherNS, "elsewhere", nil
		})
		Expect(k8s.Create(ctx, other)).To(Succeed())
		otherValue := pendingTaint(other).Value
		setTaint(w.node(2), otherValue)

		DeferCleanup(startReconciler(newManager(), &Reconciler{Workload: SameCluster{Management: k8s}, PollInterval: 100 * time.Millisecond}))
		simulate(w.ns, time.Hour)
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		own := pendingTaint(w.task("md")).Value
		Eventually(func() []string { return taintValues(w.node(0)) }, timeout, poll).Should(Equal([]string{own}),
			"the gone task's taint is taken off, and the node still to go carries the running task's own")
		Eventually(func() []string { return taintValues(w.node(1)) }, timeout, poll).Should(Equal([]string{own}))
		Consistently(func() []string { return taintValues(w.node(2)) }, time.Second, poll).Should(Equal([]string{otherValue}),
			"the taint of a task that has not ended is not taken off")
	})
})
