package upgradetask

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// machinePatch is one patch of a Machine the machine writer sent, as the tests see it.
type machinePatch struct {
	machine string
	// status is true for a patch of the status subresource (the condition), false for a
	// patch of the Machine itself (the claim label, the release annotation).
	status bool
	// claim is the claim label a patch of the Machine sent.
	claim string
	// message is the message of our condition a status patch sent.
	message string
	// err is the answer (nil while not answered yet, or when it succeeded).
	err        error
	answeredAt time.Time
}

// machinePatches is the machine writer's client, as the tests see it: every patch of a
// Machine it sends is recorded; the first can be held until released, and the first can
// be failed without reaching the API server. Everything else goes to the API server
// untouched.
type machinePatches struct {
	mu   sync.Mutex
	sent []machinePatch

	// holdFirst, when set, holds the first holdN patches until it is closed (then sends
	// them, or fails the first with failFirst); firstHeld is closed once they are all
	// held, and heldMachine names the Machine of the first. The hold does not end with
	// the request's context: a spec sees the writer wait for a write in flight when it
	// stops.
	holdFirst   chan struct{}
	firstHeld   chan struct{}
	holdN       int
	heldCount   int
	heldMachine string
	// failFirst, when set, is the answer to the first patch, which then does not reach
	// the API server.
	failFirst error
}

func (p *machinePatches) client(c client.WithWatch) client.Client {
	return interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return p.record(obj, false, func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if sub != "status" {
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			}
			return p.record(obj, true, func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
	})
}

func (p *machinePatches) record(obj client.Object, status bool, send func() error) error {
	m, ok := obj.(*clusterv1.Machine)
	if !ok {
		return send()
	}
	sent := machinePatch{machine: m.Name, status: status}
	if status {
		if c := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition); c != nil {
			sent.message = c.Message
		}
	} else {
		sent.claim = m.Labels[inplacev1.UpgradeTaskLabel]
	}
	p.mu.Lock()
	i := len(p.sent)
	p.sent = append(p.sent, sent)
	hold := p.holdFirst != nil && i < p.holdN
	if hold {
		if i == 0 {
			p.heldMachine = m.Name
		}
		p.heldCount++
		if p.heldCount == p.holdN {
			close(p.firstHeld)
		}
	}
	p.mu.Unlock()
	if hold {
		select {
		case <-p.holdFirst:
		case <-time.After(30 * time.Second): // never held for good, should a spec not release it
		}
	}
	var err error
	if i == 0 && p.failFirst != nil {
		err = p.failFirst
	} else {
		err = send()
	}
	p.mu.Lock()
	p.sent[i].err = err
	p.sent[i].answeredAt = time.Now()
	p.mu.Unlock()
	return err
}

// hold holds the first patch until release is called.
func (p *machinePatches) hold() (release func()) { return p.holdMany(1) }

// holdMany holds the first n patches until release is called.
func (p *machinePatches) holdMany(n int) (release func()) {
	p.holdN = n
	p.holdFirst = make(chan struct{})
	p.firstHeld = make(chan struct{})
	var once sync.Once
	return func() { once.Do(func() { close(p.holdFirst) }) }
}

func (p *machinePatches) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent)
}

func (p *machinePatches) patches() []machinePatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sent)
}

func (p *machinePatches) held() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heldMachine
}

// messagesSent are the condition messages the status patches sent, in order.
func (p *machinePatches) messagesSent() []string {
	var out []string
	for _, s := range p.patches() {
		if s.status {
			out = append(out, s.message)
		}
	}
	return out
}

// claimCall is one call of the machine writer's claimed callback.
type claimCall struct {
	task  types.NamespacedName
	uid   types.UID
	names []string
}

// claimCalls records the machine writer's claimed callback.
type claimCalls struct {
	mu    sync.Mutex
	calls []claimCall
}

func (c *claimCalls) claimed(task *inplacev1.UpgradeTask, names []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, claimCall{task: client.ObjectKeyFromObject(task), uid: task.UID, names: slices.Clone(names)})
}

func (c *claimCalls) all() []claimCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// namesClaimed are every machine any call named.
func (c *claimCalls) namesClaimed() []string {
	var out []string
	for _, call := range c.all() {
		out = append(out, call.names...)
	}
	return out
}

// retryCalls records the machine writer's retry callback, with when it was called.
type retryCalls struct {
	mu   sync.Mutex
	keys []types.NamespacedName
	at   []time.Time
}

func (r *retryCalls) retry(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	r.at = append(r.at, time.Now())
}

func (r *retryCalls) asked() []types.NamespacedName {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.keys)
}

func (r *retryCalls) askedAt() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

var _ = Describe("machine writer", func() {
	var (
		w       *world
		task    *inplacev1.UpgradeTask
		key     types.NamespacedName
		patches *machinePatches
		claims  *claimCalls
		asked   *retryCalls
		rec     *Reconciler
		mw      *machineWriter
		// writeCalls counts the calls of the writer's write func.
		writeCalls atomic.Int32
	)

	// stored reads a Machine from the API server, not from a cache.
	stored := func(name string) *clusterv1.Machine {
		GinkgoHelper()
		m := &clusterv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, m)).To(Succeed())
		return m
	}
	claimOf := func(m *clusterv1.Machine) string { return m.Labels[inplacev1.UpgradeTaskLabel] }
	messageOf := func(m *clusterv1.Machine) string {
		if c := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition); c != nil {
			return c.Message
		}
		return ""
	}
	storedClaim := func(name string) func() string {
		return func() string { return claimOf(stored(name)) }
	}
	storedMessage := func(name string) func() string {
		return func() string { return messageOf(stored(name)) }
	}
	namesOf := func(machines []*clusterv1.Machine) []string {
		var out []string
		for _, m := range machines {
			out = append(out, m.Name)
		}
		return out
	}
	membersOf := func(machines ...*clusterv1.Machine) []*member {
		out := make([]*member, len(machines))
		for i, m := range machines {
			out[i] = &member{name: m.Name, machine: m}
		}
		return out
	}
	// waiting wants every member claimed and Waiting with message.
	waiting := func(message string) func(*member) machineWant {
		return func(*member) machineWant {
			return machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.WaitingReason, message)}
		}
	}
	// perMachine wants every member claimed and Waiting with a message of its own.
	perMachine := func(mem *member) machineWant {
		return machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.WaitingReason, "queued: "+mem.name)}
	}
	claimValue := upgraderequest.LabelValue("task-a")

	// newWriter builds the writer as SetupWithManager does, on a reconciler whose client
	// goes through patches to the real API server.
	newWriter := func() *machineWriter {
		GinkgoHelper()
		base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme, Mapper: k8s.RESTMapper()})
		Expect(err).NotTo(HaveOccurred())
		r := &Reconciler{Client: patches.client(base)}
		rec = r
		write := func(ctx context.Context, m *clusterv1.Machine, want machineWant, task *inplacev1.UpgradeTask) error {
			writeCalls.Add(1)
			return r.writeMachine(ctx, m, want, task)
		}
		return newMachineWriter(write,
			func(m *clusterv1.Machine, task *inplacev1.UpgradeTask) *clusterv1.Machine {
				return r.writtenMachines.latest(m, upgraderequest.LabelValue(task.Name), time.Now())
			},
			claims.claimed, asked.retry)
	}
	// startWriter starts the writer as the manager does; stop cancels its context, and
	// done is closed once Start returned.
	startWriter := func(mw *machineWriter) (stop func(), done chan struct{}) {
		wctx, cancel := context.WithCancel(ctx)
		done = make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			Expect(mw.Start(wctx)).To(Succeed())
		}()
		DeferCleanup(func() {
			cancel()
			Eventually(done).Should(BeClosed(), "Start must return once its context is cancelled")
		})
		return cancel, done
	}
	// settled waits, as a reconcile of task A does, until no write of the machines is in
	// flight.
	settled := func(machines ...*clusterv1.Machine) []*clusterv1.Machine {
		GinkgoHelper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := mw.settle(sctx, task, machines)
		Expect(err).NotTo(HaveOccurred())
		return out
	}

	// busyWorkers takes every worker's turn with a held write of one of the first
	// MachineWriteConcurrency Machines (busy) and returns the Machine left (last), whose
	// write then waits for its turn until release.
	busyWorkers := func() (busy []*clusterv1.Machine, last *clusterv1.Machine, release func()) {
		GinkgoHelper()
		n := MachineWriteConcurrency
		release = patches.holdMany(n)
		DeferCleanup(release)
		for _, m := range w.machines[:n] {
			busy = append(busy, stored(m.Name))
		}
		last = stored(w.machines[n].Name)
		mw.submit(task, membersOf(busy...), waiting("busy"))
		Eventually(patches.firstHeld).Should(BeClosed(), "every turn is taken by a held write")
		return busy, last, release
	}

	BeforeEach(func() {
		// One machine more than the writes the writer makes at once.
		w = newMDWorld(MachineWriteConcurrency + 1)
		writeCalls.Store(0)
		Expect(k8s.Create(ctx, w.mdTask("task-a"))).To(Succeed())
		task = w.task("task-a")
		key = client.ObjectKeyFromObject(task)
		patches = &machinePatches{}
		claims = &claimCalls{}
		asked = &retryCalls{}
		mw = newWriter()
	})

	Context("started", func() {
		BeforeEach(func() { startWriter(mw) })

		// submit hands the writes over and returns: the reconcile does not wait for them.
		// Every member's Machine ends up claimed with the condition its want says, one
		// claimed callback names all the machines the hand-over claimed, and settle then
		// returns the Machines as the API server stores them.
		It("writes every member's Machine in the background, reports the batch's claims once, and settles on what is stored", func() {
			release := patches.hold()
			DeferCleanup(release)
			var read []*clusterv1.Machine
			var names []string
			for _, m := range w.machines {
				read = append(read, stored(m.Name))
				names = append(names, m.Name)
			}

			mw.submit(task, membersOf(read...), perMachine)
			// submit returned, and a patch it handed over is held at the client: it did
			// not wait for the writes.
			Eventually(patches.firstHeld).Should(BeClosed(), "the writes begin once handed over")
			held := patches.held()
			Expect(storedClaim(held)()).To(BeEmpty(), "the held write has not reached the API server")
			Expect(claims.all()).To(BeEmpty(), "the batch's claims are reported once all its writes ended")

			release()
			for _, name := range names {
				Eventually(storedClaim(name)).WithPolling(20*time.Millisecond).Should(Equal(claimValue), "machine %s is claimed", name)
				Eventually(storedMessage(name)).WithPolling(20*time.Millisecond).Should(Equal("queued: "+name), "machine %s has its own condition", name)
				c := meta.FindStatusCondition(stored(name).Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
				Expect(c.Status).To(Equal(metav1.ConditionFalse))
				Expect(c.Reason).To(Equal(inplacev1.WaitingReason))
			}

			Eventually(claims.all).WithPolling(10 * time.Millisecond).Should(HaveLen(1))
			Consistently(claims.all, 300*time.Millisecond, 50*time.Millisecond).Should(HaveLen(1), "one call for the hand-over")
			call := claims.all()[0]
			Expect(call.task).To(Equal(key))
			Expect(call.uid).To(Equal(task.UID))
			Expect(call.names).To(ConsistOf(names), "the call names every machine the hand-over claimed")

			// settle starts from the Machines as read before the writes and returns them as
			// last written: at the resourceVersion the API server stores.
			got := settled(read...)
			Expect(got).To(HaveLen(len(read)))
			for i, m := range got {
				now := stored(names[i])
				Expect(m.Name).To(Equal(names[i]))
				Expect(m.ResourceVersion).To(Equal(now.ResourceVersion), "machine %s as last written", names[i])
				Expect(claimOf(m)).To(Equal(claimValue))
				Expect(messageOf(m)).To(Equal("queued: " + names[i]))
			}

			// Two patches per machine (claim, then condition), none conflicted.
			Expect(patches.count()).To(Equal(2 * len(names)))
			for _, p := range patches.patches() {
				Expect(p.err).NotTo(HaveOccurred())
			}
			Expect(mw.takeError(key)).To(Succeed())
			Expect(asked.asked()).To(BeEmpty())
		})

		// A reconcile hands every machine of a task over on every round; those that
		// already carry what is wanted, with no write of them pending, cost no request.
		It("writes nothing for members that already carry what is wanted", func() {
			want := waiting("queued")
			// Bring every machine to what is wanted directly in the API server.
			for _, m := range w.machines {
				cur := stored(m.Name)
				orig := cur.DeepCopy()
				cur.Labels[inplacev1.UpgradeTaskLabel] = claimValue
				Expect(k8s.Patch(ctx, cur, client.MergeFrom(orig))).To(Succeed())
				orig = cur.DeepCopy()
				meta.SetStatusCondition(&cur.Status.Conditions, *want(nil).condition)
				Expect(k8s.Status().Patch(ctx, cur, client.MergeFrom(orig))).To(Succeed())
			}
			var read []*clusterv1.Machine
			for _, m := range w.machines {
				read = append(read, stored(m.Name))
			}

			mw.submit(task, membersOf(read...), want)
			Consistently(patches.count, 500*time.Millisecond, 20*time.Millisecond).Should(BeZero(), "no patch for up-to-date machines")
			Expect(writeCalls.Load()).To(BeZero(), "no write is even handed to writeMachine")
			Expect(claims.all()).To(BeEmpty(), "nothing claimed, nothing reported")
			for i, m := range settled(read...) {
				Expect(m.ResourceVersion).To(Equal(read[i].ResourceVersion), "machine %s untouched", m.Name)
				Expect(stored(m.Name).ResourceVersion).To(Equal(read[i].ResourceVersion))
			}

			// The writer is live: a member that differs is written, and only it.
			mw.submit(task, membersOf(read...), func(mem *member) machineWant {
				if mem.name == read[1].Name {
					return waiting("changed")(mem)
				}
				return want(mem)
			})
			Eventually(storedMessage(read[1].Name)).WithPolling(20 * time.Millisecond).Should(Equal("changed"))
			settled(read...)
			Expect(patches.patches()).To(HaveLen(1))
			Expect(patches.patches()[0].machine).To(Equal(read[1].Name))
			Expect(patches.patches()[0].status).To(BeTrue(), "the claim was there already: only the condition is patched")
			Expect(claims.all()).To(BeEmpty(), "the machine was claimed already")
			Expect(asked.asked()).To(BeEmpty())
		})

		// While a write of a Machine is in flight, later hand-overs for it replace one
		// another: only the last is written, after the write in flight, from the Machine
		// as that write left it (no conflict).
		It("writes the last hand-over for a Machine and never the ones it replaced", func() {
			release := patches.hold()
			DeferCleanup(release)
			m := stored(w.machines[0].Name)

			mw.submit(task, membersOf(m), waiting("first"))
			Eventually(patches.firstHeld).Should(BeClosed())
			// Handed over with the Machine as read before the first write, as a reconcile
			// whose cache is behind does.
			mw.submit(task, membersOf(m.DeepCopy()), waiting("second"))
			mw.submit(task, membersOf(m.DeepCopy()), waiting("third"))
			Expect(storedMessage(m.Name)()).To(BeEmpty(), "nothing landed while the first write is held")

			release()
			Eventually(storedMessage(m.Name)).WithPolling(20*time.Millisecond).Should(Equal("third"), "the last hand-over is stored")
			settled(m)
			Consistently(storedMessage(m.Name), 300*time.Millisecond, 50*time.Millisecond).Should(Equal("third"))
			Expect(storedClaim(m.Name)()).To(Equal(claimValue))

			Expect(patches.messagesSent()).To(Equal([]string{"first", "third"}), "the replaced hand-over is never sent")
			sent := patches.patches()
			Expect(sent).To(HaveLen(3), "claim, first condition, last condition")
			for _, p := range sent {
				Expect(p.err).NotTo(HaveOccurred(), "each write starts from the Machine as last written: %+v", p)
			}
			Expect(claims.all()).To(HaveLen(1), "only the first hand-over claimed the machine")
			Expect(claims.all()[0].names).To(Equal([]string{m.Name}))
			Expect(mw.takeError(key)).To(Succeed())
			Expect(asked.asked()).To(BeEmpty())
		})

		// A write waiting for its turn (MachineWriteConcurrency writes are in flight, of
		// other Machines) has not begun: a later hand-over for its Machine replaces it.
		It("replaces a write waiting for its turn with a later hand-over", func() {
			n := MachineWriteConcurrency
			busy, last, release := busyWorkers()
			mw.submit(task, membersOf(last), waiting("first"))
			mw.submit(task, membersOf(last.DeepCopy()), waiting("second"))
			Consistently(patches.count, 300*time.Millisecond, 20*time.Millisecond).Should(Equal(n), "the last Machine waits for its turn")

			release()
			Eventually(storedMessage(last.Name)).WithPolling(20 * time.Millisecond).Should(Equal("second"))
			settled(append(busy, last)...)
			for _, p := range patches.patches() {
				if p.machine == last.Name && p.status {
					Expect(p.message).To(Equal("second"), "the hand-over replaced while waiting for its turn is never sent")
				}
			}
			Expect(claims.all()).To(HaveLen(2), "one call per hand-over that claimed: the busy batch, then the last one")
			Expect(claims.namesClaimed()).To(ConsistOf(append(namesOf(busy), last.Name)))
		})

		// settle drops a write waiting for its turn and has nothing to wait for: the writes
		// in flight are of other Machines.
		It("settles a Machine whose write waits for its turn without waiting for other Machines' writes", func() {
			busy, last, release := busyWorkers()
			mw.submit(task, membersOf(last), waiting("pending"))

			done := make(chan []*clusterv1.Machine, 1)
			go func() {
				defer GinkgoRecover()
				out, err := mw.settle(ctx, task, []*clusterv1.Machine{last.DeepCopy()})
				Expect(err).NotTo(HaveOccurred())
				done <- out
			}()
			var got []*clusterv1.Machine
			Eventually(done).Should(Receive(&got), "settle returns while the other Machines' writes are held")
			Expect(got[0].ResourceVersion).To(Equal(last.ResourceVersion))

			release()
			settled(append(busy, last)...)
			Consistently(storedMessage(last.Name), 300*time.Millisecond, 50*time.Millisecond).Should(BeEmpty(), "the dropped write is never sent")
			Expect(claims.namesClaimed()).To(ConsistOf(namesOf(busy)))
		})

		// The claim is what keeps two tasks from starting the same machine: a claim handed
		// over with a Machine read before another task claimed it must conflict, never
		// overwrite the other task's claim. A conflict is no error: the task is reconciled
		// again a moment later, from what its cache shows then.
		It("never takes a Machine another task claimed meanwhile", func() {
			m := stored(w.machines[0].Name)
			Expect(claimOf(m)).To(BeEmpty())
			other := upgraderequest.LabelValue("task-b")
			byOther := m.DeepCopy()
			byOther.Labels[inplacev1.UpgradeTaskLabel] = other
			Expect(k8s.Patch(ctx, byOther, client.MergeFrom(m))).To(Succeed())

			mw.submit(task, membersOf(m), waiting("queued"))
			Eventually(asked.asked).WithPolling(10*time.Millisecond).Should(Equal([]types.NamespacedName{key}), "a reconcile of task A is asked for")

			sent := patches.patches()
			Expect(sent).To(HaveLen(1), "the claim was sent once, and the condition never")
			Expect(sent[0].status).To(BeFalse())
			Expect(sent[0].claim).To(Equal(claimValue))
			Expect(apierrors.IsConflict(sent[0].err)).To(BeTrue(), "the API server refused the stale claim: %v", sent[0].err)
			Expect(asked.askedAt()[0].Sub(sent[0].answeredAt)).To(BeNumerically(">=", machineConflictRetry),
				"the reconcile is asked for once the cache had time to show the other write")

			Consistently(storedClaim(m.Name), 300*time.Millisecond, 50*time.Millisecond).Should(Equal(other), "the other task keeps its claim")
			Expect(storedMessage(m.Name)()).To(BeEmpty())
			Expect(patches.count()).To(Equal(1), "the writer does not try again by itself")
			Expect(mw.takeError(key)).To(Succeed(), "a conflict is not an error")
			Expect(claims.namesClaimed()).NotTo(ContainElement(m.Name))
			Expect(asked.asked()).To(HaveLen(1))
		})

		// A Machine deleted meanwhile is no error either: the task is reconciled again.
		It("drops the write of a Machine deleted meanwhile, without an error", func() {
			m := stored(w.machines[0].Name)
			Expect(k8s.Delete(ctx, m.DeepCopy())).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(m), &clusterv1.Machine{}))
			}).WithPolling(20 * time.Millisecond).Should(BeTrue())

			mw.submit(task, membersOf(m), waiting("queued"))
			Eventually(asked.asked).WithPolling(10 * time.Millisecond).Should(Equal([]types.NamespacedName{key}))
			sent := patches.patches()
			Expect(sent).To(HaveLen(1))
			Expect(apierrors.IsNotFound(sent[0].err)).To(BeTrue(), "the API server found the Machine gone: %v", sent[0].err)
			Expect(asked.askedAt()[0].Sub(sent[0].answeredAt)).To(BeNumerically(">=", machineConflictRetry))
			Expect(mw.takeError(key)).To(Succeed(), "a Machine gone is not an error")
			Expect(claims.all()).To(BeEmpty())
		})

		// The same safety when the other task's claim was written by this manager (two
		// tasks of one target reconciled at once share the reconciler): task B's reconcile
		// claims M, for a node it starts, after task A's reconcile read M unclaimed and
		// handed a claim of it over. A's write starts from the Machine as A read it, not as
		// B's write left it (writtenMachines.latest only skips ahead over A's own writes),
		// so it conflicts as above and B keeps M.
		It("never takes a Machine another task claimed meanwhile through this manager", func() {
			m := stored(w.machines[0].Name)
			Expect(claimOf(m)).To(BeEmpty())
			Expect(k8s.Create(ctx, w.mdTask("task-b"))).To(Succeed())
			taskB := w.task("task-b")
			other := upgraderequest.LabelValue("task-b")
			// B's reconcile claims M itself before it starts M's node, as reconcileOngoing does.
			Expect(rec.writeMachine(ctx, m.DeepCopy(), machineWant{claim: true}, taskB)).To(Succeed())
			Expect(storedClaim(m.Name)()).To(Equal(other))

			// A's reconcile read M before B's claim and hands a claim of it over.
			mw.submit(task, membersOf(m), waiting("queued"))
			Eventually(func() int { return len(patches.patches()) }).WithPolling(10 * time.Millisecond).Should(BeNumerically(">=", 2))
			settled(m)
			Expect(storedClaim(m.Name)()).To(Equal(other), "task B keeps its claim; patches sent: %+v", patches.patches())
			Expect(claims.namesClaimed()).NotTo(ContainElement(m.Name))
		})

		// The same through settle, on the path that starts a node: reconcileOngoing settles
		// the picked machines, then claims each one it does not hold yet (and creates its
		// NodeUpdate). Task A picked M from a read before task B (same manager) claimed it;
		// settle must not hand A the Machine as B wrote it, or A's claim goes through and
		// two tasks start the same node.
		It("does not hand back another task's claim as the base of a claim", func() {
			m := stored(w.machines[0].Name)
			Expect(k8s.Create(ctx, w.mdTask("task-b"))).To(Succeed())
			taskB := w.task("task-b")
			other := upgraderequest.LabelValue("task-b")
			Expect(rec.writeMachine(ctx, m.DeepCopy(), machineWant{claim: true}, taskB)).To(Succeed())

			picked := membersOf(m.DeepCopy())
			got := settled(picked[0].machine)
			picked[0].machine = got[0]
			settledRV, settledClaim := got[0].ResourceVersion, claimOf(got[0])
			Expect(picked[0].isClaimed(task)).To(BeFalse())
			err := rec.writeMachine(ctx, picked[0].machine, machineWant{claim: true}, task)
			Expect(storedClaim(m.Name)()).To(Equal(other), "task B keeps its claim (A's claim write returned %v; settle returned M at %s claimed by %q, read at %s)",
				err, settledRV, settledClaim, m.ResourceVersion)
			Expect(apierrors.IsConflict(err)).To(BeTrue(), "A's claim conflicts: %v", err)
		})

		// Another failure of a write is kept for the task's next reconcile, which gets it
		// once, and a reconcile is asked for at once.
		It("returns a failed write's error once and asks for a reconcile", func() {
			injected := apierrors.NewInternalError(errors.New("injected: etcd is unavailable"))
			patches.failFirst = injected
			m := stored(w.machines[0].Name)

			mw.submit(task, membersOf(m), waiting("queued"))
			Eventually(asked.asked).WithPolling(10 * time.Millisecond).Should(Equal([]types.NamespacedName{key}))
			err := mw.takeError(key)
			Expect(err).To(MatchError(injected))
			Expect(apierrors.IsConflict(err)).To(BeFalse())
			Expect(mw.takeError(key)).To(Succeed(), "the error is returned once")
			Expect(mw.takeError(types.NamespacedName{Namespace: w.ns, Name: "task-b"})).To(Succeed(), "and only to its task")

			Expect(storedClaim(m.Name)()).To(BeEmpty(), "the failed write did not reach the API server")
			Expect(claims.all()).To(BeEmpty())
			settled(m)
			Expect(patches.count()).To(Equal(1), "the writer does not try again by itself")

			// The next reconcile hands it over again: written.
			mw.submit(task, membersOf(stored(m.Name)), waiting("queued"))
			Eventually(storedMessage(m.Name)).WithPolling(20 * time.Millisecond).Should(Equal("queued"))
			Expect(storedClaim(m.Name)()).To(Equal(claimValue))
			Eventually(claims.namesClaimed).WithPolling(10 * time.Millisecond).Should(Equal([]string{m.Name}))
			Expect(mw.takeError(key)).To(Succeed())
			Expect(asked.asked()).To(HaveLen(1))
		})

		// settle is how a reconcile takes a Machine back before it writes it itself: the
		// pending write is dropped, the one in flight is waited for, and the Machine comes
		// back as that write left it.
		It("settles: drops the pending write, waits for the one in flight, returns the Machine as last written", func() {
			release := patches.hold()
			DeferCleanup(release)
			m := stored(w.machines[0].Name)

			mw.submit(task, membersOf(m), waiting("in flight"))
			Eventually(patches.firstHeld).Should(BeClosed())
			mw.submit(task, membersOf(m.DeepCopy()), waiting("pending"))

			type settledResult struct {
				machines []*clusterv1.Machine
				err      error
			}
			result := make(chan settledResult, 1)
			go func() {
				out, err := mw.settle(ctx, task, []*clusterv1.Machine{m.DeepCopy()})
				result <- settledResult{out, err}
			}()
			Consistently(result, 300*time.Millisecond, 20*time.Millisecond).ShouldNot(Receive(), "settle waits for the write in flight")

			release()
			var res settledResult
			Eventually(result).Should(Receive(&res))
			Expect(res.err).NotTo(HaveOccurred())
			Expect(res.machines).To(HaveLen(1))
			now := stored(m.Name)
			Expect(res.machines[0].ResourceVersion).To(Equal(now.ResourceVersion), "the Machine as last written")
			Expect(claimOf(res.machines[0])).To(Equal(claimValue))
			Expect(messageOf(res.machines[0])).To(Equal("in flight"))
			Expect(messageOf(now)).To(Equal("in flight"))

			Consistently(patches.messagesSent, 300*time.Millisecond, 50*time.Millisecond).Should(Equal([]string{"in flight"}), "the pending write is never sent")
			Expect(storedMessage(m.Name)()).To(Equal("in flight"))
			Expect(claims.all()).To(HaveLen(1), "the write in flight claimed the machine; the dropped one claimed nothing")
			Expect(mw.takeError(key)).To(Succeed())
			Expect(asked.asked()).To(BeEmpty())
		})
	})

	Context("started, settling a task", func() {
		BeforeEach(func() { startWriter(mw) })

		// settleTask is how a task that ends or goes away takes back every write it handed
		// over, of any Machine: it waits for those in flight and drops those waiting, so no
		// claim is written for a task after its end. Another task's writes go on.
		It("waits for the task's writes in flight, drops its waiting ones, and leaves other tasks' writes alone", func() {
			// Every worker's write is held: task A's first, then another task's.
			release := patches.holdMany(MachineWriteConcurrency)
			DeferCleanup(release)
			inFlight := stored(w.machines[0].Name)
			mw.submit(task, membersOf(inFlight), waiting("in flight"))
			// The other workers take another task's Machines; task A's last one is queued
			// behind them (first handed over, first written).
			other := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "task-b", UID: "uid-of-task-b"}, Spec: task.Spec}
			var others []*clusterv1.Machine
			for _, m := range w.machines[1 : len(w.machines)-1] {
				others = append(others, stored(m.Name))
			}
			mw.submit(other, membersOf(others...), waiting("task b"))
			Eventually(patches.firstHeld).Should(BeClosed(), "every worker's write is held")
			last := stored(w.machines[len(w.machines)-1].Name)
			mw.submit(task, membersOf(last), waiting("dropped"))

			result := make(chan error, 1)
			go func() { result <- mw.settleTask(ctx, task.UID) }()
			Consistently(result, 300*time.Millisecond, 20*time.Millisecond).ShouldNot(Receive(), "settleTask waits for the task's write in flight")

			release()
			Eventually(result).Should(Receive(Succeed()))
			Expect(storedMessage(inFlight.Name)()).To(Equal("in flight"))
			for _, m := range others {
				Eventually(storedMessage(m.Name)).Should(Equal("task b"), "another task's writes go on")
			}
			Consistently(storedMessage(last.Name), 300*time.Millisecond, 50*time.Millisecond).Should(BeEmpty(), "the task's waiting write is never sent")
			Expect(storedClaim(last.Name)()).To(BeEmpty())
		})
	})

	// The writer lives as long as the manager: once its context is cancelled, Start
	// returns and nothing handed over is written any more.
	It("writes nothing once stopped", func() {
		stop, done := startWriter(mw)
		stop()
		Eventually(done).Should(BeClosed(), "Start returns once its context is cancelled")

		m := stored(w.machines[0].Name)
		mw.submit(task, membersOf(m), waiting("queued"))
		Consistently(patches.count, 500*time.Millisecond, 20*time.Millisecond).Should(BeZero())
		Expect(stored(m.Name).ResourceVersion).To(Equal(m.ResourceVersion))
		got := settled(m)
		Expect(got[0].ResourceVersion).To(Equal(m.ResourceVersion), "nothing to settle")
		Expect(claims.all()).To(BeEmpty())
		Expect(asked.asked()).To(BeEmpty())
	})

	// Start waits for the writes in flight before it returns, as a manager that stops
	// waits for its runnables; the writes still waiting for their turn are dropped.
	It("waits for the writes in flight when stopped, and drops those waiting", func() {
		n := MachineWriteConcurrency
		release := patches.holdMany(n)
		DeferCleanup(release)
		stop, done := startWriter(mw)
		var busy []*clusterv1.Machine
		for _, m := range w.machines[:n] {
			busy = append(busy, stored(m.Name))
		}
		queued := stored(w.machines[n].Name)
		mw.submit(task, membersOf(busy...), waiting("busy"))
		Eventually(patches.firstHeld).Should(BeClosed())
		mw.submit(task, membersOf(queued), waiting("queued"))

		stop()
		Consistently(done, 300*time.Millisecond, 20*time.Millisecond).ShouldNot(BeClosed(), "Start waits for the writes in flight")
		release()
		Eventually(done).Should(BeClosed())
		Expect(patches.count()).To(Equal(n), "the write waiting for its turn was never sent")
		for _, p := range patches.patches() {
			Expect(p.machine).NotTo(Equal(queued.Name))
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := mw.settle(sctx, task, append(busy, queued))
		Expect(err).NotTo(HaveOccurred(), "nothing is left to wait for once Start returned")

		// Handed over after Start returned: not written either.
		mw.submit(task, membersOf(stored(queued.Name)), waiting("after"))
		Consistently(patches.count, 300*time.Millisecond, 20*time.Millisecond).Should(Equal(n), "nothing is written after Start returned")
		Expect(storedClaim(queued.Name)()).To(BeEmpty())
		Expect(mw.takeError(key)).To(Succeed(), "a write cut short by the stop is not an error")
		Expect(claims.namesClaimed()).NotTo(ContainElement(queued.Name))
	})
})

// writtenAt is a Machine of namespace ns at resourceVersion rv carrying the claim label.
func writtenAt(name, rv, claim string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
	if claim != "" {
		m.Labels = map[string]string{inplacev1.UpgradeTaskLabel: claim}
	}
	return m
}

// TestWrittenMachinesLatest: latest returns a Machine as a task last wrote it when it is
// given at a resourceVersion that task's writes replaced and no other task wrote since,
// and the Machine given otherwise.
func TestWrittenMachinesLatest(t *testing.T) {
	now := time.Now()
	var w writtenMachines

	// m1 written twice by task a: 1 -> 2 -> 3.
	w.add(writtenAt("m1", "2", "a"), "1", "a", now)
	w.add(writtenAt("m1", "3", "a"), "2", "a", now)
	for _, rv := range []string{"1", "2"} {
		got := w.latest(writtenAt("m1", rv, ""), "a", now)
		if got.ResourceVersion != "3" || got.Labels[inplacev1.UpgradeTaskLabel] != "a" {
			t.Errorf("m1 at version %s, which a's writes replaced: want a's last write (3), got %s %v", rv, got.ResourceVersion, got.Labels)
		}
	}

	// m2 written by task a (1 -> 2), then by task b (2 -> 3).
	w.add(writtenAt("m2", "2", "a"), "1", "a", now)
	w.add(writtenAt("m2", "3", "b"), "2", "b", now)
	if got := w.latest(writtenAt("m2", "2", "a"), "b", now); got.ResourceVersion != "3" {
		t.Errorf("m2 at the version b's write replaced, for b: want b's write (3), got %s", got.ResourceVersion)
	}

	for _, tc := range []struct {
		what string
		in   *clusterv1.Machine
		by   string
		at   time.Time
	}{
		{"m1 at the written version", writtenAt("m1", "3", "a"), "a", now},
		{"m1 written by someone else since", writtenAt("m1", "7", "other"), "a", now},
		{"m1 at a replaced version, for a task that did not write it", writtenAt("m1", "1", ""), "b", now},
		{"m2 at a version a replaced, but b wrote since", writtenAt("m2", "1", ""), "a", now},
		{"m2 at a version a replaced, for b, who wrote only the last write", writtenAt("m2", "1", ""), "b", now},
		{"a Machine never written", writtenAt("m9", "1", ""), "a", now},
		{"m1 at a replaced version, the write expired", writtenAt("m1", "1", ""), "a", now.Add(writtenExpiry + time.Second)},
	} {
		if got := w.latest(tc.in, tc.by, tc.at); got != tc.in {
			t.Errorf("%s: want the Machine given, got %s %v", tc.what, got.ResourceVersion, got.Labels)
		}
	}

	// latest returns a copy: changing it does not change what is remembered.
	got := w.latest(writtenAt("m1", "1", ""), "a", now)
	got.Labels[inplacev1.UpgradeTaskLabel] = "changed"
	if again := w.latest(writtenAt("m1", "1", ""), "a", now); again.Labels[inplacev1.UpgradeTaskLabel] != "a" {
		t.Errorf("the remembered Machine changed through latest: %v", again.Labels)
	}
}

// A hand-over that asks for what the last one asked for, pending or in flight, is the
// same write: it is not handed over again (nor the Machine copied again).
func TestMachineSlotHandedOver(t *testing.T) {
	waiting := machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.WaitingReason, "queued")}
	job := func(uid types.UID, want machineWant) *machineJob {
		return &machineJob{want: want, task: &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{UID: uid}}}
	}
	inProgress := machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.InProgressReason, "started")}
	otherMessage := machineWant{claim: true, condition: machineCondition(metav1.ConditionFalse, inplacev1.WaitingReason, "held")}

	inFlight := &machineSlot{inFlight: true, current: job("a", waiting)}
	if !inFlight.handedOver("a", waiting) {
		t.Error("the same want as the write in flight: want handed over")
	}
	for name, tc := range map[string]struct {
		uid  types.UID
		want machineWant
	}{
		"another task":      {"b", waiting},
		"another condition": {"a", inProgress},
		"another message":   {"a", otherMessage},
		"no claim":          {"a", machineWant{condition: waiting.condition}},
		"a release":         {"a", machineWant{claim: true, condition: waiting.condition, release: "v1"}},
	} {
		if inFlight.handedOver(tc.uid, tc.want) {
			t.Errorf("%s: want not handed over", name)
		}
	}
	// The pending write, not the one in flight, is the last one handed over.
	pending := &machineSlot{inFlight: true, current: job("a", waiting), pending: job("a", inProgress)}
	if pending.handedOver("a", waiting) || !pending.handedOver("a", inProgress) {
		t.Error("with a write pending, only its want is handed over")
	}
	if (&machineSlot{}).handedOver("a", waiting) {
		t.Error("a slot with no write: want nothing handed over")
	}
}
