package upgradetask

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// statusWriter writes the status of UpgradeTasks off the reconcile's path. A task's
// status holds an entry per machine, so writing it costs the API server time that grows
// with the target; a reconcile that waited for it would keep the next node's hand-off (a
// NodeUpdate that ended in the meantime) waiting too. So a reconcile hands the status it
// computed over and returns, and one goroutine per task writes the latest status handed
// over: statuses are written in the order they were computed, and one superseded while
// an earlier write is in flight is never written.
//
// The status last handed over is also where the next reconcile starts from, in place of
// the cached task's, which may not show the last write yet: the events and metrics of a
// transition are recorded once. Only this controller writes a task's status, and only
// the leader runs it, so that status is the newest there is. Each write is an update
// with the resourceVersion last written: when anything else changed the task meanwhile
// (its spec, its deletion, another writer's condition), the write conflicts, what is kept
// about the task is dropped, and the next reconcile reads the task from the API server.
//
// What is lost when the manager stops with a write pending is derived state: the next
// reconcile computes it again from the NodeUpdates and Machines.
//
// statusWriter is a manager.Runnable: writes begin once the manager started it and end
// with the manager.
type statusWriter struct {
	client client.Client
	// retry asks for a reconcile of a task whose status write failed.
	retry func(key types.NamespacedName)
	// interval is the least time between two writes of a task's status but for a flush.
	interval time.Duration

	started chan struct{}
	ctx     context.Context
	writes  sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	tasks   map[types.NamespacedName]*statusRecord
}

type statusRecord struct {
	uid types.UID
	// base is the task as last written, or as read from the API server when the record
	// was made: a write is an update of it with the latest status.
	base *inplacev1.UpgradeTask
	// latest is the status last handed over, written or not.
	latest *inplacev1.UpgradeTaskStatus
	// pending says latest has not been written yet.
	pending bool
	// idle is closed when no write is pending or in flight; nil while none is.
	idle chan struct{}
	// hurry ends the wait for the interval after the last write: a flush waits for the
	// latest status.
	hurry chan struct{}
	// lastSent is when the task's status was last written.
	lastSent time.Time
	// err is the error of the last write that failed, until a reconcile takes it.
	err error
}

func newStatusWriter(c client.Client, retry func(types.NamespacedName)) *statusWriter {
	return &statusWriter{client: c, retry: retry, interval: statusWriteInterval, started: make(chan struct{}), tasks: map[types.NamespacedName]*statusRecord{}}
}

// Start implements manager.Runnable: it lends the writes the manager's lifetime and, once
// the manager stops, waits for the writes in flight.
func (w *statusWriter) Start(ctx context.Context) error {
	w.ctx = ctx
	close(w.started)
	<-ctx.Done()
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.writes.Wait()
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: the writer is stopped
// after the controllers that hand it statuses.
func (w *statusWriter) NeedLeaderElection() bool { return false }

// overlay replaces the status of task, read from the cache, with the status last handed
// over for it. It returns false when none is kept for this task (this uid): the caller
// reads the task from the API server and calls track.
func (w *statusWriter) overlay(task *inplacev1.UpgradeTask) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec, ok := w.tasks[client.ObjectKeyFromObject(task)]
	if !ok || rec.uid != task.UID {
		return false
	}
	task.Status = *rec.latest.DeepCopy()
	return true
}

// track starts keeping the status of task, as read from (or last written to) the API
// server, in place of what was kept about the task.
func (w *statusWriter) track(task *inplacev1.UpgradeTask) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tasks[client.ObjectKeyFromObject(task)] = &statusRecord{uid: task.UID, base: task.DeepCopy(), latest: task.Status.DeepCopy(), hurry: make(chan struct{}, 1)}
}

// takeError returns, once, the error of a failed background write of the task's status.
func (w *statusWriter) takeError(key types.NamespacedName) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec, ok := w.tasks[key]
	if !ok || rec.err == nil {
		return nil
	}
	err := rec.err
	rec.err = nil
	return err
}

// submit hands the status of task over to be written. When the task is not tracked
// (any more: an error or a conflict dropped it), nothing is written: the next
// reconcile computes the status again from what it reads.
func (w *statusWriter) submit(task *inplacev1.UpgradeTask) {
	key := client.ObjectKeyFromObject(task)
	w.mu.Lock()
	defer w.mu.Unlock()
	rec, ok := w.tasks[key]
	if !ok || rec.uid != task.UID || w.stopped {
		return
	}
	rec.latest = task.Status.DeepCopy()
	if rec.pending {
		return
	}
	rec.pending = true
	if rec.idle == nil {
		rec.idle = make(chan struct{})
		w.writes.Add(1)
		go w.write(key, rec)
	}
}

// write writes the latest status of a task until none is pending.
func (w *statusWriter) write(key types.NamespacedName, rec *statusRecord) {
	defer w.writes.Done()
	<-w.started
	log := ctrl.LoggerFrom(w.ctx).WithValues("controller", "upgradetask", "UpgradeTask", key)
	for {
		w.mu.Lock()
		if !rec.pending {
			close(rec.idle)
			rec.idle = nil
			select { // a flush that came as the last write ended needs no hurry
			case <-rec.hurry:
			default:
			}
			w.mu.Unlock()
			return
		}
		wait := time.Until(rec.lastSent.Add(w.intervalFor(rec.latest)))
		w.mu.Unlock()
		if wait > 0 {
			// One write of a task's status per interval at most: the statuses computed
			// meanwhile are folded into the next write. A flush does not wait.
			select {
			case <-time.After(wait):
			case <-rec.hurry:
			case <-w.ctx.Done():
			}
		}

		w.mu.Lock()
		rec.pending = false
		obj := rec.base.DeepCopy()
		obj.Status = *rec.latest.DeepCopy()
		base := rec.base
		w.mu.Unlock()

		written, err := w.update(base, obj)

		w.mu.Lock()
		switch {
		case err == nil:
			// The latest status handed over is stored: an earlier failure is moot.
			if written != base {
				rec.lastSent = time.Now()
			}
			rec.base, rec.err = written, nil
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err) || w.ctx.Err() != nil:
			// The task changed or went away meanwhile, or the manager stops: the next
			// reconcile (if any) starts from the API server.
			if w.tasks[key] == rec {
				delete(w.tasks, key)
			}
			rec.pending = false
			if !apierrors.IsNotFound(err) {
				rec.err = err // for a flush waiting on this write
			}
		default:
			rec.err = err
		}
		w.mu.Unlock()
		switch {
		case err == nil || w.ctx.Err() != nil || apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			log.V(1).Info("the UpgradeTask changed since its status was last written; reading it again", "reason", err.Error())
			w.retry(key)
		default:
			log.Error(err, "writing the status of the UpgradeTask failed; it is written again at its next reconcile")
			w.retry(key)
		}
	}
}

// statusWriteInterval is the least time between two writes of a task's status, but for
// its last status, while the status holds at most statusEntriesPerInterval machines. A
// reconcile per node ended would write it ten times a second with node work that takes no
// time, and slow down the writes that hand the next node over.
const statusWriteInterval = time.Second

// statusEntriesPerInterval is how many machine entries a task's status may hold for its
// writes to be statusWriteInterval apart; a larger status waits one interval more for
// every so many entries more, up to maxStatusWriteInterval. A write costs the API server
// in proportion to the entries (it decodes, validates and tracks the fields of each, and
// decodes the watch event it makes): the status of 500 machines took it 50 to 100 ms at
// p50 in make bench where 100 took 20. At one write a second, what a task's status costs
// the API server per node would grow with the task's size whenever nodes end faster than
// a second apart; with the interval growing with the entries, what it costs per second
// stays about that of 100 entries, whatever the size.
const statusEntriesPerInterval = 100

// maxStatusWriteInterval bounds how long a large task's status may lag behind the task:
// reached at 1,000 machines. Events tell each node's start and end as they happen.
const maxStatusWriteInterval = 10 * time.Second

// intervalFor is the least time between two writes of status (statusEntriesPerInterval).
func (w *statusWriter) intervalFor(status *inplacev1.UpgradeTaskStatus) time.Duration {
	steps := max(1, (len(status.Machines)+statusEntriesPerInterval-1)/statusEntriesPerInterval)
	return min(w.interval*time.Duration(steps), max(w.interval, maxStatusWriteInterval))
}

// update writes the status of obj over base and returns the task as written; when the
// statuses do not differ as the API stores them (times to the second) it writes nothing.
func (w *statusWriter) update(base, obj *inplacev1.UpgradeTask) (*inplacev1.UpgradeTask, error) {
	before, err := json.Marshal(base.Status)
	if err != nil {
		return nil, fmt.Errorf("encode the status of UpgradeTask %s: %w", klog.KObj(obj), err)
	}
	after, err := json.Marshal(obj.Status)
	if err != nil {
		return nil, fmt.Errorf("encode the status of UpgradeTask %s: %w", klog.KObj(obj), err)
	}
	if bytes.Equal(before, after) {
		return base, nil
	}
	if err := w.client.Status().Update(w.ctx, obj); err != nil {
		return nil, fmt.Errorf("write status of UpgradeTask %s: %w", klog.KObj(obj), err)
	}
	return obj, nil
}

// flush waits until the status handed over last for the task is written, and returns the
// error of that write.
func (w *statusWriter) flush(ctx context.Context, key types.NamespacedName) error {
	w.mu.Lock()
	rec := w.tasks[key]
	var idle chan struct{}
	if rec != nil {
		idle = rec.idle
		if idle != nil {
			select {
			case rec.hurry <- struct{}{}:
			default:
			}
		}
	}
	w.mu.Unlock()
	if rec == nil {
		return nil
	}
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	err := rec.err
	rec.err = nil
	return err
}

// forget waits for the task's writes in flight and drops what is kept about it.
func (w *statusWriter) forget(ctx context.Context, key types.NamespacedName) {
	_ = w.flush(ctx, key)
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.tasks, key)
}
