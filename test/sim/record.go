// Package sim holds the simulators that play, on a real API server, the parts no API
// server has: the kubelet of each node (Ready, NotReady around a restart or reboot, its
// version) and System Upgrade Controller (Plans run as Jobs on the selected nodes). Each
// simulator records what it did, so tests assert safety (how many nodes were down at
// once, which node ran which plan, whether anything ran twice), not only completion, and
// can be told to fail a given node.
package sim

import (
	"sort"
	"sync"
	"time"
)

// PlanRun is one run of a SUC Plan on one node.
type PlanRun struct {
	Plan    string
	Node    string
	Job     string
	Hash    string
	Version string
	// Images are the images of the run's pod, init containers first.
	Images []string
	// Commands are what the pod's containers ran, in the same order (podCommand): a node
	// program subcommand, kubectl's verb, or the image's name and tag.
	Commands []string
	// PlanSeen is when the simulator first synced the run's Plan: with Start and
	// Labelled, what System Upgrade Controller's chain around the pod's work took (facts
	// 28 and 46): from the Plan to the pod started (a Job created paused, the Plan's
	// applying status, the Job resumed, the pod), and from the Job's completion to the
	// node's label.
	PlanSeen time.Time
	Start    time.Time
	End      time.Time
	// Labelled is when the simulator labelled the node with the run's hash after its Job
	// completed (fact 46); zero until then.
	Labelled time.Time
	// Failed is true when the run's Job failed; Message is its reason, or what holds a
	// run that has not ended (an image that cannot be pulled).
	Failed  bool
	Message string
	// Interrupted is true when SUC deleted the Job while its pod still ran.
	Interrupted bool
	// Deleted says why SUC deleted the run's Job, if it did.
	Deleted string
}

// JobRejection is a Job of a Plan that the API server refused to create.
type JobRejection struct {
	Plan, Node, Job, Error string
}

// NodeEvent is something done to a node: drained by a Plan's Job, or uncordoned by SUC
// when a Plan's Job completed.
type NodeEvent struct {
	Node, Plan string
	At         time.Time
}

// Record is what the simulators observed and did, safe for concurrent use.
type Record struct {
	mu      sync.Mutex
	runs    []PlanRun
	down    map[string]bool
	maxDown int
	downLog []DownEvent
	rejects []JobRejection
	drains  []NodeEvent
	// uncordons are SUC's uncordons after a completed Job (fact 46).
	uncordons []NodeEvent
	reboots   []Reboot
}

// Reboot is a reboot of a node's host: Start when it went down, End when its kubelet
// reported Ready again on the new boot (zero while it is down).
type Reboot struct {
	Node       string
	Start, End time.Time
}

// DownEvent is a node going NotReady (Down true) or coming back Ready.
type DownEvent struct {
	Node string
	Down bool
	At   time.Time
}

// NewRecord returns an empty record.
func NewRecord() *Record {
	return &Record{down: map[string]bool{}}
}

func (r *Record) startRun(run PlanRun) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, run)
	return len(r.runs) - 1
}

func (r *Record) endRun(i int, end time.Time, failed bool, message string, interrupted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[i].End, r.runs[i].Failed, r.runs[i].Interrupted = end, failed, interrupted
	if message != "" {
		r.runs[i].Message = message
	}
}

func (r *Record) labelledRun(i int, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs[i].Labelled.IsZero() {
		r.runs[i].Labelled = at
	}
}

func (r *Record) deletedRun(i int, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[i].Deleted = why
}

func (r *Record) noteRun(i int, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[i].Message = message
}

// rejectJob records a refused Job once: SUC tries again on every sync, as the
// simulator does.
func (r *Record) rejectJob(j JobRejection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, seen := range r.rejects {
		if seen == j {
			return
		}
	}
	r.rejects = append(r.rejects, j)
}

func (r *Record) drained(node, plan string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drains = append(r.drains, NodeEvent{Node: node, Plan: plan, At: at})
}

func (r *Record) uncordonedBySUC(node, plan string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.uncordons = append(r.uncordons, NodeEvent{Node: node, Plan: plan, At: at})
}

func (r *Record) rebootStarted(node string, at time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reboots = append(r.reboots, Reboot{Node: node, Start: at})
	return len(r.reboots) - 1
}

func (r *Record) rebootEnded(i int, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reboots[i].End = at
}

// Reboots returns the reboots of node (of every node when node is ""), in order.
func (r *Record) Reboots(node string) []Reboot {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Reboot
	for _, rb := range r.reboots {
		if node == "" || rb.Node == node {
			out = append(out, rb)
		}
	}
	return out
}

// Rejections returns the Jobs the API server refused to create, in order.
func (r *Record) Rejections() []JobRejection {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]JobRejection(nil), r.rejects...)
}

// Drains returns the drains of node by Plans' Jobs, in order.
func (r *Record) Drains(node string) []NodeEvent {
	return r.nodeEvents(&r.drains, node)
}

// UncordonsBySUC returns SUC's uncordons of node after a Plan's Job completed, in order.
func (r *Record) UncordonsBySUC(node string) []NodeEvent {
	return r.nodeEvents(&r.uncordons, node)
}

func (r *Record) nodeEvents(events *[]NodeEvent, node string) []NodeEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []NodeEvent
	for _, e := range *events {
		if e.Node == node {
			out = append(out, e)
		}
	}
	return out
}

func (r *Record) nodeDown(node string, down bool, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down[node] == down {
		return
	}
	r.down[node] = down
	r.downLog = append(r.downLog, DownEvent{Node: node, Down: down, At: at})
	n := 0
	for _, d := range r.down {
		if d {
			n++
		}
	}
	if n > r.maxDown {
		r.maxDown = n
	}
}

// Runs returns every plan run so far, in start order.
func (r *Record) Runs() []PlanRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]PlanRun(nil), r.runs...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// RunsOf returns how many times each node ran the named plan.
func (r *Record) RunsOf(plan string) map[string]int {
	out := map[string]int{}
	for _, run := range r.Runs() {
		if run.Plan == plan {
			out[run.Node]++
		}
	}
	return out
}

// MaxDown is the largest number of nodes that were NotReady at the same time.
func (r *Record) MaxDown() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxDown
}

// DownLog returns the NotReady / Ready transitions in order.
func (r *Record) DownLog() []DownEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]DownEvent(nil), r.downLog...)
}

// MaxConcurrentRuns is the largest number of plan runs (of any plan) that overlapped.
func (r *Record) MaxConcurrentRuns() int {
	runs := r.Runs()
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, run := range runs {
		end := run.End
		if end.IsZero() {
			end = time.Now().Add(time.Hour)
		}
		edges = append(edges, edge{run.Start, 1}, edge{end, -1})
	}
	// Ends sort before starts at the same instant: a run that ends as another starts
	// did not overlap it.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].at.Before(edges[j].at)
	})
	cur, maxSeen := 0, 0
	for _, e := range edges {
		cur += e.delta
		if cur > maxSeen {
			maxSeen = cur
		}
	}
	return maxSeen
}
