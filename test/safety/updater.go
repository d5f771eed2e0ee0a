package safety

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// The simulated updater's steps, in order. They stand for what a real updater does to a
// node (the Harvester adapter: DESIGN.md section 5): work while the node serves (image
// preload, drain), a disruptive step (the RKE2 upgrade restarts the kubelet, the OS step
// reboots: the node is NotReady), and the node coming back Ready at the new version. The
// disruptive step arms a reboot that the host carries out a moment later whatever the
// manager does, as a Harvester node's OS Job arms its reboot and completes before the
// host goes down (node sheet fact 28): the updater's Abort waits for it, so no reboot
// comes after the NodeUpdate ended (invariant 8).
const (
	stepPrepare = "Prepare"
	stepDrain   = "Drain"
	stepReboot  = "Reboot"
	stepKubelet = "Kubelet"
)

var steps = []string{stepPrepare, stepDrain, stepReboot, stepKubelet}

// updateState is what the simulated updater knows of one NodeUpdate, kept across manager
// restarts as a real updater's work on a node (its SUC Plans and Jobs) outlives the
// manager.
type updateState struct {
	node, machine, version string
	// next is the index of the step to run next; nextAt when it is due.
	next   int
	nextAt time.Time
	// failAt is the step at which the node fails (-1: never).
	failAt int
	down   bool
	// armed: the disruptive step armed the host's reboot; rebooted: it happened.
	armed, rebooted bool
	// skip: the NodeUpdate carries drainPolicy Skip and its drain is to stay blocked, so
	// the updater puts the node back at the Drain step; skipErr is the SkipError it
	// answered once it decided so.
	skip    bool
	skipErr error
	// ended is "", "succeeded", "failed", "aborted" or "skipped".
	ended   string
	failErr error
	resumed bool
	// askedAfterSkip: Reconcile was called again after the skip's put-back was done.
	askedAfterSkip bool
}

// Updater is the simulated updater: it implements nodeupdater.Updater and
// nodeupdater.TargetJudge for the updater configuration kind ConfigMap, records every
// thing it does to a node in the History, and can be told to fail nodes.
type Updater struct {
	Client   client.Client
	Kubelets *Kubelets
	Volumes  *Volumes
	History  *History
	// TargetOf maps a node to its control plane or MachineDeployment, ControlPlane names the control plane.
	TargetOf     map[string]string
	ControlPlane string
	// TargetSize says how many machines a target has now (machines deleted do not count).
	TargetSize func(target string) int
	// FailProbability is the chance that a NodeUpdate fails at a random step.
	FailProbability float64
	// SkipProbability is the chance that the drain of a NodeUpdate whose drainPolicy is
	// Skip stays blocked past its grace period, so that the updater puts the node back.
	SkipProbability float64

	mu      sync.Mutex
	rng     *rand.Rand
	updates map[string]*updateState
	// kubelet is the kubelet version each node runs, as the updater left it.
	kubelet map[string]string
}

// NewUpdater returns a simulated updater whose random choices (step durations, where a
// node fails) come from seed.
func NewUpdater(seed int64, initial map[string]string) *Updater {
	u := &Updater{rng: rand.New(rand.NewSource(seed)), updates: map[string]*updateState{}, kubelet: map[string]string{}}
	for n, v := range initial {
		u.kubelet[n] = v
	}
	return u
}

var (
	_ nodeupdater.Updater     = &Updater{}
	_ nodeupdater.TargetJudge = &Updater{}
)

func updateKey(nu *inplacev1.NodeUpdate) string { return nu.Name + "/" + string(nu.UID) }

// stepDuration is how long one step takes: some tens of milliseconds.
func (u *Updater) stepDuration() time.Duration {
	return time.Duration(10+u.rng.Intn(40)) * time.Millisecond
}

// Reconcile implements nodeupdater.Updater: it runs the NodeUpdate's next step when it
// is due.
func (u *Updater) Reconcile(ctx context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	u.mu.Lock()
	st := u.updates[updateKey(nu)]
	if st == nil {
		st = u.start(ctx, nu)
	}
	if st.skipErr != nil {
		// The skip may not have been persisted (the manager stopped before it wrote the
		// status): asked again, the updater answers the same skip without touching the
		// node, and the reconciler goes on to Abort, which says done at once when the
		// put-back is done. Asked after the put-back was done, the History records it: the
		// Checker judges it against what the API showed (invariant 6).
		skipErr := st.skipErr
		first := st.ended == "skipped" && !st.askedAfterSkip
		if first {
			st.askedAfterSkip = true
		}
		u.mu.Unlock()
		if first {
			u.History.Record(Event{Kind: EventAskedAfterSkip, Node: st.node, NodeUpdate: nu.Name})
		}
		return nodeupdater.Result{}, skipErr
	}
	switch st.ended {
	case "succeeded":
		u.mu.Unlock()
		return nodeupdater.Result{Done: true}, nil
	case "failed":
		// The failure may not have been persisted (the manager stopped before it wrote
		// the status): the contract calls Reconcile again with the status as last
		// persisted, and the updater answers the same failure without touching the node.
		failErr := st.failErr
		u.mu.Unlock()
		u.History.Action("updater asked again about failed NodeUpdate %s; answers the same failure", nu.Name)
		return nodeupdater.Result{}, failErr
	case "aborted":
		// After Abort said done, the nodeupdater only calls Abort again (the NodeUpdate
		// says Abort, or it timed out, or it is being deleted). A real updater keeps no
		// memory of having stopped: asked to go on, it would start over on the node.
		first := !st.resumed
		st.resumed = true
		u.mu.Unlock()
		if first {
			u.History.Record(Event{Kind: EventResumedAfterEnd, Node: st.node, NodeUpdate: nu.Name, Why: "aborted"})
		}
		return nodeupdater.Result{RequeueAfter: time.Second}, nil
	}
	now := time.Now()
	if now.Before(st.nextAt) {
		u.mu.Unlock()
		return nodeupdater.Result{RequeueAfter: st.nextAt.Sub(now)}, nil
	}
	step := st.next
	fail := st.failAt == step
	if st.armed && !st.rebooted {
		// Nothing goes on, not even a failure, until the armed reboot has happened.
		u.mu.Unlock()
		return nodeupdater.Result{RequeueAfter: 10 * time.Millisecond}, nil
	}
	u.mu.Unlock()

	nodeupdater.DeclareSteps(nu, steps...)
	for _, done := range steps[:step] {
		if nodeupdater.StepState(nu, done) != inplacev1.StepStateSucceeded {
			nodeupdater.CompleteStep(nu, done, "")
		}
	}
	nodeupdater.StartStep(nu, steps[step], "simulated "+strings.ToLower(steps[step])+" on node "+nu.Spec.NodeName)

	if fail {
		return nodeupdater.Result{}, u.fail(ctx, nu, st, step)
	}
	if st.skip && steps[step] == stepDrain {
		return nodeupdater.Result{}, u.skipNode(nu, st)
	}
	switch steps[step] {
	case stepReboot:
		// Recorded when the updater decides to take the node down, which is when it arms
		// the reboot: the Checker judges that moment.
		u.History.Record(Event{Kind: EventNodeDown, Node: st.node, NodeUpdate: nu.Name, Target: u.TargetOf[st.node]})
		u.mu.Lock()
		st.down, st.armed = true, true
		// The host reboots a while after the step armed it (a Harvester OS Job's
		// reboot comes a minute after it completed): long enough, against steps of
		// tens of milliseconds, for aborts and timeouts to land in between.
		delay := 4*u.stepDuration() + 60*time.Millisecond
		u.mu.Unlock()
		u.armReboot(nu.Name, st, delay)
	case stepKubelet:
		if err := u.Kubelets.SetVersion(ctx, st.machine, st.node, st.version); err != nil {
			return nodeupdater.Result{}, fmt.Errorf("set the kubelet version of node %s: %w", st.node, err)
		}
		u.History.Record(Event{Kind: EventKubelet, Node: st.node, NodeUpdate: nu.Name, Version: st.version})
		if err := u.Kubelets.Hold(ctx, st.node, nu.Name, false); err != nil {
			return nodeupdater.Result{}, fmt.Errorf("bring node %s back: %w", st.node, err)
		}
		u.History.Record(Event{Kind: EventNodeUp, Node: st.node, NodeUpdate: nu.Name})
		u.mu.Lock()
		st.down = false
		st.ended = "succeeded"
		u.kubelet[st.node] = st.version
		u.mu.Unlock()
		u.History.Record(Event{Kind: EventNodeUpdateDone, Node: st.node, NodeUpdate: nu.Name, Version: st.version})
		return nodeupdater.Result{Done: true}, nil
	}
	u.mu.Lock()
	st.next++
	d := u.stepDuration()
	if steps[step] == stepReboot {
		d += u.stepDuration()
	}
	st.nextAt = time.Now().Add(d)
	u.mu.Unlock()
	return nodeupdater.Result{RequeueAfter: d}, nil
}

// armReboot has the host of st's node reboot after delay, whatever the manager does
// meanwhile: the host takes the node NotReady (until the updater brings it back) and the
// History records the reboot.
func (u *Updater) armReboot(nuName string, st *updateState, delay time.Duration) {
	time.AfterFunc(delay, func() {
		u.History.Record(Event{Kind: EventHostReboot, Node: st.node, NodeUpdate: nuName})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := u.Kubelets.Hold(ctx, st.node, nuName, true); err != nil && !errors.Is(err, errNodeGone) {
			u.History.Action("the host of node %s rebooted, but its NotReady could not be written: %v", st.node, err)
		}
		u.mu.Lock()
		st.rebooted = true
		u.mu.Unlock()
	})
}

// start takes a NodeUpdate into the updater's hands; u.mu is held.
func (u *Updater) start(ctx context.Context, nu *inplacev1.NodeUpdate) *updateState {
	st := &updateState{node: nu.Spec.NodeName, machine: nu.Spec.MachineName, version: nu.Spec.Version, failAt: -1}
	if u.rng.Float64() < u.FailProbability {
		st.failAt = u.rng.Intn(len(steps))
	}
	// Only a NodeUpdate whose drainPolicy (copied from its task or its Cluster's
	// annotation) is Skip is put back: under Hold a blocked drain holds until its step
	// times out, under Evict the blocking pods are deleted; neither puts a node back.
	skipDraw := u.rng.Float64()
	if nu.Spec.DrainPolicy.DrainModeOrDefault() == inplacev1.DrainModeSkip && skipDraw < u.SkipProbability {
		st.skip = true
	}
	st.nextAt = time.Now().Add(u.stepDuration())
	u.updates[updateKey(nu)] = st
	task, mu := u.taskOf(ctx, nu)
	var whys []string
	if st.failAt >= 0 {
		whys = append(whys, "will fail at step "+steps[st.failAt])
	}
	if st.skip {
		whys = append(whys, "drain will stay blocked: skipped at step "+stepDrain)
	}
	why := strings.Join(whys, "; ")
	u.History.Record(Event{Kind: EventNodeUpdateStart, Node: st.node, NodeUpdate: nu.Name, Task: task, Target: u.TargetOf[st.node],
		Version: st.version, MaxUnavailable: mu, Why: why})
	return st
}

// taskOf names the NodeUpdate's UpgradeTask and its maxUnavailable resolved against the
// target's size now (1 for a control plane, as the controller takes it). The task is read
// on the test's own terms, not the reconcile's: a manager that is stopping cancels the
// reconcile's context, and a task that could not be read is judged by the smallest
// budget there is (the soak's seed 310 judged a 100% task by maxUnavailable 1 that way).
func (u *Updater) taskOf(ctx context.Context, nu *inplacev1.NodeUpdate) (string, int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	name := ""
	for _, ref := range nu.OwnerReferences {
		if ref.Kind == "UpgradeTask" {
			name = ref.Name
		}
	}
	target := u.TargetOf[nu.Spec.NodeName]
	if target == u.ControlPlane {
		return name, 1
	}
	task := &inplacev1.UpgradeTask{}
	if name == "" || u.Client.Get(ctx, client.ObjectKey{Namespace: nu.Namespace, Name: name}, task) != nil {
		// Unknown: judged as the smallest budget there is.
		return name, 1
	}
	n, err := preflight.ResolveMaxUnavailable(task.Spec.MaxUnavailable, u.TargetSize(target))
	if err != nil {
		return name, 1
	}
	return name, n
}

// fail is the node failing at step: the updater stops there, brings the node back to
// where it was (a real updater removes what it created before the NodeUpdate is final:
// DESIGN.md section 3), and reports a permanent error.
func (u *Updater) fail(ctx context.Context, nu *inplacev1.NodeUpdate, st *updateState, step int) error {
	if err := u.cleanUp(ctx, nu, st); err != nil {
		return fmt.Errorf("clean up node %s after its failure: %w", st.node, err)
	}
	err := nodeupdater.Permanentf("SimulatedFailure", "simulated failure of node %s at step %s", st.node, steps[step])
	u.mu.Lock()
	st.ended, st.failErr = "failed", err
	u.mu.Unlock()
	u.History.Record(Event{Kind: EventNodeUpdateFailed, Node: st.node, NodeUpdate: nu.Name, Why: steps[step]})
	return err
}

// skipNode is the drain staying blocked for its grace period under drainPolicy Skip: the
// updater answers a SkipError naming the blocking pod, as the Harvester updater does, and
// puts the node back in Abort, which the reconciler calls next (DESIGN.md section 3; the
// drain policy in docs/upgradetask.md). The Drain step is before the disruptive one, so a
// skipped node was never taken down and no reboot is armed.
func (u *Updater) skipNode(nu *inplacev1.NodeUpdate, st *updateState) error {
	err := nodeupdater.Skipf("the drain of node %s is blocked by pod safety/blocker-%s (PodDisruptionBudget safety/blocker allows no disruption) for longer than its grace period; node put back",
		st.node, nu.Spec.MachineName)
	u.mu.Lock()
	st.skipErr = err
	u.mu.Unlock()
	u.History.Record(Event{Kind: EventNodeUpdateSkipping, Node: st.node, NodeUpdate: nu.Name, Why: "drain blocked past its grace period"})
	return err
}

// cleanUp brings a node the updater holds down back Ready; a node that is gone needs
// nothing.
func (u *Updater) cleanUp(ctx context.Context, nu *inplacev1.NodeUpdate, st *updateState) error {
	u.mu.Lock()
	down := st.down
	u.mu.Unlock()
	if !down {
		return nil
	}
	if err := u.Kubelets.Hold(ctx, st.node, nu.Name, false); err != nil && !errors.Is(err, errNodeGone) {
		return err
	}
	u.History.Record(Event{Kind: EventNodeUp, Node: st.node, NodeUpdate: nu.Name, Why: "cleanup"})
	u.mu.Lock()
	st.down = false
	u.mu.Unlock()
	return nil
}

// Abort implements nodeupdater.Updater: the updater stops at its safe point, which for
// this updater is at once, unless a reboot is armed: then once the host has rebooted. A
// node it holds down is brought back Ready. After it said done it never touches the node
// for this NodeUpdate again.
func (u *Updater) Abort(ctx context.Context, nu *inplacev1.NodeUpdate) (bool, error) {
	u.mu.Lock()
	st := u.updates[updateKey(nu)]
	if st == nil || st.ended != "" {
		u.mu.Unlock()
		return true, nil
	}
	if st.armed && !st.rebooted {
		u.mu.Unlock()
		return false, nil
	}
	skipped := st.skipErr != nil
	u.mu.Unlock()
	if err := u.cleanUp(ctx, nu, st); err != nil {
		return false, err
	}
	u.mu.Lock()
	st.ended = "aborted"
	if skipped {
		// The put-back of a skip: the drain stopped, the node uncordoned, what was
		// stopped restored (for this updater: the node Ready and out of its hands).
		st.ended = "skipped"
	}
	u.mu.Unlock()
	if skipped {
		u.History.Record(Event{Kind: EventNodeUpdateSkipped, Node: st.node, NodeUpdate: nu.Name})
		return true, nil
	}
	u.History.Record(Event{Kind: EventNodeUpdateAborted, Node: st.node, NodeUpdate: nu.Name})
	return true, nil
}

// Preflight implements nodeupdater.Updater. It stands for Longhorn's check: a node is
// held when some volume would be left with no replica on a node outside the candidate,
// the cluster's disrupted nodes and this round's picks.
func (u *Updater) Preflight(_ context.Context, target nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	down := map[string]bool{target.NodeName: true}
	for _, n := range target.Disrupted {
		down[n] = true
	}
	for _, n := range target.Picked {
		down[n] = true
	}
	left := u.Volumes.LeftWithout(down)
	if len(left) == 0 {
		return []nodeupdater.CheckResult{{Name: "VolumesKeepAReplica", Passed: true}}
	}
	return []nodeupdater.CheckResult{{Name: "VolumesKeepAReplica", Message: "no healthy replica left outside the disrupted nodes for " + strings.Join(left, ", ")}}
}

// AtTarget implements nodeupdater.TargetJudge: a node runs the target when the updater
// left its kubelet at exactly that version.
func (u *Updater) AtTarget(_ context.Context, target nodeupdater.PreflightTarget) (bool, string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if v := u.kubelet[target.NodeName]; v != target.Version {
		return false, fmt.Sprintf("node %s runs %s", target.NodeName, v), nil
	}
	return true, "", nil
}

// Running counts the NodeUpdates in the updater's hands.
func (u *Updater) Running() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, st := range u.updates {
		if st.ended == "" {
			n++
		}
	}
	return n
}

// Upgrading reports whether a NodeUpdate of node is in the updater's hands: a real
// updater has cordoned the node by then.
func (u *Updater) Upgrading(node string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, st := range u.updates {
		if st.node == node && st.ended == "" {
			return true
		}
	}
	return false
}

// Counts says how many NodeUpdates the updater started, and how they ended.
func (u *Updater) Counts() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]int{"started": len(u.updates)}
	for _, st := range u.updates {
		if st.ended != "" {
			out[st.ended]++
		}
	}
	return out
}
