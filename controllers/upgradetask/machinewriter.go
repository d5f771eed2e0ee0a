package upgradetask

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// machineWriter writes the bookkeeping of a task's Machines off the reconcile's path:
// the claims and Waiting conditions of machines not started yet, the InProgress
// condition of a node that started, and the Done or Failed condition, release annotation
// and released claim of a node that ended. None of them has to be written before the
// next node starts, and a reconcile that waited for them (thirty writes when ten nodes
// end and ten start) would keep every NodeUpdate that ends meanwhile waiting for its
// hand-off. A reconcile hands the Machines it wants written over and returns.
//
// Writes of one Machine are serialized: a Machine has at most one write in flight and
// one pending; a later hand-over replaces the pending one, which is then never written.
// Machines are written by a few workers, the writes of nodes that ended first, then those
// of nodes that started, then the claims and Waiting conditions of machines not started
// yet (writeClass), each class in the order it was handed over. When the API server
// cannot keep up with every write (node work that takes no time, make bench), what falls
// behind is a Waiting condition, which the machine's start or end then replaces before it
// is ever written, not the end of a node: so a task's end finds little left to write, and
// the API server is spared the writes nobody would have read.
// Each write starts from the Machine as this manager last wrote it (writtenMachines) and
// carries its resourceVersion, so a claim is never taken from a Machine another task
// claimed meanwhile: such a write conflicts, is dropped, and the task is reconciled again
// from what its cache shows.
//
// What must be written before something else happens is written by the reconcile itself,
// after settle: the claim of a machine about to start (it must precede its NodeUpdate:
// it keeps two tasks from starting the same machine), and every write at a task's end, an
// abort or a deletion (a finished task has released its claims).
//
// machineWriter is a manager.Runnable: writes begin once the manager started it and end
// with the manager. What is lost when it stops with writes pending is bookkeeping the
// next reconcile computes again.
type machineWriter struct {
	// write brings a Machine to what a task wants (Reconciler.writeMachine).
	write func(ctx context.Context, m *clusterv1.Machine, want machineWant, task *inplacev1.UpgradeTask) error
	// latest returns a Machine as task last wrote it, if that is newer and no other task
	// wrote it since (writtenMachines.latest).
	latest func(m *clusterv1.Machine, task *inplacev1.UpgradeTask) *clusterv1.Machine
	// claimed records the machines one hand-over claimed, once all its writes ended.
	claimed func(task *inplacev1.UpgradeTask, names []string)
	// retry asks for a reconcile of a task one of whose Machine writes failed.
	retry func(key types.NamespacedName)

	ctx     context.Context
	workers sync.WaitGroup

	mu sync.Mutex
	// wake is signalled when a Machine is queued or the writer stops.
	wake    *sync.Cond
	stopped bool
	// machines holds what is kept about each Machine with a write pending or in flight.
	machines map[types.NamespacedName]*machineSlot
	// queues hold, by writeClass, the Machines with a write pending, first handed over
	// first; an entry whose Machine's pending write was dropped, is already in flight or is
	// now of another class is skipped.
	queues [writeClasses][]types.NamespacedName
	// errs holds, by task, the error of the last write that failed until a reconcile
	// takes it.
	errs map[types.NamespacedName]error
}

// machineSlot is what is kept about a Machine while a write of it is pending or in flight.
type machineSlot struct {
	// pending is the write to make next; nil when none.
	pending *machineJob
	// inFlight says a worker writes the Machine now; current is that write.
	inFlight bool
	current  *machineJob
	// idle is closed once no write of the Machine is pending or in flight.
	idle chan struct{}
	// queued says which queues hold an entry of the Machine.
	queued [writeClasses]bool
}

// writeClass orders the writes waiting for a worker: a lower class is written first.
type writeClass int

const (
	// classEnded: a node that ended (Done, Failed, Aborted, Skipped), a claim released.
	classEnded writeClass = iota
	// classStarted: a node that started (InProgress, skip-remediation).
	classStarted
	// classWaiting: a claim and Waiting condition of a machine not started yet.
	classWaiting
	writeClasses
)

// classOf says which class a write is of.
func classOf(want machineWant) writeClass {
	switch {
	case !want.claim:
		return classEnded
	case want.skipRemediation:
		return classStarted
	case want.condition != nil && want.condition.Reason == inplacev1.WaitingReason:
		return classWaiting
	}
	// A claim kept on a Failed, Aborted or Skipped machine while the task runs.
	return classEnded
}

// enqueueLocked puts the Machine in the queue of its pending write's class, unless it is
// there already. w.mu is held.
func (w *machineWriter) enqueueLocked(key types.NamespacedName, slot *machineSlot) {
	c := classOf(slot.pending.want)
	if slot.queued[c] {
		return
	}
	slot.queued[c] = true
	w.queues[c] = append(w.queues[c], key)
	w.wake.Signal()
}

type machineJob struct {
	machine *clusterv1.Machine
	want    machineWant
	task    *inplacev1.UpgradeTask
	batch   *claimBatch
}

// claimBatch gathers the machines one hand-over claimed, for one event.
type claimBatch struct {
	task    *inplacev1.UpgradeTask
	left    int
	claimed []string
}

// MachineWriteConcurrency bounds the Machine writes in flight at once, in the
// background, and in a reconcile's own writes: they are distinct objects, each written
// with its own resourceVersion, so their order does not matter and their round trips can
// overlap; a bound leaves the API server room for the writes that start nodes.
const MachineWriteConcurrency = 4

// EndWriteConcurrency bounds the Machine writes in flight at once when a task ends, is
// aborted or is deleted (writeMachinesNow): the task starts no node any more, so its
// writes leave no hand-off waiting, and a task whose background writer fell behind (node
// work that takes no time, make bench) wrote its backlog 4 at a time for seconds.
const EndWriteConcurrency = 16

// machineConflictRetry is how long after a Machine write conflicted its task is
// reconciled again: long enough for the cache to show the write that came in between.
const machineConflictRetry = 100 * time.Millisecond

func newMachineWriter(write func(context.Context, *clusterv1.Machine, machineWant, *inplacev1.UpgradeTask) error,
	latest func(*clusterv1.Machine, *inplacev1.UpgradeTask) *clusterv1.Machine, claimed func(*inplacev1.UpgradeTask, []string), retry func(types.NamespacedName)) *machineWriter {
	w := &machineWriter{
		write: write, latest: latest, claimed: claimed, retry: retry,
		machines: map[types.NamespacedName]*machineSlot{},
		errs:     map[types.NamespacedName]error{},
	}
	w.wake = sync.NewCond(&w.mu)
	return w
}

// Start implements manager.Runnable: it runs the workers for the manager's lifetime and,
// once the manager stops, waits for the writes in flight. Writes pending then are dropped.
func (w *machineWriter) Start(ctx context.Context) error {
	w.ctx = ctx
	for range MachineWriteConcurrency {
		w.workers.Add(1)
		go w.work()
	}
	<-ctx.Done()
	w.mu.Lock()
	w.stopped = true
	w.wake.Broadcast()
	w.mu.Unlock()
	w.workers.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, slot := range w.machines {
		if slot.pending != nil {
			w.finishLocked(slot.pending, false)
		}
		delete(w.machines, key)
		close(slot.idle)
	}
	w.queues = [writeClasses][]types.NamespacedName{}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: the writer is stopped
// after the controllers that hand it writes.
func (w *machineWriter) NeedLeaderElection() bool { return false }

// submit hands the writes of members' Machines for task over, each as want says; those
// it claims are named in one MachineClaimed event once they all ended. A Machine that
// carries what the task wants and has no write pending is left alone, and so is one whose
// last write handed over (pending or in flight) asks for the same. Otherwise this write
// takes the place of the pending one, even when the Machine carries what the task wants
// now: the last hand-over wins.
func (w *machineWriter) submit(task *inplacev1.UpgradeTask, members []*member, want func(*member) machineWant) {
	if len(members) == 0 {
		return
	}
	// The writes and the event need the task's identity and version, not its status.
	ref := &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: task.Namespace, Name: task.Name, UID: task.UID, ResourceVersion: task.ResourceVersion},
		Spec:       inplacev1.UpgradeTaskSpec{Version: task.Spec.Version},
	}
	claimValue := upgraderequest.LabelValue(task.Name)
	batch := &claimBatch{task: ref}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	for _, mem := range members {
		key := client.ObjectKeyFromObject(mem.machine)
		slot, ok := w.machines[key]
		wanted := want(mem)
		if !ok && machineUpToDate(mem.machine, wanted, claimValue) {
			continue
		}
		if ok && slot.handedOver(task.UID, wanted) {
			// A reconcile that came before the write ended handed it over already.
			continue
		}
		batch.left++
		job := &machineJob{machine: mem.machine.DeepCopy(), want: wanted, task: ref, batch: batch}
		if !ok {
			slot = &machineSlot{idle: make(chan struct{})}
			w.machines[key] = slot
		}
		if slot.pending != nil {
			w.finishLocked(slot.pending, false)
		}
		slot.pending = job
		// A Machine in flight is queued again by its worker when a write is pending.
		if !slot.inFlight {
			w.enqueueLocked(key, slot)
		}
	}
}

// work writes queued Machines until the writer stops.
func (w *machineWriter) work() {
	defer w.workers.Done()
	for {
		w.mu.Lock()
		key, slot, job := w.nextLocked()
		w.mu.Unlock()
		if job == nil {
			return
		}
		m := w.latest(job.machine, job.task)
		claimValue := upgraderequest.LabelValue(job.task.Name)
		wasClaimed := m.Labels[inplacev1.UpgradeTaskLabel] == claimValue
		err := w.write(w.ctx, m, job.want, job.task)
		taskKey := client.ObjectKeyFromObject(job.task)

		w.mu.Lock()
		w.finishLocked(job, err == nil && !wasClaimed && m.Labels[inplacev1.UpgradeTaskLabel] == claimValue)
		slot.inFlight, slot.current = false, nil
		if slot.pending != nil {
			w.enqueueLocked(key, slot)
		} else {
			delete(w.machines, key)
			close(slot.idle)
		}
		stopping := w.stopped || w.ctx.Err() != nil
		switch {
		case err == nil || stopping:
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// Another writer came in between, or the Machine is gone: what to write is
			// decided again from what the cache shows.
			time.AfterFunc(machineConflictRetry, func() { w.retry(taskKey) })
		default:
			w.errs[taskKey] = err
			w.retry(taskKey)
		}
		w.mu.Unlock()

		log := ctrl.LoggerFrom(w.ctx)
		switch {
		case err == nil || stopping:
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			log.V(1).Info("a Machine changed since it was read; the UpgradeTask decides its write again",
				"controller", "upgradetask", "UpgradeTask", taskKey, "Machine", klog.KObj(m), "reason", err.Error())
		default:
			log.Error(err, "writing a Machine for an UpgradeTask failed; it is written again at the task's next reconcile",
				"controller", "upgradetask", "UpgradeTask", taskKey, "Machine", klog.KObj(m))
		}
	}
}

// nextLocked waits for the next queued Machine with a write pending and takes the write;
// it returns a nil job once the writer stops. w.mu is held.
func (w *machineWriter) nextLocked() (types.NamespacedName, *machineSlot, *machineJob) {
	for {
		if w.stopped {
			return types.NamespacedName{}, nil, nil
		}
		c := writeClass(0)
		for c < writeClasses && len(w.queues[c]) == 0 {
			c++
		}
		if c == writeClasses {
			w.wake.Wait()
			continue
		}
		key := w.queues[c][0]
		w.queues[c][0] = types.NamespacedName{}
		w.queues[c] = w.queues[c][1:]
		slot, ok := w.machines[key]
		if !ok {
			continue
		}
		slot.queued[c] = false
		if slot.inFlight || slot.pending == nil || classOf(slot.pending.want) != c {
			continue
		}
		job := slot.pending
		slot.pending, slot.inFlight, slot.current = nil, true, job
		return key, slot, job
	}
}

// handedOver reports whether the last write handed over for the Machine, pending or in
// flight, is the task's and wants the same.
func (slot *machineSlot) handedOver(task types.UID, want machineWant) bool {
	last := slot.pending
	if last == nil {
		last = slot.current
	}
	return last != nil && last.task.UID == task && sameWant(last.want, want)
}

// sameWant reports whether two wants ask for the same Machine.
func sameWant(a, b machineWant) bool {
	if a.claim != b.claim || a.removeCondition != b.removeCondition || a.release != b.release || (a.condition == nil) != (b.condition == nil) {
		return false
	}
	return a.condition == nil || (a.condition.Status == b.condition.Status && a.condition.Reason == b.condition.Reason && a.condition.Message == b.condition.Message)
}

// finishLocked counts a job of a hand-over as ended, and records the machines the
// hand-over claimed once all its jobs ended. w.mu is held.
func (w *machineWriter) finishLocked(job *machineJob, claimed bool) {
	b := job.batch
	if claimed {
		b.claimed = append(b.claimed, job.machine.Name)
	}
	b.left--
	if b.left == 0 && len(b.claimed) > 0 {
		w.claimed(b.task, b.claimed)
	}
}

// settle drops the pending write of each Machine, waits for the writes in flight, and
// returns the Machines as task last wrote them: task writes them itself.
func (w *machineWriter) settle(ctx context.Context, task *inplacev1.UpgradeTask, machines []*clusterv1.Machine) ([]*clusterv1.Machine, error) {
	var idle []chan struct{}
	w.mu.Lock()
	for _, m := range machines {
		key := client.ObjectKeyFromObject(m)
		slot, ok := w.machines[key]
		if !ok {
			continue
		}
		if slot.pending != nil {
			w.finishLocked(slot.pending, false)
			slot.pending = nil
		}
		if slot.inFlight {
			idle = append(idle, slot.idle)
			continue
		}
		// Queued, not started: its queue entry is skipped.
		delete(w.machines, key)
		close(slot.idle)
	}
	w.mu.Unlock()
	for _, ch := range idle {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]*clusterv1.Machine, len(machines))
	for i, m := range machines {
		out[i] = w.latest(m, task)
	}
	return out, nil
}

// settleTask drops every pending write of a task's and waits for its writes in flight:
// after it, no write the task handed over is made.
func (w *machineWriter) settleTask(ctx context.Context, task types.UID) error {
	var idle []chan struct{}
	w.mu.Lock()
	for key, slot := range w.machines {
		if slot.pending != nil && slot.pending.task.UID == task {
			w.finishLocked(slot.pending, false)
			slot.pending = nil
			if !slot.inFlight {
				delete(w.machines, key)
				close(slot.idle)
				continue
			}
		}
		if slot.inFlight && slot.current.task.UID == task {
			idle = append(idle, slot.idle)
		}
	}
	w.mu.Unlock()
	for _, ch := range idle {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// takeError returns, once, the error of the last failed background write of one of the
// task's Machines.
func (w *machineWriter) takeError(key types.NamespacedName) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.errs[key]
	delete(w.errs, key)
	return err
}
