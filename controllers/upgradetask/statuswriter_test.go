package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// statusWrites is the status writer's client, as the tests see it: every status update
// of an UpgradeTask it sends is recorded (the status sent, and the API server's answer);
// the first can be held until released, and the first can be failed without reaching
// the API server.
type statusWrites struct {
	mu      sync.Mutex
	sent    []inplacev1.UpgradeTaskStatus
	results []error
	// sentAt and answeredAt are when each update was sent and answered.
	sentAt, answeredAt []time.Time

	// holdFirst, when set, holds the first update until it is closed (and then sends
	// it, or fails it with failFirst); firstHeld is closed once the first update is held.
	holdFirst chan struct{}
	firstHeld chan struct{}
	// failFirst, when set, is the error of the first update, which then does not reach
	// the API server.
	failFirst error
}

func (s *statusWrites) client(c client.WithWatch) client.Client {
	return interceptor.NewClient(c, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			task, ok := obj.(*inplacev1.UpgradeTask)
			if !ok || sub != "status" {
				return c.SubResource(sub).Update(ctx, obj, opts...)
			}
			s.mu.Lock()
			first := len(s.sent) == 0
			s.sent = append(s.sent, *task.Status.DeepCopy())
			s.sentAt = append(s.sentAt, time.Now())
			s.mu.Unlock()
			if first && s.holdFirst != nil {
				close(s.firstHeld)
				select {
				case <-s.holdFirst:
				case <-ctx.Done():
				case <-time.After(30 * time.Second): // never held for good, should a spec not release it
				}
			}
			var err error
			if first && s.failFirst != nil {
				err = s.failFirst
			} else {
				err = c.SubResource(sub).Update(ctx, obj, opts...)
			}
			s.mu.Lock()
			s.results = append(s.results, err)
			s.answeredAt = append(s.answeredAt, time.Now())
			s.mu.Unlock()
			return err
		},
	})
}

// count is the number of status updates sent.
func (s *statusWrites) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

func (s *statusWrites) statuses() []inplacev1.UpgradeTaskStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}

// answers are the errors the status updates sent ended with, in order.
func (s *statusWrites) answers() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.results)
}

// hold holds the first status update until release is called.
func (s *statusWrites) hold() (release func()) {
	s.holdFirst = make(chan struct{})
	s.firstHeld = make(chan struct{})
	var once sync.Once
	return func() { once.Do(func() { close(s.holdFirst) }) }
}

// retries records the keys the status writer asked to reconcile again.
type retries struct {
	mu   sync.Mutex
	keys []types.NamespacedName
}

func (r *retries) retry(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
}

func (r *retries) asked() []types.NamespacedName {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.keys)
}

// onDone is a context that calls f the first time its Done is called: flush calls Done
// only once it holds the task's record and waits for the write in flight, so a write
// held until f is called ends after flush began waiting for it.
type onDone struct {
	context.Context
	once sync.Once
	f    func()
}

func (c *onDone) Done() <-chan struct{} {
	c.once.Do(c.f)
	return c.Context.Done()
}

// progressStatus is the status of a task with upgraded of total machines upgraded.
func progressStatus(upgraded, total int32) inplacev1.UpgradeTaskStatus {
	return inplacev1.UpgradeTaskStatus{
		Phase:    inplacev1.TaskPhaseInProgress,
		Total:    total,
		Upgraded: upgraded,
		Waiting:  total - upgraded,
		Progress: fmt.Sprintf("%d/%d", upgraded, total),
	}
}

var _ = Describe("status writer", func() {
	var (
		ns     string
		key    types.NamespacedName
		writes *statusWrites
		asked  *retries
		w      *statusWriter
	)

	// stored reads the task from the API server, not from a cache.
	stored := func() *inplacev1.UpgradeTask {
		GinkgoHelper()
		t := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, key, t)).To(Succeed())
		return t
	}
	// withStatus is the tracked task (as read from the API server) with status st, as a
	// reconcile hands it over.
	withStatus := func(task *inplacev1.UpgradeTask, st inplacev1.UpgradeTaskStatus) *inplacev1.UpgradeTask {
		t := task.DeepCopy()
		t.Status = st
		return t
	}
	// overlaid is the status overlay puts on the task, and whether it kept one.
	overlaid := func(task *inplacev1.UpgradeTask) (inplacev1.UpgradeTaskStatus, bool) {
		t := task.DeepCopy()
		t.Status = inplacev1.UpgradeTaskStatus{Progress: "not overlaid"}
		ok := w.overlay(t)
		return t.Status, ok
	}
	startWriter := func(sw *statusWriter) {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			Expect(sw.Start(wctx)).To(Succeed())
		}()
		DeferCleanup(func() {
			cancel()
			Eventually(done).Should(BeClosed(), "Start must return once its context is cancelled")
		})
	}
	newWriter := func() *statusWriter {
		GinkgoHelper()
		base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme, Mapper: k8s.RESTMapper()})
		Expect(err).NotTo(HaveOccurred())
		return newStatusWriter(writes.client(base), asked.retry)
	}

	BeforeEach(func() {
		var err error
		ns, err = fixtures.Namespace(ctx, k8s, "sw")
		Expect(err).NotTo(HaveOccurred())
		task := (&world{ns: ns}).mdTask("task")
		Expect(k8s.Create(ctx, task)).To(Succeed())
		key = client.ObjectKeyFromObject(task)
		writes = &statusWrites{}
		asked = &retries{}
		w = newWriter()
	})

	Context("started", func() {
		BeforeEach(func() { startWriter(w) })

		It("coalesces statuses handed over while a write is in flight, and writes the last one last", func() {
			release := writes.hold()
			DeferCleanup(release)
			task := stored()
			w.track(task)
			const n = 50

			w.submit(withStatus(task, progressStatus(1, n)))
			Eventually(writes.firstHeld).Should(BeClosed(), "the first status is written at once")
			for i := int32(2); i <= n; i++ {
				st := progressStatus(i, n)
				w.submit(withStatus(task, st))
				got, ok := overlaid(task)
				Expect(ok).To(BeTrue(), "a tracked task's status is overlaid")
				Expect(got).To(Equal(st), "overlay returns the status handed over last")
			}
			// Nothing landed yet: the API server has the status the task was created with.
			Expect(stored().Status).To(Equal(inplacev1.UpgradeTaskStatus{}))

			release()
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(stored().Status).To(Equal(progressStatus(n, n)), "the last status handed over is stored")
			Expect(writes.count()).To(BeNumerically("<", n), "fewer updates than statuses handed over")
			Expect(writes.statuses()).To(Equal([]inplacev1.UpgradeTaskStatus{progressStatus(1, n), progressStatus(n, n)}),
				"the write in flight, then only the status handed over last")
			Expect(writes.answers()).To(Equal([]error{nil, nil}))
			st, ok := overlaid(task)
			Expect(ok).To(BeTrue())
			Expect(st).To(Equal(progressStatus(n, n)))
			Expect(w.takeError(key)).To(Succeed())
			Expect(asked.asked()).To(BeEmpty())
		})

		It("writes statuses in the order they were handed over, each write over the last", func() {
			task := stored()
			w.track(task)
			const n = 50
			for i := int32(1); i <= n; i++ {
				w.submit(withStatus(task, progressStatus(i, n)))
			}
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(stored().Status).To(Equal(progressStatus(n, n)))

			sent := writes.statuses()
			Expect(sent).NotTo(BeEmpty())
			Expect(len(sent)).To(BeNumerically("<=", n))
			Expect(sent[len(sent)-1]).To(Equal(progressStatus(n, n)), "the status handed over last is written last")
			for i := 1; i < len(sent); i++ {
				Expect(sent[i].Upgraded).To(BeNumerically(">", sent[i-1].Upgraded), "statuses are written in the order handed over: %v", sent)
			}
			// Every write was an update over the one before (the resourceVersion it
			// returned): none conflicted.
			for _, err := range writes.answers() {
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(asked.asked()).To(BeEmpty())

			// Handed over again after the burst: written again.
			w.submit(withStatus(task, progressStatus(0, n)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(stored().Status).To(Equal(progressStatus(0, n)))
		})

		It("writes a task's status at most once per interval, but at once for a flush", func() {
			Expect(w.interval).To(Equal(statusWriteInterval))
			task := stored()
			w.track(task)
			w.submit(withStatus(task, progressStatus(1, 3)))
			Eventually(writes.count).WithPolling(10 * time.Millisecond).Should(Equal(1))
			w.submit(withStatus(task, progressStatus(2, 3)))
			Eventually(writes.count).WithPolling(10*time.Millisecond).Should(Equal(2), "the next status is written after the pause")
			writes.mu.Lock()
			paused := writes.sentAt[1].Sub(writes.answeredAt[0])
			writes.mu.Unlock()
			Expect(paused).To(BeNumerically(">=", statusWriteInterval), "the second write waits out the interval after the first")
			// Counted when sent: the API server may not have answered yet.
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(stored().Status).To(Equal(progressStatus(2, 3)))
		})

		It("pauses longer after a write of a larger status, but not for a flush", func() {
			w.interval = 100 * time.Millisecond // set before the first write reads it
			task := stored()
			w.track(task)
			large := func(upgraded int32) inplacev1.UpgradeTaskStatus {
				st := progressStatus(upgraded, 250)
				st.Machines = withEntries(250).Machines
				return st
			}
			w.submit(withStatus(task, large(1)))
			Eventually(writes.count).WithPolling(10 * time.Millisecond).Should(Equal(1))
			w.submit(withStatus(task, large(2)))
			Eventually(writes.count).WithPolling(10*time.Millisecond).Should(Equal(2), "the next status is written after the pause")
			writes.mu.Lock()
			paused := writes.sentAt[1].Sub(writes.answeredAt[0])
			writes.mu.Unlock()
			Expect(paused).To(BeNumerically(">=", 3*w.interval), "250 entries: three intervals between two writes")

			w.submit(withStatus(task, large(3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(3))
			Expect(stored().Status).To(Equal(large(3)))
		})

		It("ends the pause after a write for a flush", func() {
			w.interval = time.Hour // set before the first write reads it
			task := stored()
			w.track(task)
			w.submit(withStatus(task, progressStatus(1, 3)))
			Eventually(writes.count).WithPolling(10 * time.Millisecond).Should(Equal(1))
			// The writer now pauses for an hour; a flush (a task's last status) ends it.
			w.submit(withStatus(task, progressStatus(3, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(2))
			Expect(stored().Status).To(Equal(progressStatus(3, 3)))
		})

		It("sends no update for a status equal to the one stored", func() {
			task := stored()
			w.track(task)

			// The status the task has (none yet).
			w.submit(withStatus(task, task.Status))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(0))

			// A status with a time is written once; the same status again, with the time
			// differing below the second (the API server keeps seconds), is not.
			at := time.Date(2025, 6, 1, 12, 0, 0, int(100*time.Millisecond), time.UTC)
			st := progressStatus(1, 3)
			st.StartTime = &metav1.Time{Time: at}
			w.submit(withStatus(task, st))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(1))
			rv := stored().ResourceVersion

			again := progressStatus(1, 3)
			again.StartTime = &metav1.Time{Time: at.Add(800 * time.Millisecond)}
			w.submit(withStatus(task, again))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(1), "a status equal as stored is not written again")
			Expect(stored().ResourceVersion).To(Equal(rv))
			got, ok := overlaid(task)
			Expect(ok).To(BeTrue())
			Expect(got).To(Equal(again), "overlay still returns the status handed over last")

			// A status that differs is written, over the last write: no conflict.
			w.submit(withStatus(task, progressStatus(2, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(2))
			Expect(stored().Status.Progress).To(Equal("2/3"))
			Expect(asked.asked()).To(BeEmpty())
		})

		It("drops the task on a conflict with another writer's change, asks for a reconcile and keeps that change", func() {
			release := writes.hold()
			DeferCleanup(release)
			task := stored()
			w.track(task)

			// Another writer changes the task after it was read: its resourceVersion moves.
			other := stored()
			other.Labels["example.com/other-writer"] = "changed"
			other.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2))
			Expect(k8s.Update(ctx, other)).To(Succeed())

			w.submit(withStatus(task, progressStatus(1, 3)))
			// The write is held until flush waits for it, so that flush sees it end.
			err := w.flush(&onDone{Context: ctx, f: release}, key)
			Expect(apierrors.IsConflict(err)).To(BeTrue(), "flush returns the write's conflict, got %v", err)
			Expect(writes.count()).To(Equal(1))
			Expect(apierrors.IsConflict(writes.answers()[0])).To(BeTrue())

			Expect(asked.asked()).To(Equal([]types.NamespacedName{key}), "a reconcile of the task is asked for")
			_, ok := overlaid(task)
			Expect(ok).To(BeFalse(), "the task is no longer tracked: the next reconcile reads it from the API server")
			Expect(w.takeError(key)).To(Succeed(), "nothing is kept about the task, not even the error")

			got := stored()
			Expect(got.Labels).To(HaveKeyWithValue("example.com/other-writer", "changed"))
			Expect(got.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(2))))
			Expect(got.Status).To(Equal(inplacev1.UpgradeTaskStatus{}), "the conflicting status is not written")

			// Untracked, a status handed over is not written.
			w.submit(withStatus(task, progressStatus(2, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Consistently(writes.count, 300*time.Millisecond, 50*time.Millisecond).Should(Equal(1))

			// Tracked again from the API server, its status is written over the change.
			w.track(stored())
			w.submit(withStatus(stored(), progressStatus(2, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			got = stored()
			Expect(got.Status).To(Equal(progressStatus(2, 3)))
			Expect(got.Labels).To(HaveKeyWithValue("example.com/other-writer", "changed"))
			Expect(asked.asked()).To(HaveLen(1))
		})

		It("drops a task deleted meanwhile, without an error", func() {
			release := writes.hold()
			DeferCleanup(release)
			task := stored()
			w.track(task)
			Expect(k8s.Delete(ctx, task)).To(Succeed())
			Expect(apierrors.IsNotFound(k8s.Get(ctx, key, &inplacev1.UpgradeTask{}))).To(BeTrue())

			w.submit(withStatus(task, progressStatus(1, 3)))
			Expect(w.flush(&onDone{Context: ctx, f: release}, key)).To(Succeed(), "a write that finds the task gone is no error")
			Expect(writes.count()).To(Equal(1), "the write was sent")
			Expect(apierrors.IsNotFound(writes.answers()[0])).To(BeTrue(), "and found the task gone: %v", writes.answers())

			_, ok := overlaid(task)
			Expect(ok).To(BeFalse(), "the task is no longer tracked")
			Expect(w.takeError(key)).To(Succeed())
			// A status handed over for it is not written.
			w.submit(withStatus(task, progressStatus(2, 3)))
			Consistently(writes.count, 300*time.Millisecond, 50*time.Millisecond).Should(Equal(1))
		})

		It("returns another error once, asks for a reconcile and keeps the task's status", func() {
			injected := errors.New("injected: the API server is unavailable")
			writes.failFirst = injected
			task := stored()
			w.track(task)

			w.submit(withStatus(task, progressStatus(1, 3)))
			Eventually(asked.asked).WithPolling(10*time.Millisecond).Should(Equal([]types.NamespacedName{key}), "a reconcile of the task is asked for")
			err := w.takeError(key)
			Expect(err).To(MatchError(injected))
			Expect(apierrors.IsConflict(err) || apierrors.IsNotFound(err)).To(BeFalse())
			Expect(w.takeError(key)).To(Succeed(), "the error is returned once")
			Expect(w.flush(ctx, key)).To(Succeed(), "flush does not return the error taken")

			st, ok := overlaid(task)
			Expect(ok).To(BeTrue(), "the task is still tracked")
			Expect(st).To(Equal(progressStatus(1, 3)), "with the status handed over last")
			Expect(stored().Status).To(Equal(inplacev1.UpgradeTaskStatus{}), "which did not reach the API server")

			// The next reconcile hands a status over again: written over the last write.
			w.submit(withStatus(task, progressStatus(2, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(stored().Status).To(Equal(progressStatus(2, 3)))
			Expect(writes.count()).To(Equal(2))
			Expect(w.takeError(key)).To(Succeed())
			Expect(asked.asked()).To(HaveLen(1))
		})

		It("returns a failed write's error to the next flush, once", func() {
			injected := errors.New("injected: the API server is unavailable")
			writes.failFirst = injected
			task := stored()
			w.track(task)

			w.submit(withStatus(task, progressStatus(1, 3)))
			Eventually(asked.asked).WithPolling(10 * time.Millisecond).Should(HaveLen(1))
			Expect(w.flush(ctx, key)).To(MatchError(injected))
			Expect(w.takeError(key)).To(Succeed(), "flush took the error")
		})

		// A write that fails with an error other than a conflict or NotFound keeps its
		// error only until a later write of the same record succeeds: a flush waiting for
		// that later write (the status handed over last) gets no error, and neither does
		// the next reconcile's takeError.
		It("returns no error to a flush whose status was written after an earlier write failed", func() {
			injected := errors.New("injected: the API server is unavailable")
			writes.failFirst = injected
			release := writes.hold()
			DeferCleanup(release)
			task := stored()
			w.track(task)

			// The first write fails once the second status is handed over: the second is
			// written after it, over the same resourceVersion.
			w.submit(withStatus(task, progressStatus(1, 3)))
			Eventually(writes.firstHeld).Should(BeClosed())
			w.submit(withStatus(task, progressStatus(2, 3)))
			err := w.flush(&onDone{Context: ctx, f: release}, key)
			Expect(writes.statuses()).To(Equal([]inplacev1.UpgradeTaskStatus{progressStatus(1, 3), progressStatus(2, 3)}))
			Expect(writes.answers()).To(Equal([]error{injected, nil}))
			Expect(stored().Status).To(Equal(progressStatus(2, 3)), "the status handed over last is stored")
			Expect(asked.asked()).To(Equal([]types.NamespacedName{key}), "the failed write asked for a reconcile")
			// flush "waits until the status handed over last for the task is written, and
			// returns the error of that write": that write succeeded.
			Expect(err).NotTo(HaveOccurred(), "flush returns the error of an earlier, superseded write")
			Expect(w.takeError(key)).To(Succeed())
		})

		It("forgets a task: its status is no longer overlaid nor written", func() {
			task := stored()
			w.track(task)
			w.submit(withStatus(task, progressStatus(1, 3)))
			w.forget(ctx, key)
			Expect(writes.count()).To(Equal(1), "forget waits for the write in flight")
			Expect(stored().Status).To(Equal(progressStatus(1, 3)))
			_, ok := overlaid(task)
			Expect(ok).To(BeFalse())
			w.submit(withStatus(task, progressStatus(2, 3)))
			Consistently(writes.count, 300*time.Millisecond, 50*time.Millisecond).Should(Equal(1))
		})

		It("keeps nothing of a task tracked under another uid", func() {
			task := stored()
			w.track(task)
			w.submit(withStatus(task, progressStatus(1, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())

			recreated := task.DeepCopy()
			recreated.UID = "another-uid"
			_, ok := overlaid(recreated)
			Expect(ok).To(BeFalse(), "a task of the same name with another uid is not overlaid")
			w.submit(withStatus(recreated, progressStatus(2, 3)))
			Expect(w.flush(ctx, key)).To(Succeed())
			Expect(writes.count()).To(Equal(1), "nor written")
			st, ok := overlaid(task)
			Expect(ok).To(BeTrue())
			Expect(st).To(Equal(progressStatus(1, 3)))
		})
	})

	It("writes nothing until it is started", func() {
		task := stored()
		w.track(task)
		w.submit(withStatus(task, progressStatus(1, 3)))
		st, ok := overlaid(task)
		Expect(ok).To(BeTrue())
		Expect(st).To(Equal(progressStatus(1, 3)))
		Consistently(writes.count, 500*time.Millisecond, 50*time.Millisecond).Should(Equal(0))
		Expect(stored().Status).To(Equal(inplacev1.UpgradeTaskStatus{}))

		startWriter(w)
		Expect(w.flush(ctx, key)).To(Succeed())
		Expect(stored().Status).To(Equal(progressStatus(1, 3)))
		Expect(writes.count()).To(Equal(1))
	})
})
