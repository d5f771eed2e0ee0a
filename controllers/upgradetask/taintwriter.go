package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// taintWriter brings the upgrade-pending taints of a running task's nodes to what its
// last reconcile wants, off the reconcile's path. A task's first reconcile taints every
// node still to go (hundreds of writes to the workload cluster, one per node), and each
// node that ends has its taint taken off: a reconcile that waited for them would hold
// the next hand-off, as the reconciles of one task run one after the other. The taint
// only makes kube-scheduler prefer other nodes, so nothing else waits for it.
//
// A task has at most one hand-over being written and one pending; a later hand-over
// replaces the pending one. Each node is written with the resourceVersion its reconcile
// read, so a node changed since is never overwritten: the write conflicts, and the next
// reconcile, which reads the node again, hands it over again.
//
// A task that ends, is aborted to its end or is deleted settles its writes first
// (trySettle) and then writes its taints itself, so that no taint is written after its
// last reconcile. While a hand-over is still being written the reconcile does not wait for
// it (a slow workload cluster would hold one of the controller's workers): it ends without
// the task's end, and the writer asks for the task again once the write is done.
//
// taintWriter is a manager.Runnable: writes begin once the manager started it and end
// with the manager.
type taintWriter struct {
	// workload returns the client of a Cluster's workload cluster.
	workload func(ctx context.Context, cluster types.NamespacedName) (client.Client, error)
	// timeout bounds each write (setPendingTaint).
	timeout time.Duration
	// retry asks for a reconcile of a task one of whose taint writes failed; wake asks for
	// one at once, for a task that waits to settle.
	retry, wake func(key types.NamespacedName)

	ctx     context.Context
	workers sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	tasks   map[types.NamespacedName]*taintSlot
	// written holds, by task and node, the last taint write the writer made: a reconcile
	// whose cache does not show it yet hands the node over again as it was before the
	// write, and is not written again (a conflict per node, hundreds of them while a
	// task's first taints are written).
	written map[types.NamespacedName]map[string]taintWritten
}

// taintWritten is a write the writer made: the node's resourceVersion it was written
// from, and whether the node carries the taint since. unsure marks a put the workload
// cluster took and never answered (given up after the writer's timeout, or cut by the
// connection): the server may still carry it out later, so the task's end fences the
// node (fenceNode) even when no taint shows on it.
type taintWritten struct {
	from   string
	has    bool
	unsure bool
}

// taintSlot is what is kept about a task while a hand-over of its taints is pending or
// being written.
type taintSlot struct {
	pending *taintJob
	running bool
	// waited says that a reconcile found the hand-over being written and waits to settle:
	// the task is woken once the writer is done.
	waited bool
}

// taintJob is one hand-over: the nodes as the reconcile read them, and which of them
// carry the task's taint.
type taintJob struct {
	task    types.NamespacedName
	cluster types.NamespacedName
	taint   corev1.Taint
	nodes   []*corev1.Node
	want    map[string]bool
	// stray are values of the taint's key that no task that has not ended carries: taken
	// off wherever they are (strayPendingTaints).
	stray map[string]bool
}

// TaintWriteConcurrency bounds the taint writes of one task in flight at once.
const TaintWriteConcurrency = 4

func newTaintWriter(workload func(context.Context, types.NamespacedName) (client.Client, error), timeout time.Duration, retry, wake func(types.NamespacedName)) *taintWriter {
	return &taintWriter{workload: workload, timeout: timeout, retry: retry, wake: wake, tasks: map[types.NamespacedName]*taintSlot{}, written: map[types.NamespacedName]map[string]taintWritten{}}
}

// Start implements manager.Runnable: writes run until the manager stops, which then
// waits for the writes in flight. Hand-overs pending then are dropped.
func (w *taintWriter) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.workers.Wait()
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: the writes are the
// reconciles', which run only on the leader.
func (w *taintWriter) NeedLeaderElection() bool { return false }

// submit hands over the taints of a task's nodes: the node named in want true carry
// taint, every other node of nodes does not. It returns at once.
func (w *taintWriter) submit(task, cluster types.NamespacedName, taint corev1.Taint, nodes map[string]*corev1.Node, want, stray map[string]bool) {
	job := &taintJob{task: task, cluster: cluster, taint: taint, want: want, stray: stray}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.ctx == nil {
		return
	}
	written := w.written[task]
	for _, n := range nodes {
		if _, changed := wantedTaints(n, taint, want[n.Name], stray); !changed {
			continue
		}
		if lags, _ := lagging(written, n); lags {
			// The node as it was before the writer's last write of it: written with
			// the resourceVersion read, it would conflict. The next reconcile sees it.
			continue
		}
		job.nodes = append(job.nodes, n.DeepCopy())
	}
	slot := w.tasks[task]
	if slot == nil {
		if len(job.nodes) == 0 {
			return
		}
		slot = &taintSlot{}
		w.tasks[task] = slot
	}
	// Even an empty hand-over replaces the pending one: the last reconcile wins.
	slot.pending = job
	if !slot.running {
		slot.running = true
		w.workers.Add(1)
		go w.run(task, slot)
	}
}

// run writes the task's hand-overs until none is pending.
func (w *taintWriter) run(task types.NamespacedName, slot *taintSlot) {
	defer w.workers.Done()
	for {
		w.mu.Lock()
		job := slot.pending
		slot.pending = nil
		if job == nil || w.stopped {
			slot.running = false
			delete(w.tasks, task)
			waited := slot.waited && !w.stopped
			w.mu.Unlock()
			if waited {
				w.wake(task)
			}
			return
		}
		ctx := w.ctx
		w.mu.Unlock()
		if err := w.write(ctx, job); err != nil && ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "writing the upgrade-pending taints of an UpgradeTask failed; they are written again at its next reconcile",
				"controller", "upgradetask", "UpgradeTask", task)
			w.retry(task)
		}
	}
}

// write brings the job's nodes to what it wants, at most TaintWriteConcurrency at once.
// A node changed since it was read is left to the next reconcile.
func (w *taintWriter) write(ctx context.Context, job *taintJob) error {
	if len(job.nodes) == 0 {
		return nil
	}
	wc, err := w.workload(ctx, job.cluster)
	if err != nil {
		return fmt.Errorf("reach the workload cluster of Cluster %s to set the upgrade-pending taints: %w", job.cluster, err)
	}
	return forEachConcurrently(job.nodes, TaintWriteConcurrency, func(node *corev1.Node) error {
		from := node.ResourceVersion
		err := setPendingTaint(ctx, wc, node, job.taint, job.want[node.Name], job.stray, w.timeout)
		switch {
		case err == nil:
			w.record(job.task, node.Name, taintWritten{from: from, has: job.want[node.Name]})
		case job.want[node.Name] && outcomeUnknown(err):
			w.record(job.task, node.Name, taintWritten{unsure: true})
		}
		if apierrors.IsConflict(err) {
			ctrl.LoggerFrom(ctx).V(1).Info("upgrade-pending taint not written yet", "node", node.Name, "error", err.Error())
			return nil
		}
		return err
	})
}

func (w *taintWriter) record(task types.NamespacedName, node string, written taintWritten) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written[task] == nil {
		w.written[task] = map[string]taintWritten{}
	}
	w.written[task][node] = written
}

// outcomeUnknown says whether a write that failed with err may still be carried out by
// the server: it never answered (a deadline, a connection cut), rather than refused it
// with a status.
func outcomeUnknown(err error) bool {
	var status apierrors.APIStatus
	return err != nil && !errors.As(err, &status)
}

// trySettle drops the task's pending hand-over and says whether the writer is done with
// the task: then no taint the task handed over is written any more, and it returns the
// writes the writer made for it (lagging tells a node the cache shows as it was before
// one of them). While a hand-over is being written it returns false, and the writer asks
// for the task (wake) once that write is done.
func (w *taintWriter) trySettle(task types.NamespacedName) (map[string]taintWritten, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if slot := w.tasks[task]; slot != nil {
		slot.pending = nil
		slot.waited = true
		return nil, false
	}
	return maps.Clone(w.written[task]), true
}

// forget drops what is kept about a task whose taints were all written at its end, or
// that is gone.
func (w *taintWriter) forget(task types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.written, task)
}

// lagging says whether the cache shows node as it was before the writer's last write of
// it, and if so whether that write left the taint on it.
func lagging(written map[string]taintWritten, node *corev1.Node) (lags, has bool) {
	last, ok := written[node.Name]
	return ok && last.from == node.ResourceVersion, last.has
}

// setPendingTaintNow is setPendingTaint for a node the cache may show from before one
// of the writer's writes (written, from settle): a node already as wanted is left alone,
// and one that is not is a conflict, for the reconcile to read it again.
func setPendingTaintNow(ctx context.Context, wc client.Client, written map[string]taintWritten, node *corev1.Node, taint corev1.Taint, want bool, timeout time.Duration) error {
	if lags, has := lagging(written, node); lags {
		if has == want {
			return nil
		}
		return apierrors.NewConflict(corev1.Resource("nodes"), node.Name,
			fmt.Errorf("the cache does not show the upgrade-pending taint written at resourceVersion %s yet", node.ResourceVersion))
	}
	if !want && written[node.Name].unsure && !needsTaintWrite(node, taint, false) {
		return fenceNode(ctx, wc, node, taint, timeout)
	}
	return setPendingTaint(ctx, wc, node, taint, want, nil, timeout)
}

// PendingFenceAnnotation is set on a Node and taken off again at once by a task's end,
// when a put of the task's taint on the node went unanswered (fenceNode).
const PendingFenceAnnotation = inplacev1.AnnotationPrefix + "upgrade-pending-fence"

// fenceNode makes a put of the task's taint that the workload cluster took and never
// answered fail if the server carries it out after all: each put carries the
// resourceVersion it was read at, so a write of the node after it (an annotation set, then
// taken off) leaves it to conflict. Both writes carry the resourceVersion read too: a put
// that landed since makes them conflict, and the next reconcile, which then sees the taint,
// takes it off (which fences the node as well).
func fenceNode(ctx context.Context, wc client.Client, node *corev1.Node, taint corev1.Taint, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, set := range []bool{true, false} {
		fenced := node.DeepCopy()
		if set {
			metav1.SetMetaDataAnnotation(&fenced.ObjectMeta, PendingFenceAnnotation, taint.Value)
		} else {
			delete(fenced.Annotations, PendingFenceAnnotation)
		}
		if err := wc.Patch(ctx, fenced, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("fence node %s against an upgrade-pending taint put the workload cluster did not answer: %w", node.Name, err)
		}
		node = fenced
	}
	ctrl.LoggerFrom(ctx).V(1).Info("upgrade-pending taint put that went unanswered fenced", "node", node.Name)
	return nil
}

// needsTaintWrite says whether node must be written to carry taint (want) or not.
func needsTaintWrite(node *corev1.Node, taint corev1.Taint, want bool) bool {
	_, changed := wantedTaints(node, taint, want, nil)
	return changed
}

// wantedTaints are the taints node carries once it carries taint (want) or not and none
// of the stray values of taint's key: a taint of the key with another value that is not
// stray belongs to another task and is left alone, and then taint is not put on (key and
// effect are unique on a node). changed says whether they differ from the node's.
func wantedTaints(node *corev1.Node, taint corev1.Taint, want bool, stray map[string]bool) ([]corev1.Taint, bool) {
	sameKey := func(t corev1.Taint) bool { return t.Key == taint.Key && t.Effect == taint.Effect }
	out := make([]corev1.Taint, 0, len(node.Spec.Taints)+1)
	has, other, changed := false, false, false
	for _, t := range node.Spec.Taints {
		switch {
		case !sameKey(t):
		case t.Value == taint.Value:
			if !want {
				changed = true
				continue
			}
			has = true
		case stray[t.Value]:
			changed = true
			continue
		default:
			other = true
		}
		out = append(out, t)
	}
	if want && !has && !other {
		out, changed = append(out, taint), true
	}
	return out, changed
}
