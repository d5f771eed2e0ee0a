package upgradetask

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
)

// DefaultGateInterval is how often the health gates of a task are evaluated again.
const DefaultGateInterval = 20 * time.Second

// gateResults holds the last results of each task's health gates: gates read Prometheus,
// list objects and run Jobs, which is too much for every reconcile. It is a cache only:
// what an operator sees (and a restarted manager starts from) is status.gates.
type gateResults struct {
	mu     sync.Mutex
	byTask map[types.UID]gateEntry
	// jobsDeleted holds the ended tasks whose gate Jobs were deleted (deleteGateJobs).
	jobsDeleted map[types.UID]bool
}

type gateEntry struct {
	// at is when the gates were evaluated.
	at time.Time
	// key is what the results depend on besides time: the task's generation, the
	// Cluster's gates annotation and the count of ended nodes.
	key     string
	results []healthgate.Result
}

func (g *gateResults) get(uid types.UID) (gateEntry, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.byTask[uid]
	return e, ok
}

func (g *gateResults) put(uid types.UID, e gateEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byTask == nil {
		g.byTask = map[types.UID]gateEntry{}
	}
	g.byTask[uid] = e
}

func (g *gateResults) forget(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.byTask, uid)
}

// deletedJobs tells whether the task's gate Jobs were deleted, and with done, records that
// they were.
func (g *gateResults) deletedJobs(uid types.UID, done bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if done {
		if g.jobsDeleted == nil {
			g.jobsDeleted = map[types.UID]bool{}
		}
		g.jobsDeleted[uid] = true
	}
	return g.jobsDeleted[uid]
}

// healthGates evaluates the task's health gates when their last results are older than
// the gate interval or a node ended since, records an event for each gate that turned
// red or green, sets s.gates (status.gates) and returns what preflight's health gate
// looks at.
func (r *Reconciler) healthGates(ctx context.Context, s *taskScope) []preflight.HealthGate {
	task := s.task
	gates, bad := healthgate.Merge(task.Spec.Gates, s.cluster)
	if len(gates) == 0 && len(bad) == 0 {
		r.gateResults.forget(task.UID)
		s.gates = nil
		return nil
	}
	ended, waiting := 0, false
	for _, mem := range s.members {
		switch mem.state {
		case inplacev1.MachineStateUpgraded, inplacev1.MachineStateFailed:
			ended++
		case inplacev1.MachineStateWaiting:
			waiting = true
		}
	}
	if !waiting {
		// No node is left to start: the gates decide nothing, and are not run again
		// (a Job gate would run once more after the last node). Their last results stay.
		s.gates = task.Status.Gates
		return nil
	}
	annotation := ""
	if s.cluster != nil {
		annotation = s.cluster.Annotations[inplacev1.GatesAnnotation]
	}
	key := fmt.Sprintf("%d/%d/%s", task.Generation, ended, annotation)
	interval := r.GateInterval
	if interval <= 0 {
		interval = DefaultGateInterval
	}
	prev, cached := r.gateResults.get(task.UID)
	results := prev.results
	if !cached || prev.key != key || s.now.Sub(prev.at) >= interval {
		in := healthgate.Input{Namespace: task.Namespace, Task: task.Name, Ended: ended, FromCluster: healthgate.FromCluster(task.Spec.Gates, gates)}
		if s.cluster != nil {
			in.Workload, in.WorkloadErr = r.Workload.Client(ctx, types.NamespacedName{Namespace: s.cluster.Namespace, Name: s.cluster.Name})
		} else {
			in.WorkloadErr = fmt.Errorf("the Cluster %s/%s was not found", task.Namespace, task.Spec.ClusterName)
		}
		reader := r.APIReader
		if reader == nil {
			reader = r.Client
		}
		ev := &healthgate.Evaluator{Management: reader, Policy: r.GatePolicy}
		results = append(bad, ev.Evaluate(ctx, gates, in)...)
		r.gateResults.put(task.UID, gateEntry{at: s.now, key: key, results: results})
		ctrl.LoggerFrom(ctx).V(4).Info("health gates evaluated", "ended", ended, "results", results)
	}

	before := map[string]inplacev1.HealthGateStatus{}
	for _, g := range task.Status.Gates {
		before[g.Name] = g
	}
	if cached {
		// The cache knows the last results even when the status written in the background
		// is not read back yet: one event per transition.
		for _, res := range prev.results {
			st := before[res.Name]
			st.State = gateState(res.Green)
			before[res.Name] = st
		}
	}
	s.gates = make([]inplacev1.HealthGateStatus, 0, len(results))
	out := make([]preflight.HealthGate, 0, len(results))
	for _, res := range results {
		st := inplacev1.HealthGateStatus{Name: res.Name, State: gateState(res.Green), Message: truncate(res.Message, 4096)}
		old, seen := before[res.Name]
		if seen && old.State == st.State && old.LastTransitionTime != nil {
			st.LastTransitionTime = old.LastTransitionTime
		} else {
			st.LastTransitionTime = ptrTime(metav1.NewTime(s.now))
		}
		if !seen || old.State != st.State {
			r.recordGateTransition(ctx, s, st, seen)
		}
		s.gates = append(s.gates, st)
		hg := preflight.HealthGate{Name: res.Name, Green: res.Green, Message: res.Message}
		if res.Green {
			hg.GreenSince = st.LastTransitionTime.Time
		}
		out = append(out, hg)
	}
	slices.SortStableFunc(s.gates, func(a, b inplacev1.HealthGateStatus) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

func (r *Reconciler) recordGateTransition(ctx context.Context, s *taskScope, st inplacev1.HealthGateStatus, seen bool) {
	log := ctrl.LoggerFrom(ctx)
	if st.State == inplacev1.GateRed {
		log.Info("health gate is red; no new node starts", "gate", st.Name, "message", st.Message)
		r.Recorder.Eventf(s.task, nil, corev1.EventTypeWarning, inplacev1.GateRedReason, "Gate", "health gate %s is red: %s", st.Name, st.Message)
		return
	}
	if seen {
		log.Info("health gate is green", "gate", st.Name, "message", st.Message)
		r.Recorder.Eventf(s.task, nil, corev1.EventTypeNormal, inplacev1.GateGreenReason, "Gate", "health gate %s is green: %s", st.Name, st.Message)
	}
}

func gateState(green bool) inplacev1.GateState {
	if green {
		return inplacev1.GateGreen
	}
	return inplacev1.GateRed
}
