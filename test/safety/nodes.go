package safety

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Kubelets plays the kubelets of the cluster's nodes: a node is Ready unless something
// holds it down (the updater's disruptive step, a flap), which is how a real node reports
// NotReady while it reboots or loses its network and Ready again after. It also plays
// Cluster API copying the kubelet version from the Node into Machine.status.nodeInfo
// (Cluster API's Machine controller does this on every reconcile; facts
// capi-inplace-updates.md, fact 34 and 35 rely on it).
type Kubelets struct {
	client    client.Client
	namespace string

	mu sync.Mutex
	// holds: per node, why it is held NotReady (an updater's NodeUpdate, "flap").
	holds map[string]map[string]bool
	gone  map[string]bool
	// nodeLocks serializes the writes of one Node.
	nodeLocks map[string]*sync.Mutex
	// machineLag, while set, is how long Cluster API takes to copy a new kubelet version
	// into the Machine: its Machine controller copies the Node's nodeInfo on its own
	// reconciles, so a reader of the Machine sees the new kubelet seconds after the Node
	// shows it (issue #34 point 1). lagged tracks the copies still to write.
	machineLag time.Duration
	lagged     int
}

// NewKubelets returns the kubelets of the nodes of namespace's machines.
func NewKubelets(c client.Client, namespace string) *Kubelets {
	return &Kubelets{client: c, namespace: namespace, holds: map[string]map[string]bool{}, gone: map[string]bool{}, nodeLocks: map[string]*sync.Mutex{}}
}

func (k *Kubelets) lockNode(node string) func() {
	k.mu.Lock()
	l := k.nodeLocks[node]
	if l == nil {
		l = &sync.Mutex{}
		k.nodeLocks[node] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Hold holds node NotReady for reason (held true) or lets go of that reason, and writes
// the Node's Ready condition: Ready when no reason holds it. A node that is gone is not
// written: errNodeGone.
func (k *Kubelets) Hold(ctx context.Context, node, reason string, held bool) error {
	unlock := k.lockNode(node)
	defer unlock()
	k.mu.Lock()
	if k.gone[node] {
		k.mu.Unlock()
		return errNodeGone
	}
	if k.holds[node] == nil {
		k.holds[node] = map[string]bool{}
	}
	if held {
		k.holds[node][reason] = true
	} else {
		delete(k.holds[node], reason)
	}
	ready := len(k.holds[node]) == 0
	k.mu.Unlock()
	return k.writeNode(ctx, node, func(st *corev1.NodeStatus) { setReady(st, ready) })
}

// HeldBy reports whether reason holds node down.
func (k *Kubelets) HeldBy(node, reason string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.holds[node][reason]
}

// Down reports whether some reason holds node NotReady, or it is gone.
func (k *Kubelets) Down(node string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gone[node] || len(k.holds[node]) > 0
}

// SetVersion reports version as the node's kubelet version, on the Node as its kubelet
// does and on the Machine as Cluster API copies it.
func (k *Kubelets) SetVersion(ctx context.Context, machine, node, version string) error {
	unlock := k.lockNode(node)
	defer unlock()
	if k.isGone(node) {
		return errNodeGone
	}
	if err := k.writeNode(ctx, node, func(st *corev1.NodeStatus) { st.NodeInfo.KubeletVersion = version }); err != nil {
		return err
	}
	k.mu.Lock()
	lag := k.machineLag
	if lag > 0 {
		k.lagged++
	}
	k.mu.Unlock()
	if lag == 0 {
		return setMachineKubelet(ctx, k.client, k.namespace, machine, version)
	}
	go func() {
		time.Sleep(lag)
		// Cluster API copies what the Node says when its Machine controller looks, not
		// what it said when it changed: a later version written meanwhile wins.
		wctx := context.WithoutCancel(ctx)
		current := &corev1.Node{}
		if err := k.client.Get(wctx, client.ObjectKey{Name: node}, current); err == nil {
			_ = setMachineKubelet(wctx, k.client, k.namespace, machine, current.Status.NodeInfo.KubeletVersion)
		}
		k.mu.Lock()
		k.lagged--
		k.mu.Unlock()
	}()
	return nil
}

// LagMachines makes Cluster API's copy of a new kubelet version into the Machine come
// lag after the Node shows it (0: at once).
func (k *Kubelets) LagMachines(lag time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.machineLag = lag
}

// WaitMachines waits until every lagged copy into a Machine is written.
func (k *Kubelets) WaitMachines() {
	for {
		k.mu.Lock()
		n := k.lagged
		k.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Gone records that node was deleted: nothing writes it any more.
func (k *Kubelets) Gone(node string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gone[node] = true
}

func (k *Kubelets) isGone(node string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gone[node]
}

var errNodeGone = fmt.Errorf("the node is gone")

func (k *Kubelets) writeNode(ctx context.Context, name string, mutate func(*corev1.NodeStatus)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := k.client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		mutate(&node.Status)
		return k.client.Status().Update(ctx, node)
	})
	if apierrors.IsNotFound(err) {
		return errNodeGone
	}
	return err
}

func setReady(st *corev1.NodeStatus, ready bool) {
	cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	if !ready {
		cond.Status, cond.Reason = corev1.ConditionFalse, "KubeletNotReady"
	}
	for i := range st.Conditions {
		if st.Conditions[i].Type == corev1.NodeReady {
			if st.Conditions[i].Status == cond.Status {
				cond.LastTransitionTime = st.Conditions[i].LastTransitionTime
			}
			st.Conditions[i] = cond
			return
		}
	}
	st.Conditions = append(st.Conditions, cond)
}

func setMachineKubelet(ctx context.Context, c client.Client, namespace, name, version string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, m); err != nil {
			return err
		}
		if m.Status.NodeInfo == nil {
			m.Status.NodeInfo = &corev1.NodeSystemInfo{}
		}
		m.Status.NodeInfo.KubeletVersion = version
		return c.Status().Update(ctx, m)
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Volumes stands in for Longhorn's volumes and where their replicas are. When a node is
// deleted, Longhorn rebuilds its replicas on other nodes (its replica replenishment);
// here that is immediate, so a volume never loses its last replica to a deletion.
type Volumes struct {
	mu       sync.Mutex
	replicas map[string]map[string]bool
}

// PlaceVolumes spreads count volumes of 1 to 3 replicas over nodes at random and records
// the placement. A volume of one replica pins its node (the preflight check never lets
// it go down), so those are placed on workers (the nodes of workers): one pinned control
// plane node would hold every control plane upgrade, and every worker's behind it.
func PlaceVolumes(rng *rand.Rand, nodes, workers []string, count int, h *History) *Volumes {
	v := &Volumes{replicas: map[string]map[string]bool{}}
	for i := 1; i <= count; i++ {
		name := fmt.Sprintf("vol-%d", i)
		v.replicas[name] = map[string]bool{}
		on := nodes
		n := 1 + rng.Intn(3)
		if n == 1 {
			on = workers
		}
		for _, j := range rng.Perm(len(on))[:n] {
			v.replicas[name][on[j]] = true
			h.Record(Event{Kind: EventReplica, Volume: name, Node: on[j]})
		}
	}
	return v
}

// NodeGone moves the replicas node held to other nodes of schedulable, as Longhorn
// rebuilds them: from a healthy replica that is left (with none left, a volume whose only
// replica was on the deleted node is faulted and has nothing to rebuild from, so it keeps
// no replica), onto a node that can take one (Longhorn's "Disable Scheduling On Cordoned
// Node", on by default, keeps new replicas off a node an updater cordoned; the caller
// leaves those and the nodes that are down out of schedulable). Sources: longhorn-manager
// v1.10.0 types/setting.go (disable-scheduling-on-cordoned-node, default "true"), and
// shared/facts/longhorn-v2-live-upgrade.md fact 28 (the Node's Schedulable condition has
// the reason KubernetesNodeCordoned).
func (v *Volumes) NodeGone(rng *rand.Rand, node string, schedulable []string, h *History) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, name := range sortedKeys(v.replicas) {
		on := v.replicas[name]
		if !on[node] {
			continue
		}
		delete(on, node)
		h.Record(Event{Kind: EventReplicaLost, Volume: name, Node: node})
		if len(on) == 0 {
			h.Record(Event{Kind: EventReplicaLost, Volume: name, Node: node, Why: "faulted: its only replica was on the deleted node, nothing to rebuild from"})
			continue
		}
		var candidates []string
		for _, n := range schedulable {
			if n != node && !on[n] {
				candidates = append(candidates, n)
			}
		}
		if len(candidates) > 0 {
			to := candidates[rng.Intn(len(candidates))]
			on[to] = true
			h.Record(Event{Kind: EventReplica, Volume: name, Node: to, Why: "rebuilt after " + node + " was deleted"})
		}
	}
}

// LeftWithout lists the volumes that would have no replica outside down, with where
// their replicas are.
func (v *Volumes) LeftWithout(down map[string]bool) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for _, name := range sortedKeys(v.replicas) {
		if len(v.replicas[name]) == 0 {
			// Faulted with its deleted node: nothing an upgrade can keep.
			continue
		}
		var on []string
		outside := false
		for n := range v.replicas[name] {
			on = append(on, n)
			if !down[n] {
				outside = true
			}
		}
		if !outside {
			sort.Strings(on)
			out = append(out, fmt.Sprintf("%s (replicas on %v)", name, on))
		}
	}
	return out
}
