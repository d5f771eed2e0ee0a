package sim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhornlive"
)

// The facts this simulator follows are in shared/facts/longhorn-v2-live-upgrade.md
// ("fact N" below). It plays Longhorn's live upgrade of v2 instance managers
// (InstanceManagerUpgradeControl and InstanceManagerUpgrade, section C) on the Setting,
// Volume, Engine, Replica and InstanceManager kinds of longhorn-manager v1.10.0, which
// the test API server serves from test/crds/longhorn, and the two live-upgrade kinds
// from test/crds/longhorn-liveupgrade.
//
// Simplifications, each said where it happens: no start-time setting (fact 12), no
// per-state timeout and no retries (facts 12, 14), engines are moved by rewriting the
// Engine's spec.nodeID (v1.10.0 has no volume.spec.engineNodeID, fact 18), and replicas
// are not detached (fact 17.3).
//
// Where the cluster does not serve the live-upgrade kinds (every released Longhorn,
// shared/facts/harvester-release-steps.md fact 68), it plays instead what released
// Longhorn does when its default instance-manager image changes (UpgradeLonghorn): see
// longhorn_released.go. The v1 part of that runs in both cases.

const (
	// SettingV2AutomaticUpgrade is Longhorn's switch of the live upgrade (fact 12).
	SettingV2AutomaticUpgrade = "allow-v2-instance-manager-automatic-upgrade"
	// labelIMNode and the labels below are Longhorn's InstanceManager labels (fact 29).
	labelIMNode       = "longhorn.io/node"
	labelIMType       = "longhorn.io/instance-manager-type"
	labelIMDataEngine = "longhorn.io/data-engine"
)

// LiveUpgrade is one node's InstanceManagerUpgrade as the simulator ran it: while it was
// active (from creation to completed or failed) no other node may be taken down.
type LiveUpgrade struct {
	Node, IMU  string
	Start, End time.Time // End is zero while it runs
	Result     longhornlive.UpgradeState
}

// Longhorn plays Longhorn's live upgrade of v2 instance managers on the workload cluster.
// When the cluster serves the live-upgrade kinds, the setting is "true" and a node's
// running v2 AllInOne InstanceManager is not on the target image (SetTargetImage), it
// rolls the nodes one at a time through InstanceManagerUpgrades. It records every
// upgrade it ran, and every node it saw cordoned or not Ready while one was active.
type Longhorn struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace is Longhorn's namespace (longhorn-system).
	Namespace string
	// StateDuration is how long an InstanceManagerUpgrade stays in each state before the
	// next. Default 100ms.
	StateDuration time.Duration
	// Interval is how often the simulator looks. Default 20ms.
	Interval time.Duration
	// Cache, when set, is an informer cache of the workload cluster that released
	// Longhorn's controllers read the data-engine and image settings and the Kubernetes
	// Nodes from, as longhorn-manager reads them from its informers (datastore's
	// listers): others write them, never the simulator (UpgradeLonghorn waits for the
	// cache to show the image it writes). What the simulator writes itself (instance
	// managers, engines, replicas, the live-upgrade kinds) and the live upgrade's
	// setting, which an upgrader turns off to hold the next node, it still reads from the
	// API server. Unset, every read goes to the API server.
	Cache ctrlcache.Cache

	mu         sync.Mutex
	target     string
	fails      map[string]string
	holds      map[string]bool
	upgrades   []LiveUpgrade
	violations []string
	entered    map[string]time.Time // IMU name -> when it entered its current state

	// loop wakes Run when UpgradeLonghorn changed the setting.
	loop passLoop
	// imPods are the instance managers whose pod the released instance-manager
	// controller created (longhorn_released.go), and when.
	imPods map[string]time.Time
	// unservedUntil is when to look again for the live-upgrade kinds after the cluster
	// did not serve them. Only Run's goroutine uses it.
	unservedUntil time.Time
}

// SetTargetImage is the instance-manager image Longhorn rolls to, the setting
// default-instance-manager-image (fact 11). Empty (the default) rolls nothing.
func (l *Longhorn) SetTargetImage(image string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.target = image
}

// FailNode makes the upgrade of node end failed with message.
func (l *Longhorn) FailNode(node, message string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fails == nil {
		l.fails = map[string]string{}
	}
	l.fails[node] = message
}

// HoldNode keeps the upgrade of node in relocating-engines, engines moved away, until
// ReleaseNode: a test can then look at what happens while it is active for as long as it
// needs.
func (l *Longhorn) HoldNode(node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holds == nil {
		l.holds = map[string]bool{}
	}
	l.holds[node] = true
}

// ReleaseNode lets the upgrade of node go on.
func (l *Longhorn) ReleaseNode(node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.holds, node)
}

// Upgrades returns the upgrades the simulator ran, in the order they started.
func (l *Longhorn) Upgrades() []LiveUpgrade {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.upgrades)
}

// Upgraded returns the nodes whose instance manager was upgraded, in order.
func (l *Longhorn) Upgraded() []string {
	var out []string
	for _, u := range l.Upgrades() {
		if u.Result == longhornlive.UpgradeStateCompleted {
			out = append(out, u.Node)
		}
	}
	return out
}

// Violations lists what the simulator saw while an upgrade was active that an upgrader
// must not do then (fact 37): a node cordoned or not Ready.
func (l *Longhorn) Violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.violations)
}

// others is where the simulator reads what others write: Cache when set, else the API
// server.
func (l *Longhorn) others() client.Reader {
	if l.Cache != nil {
		return l.Cache
	}
	return l.Client
}

// Run plays Longhorn until ctx ends.
func (l *Longhorn) Run(ctx context.Context) {
	interval := l.Interval
	if interval == 0 {
		interval = 20 * time.Millisecond
	}
	l.loop.init()
	for {
		wait := interval
		if !l.pass(ctx) {
			wait = max(interval, unservedRecheck)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-l.loop.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// unservedRecheck is how long the simulator waits to look again for the live-upgrade
// kinds when the cluster does not serve them (fact 35): a Longhorn without them does
// no live upgrade, and each look at a kind the client's REST mapper does not know asks
// the API server's discovery again (about 40 requests a second at a 20ms interval).
// It is also how long Run idles when there is nothing to play at all: neither the
// live-upgrade kinds nor the setting default-instance-manager-image (UpgradeLonghorn,
// which wakes it).
const unservedRecheck = time.Second

// pass does what Longhorn's controllers would do now: released Longhorn's replacement of
// instance managers on a new default image (longhorn_released.go), then, where the
// cluster serves the live-upgrade kinds, the live upgrade of v2 instance managers. It
// reports false when there was nothing to play.
func (l *Longhorn) pass(ctx context.Context) bool {
	imus := &longhornlive.InstanceManagerUpgradeList{}
	served, listed := false, false
	if time.Now().After(l.unservedUntil) {
		err := l.Client.List(ctx, imus, client.InNamespace(l.Namespace))
		switch {
		case err == nil:
			served, listed = true, true
		case meta.IsNoMatchError(err):
			// Not a Longhorn with the live upgrade (fact 35), or not yet.
			l.unservedUntil = time.Now().Add(unservedRecheck)
		default:
			// Not known whether it is served: leave v2 alone this time.
			served = true
		}
	}
	releasedActive := l.syncReleased(ctx, served)
	if !listed {
		return releasedActive || served
	}
	l.watchNodes(ctx, imus.Items)
	allowed, err := l.automaticUpgradeAllowed(ctx)
	if err != nil {
		return true
	}
	offTarget, err := l.offTargetNodes(ctx)
	if err != nil {
		return true
	}
	control, err := l.syncControl(ctx, allowed, offTarget)
	if err != nil || control == nil {
		return true
	}
	if control.Status.CurrentNode != "" {
		// The node in progress goes on whatever the setting says: turning it off lets
		// the current node finish (facts 12, 36a).
		l.advance(ctx, control)
		return true
	}
	if allowed {
		l.startNext(ctx, control)
	}
	return true
}

// watchNodes records any node of Longhorn (one with a Longhorn Node) cordoned or not
// Ready while an upgrade is active.
func (l *Longhorn) watchNodes(ctx context.Context, imus []longhornlive.InstanceManagerUpgrade) {
	var active []string
	for _, imu := range imus {
		if imu.Status.State.Active() {
			active = append(active, fmt.Sprintf("%s (node %s, %s)", imu.Name, imu.Spec.NodeID, imu.Status.State))
		}
	}
	if len(active) == 0 {
		return
	}
	nodes := &corev1.NodeList{}
	if err := l.Client.List(ctx, nodes); err != nil {
		return
	}
	lhNodes := &longhornv1.NodeList{}
	if err := l.Client.List(ctx, lhNodes, client.InNamespace(l.Namespace)); err != nil {
		return
	}
	for _, n := range nodes.Items {
		if !slices.ContainsFunc(lhNodes.Items, func(ln longhornv1.Node) bool { return ln.Name == n.Name }) {
			continue // not a node of this Longhorn
		}
		what := ""
		switch {
		case n.Spec.Unschedulable:
			what = "cordoned"
		case !nodeReadyCondition(&n):
			what = "not Ready"
		default:
			continue
		}
		l.mu.Lock()
		l.violations = append(l.violations, fmt.Sprintf("node %s was %s while %v was active", n.Name, what, active))
		l.mu.Unlock()
	}
}

func nodeReadyCondition(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// automaticUpgradeAllowed reads the setting; Longhorn creates every setting with its
// default, and this one's is "false" (fact 12), so the simulator does too.
func (l *Longhorn) automaticUpgradeAllowed(ctx context.Context) (bool, error) {
	s := &longhornv1.Setting{}
	err := l.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: SettingV2AutomaticUpgrade}, s)
	if apierrors.IsNotFound(err) {
		s = &longhornv1.Setting{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: SettingV2AutomaticUpgrade}, Value: "false"}
		if err := l.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err
		}
		return false, nil
	}
	return err == nil && s.Value == "true", err
}

// offTargetNodes lists the nodes whose running v2 AllInOne InstanceManager is not on the
// target image (facts 11 and 13), sorted.
func (l *Longhorn) offTargetNodes(ctx context.Context) ([]string, error) {
	l.mu.Lock()
	target := l.target
	l.mu.Unlock()
	if target == "" {
		return nil, nil
	}
	ims := &longhornv1.InstanceManagerList{}
	if err := l.Client.List(ctx, ims, client.InNamespace(l.Namespace)); err != nil {
		return nil, err
	}
	var out []string
	for _, im := range ims.Items {
		if im.Spec.DataEngine == longhornv1.DataEngineTypeV2 && im.Spec.Type == longhornv1.InstanceManagerTypeAllInOne &&
			im.Status.CurrentState == longhornv1.InstanceManagerStateRunning && im.Spec.Image != target && !slices.Contains(out, im.Spec.NodeID) {
			out = append(out, im.Spec.NodeID)
		}
	}
	sort.Strings(out)
	return out, nil
}

// syncControl creates or updates the InstanceManagerUpgradeControl singleton when the
// setting is on and a node is off target (fact 11), and registers every off-target node
// as pending, a completed or failed one again if it is off target again (fact 13). It
// returns the control, or nil when there is none.
func (l *Longhorn) syncControl(ctx context.Context, allowed bool, offTarget []string) (*longhornlive.InstanceManagerUpgradeControl, error) {
	l.mu.Lock()
	target := l.target
	l.mu.Unlock()
	key := client.ObjectKey{Namespace: l.Namespace, Name: longhornlive.ControlName}
	control := &longhornlive.InstanceManagerUpgradeControl{}
	err := l.Client.Get(ctx, key, control)
	switch {
	case apierrors.IsNotFound(err) && allowed && len(offTarget) > 0:
		control = &longhornlive.InstanceManagerUpgradeControl{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec:       longhornlive.InstanceManagerUpgradeControlSpec{TargetImage: target},
		}
		if err := l.Client.Create(ctx, control); err != nil {
			return nil, err
		}
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	if allowed && len(offTarget) > 0 && control.Spec.TargetImage != target {
		control.Spec.TargetImage = target
		if err := l.Client.Update(ctx, control); err != nil {
			return nil, err
		}
	}
	changed := false
	if control.Status.Nodes == nil {
		control.Status.Nodes = map[string]longhornlive.NodeUpgradeInfo{}
	}
	for _, n := range offTarget {
		info, ok := control.Status.Nodes[n]
		// Longhorn retries a failed node up to 5 times (fact 14); the simulator does not:
		// a failed node stays failed until the test edits it.
		if !ok || info.State == longhornlive.NodeUpgradeStateCompleted {
			control.Status.Nodes[n] = longhornlive.NodeUpgradeInfo{State: longhornlive.NodeUpgradeStatePending}
			changed = true
		}
	}
	if changed {
		if err := l.Client.Status().Update(ctx, control); err != nil {
			return nil, err
		}
	}
	return control, nil
}

// startNext starts the lexicographically smallest pending node (fact 13) with an
// InstanceManagerUpgrade named upgrade-<node>-<UTC yyyymmddHHMMSS> (fact 16). The setting
// is read once more just before: an upgrader may have turned it off since this pass began.
func (l *Longhorn) startNext(ctx context.Context, control *longhornlive.InstanceManagerUpgradeControl) {
	var pending []string
	for n, info := range control.Status.Nodes {
		if info.State == longhornlive.NodeUpgradeStatePending {
			pending = append(pending, n)
		}
	}
	if len(pending) == 0 {
		return
	}
	if allowed, err := l.automaticUpgradeAllowed(ctx); err != nil || !allowed {
		return
	}
	node := slices.Min(pending)
	now := time.Now().UTC()
	name := "upgrade-" + node + "-" + now.Format("20060102150405")
	if len(name) > 63 {
		name = name[:63]
	}
	imu := &longhornlive.InstanceManagerUpgrade{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: name},
		Spec:       longhornlive.InstanceManagerUpgradeSpec{NodeID: node, TargetImage: control.Spec.TargetImage},
	}
	if err := l.Client.Create(ctx, imu); err != nil {
		return // a name already taken this second: the next pass tries again
	}
	imu.Status = longhornlive.InstanceManagerUpgradeStatus{State: longhornlive.UpgradeStatePending, StartedAt: now.Format(time.RFC3339)}
	if err := l.Client.Status().Update(ctx, imu); err != nil {
		return
	}
	info := control.Status.Nodes[node]
	info.State, info.IMUName, info.StartedAt = longhornlive.NodeUpgradeStateInProgress, name, now.Format(time.RFC3339)
	control.Status.Nodes[node] = info
	control.Status.CurrentNode = node
	if err := l.Client.Status().Update(ctx, control); err != nil {
		return
	}
	l.mu.Lock()
	l.upgrades = append(l.upgrades, LiveUpgrade{Node: node, IMU: name, Start: now})
	if l.entered == nil {
		l.entered = map[string]time.Time{}
	}
	l.entered[name] = now
	l.mu.Unlock()
}

// stateFlow is the order an InstanceManagerUpgrade walks (fact 17): plan, move the
// engines away, upgrade the source IM, move them back, wait for healthy volumes.
var stateFlow = []longhornlive.UpgradeState{
	longhornlive.UpgradeStatePending,
	longhornlive.UpgradeStateRelocatingEngines,
	longhornlive.UpgradeStateWaitingForSourceIM,
	longhornlive.UpgradeStateRestoringEngines,
	longhornlive.UpgradeStateWaitingForHealthyVolumes,
	longhornlive.UpgradeStateCompleted,
}

// advance moves the current node's InstanceManagerUpgrade to its next state once it has
// spent StateDuration in the current one.
func (l *Longhorn) advance(ctx context.Context, control *longhornlive.InstanceManagerUpgradeControl) {
	node := control.Status.CurrentNode
	info := control.Status.Nodes[node]
	imu := &longhornlive.InstanceManagerUpgrade{}
	if err := l.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: info.IMUName}, imu); err != nil {
		return
	}
	duration := l.StateDuration
	if duration == 0 {
		duration = 100 * time.Millisecond
	}
	l.mu.Lock()
	entered, ok := l.entered[imu.Name]
	if !ok {
		entered = time.Now()
		if l.entered == nil {
			l.entered = map[string]time.Time{}
		}
		l.entered[imu.Name] = entered
	}
	failMessage, fail := l.fails[node]
	held := l.holds[node] && imu.Status.State == longhornlive.UpgradeStateRelocatingEngines
	l.mu.Unlock()
	if held || time.Since(entered) < duration {
		return
	}

	next := longhornlive.UpgradeStateFailed
	if i := slices.Index(stateFlow, imu.Status.State); i >= 0 && i+1 < len(stateFlow) {
		next = stateFlow[i+1]
	}
	status := imu.Status
	var err error
	switch next {
	case longhornlive.UpgradeStateRelocatingEngines:
		status.Engines, err = l.relocateEngines(ctx, node)
		if err != nil {
			// A volume with no replica outside the node fails the upgrade at once (fact 19).
			next, status.ErrorMsg = longhornlive.UpgradeStateFailed, err.Error()
		}
	case longhornlive.UpgradeStateWaitingForSourceIM:
		err = l.setInstanceManagerImage(ctx, node, imu.Spec.TargetImage) // fact 17.4
	case longhornlive.UpgradeStateRestoringEngines:
		if fail {
			// A failing node aborts: its engines go back and it ends failed (fact 21).
			status.AbortRequested, status.AbortReason, status.ErrorMsg = true, "timeout", failMessage
		}
		err = l.restoreEngines(ctx, status.Engines) // fact 17.6
	case longhornlive.UpgradeStateWaitingForHealthyVolumes:
		if fail {
			next = longhornlive.UpgradeStateFailed
		}
	}
	if err != nil {
		return
	}
	status.State = next
	imu.Status = status
	if err := l.Client.Status().Update(ctx, imu); err != nil {
		return
	}
	now := time.Now()
	l.mu.Lock()
	l.entered[imu.Name] = now
	l.mu.Unlock()
	if next.Active() {
		return
	}
	info.State = longhornlive.NodeUpgradeStateCompleted
	if next == longhornlive.UpgradeStateFailed {
		info.State, info.ErrorMsg = longhornlive.NodeUpgradeStateFailed, status.ErrorMsg
	}
	info.CompletedAt = now.UTC().Format(time.RFC3339)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := l.Client.Get(ctx, client.ObjectKeyFromObject(control), control); err != nil {
			return err
		}
		control.Status.Nodes[node] = info
		control.Status.CurrentNode = ""
		return l.Client.Status().Update(ctx, control)
	})
	if err != nil {
		return
	}
	l.mu.Lock()
	for i := range l.upgrades {
		if l.upgrades[i].IMU == imu.Name {
			l.upgrades[i].End, l.upgrades[i].Result = now, next
		}
	}
	l.mu.Unlock()
}

// relocateEngines moves each attached v2 volume's engine off node to a temporary node:
// one holding a healthy replica of the volume (healthyAt set, failedAt empty) and a
// running v2 instance manager, cordoned or not (facts 17.1 and 20), the one with the
// fewest v2 engines, ties by name (fact 20).
func (l *Longhorn) relocateEngines(ctx context.Context, node string) (map[string]longhornlive.EngineRelocation, error) {
	engines := &longhornv1.EngineList{}
	replicas := &longhornv1.ReplicaList{}
	ims := &longhornv1.InstanceManagerList{}
	for _, list := range []client.ObjectList{engines, replicas, ims} {
		if err := l.Client.List(ctx, list, client.InNamespace(l.Namespace)); err != nil {
			return nil, err
		}
	}
	hasV2IM := map[string]bool{}
	for _, im := range ims.Items {
		if im.Spec.DataEngine == longhornv1.DataEngineTypeV2 && im.Status.CurrentState == longhornv1.InstanceManagerStateRunning {
			hasV2IM[im.Spec.NodeID] = true
		}
	}
	load := map[string]int{}
	for _, e := range engines.Items {
		if e.Spec.DataEngine == longhornv1.DataEngineTypeV2 {
			load[e.Spec.NodeID]++
		}
	}
	moves := map[string]longhornlive.EngineRelocation{}
	for i := range engines.Items {
		e := &engines.Items[i]
		if e.Spec.NodeID != node || e.Spec.DataEngine != longhornv1.DataEngineTypeV2 {
			continue
		}
		var candidates []string
		for _, r := range replicas.Items {
			if r.Spec.VolumeName == e.Spec.VolumeName && r.Spec.NodeID != node && r.Spec.HealthyAt != "" && r.Spec.FailedAt == "" && hasV2IM[r.Spec.NodeID] {
				candidates = append(candidates, r.Spec.NodeID)
			}
		}
		if len(candidates) == 0 {
			return nil, fmt.Errorf("volume %s has no healthy replica outside node %s", e.Spec.VolumeName, node)
		}
		slices.SortFunc(candidates, func(a, b string) int {
			return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(a, b))
		})
		temp := candidates[0]
		load[temp]++
		moves[e.Spec.VolumeName] = longhornlive.EngineRelocation{OriginalNodeID: node, TemporaryNodeID: temp}
	}
	for vol, m := range moves {
		if err := l.moveEngine(ctx, vol, m.TemporaryNodeID); err != nil {
			return nil, err
		}
	}
	return moves, nil
}

func (l *Longhorn) restoreEngines(ctx context.Context, moves map[string]longhornlive.EngineRelocation) error {
	for vol, m := range moves {
		if err := l.moveEngine(ctx, vol, m.OriginalNodeID); err != nil {
			return err
		}
	}
	return nil
}

// moveEngine points the engines of volume at node. Real Longhorn sets
// volume.spec.engineNodeID and starts the engine there (fact 17.2); v1.10.0's types have
// no such field (fact 18), so the simulator moves the Engine itself, which is what an
// upgrader reads (fact 27).
func (l *Longhorn) moveEngine(ctx context.Context, volume, node string) error {
	return MoveLonghornEngine(ctx, l.Client, l.Namespace, volume, node)
}

// MoveLonghornEngine moves the engines of volume to node, as a VM's live migration moves
// its volume's attachment (fact 38) or Longhorn's live upgrade relocates it (fact 17).
func MoveLonghornEngine(ctx context.Context, c client.Client, namespace, volume, node string) error {
	engines := &longhornv1.EngineList{}
	if err := c.List(ctx, engines, client.InNamespace(namespace), client.MatchingLabels{"longhornvolume": volume}); err != nil {
		return err
	}
	for i := range engines.Items {
		key := client.ObjectKeyFromObject(&engines.Items[i])
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			e := &unstructured.Unstructured{}
			e.SetAPIVersion(longhornv1.SchemeGroupVersion.String())
			e.SetKind("Engine")
			if err := c.Get(ctx, key, e); err != nil {
				return err
			}
			if err := unstructured.SetNestedField(e.Object, node, "spec", "nodeID"); err != nil {
				return err
			}
			return c.Update(ctx, e)
		})
		if err != nil {
			return fmt.Errorf("move the engine of Longhorn volume %s to node %s: %w", volume, node, err)
		}
	}
	return nil
}

func (l *Longhorn) setInstanceManagerImage(ctx context.Context, node, image string) error {
	ims := &longhornv1.InstanceManagerList{}
	if err := l.Client.List(ctx, ims, client.InNamespace(l.Namespace), client.MatchingLabels{labelIMNode: node, labelIMDataEngine: string(longhornv1.DataEngineTypeV2)}); err != nil {
		return err
	}
	for i := range ims.Items {
		key := client.ObjectKeyFromObject(&ims.Items[i])
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			im := &unstructured.Unstructured{}
			im.SetAPIVersion(longhornv1.SchemeGroupVersion.String())
			im.SetKind("InstanceManager")
			if err := l.Client.Get(ctx, key, im); err != nil {
				return err
			}
			if err := unstructured.SetNestedField(im.Object, image, "spec", "image"); err != nil {
				return err
			}
			return l.Client.Update(ctx, im)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// LonghornV2Volume is an attached, healthy v2 volume as Longhorn reports it: a replica on
// each of ReplicaNodes and, unless EngineNode is empty, its engine on EngineNode.
type LonghornV2Volume struct {
	Name         string
	ReplicaNodes []string
	EngineNode   string
	// PVC is the volume's PersistentVolumeClaim, and Users the pods that mount it, as
	// Longhorn reports them (status.kubernetesStatus; longhornusers.go). Empty: a volume
	// attached by hand.
	PVC   client.ObjectKey
	Users []LonghornVolumeUser
}

// LonghornVolumeUser is a pod that mounts a volume's PVC, as Longhorn reports it
// (status.kubernetesStatus.workloadsStatus): a VM's disk is used by its virt-launcher
// pod, whose workload is the VirtualMachineInstance.
type LonghornVolumeUser struct {
	Pod, WorkloadName, WorkloadType string
}

// CreateLonghornV2Volume writes the volume, its replicas and its engine. Longhorn's CRDs
// make several enums required when present; a typed object would send them empty, so
// the objects carry only the fields Longhorn sets.
func CreateLonghornV2Volume(ctx context.Context, c client.Client, namespace string, v LonghornV2Volume) error {
	obj := func(kind, name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": longhornv1.SchemeGroupVersion.String(), "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": namespace, "labels": map[string]any{"longhornvolume": v.Name}},
			"spec":     spec,
		}}
	}
	// An attached volume's engine and replicas are desired running (LH fact 26:
	// desireState; DetachLonghornVolume stops them).
	vol := obj("Volume", v.Name, map[string]any{"dataEngine": "v2", "numberOfReplicas": int64(len(v.ReplicaNodes)), "nodeID": v.EngineNode})
	status := map[string]any{"state": "attached", "robustness": "healthy", "currentNodeID": v.EngineNode}
	if v.PVC.Name != "" {
		users := []any{}
		for _, u := range v.Users {
			users = append(users, map[string]any{"podName": u.Pod, "podStatus": "Running", "workloadName": u.WorkloadName, "workloadType": u.WorkloadType})
		}
		status["kubernetesStatus"] = map[string]any{"namespace": v.PVC.Namespace, "pvcName": v.PVC.Name, "workloadsStatus": users}
	}
	if err := createWithStatus(ctx, c, vol, status); err != nil {
		return fmt.Errorf("create Longhorn volume %s: %w", v.Name, err)
	}
	for _, n := range v.ReplicaNodes {
		r := obj("Replica", v.Name+"-r-"+n, map[string]any{"volumeName": v.Name, "nodeID": n, "dataEngine": "v2", "healthyAt": "2026-11-01T00:00:00Z", "desireState": "running"})
		if err := createWithStatus(ctx, c, r, map[string]any{"currentState": "running"}); err != nil {
			return fmt.Errorf("create Longhorn replica of %s on %s: %w", v.Name, n, err)
		}
	}
	if v.EngineNode != "" {
		e := obj("Engine", v.Name+"-e-0", map[string]any{"volumeName": v.Name, "nodeID": v.EngineNode, "dataEngine": "v2", "active": true, "desireState": "running"})
		if err := createWithStatus(ctx, c, e, map[string]any{"currentState": "running"}); err != nil {
			return fmt.Errorf("create Longhorn engine of %s: %w", v.Name, err)
		}
	}
	return nil
}

// CreateLonghornV2InstanceManager writes node's running v2 AllInOne InstanceManager on
// image, with Longhorn's name and labels (InstanceManagerName, instanceManagerLabels; LH
// fact 29), and its Longhorn Node.
func CreateLonghornV2InstanceManager(ctx context.Context, c client.Client, namespace, node, image string) error {
	return CreateLonghornInstanceManager(ctx, c, namespace, node, image, longhornv1.DataEngineTypeV2)
}

// CreateLonghornInstanceManager writes node's running AllInOne InstanceManager of
// dataEngine on image, with Longhorn's name and labels, and its Longhorn Node.
func CreateLonghornInstanceManager(ctx context.Context, c client.Client, namespace, node, image string, dataEngine longhornv1.DataEngineType) error {
	im := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": longhornv1.SchemeGroupVersion.String(), "kind": "InstanceManager",
		"metadata": map[string]any{"name": InstanceManagerName(node, image, dataEngine), "namespace": namespace,
			"labels": instanceManagerLabels(node, image, dataEngine)},
		"spec": map[string]any{"nodeID": node, "type": "aio", "dataEngine": string(dataEngine), "image": image},
	}}
	if err := createWithStatus(ctx, c, im, map[string]any{"currentState": "running", "ownerID": node}); err != nil {
		return fmt.Errorf("create Longhorn instance manager on %s: %w", node, err)
	}
	n := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": longhornv1.SchemeGroupVersion.String(), "kind": "Node",
		"metadata": map[string]any{"name": node, "namespace": namespace},
	}}
	if err := c.Create(ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Longhorn node %s: %w", node, err)
	}
	return nil
}

// SetLonghornSetting writes a Longhorn setting's value, creating it if needed.
func SetLonghornSetting(ctx context.Context, c client.Client, namespace, name, value string) error {
	// Another writer (longhorn-manager's setting controller, the updater giving a setting
	// back) may create the setting between the read and the create: that is a lost race
	// like a conflict, and the next try updates what it created.
	lostRace := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	return retry.OnError(retry.DefaultRetry, lostRace, func() error {
		s := &longhornv1.Setting{}
		err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s)
		if apierrors.IsNotFound(err) {
			return c.Create(ctx, &longhornv1.Setting{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Value: value})
		}
		if err != nil {
			return err
		}
		s.Value = value
		return c.Update(ctx, s)
	})
}

func createWithStatus(ctx context.Context, c client.Client, obj *unstructured.Unstructured, status map[string]any) error {
	if err := c.Create(ctx, obj); err != nil {
		return err
	}
	if err := unstructured.SetNestedMap(obj.Object, status, "status"); err != nil {
		return err
	}
	return c.Status().Update(ctx, obj)
}
