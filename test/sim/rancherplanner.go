package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/rkev1"
)

// Names Rancher v2prov uses on machine-plan Secrets and Nodes (rancher@v2.14.4
// pkg/capr/common.go; shared/facts/harvester-node-upgrade.md, fact 38).
const (
	// MachinePlanSecretType is the type of a machine-plan Secret.
	MachinePlanSecretType corev1.SecretType = "rke.cattle.io/machine-plan"
	// MachineNameLabel names, on a machine-plan Secret, the CAPI Machine it belongs to.
	MachineNameLabel = "rke.cattle.io/machine-name"
	// NodeMachineAnnotation names, on a Node, its CAPI Machine.
	NodeMachineAnnotation = "cluster.x-k8s.io/machine"
	// EtcdRoleLabel, ControlPlaneRoleLabel and WorkerRoleLabel are the machine's roles,
	// on its plan Secret; InitNodeLabel marks the init node.
	EtcdRoleLabel         = "rke.cattle.io/etcd-role"
	ControlPlaneRoleLabel = "rke.cattle.io/control-plane-role"
	WorkerRoleLabel       = "rke.cattle.io/worker-role"
	InitNodeLabel         = "rke.cattle.io/init-node"
	// DrainOptionsAnnotation is the planner's drain request: the JSON of the drain
	// options; DrainDoneAnnotation is set to the same value once cordoned, the pre-drain
	// hooks answered and the node drained; UnCordonAnnotation asks for the uncordon after
	// the plan is applied (rancher@v2.14.4 pkg/capr/planner/drain.go drain, undrain).
	DrainOptionsAnnotation = "rke.cattle.io/drain-options"
	DrainDoneAnnotation    = "rke.cattle.io/drain-done"
	UnCordonAnnotation     = "rke.cattle.io/uncordon"
	// PreDrainAnnotation and PostDrainAnnotation are Rancher's hook requests; each hook
	// answers by setting its own annotation to the same value (node sheet fact 39).
	PreDrainAnnotation  = "rke.cattle.io/pre-drain"
	PostDrainAnnotation = "rke.cattle.io/post-drain"

	// PlanAnnotation is the hash of the plan the simulated planner delivered to the
	// Secret, PlanVersionAnnotation the Kubernetes version that plan installs, and
	// AppliedPlanAnnotation the hash of the plan the simulated rancher-system-agent last
	// applied. Rancher keeps the plan and the applied plan themselves in the Secret's
	// data (keys plan and appliedPlan, rancher@v2.14.4 pkg/capr/planner/store.go); the
	// simulator keeps only their hashes, in annotations a test can read.
	PlanAnnotation        = "sim.capi-inplace.io/plan"
	PlanVersionAnnotation = "sim.capi-inplace.io/plan-version"
	AppliedPlanAnnotation = "sim.capi-inplace.io/applied-plan"
	// PlanDataKey and AppliedPlanDataKey are the Secret's data keys where Rancher
	// delivers the node's plan and rancher-system-agent writes the plan it last applied
	// successfully; the plan is in sync when the two are equal (rancher@v2.14.4
	// pkg/capr/planner/store.go UpdatePlan, SecretToNode). The simulator's plan is the
	// install instruction alone (PlanData), as the product reads it.
	PlanDataKey        = "plan"
	AppliedPlanDataKey = "appliedPlan"
	// FailureCountKey is the Secret's data key where rancher-system-agent counts the failed
	// applications of the current plan (rancher@v2.14.4 pkg/capr/planner/store.go
	// SecretToNode reads it).
	FailureCountKey = "failure-count"

	// Messages of Rancher's planner (rancher@v2.14.4 pkg/capr/planner/store.go and
	// planner.go reconcile).
	WaitingPlanMessage    = "waiting for plan to be applied"
	FailedPlanMessage     = "failure while applying plan"
	WaitingKubeletMessage = "waiting for kubelet to update"
)

// Rancher's tier names (rancher@v2.14.4 pkg/capr/planner/planner.go).
const (
	tierEtcd         = "etcd"
	tierControlPlane = "control plane"
	tierWorker       = "worker"
)

// PlanApply is one run of a machine plan's install instruction on a node by
// rancher-system-agent, as the RancherPlanner simulator played it.
type PlanApply struct {
	Node, Machine string
	// Plan is the hash of the plan applied.
	Plan string
	// From is the node's kubelet version before, To the version the plan installs (the
	// declared spec.kubernetesVersion when the plan was rendered).
	From, To string
	// Restarted is true when RKE2 was restarted (the node went NotReady and came back at
	// To); false when the installer ran under the restart guard or failed.
	Restarted bool
	// Guarded is true when the node carried the restart guard (fact 12).
	Guarded bool
	// Cordoned and Drained say whether the planner had cordoned, and drained (drain
	// enabled), the node before delivering the plan.
	Cordoned, Drained bool
	// InHooks is true when the plan was delivered between the node's answered pre-drain
	// hooks and its post-drain request.
	InHooks bool
	// Failed is true when the installer failed (see FailInstall); Message says why.
	Failed  bool
	Message string
	Start   time.Time
	End     time.Time
}

// Downgrade says whether the run restarted RKE2 at a lower version than it ran.
func (a PlanApply) Downgrade() bool {
	if !a.Restarted {
		return false
	}
	from, err1 := version.ParseGeneric(a.From)
	to, err2 := version.ParseGeneric(a.To)
	return err1 == nil && err2 == nil && to.LessThan(from)
}

// HookEvent is the planner asking for a node's drain hooks (Kind PreDrainAnnotation or
// PostDrainAnnotation), or a cordon / uncordon of the node by Rancher (Kind "cordon",
// "drain", "uncordon").
type HookEvent struct {
	Node, Kind string
	At         time.Time
}

// RancherPlanner plays Rancher v2prov's planner, its machine-drain controller and
// rancher-system-agent for the Harvester cluster itself, fleet-local/local, on the plan
// Secrets SeedMachines creates (shared/facts/harvester-release-steps.md section E, facts
// 58-63; harvester-node-upgrade.md facts 11, 38-39). The behaviours, each after Rancher
// v2.14.4's code as the facts cite it:
//
//   - every node's desired plan is a hash of spec.kubernetesVersion,
//     rkeConfig.provisionGeneration, rkeConfig.registries and how Rancher renders (the
//     server-version Setting, and Rerender): fact 58;
//   - a changed plan is rolled out tier by tier, etcd nodes (the init node first) one at a
//     time, then control-plane-only nodes at controlPlaneConcurrency, then worker-only
//     nodes at workerConcurrency; a tier with any node not settled holds back the next
//     tiers: fact 60;
//   - a node whose drain hash changed, with drain enabled or hooks set, is cordoned, asked
//     for its pre-drain hooks, drained, given its plan, asked for its post-drain hooks
//     and uncordoned: fact 60, node sheet facts 11 and 39;
//   - applying a plan restarts RKE2 at the declared version whatever the node ran (a
//     downgrade for a node upgraded by SUC), unless the node carries the restart guard:
//     facts 58, 62 and 12;
//   - the cluster is not "Updated" while a node's kubelet differs from the declared
//     version: fact 61;
//   - nothing is rolled while the local-rke-state Secret is not of type
//     rke.cattle.io/cluster-state: fact 18.
//
// Time is real time; the simulator looks at the cluster every Interval, or, with Cache,
// on events (passLoop). Run it once per cluster; only one may run against
// fleet-local/local at a time. Set the Rancher simulator's PlannerOwnsLocalCluster so it
// leaves the Cluster's status to this one.
type RancherPlanner struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Kubelet reports the nodes' NotReady / Ready and versions around a restart; its
	// Record receives the transitions (so Record.MaxDown counts these restarts).
	Kubelet *Kubelet
	// NodeSelector selects the cluster's nodes (tests share one API server).
	NodeSelector map[string]string
	// Cache, when set, starts passes on events of Nodes, Secrets, Settings and
	// provisioning Clusters, as Rancher's wrangler controllers run on informer events.
	Cache ctrlcache.Cache
	// Interval is how often the cluster is looked at (see passLoop).
	Interval time.Duration
	// InstallDuration is how long the install instruction runs before RKE2 restarts.
	// Default 20ms.
	InstallDuration time.Duration
	// RestartDuration is how long a node stays NotReady while RKE2 restarts. Default
	// 150ms.
	RestartDuration time.Duration
	// RetryDelay is how long rancher-system-agent waits before it applies a failed plan
	// again. Default 300ms.
	RetryDelay time.Duration
	// Guarded says whether a node carries the restart guard of fact 12 (the runtime
	// drop-in giving rancher-system-agent INSTALL_RKE2_SKIP_ENABLE=true). That is host
	// state no API server shows: a test wires it, e.g. to the SUC simulator's record of
	// the guard Plan. Nil guards no node.
	Guarded func(node string) bool
	// Multus, when set, is told of every RKE2 restart of a server node (an etcd or
	// control-plane machine: RKE2 runs as a server there, with its deploy controller):
	// the restart applies the server manifests, rke2-multus.yaml among them unless
	// skipped (Multus.RKE2Restarted; harvester-release-steps.md facts 9 and 34).
	Multus *Multus
	// CopyDelay is how long Rancher's provisioningcluster controller takes to write a
	// change of fleet-local/local's version or rkeConfig into the RKEControlPlane the
	// planner reads (copyPass). Default 0: its next pass, on the Cluster's event.
	CopyDelay time.Duration
	// TakeDelay is how long a pass takes from reading the RKEControlPlane to writing a
	// node's drain-options (taking the node). Rancher's planner reads the pause once, at
	// the start of its pass (rancher@v2.14.4 pkg/capr/planner/planner.go Process), and
	// writes the plan Secrets later in the same pass (fullReconcile), which on a real
	// cluster reads many objects: a pass that read the planner unpaused still takes its
	// node after a pause has landed. Default 0.
	TakeDelay time.Duration
	// DrainDelay is how long Rancher's machine-drain controller takes from the Secret it
	// handles to its cordon: it handles the version its informer cache holds when the
	// Secret's key comes out of its queue and builds a client of the cluster for each call
	// (rancher@v2.14.4 pkg/controllers/capr/machinedrain/machinedrain.go OnChange,
	// k8sClient), so a drain written back meanwhile can still be acted on. Default 0.
	DrainDelay time.Duration

	loop   passLoop
	copier passLoop

	mu        sync.Mutex
	rerenders int
	// applying holds the nodes whose install instruction runs now.
	applying map[string]bool
	// appliedBy is the plan each node's agent last applied successfully: the agent
	// applies a plan once, whatever a Secret read before its write still says
	// (rancher-system-agent keeps the applied plan's checksum itself).
	appliedBy map[string]string
	// retryAt is when a failed node's plan is applied again.
	retryAt map[string]time.Time
	fails   map[string]string
	// stopped holds the nodes whose rancher-system-agent does not run (StopAgent).
	stopped map[string]bool
	// delivered is what was known at delivery of a node's plan (for its PlanApply).
	delivered  map[string]PlanApply
	applies    []PlanApply
	hooks      []HookEvent
	restarting int
	maxRestart int
	cordoned   map[string]bool
	maxCordon  int
	// copySeen is when copyPass first saw the RKEControlPlane behind the Cluster.
	copySeen time.Time
	// taking is the node a pass is taking now, during its TakeDelay.
	taking string
}

// Taking is the node a pass of the planner is taking now (it read the planner unpaused
// and writes the node's drain-options once its TakeDelay has passed), "" when none.
func (p *RancherPlanner) Taking() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.taking
}

// Rerender stands for a Rancher upgrade that renders every machine plan differently
// (fact 58; PR #4149): every node's desired plan changes.
func (p *RancherPlanner) Rerender() {
	p.mu.Lock()
	p.rerenders++
	p.mu.Unlock()
	p.loop.wake()
}

// FailInstall makes rancher-system-agent's install instruction fail on node with message
// (e.g. an image that cannot be pulled) from its next run on, until ClearInstallFailure.
// The failure happens before the installer touches RKE2: the node keeps running its
// version, Ready (chosen: the facts are silent on where an install fails). As Rancher
// does, the plan stays delivered and unapplied, the Secret counts the failure
// (FailureCountKey), the agent retries every RetryDelay, and the cluster's Updated
// condition says "failure while applying plan" (rancher@v2.14.4
// pkg/capr/planner/store.go getPlanStatusReasonMessage); the tier, and every later tier,
// waits.
func (p *RancherPlanner) FailInstall(node, message string) {
	p.mu.Lock()
	if p.fails == nil {
		p.fails = map[string]string{}
	}
	p.fails[node] = message
	p.mu.Unlock()
	p.loop.wake()
}

// ClearInstallFailure lets the next run of the install on node succeed.
func (p *RancherPlanner) ClearInstallFailure(node string) {
	p.mu.Lock()
	delete(p.fails, node)
	p.mu.Unlock()
	p.loop.wake()
}

// StopAgent stops rancher-system-agent on node, as when its systemd unit
// (rancher-system-agent.service) is stopped or cannot start: nothing reads the node's
// plan Secret, so a plan delivered there is neither applied (no applied plan, no
// checksum) nor counted as failed (no failure-count), and RKE2 is not restarted. Rancher
// shows the machine as "waiting for plan to be applied" for as long as it lasts: the
// plan is there, the agent applied an older one and no failure is counted
// (rancher@v2.14.4 pkg/capr/planner/store.go getPlanStatusReasonMessage, default case;
// SecretToNode); no timeout of Rancher's ends that wait. A run of the install already
// going when the agent stops finishes. StartAgent starts it again.
func (p *RancherPlanner) StopAgent(node string) {
	p.mu.Lock()
	if p.stopped == nil {
		p.stopped = map[string]bool{}
	}
	p.stopped[node] = true
	p.mu.Unlock()
}

// StartAgent starts rancher-system-agent on node again: it applies the plan it finds
// delivered, as on its first run after any start (it compares the plan with the one it
// last applied).
func (p *RancherPlanner) StartAgent(node string) {
	p.mu.Lock()
	delete(p.stopped, node)
	p.mu.Unlock()
	p.loop.wake()
}

// Applies returns every run of an install instruction, in start order.
func (p *RancherPlanner) Applies() []PlanApply {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]PlanApply(nil), p.applies...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Restarts returns the runs that restarted RKE2.
func (p *RancherPlanner) Restarts() []PlanApply {
	return p.filter(func(a PlanApply) bool { return a.Restarted })
}

// Downgrades returns the restarts at a lower version than the node ran (fact 62b).
func (p *RancherPlanner) Downgrades() []PlanApply {
	return p.filter(PlanApply.Downgrade)
}

// UnguardedRestartsOutsideDrain returns the RKE2 restarts of nodes that were neither
// drained nor inside answered drain hooks: what took down the workloads of a node
// without warning (fact 12's "if skipped", fact 63).
func (p *RancherPlanner) UnguardedRestartsOutsideDrain() []PlanApply {
	return p.filter(func(a PlanApply) bool { return a.Restarted && !a.Drained && !a.InHooks })
}

func (p *RancherPlanner) filter(keep func(PlanApply) bool) []PlanApply {
	var out []PlanApply
	for _, a := range p.Applies() {
		if keep(a) {
			out = append(out, a)
		}
	}
	return out
}

// HookEvents returns the hook requests, cordons, drains and uncordons, in order.
func (p *RancherPlanner) HookEvents() []HookEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]HookEvent(nil), p.hooks...)
}

// MaxRestarting is the largest number of nodes whose RKE2 restarted at the same time.
func (p *RancherPlanner) MaxRestarting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxRestart
}

// MaxCordoned is the largest number of nodes cordoned by the planner at the same time.
func (p *RancherPlanner) MaxCordoned() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxCordon
}

func (p *RancherPlanner) event(node, kind string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks = append(p.hooks, HookEvent{Node: node, Kind: kind, At: time.Now()})
	if p.cordoned == nil {
		p.cordoned = map[string]bool{}
	}
	switch kind {
	case "cordon":
		p.cordoned[node] = true
		n := 0
		for _, c := range p.cordoned {
			if c {
				n++
			}
		}
		p.maxCordon = max(p.maxCordon, n)
	case "uncordon":
		p.cordoned[node] = false
	}
}

// forgetCordon drops from the planner's count of the nodes it holds cordoned a node seen
// schedulable: someone else lifted the cordon (a NodeUpdate's Finish, a withdrawn drain)
// before Rancher's own uncordon, which then finds nothing to do (kubectl's drain helper
// RunCordonOrUncordon, as machinedrain.go calls it, changes nothing on a node already as
// asked) and records no uncordon.
func (p *RancherPlanner) forgetCordon(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cordoned[node] {
		p.cordoned[node] = false
	}
}

// MachineName is the CAPI Machine SeedMachines gives a node. Rancher names custom
// machines custom-<hash>; the simulator keeps the node's name readable.
func MachineName(node string) string { return "custom-" + node }

// SeedMachines gives every node of the cluster (NodeSelector) what Rancher v2prov keeps
// for it, settled at the current desired plan (node sheet fact 38): the machine-plan
// Secret in fleet-local (type rke.cattle.io/machine-plan, label
// rke.cattle.io/machine-name, its role labels) with its plan delivered and applied, and
// the Node's cluster.x-k8s.io/machine annotation. The CAPI Machines themselves (whose
// status.nodeRef Rancher maps through) are not created: the simulator maps Secret and
// Node by that annotation. Roles come from the node's labels, as harvesteradapter's
// nodeRole reads them: node-role.kubernetes.io/etcd or the witness label
// node-role.harvesterhci.io/witness make an etcd machine, node-role.kubernetes.io/
// control-plane or master a control-plane machine; a node with neither is a worker.
// Harvester's management nodes run all three roles, so they are in the etcd tier. The
// first etcd node by name is the init node. Call it after the provisioning Cluster
// exists (Seed) and before Run.
func (p *RancherPlanner) SeedMachines(ctx context.Context) error {
	cl := &provisioningv1.Cluster{}
	if err := p.Client.Get(ctx, localClusterKey, cl); err != nil {
		return fmt.Errorf("read fleet-local/local: %w", err)
	}
	// Rancher generated the RKEControlPlane long before: it carries the Cluster's spec.
	if err := p.copyPass(ctx, true); err != nil {
		return err
	}
	render, err := p.renderInput(ctx)
	if err != nil {
		return err
	}
	hash := desiredPlan(cl, render)
	nodes, err := p.nodes(ctx)
	if err != nil {
		return err
	}
	initDone := false
	for i := range nodes {
		n := &nodes[i]
		machine := MachineName(n.Name)
		etcd, cp, worker := roles(n)
		lbls := map[string]string{MachineNameLabel: machine}
		if etcd {
			lbls[EtcdRoleLabel] = "true"
			if !initDone {
				lbls[InitNodeLabel] = "true"
				initDone = true
			}
		}
		if cp {
			lbls[ControlPlaneRoleLabel] = "true"
		}
		if worker {
			lbls[WorkerRoleLabel] = "true"
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: rancher.FleetLocal, Name: machine + "-machine-plan", Labels: lbls,
				Annotations: map[string]string{PlanAnnotation: hash, PlanVersionAnnotation: cl.Spec.KubernetesVersion, AppliedPlanAnnotation: hash},
			},
			Data: map[string][]byte{PlanDataKey: PlanData(cl.Spec.KubernetesVersion, hash), AppliedPlanDataKey: PlanData(cl.Spec.KubernetesVersion, hash)},
			Type: MachinePlanSecretType,
		}
		if err := recreate(ctx, p.Client, secret); err != nil {
			return err
		}
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &corev1.Node{}
			if err := p.Client.Get(ctx, client.ObjectKeyFromObject(n), cur); err != nil {
				return err
			}
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			cur.Annotations[NodeMachineAnnotation] = machine
			return p.Client.Update(ctx, cur)
		}); err != nil {
			return fmt.Errorf("annotate node %s: %w", n.Name, err)
		}
	}
	return nil
}

// roles reads a node's roles from its labels (see SeedMachines).
func roles(n *corev1.Node) (etcd, controlPlane, worker bool) {
	l := n.Labels
	etcd = l["node-role.kubernetes.io/etcd"] == "true" || l["node-role.harvesterhci.io/witness"] == "true"
	controlPlane = l["node-role.kubernetes.io/control-plane"] == "true" || l["node-role.kubernetes.io/master"] == "true"
	// Harvester management nodes are schedulable workers too; a witness is not.
	worker = l["node-role.harvesterhci.io/witness"] != "true"
	return etcd, controlPlane, worker
}

var localClusterKey = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}

// Run plays the planner until ctx ends.
func (p *RancherPlanner) Run(ctx context.Context) error {
	controlPlane := &metav1.PartialObjectMetadata{}
	controlPlane.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	kinds := []client.Object{&corev1.Node{}, &corev1.Secret{}, &managementv3.Setting{}, &provisioningv1.Cluster{}, controlPlane}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		p.copier.run(ctx, p.Interval, p.Cache, []client.Object{&provisioningv1.Cluster{}}, func(ctx context.Context) { _ = p.copyPass(ctx, false) })
	}()
	p.loop.run(ctx, p.Interval, p.Cache, kinds, func(ctx context.Context) { _ = p.pass(ctx) })
	<-copied
	return ctx.Err()
}

// renderInput is what, besides the Cluster, makes Rancher render a plan differently:
// the running Rancher version and the Rerender count. The server-version Setting is
// written by Rancher when it starts at a new version (the Rancher simulator copies the
// rolled-out rancher Deployment's tag into it). Chosen where fact 58 is not exact (it
// says a Rancher upgrade that renders plans differently, e.g. v2.6 → v2.7): every
// Rancher version change re-renders, the worst case.
func (p *RancherPlanner) renderInput(ctx context.Context) (string, error) {
	s := &managementv3.Setting{}
	if err := p.Client.Get(ctx, client.ObjectKey{Name: rancher.ServerVersionSetting}, s); err != nil && !apierrors.IsNotFound(err) {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%s/%d", s.Value, p.rerenders), nil
}

// desiredPlan hashes what goes into a node's install instruction and its RESTART_STAMP
// and DRAIN_HASH (fact 58; rancher@v2.14.4 pkg/capr/planner/config.go restartStamp,
// drainHash; planner.go getInstallerImage puts the version in the image tag). The
// simulator uses this one hash as plan, restart stamp and drain hash: every input of
// one is an input of the others.
func desiredPlan(cl *provisioningv1.Cluster, render string) string {
	h := sha256.New()
	_, _ = fmt.Fprintf(h, "image=rke2:%s\n", strings.ReplaceAll(cl.Spec.KubernetesVersion, "+", "-"))
	if rc := cl.Spec.RKEConfig; rc != nil {
		_, _ = fmt.Fprintf(h, "provisionGeneration=%d\n", rc.ProvisionGeneration)
		if rc.Registries != nil {
			_, _ = fmt.Fprintf(h, "registries=%s\n", rc.Registries.Raw)
		}
	}
	_, _ = fmt.Fprintf(h, "render=%s\n", render)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// InstallerImage is the repository of Rancher's RKE2 installer image; the tag is the
// version with "+" made "-" (fact 58; planner.go getInstallerImage).
const InstallerImage = "rancher/system-agent-installer-rke2"

// PlanData is the plan the simulator delivers as the Secret's PlanDataKey: the JSON of a
// node plan (rancher@v2.14.4 pkg/apis/rke.cattle.io/v1/plan NodePlan) holding only its
// install instruction, which runs the installer image at version with the restart stamp
// (planner.go addInstallInstructionWithRestartStamp; fact 58).
func PlanData(version, stamp string) []byte {
	b, _ := json.Marshal(map[string]any{"instructions": []any{map[string]any{
		"name":    "install",
		"image":   InstallerImage + ":" + strings.ReplaceAll(version, "+", "-"),
		"command": "sh",
		"args":    []string{"-c", "run.sh"},
		"env":     []string{"RESTART_STAMP=" + stamp},
	}}})
	return b
}

func (p *RancherPlanner) nodes(ctx context.Context) ([]corev1.Node, error) {
	list := &corev1.NodeList{}
	if err := p.Client.List(ctx, list, client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(p.NodeSelector)}); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// entry is a machine: its node and plan Secret.
type entry struct {
	node   *corev1.Node
	secret *corev1.Secret
}

func (e *entry) ann(key string) string { return e.secret.Annotations[key] }

func (e *entry) inSync() bool { return e.ann(PlanAnnotation) == e.ann(AppliedPlanAnnotation) }

// inDrain is Rancher's isInDrain (planner.go).
func (e *entry) inDrain() bool {
	return e.ann(PreDrainAnnotation) != "" || e.ann(PostDrainAnnotation) != "" || e.ann(DrainOptionsAnnotation) != "" || e.ann(UnCordonAnnotation) != ""
}

func (e *entry) failed() bool {
	return !e.inSync() && len(e.secret.Data[FailureCountKey]) > 0 && string(e.secret.Data[FailureCountKey]) != "0"
}

// healthy stands for the plan's probes (kubelet and, on servers, the API server,
// etcd): the node Ready.
func (e *entry) healthy() bool { return NodeReady(e.node) }

func (p *RancherPlanner) pass(ctx context.Context) error {
	cl := &provisioningv1.Cluster{}
	if err := p.Client.Get(ctx, localClusterKey, cl); err != nil {
		return client.IgnoreNotFound(err)
	}
	// The planner reconciles the RKEControlPlane: its version, upgrade strategy and pause
	// are read together, from that one object (planner.go Process, fullReconcile), not
	// from the provisioning Cluster, whose changes reach it through copyPass.
	controlPlane, spec, err := p.readControlPlane(ctx)
	if err != nil || controlPlane == nil {
		return err
	}
	cl = spec.view(cl)
	// Rancher v2.7 and later require the local cluster's state Secret to be of type
	// rke.cattle.io/cluster-state and stop there otherwise: an Opaque one (clusters
	// installed before) blocks every plan change, RKE2 upgrades included
	// (harvester-release-steps.md fact 18; rancher/rancher PR #41088, harvester issue
	// #3858).
	state := &corev1.Secret{}
	if err := p.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalRKEStateSecret}, state); err == nil && state.Type != rancher.RKEClusterStateType {
		return p.writeStatus(ctx, fmt.Sprintf("the Secret %s/%s is of type %s, not %s", rancher.FleetLocal, rancher.LocalRKEStateSecret, state.Type, rancher.RKEClusterStateType))
	} else if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	render, err := p.renderInput(ctx)
	if err != nil {
		return err
	}
	desired := desiredPlan(cl, render)
	nodes, err := p.nodes(ctx)
	if err != nil {
		return err
	}
	secrets := &corev1.SecretList{}
	if err := p.Client.List(ctx, secrets, client.InNamespace(rancher.FleetLocal)); err != nil {
		return err
	}
	byMachine := map[string]*corev1.Secret{}
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if s.Type == MachinePlanSecretType && s.Labels[MachineNameLabel] != "" {
			byMachine[s.Labels[MachineNameLabel]] = s
		}
	}
	var etcd, cp, workers []*entry
	for i := range nodes {
		n := &nodes[i]
		s := byMachine[n.Annotations[NodeMachineAnnotation]]
		if s == nil {
			continue // not a machine of this cluster
		}
		e := &entry{node: n, secret: s}
		if !n.Spec.Unschedulable {
			p.forgetCordon(n.Name)
		}
		switch {
		case s.Labels[EtcdRoleLabel] == "true":
			etcd = append(etcd, e)
		case s.Labels[ControlPlaneRoleLabel] == "true":
			cp = append(cp, e)
		default:
			workers = append(workers, e)
		}
	}
	// The init node is reconciled first (the bootstrap tier), then the other etcd
	// nodes, one at a time either way (planner.go fullReconcile).
	sort.SliceStable(etcd, func(i, j int) bool {
		return etcd[i].secret.Labels[InitNodeLabel] == "true" && etcd[j].secret.Labels[InitNodeLabel] != "true"
	})
	machines := len(etcd) + len(cp) + len(workers)
	us := ptrDeref(cl.Spec.RKEConfig).UpgradeStrategy

	tiers := []struct {
		name        string
		entries     []*entry
		concurrency string
		drain       provisioningv1.DrainOptions
	}{
		{tierEtcd, etcd, "1", us.ControlPlaneDrainOptions},
		{tierControlPlane, cp, us.ControlPlaneConcurrency, us.ControlPlaneDrainOptions},
		{tierWorker, workers, us.WorkerConcurrency, us.WorkerDrainOptions},
	}
	waiting := ""
	var errs []error
	paused, err := p.paused(ctx, controlPlane)
	if err != nil {
		return err
	}
	if paused {
		// Pausing the control plane stops machine reconciliation (planner.go Process):
		// no drain is started, no plan delivered, no uncordon asked. The machine-drain
		// controller and the agents are not the planner: they go on.
		waiting = PausedMessage
	}
	for _, t := range tiers {
		if paused {
			break
		}
		msg, err := p.reconcileTier(ctx, cl, t.name, t.entries, desired, t.concurrency, t.drain, machines)
		if err != nil {
			errs = append(errs, err)
		}
		if msg != "" {
			// An errWaiting of a tier ends fullReconcile: later tiers wait
			// (planner.go fullReconcile, reconcile, setMachineConditionStatus; errors.go).
			waiting = msg
			break
		}
	}
	all := append(append(append([]*entry{}, etcd...), cp...), workers...)
	for _, e := range all {
		errs = append(errs, p.machineDrain(ctx, e))
	}
	errs = append(errs, p.agents(ctx, all))
	errs = append(errs, p.writeStatus(ctx, waiting))
	return errors.Join(errs...)
}

// PausedMessage is what the planner says while the control plane or its CAPI Cluster is
// paused (rancher@v2.14.4 pkg/capr/planner/planner.go Process).
const PausedMessage = "CAPI cluster or RKEControlPlane is paused"

// paused is Cluster API's IsPaused as the planner calls it (planner.go Process,
// capiannotations.IsPaused(capiCluster, cp)): the RKEControlPlane fleet-local/local, as
// the pass read it, carries cluster.x-k8s.io/paused, or the CAPI Cluster
// fleet-local/local has spec.paused. A missing CAPI Cluster pauses nothing.
func (p *RancherPlanner) paused(ctx context.Context, cp client.Object) (bool, error) {
	if _, ok := cp.GetAnnotations()[clusterv1.PausedAnnotation]; ok {
		return true, nil
	}
	capi := &clusterv1.Cluster{}
	if err := p.Client.Get(ctx, localClusterKey, capi); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return false, nil
		}
		return false, err
	}
	return ptr.Deref(capi.Spec.Paused, false), nil
}

func ptrDeref(rc *provisioningv1.RKEConfig) provisioningv1.RKEConfig {
	if rc == nil {
		return provisioningv1.RKEConfig{}
	}
	return *rc
}

// calculateConcurrency is Rancher's (planner.go calculateConcurrency): a number as
// given (0 is no limit), empty is 1, a percentage of the tier's machines rounded up.
func calculateConcurrency(s string, count int) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	if s == "" {
		return 1, nil
	}
	pct, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil {
		return 0, fmt.Errorf("concurrency must be a number or a percentage: %w", err)
	}
	return int(math.Ceil(float64(count) * pct / 100)), nil
}

// reconcileTier is Rancher's reconcile of one tier (planner.go reconcile). It returns the
// message the tier waits with ("" when every machine is settled).
func (p *RancherPlanner) reconcileTier(ctx context.Context, cl *provisioningv1.Cluster, tier string, entries []*entry, desired, maxUnavailable string, drain provisioningv1.DrainOptions, machines int) (string, error) {
	concurrency, err := calculateConcurrency(maxUnavailable, len(entries))
	if err != nil {
		return "", err
	}
	unavailable := 0
	isUnavailable := func(e *entry) bool {
		change := e.ann(PlanAnnotation) != desired
		return !e.inSync() || e.inDrain() || (!change && !e.healthy())
	}
	for _, e := range entries {
		if isUnavailable(e) {
			unavailable++
		}
	}
	var uncordoning, draining, configuring []string
	messages := map[string]string{}
	var errs []error
	for _, e := range entries {
		machine := e.secret.Labels[MachineNameLabel]
		statusMsg := planStatusMessage(e)
		switch {
		case e.ann(PlanAnnotation) != desired:
			configuring = append(configuring, machine)
			messages[machine] = statusMsg
			if !e.inDrain() && !e.failed() && concurrency != 0 && unavailable >= concurrency {
				continue
			}
			if !isUnavailable(e) {
				unavailable++
			}
			done, err := p.drain(ctx, e, desired, drain, machines)
			if err != nil {
				errs = append(errs, err)
			}
			if !done {
				draining = append(draining, machine)
				messages[machine] = "draining node"
				continue
			}
			if err := p.deliver(ctx, e, cl, desired); err != nil {
				errs = append(errs, err)
			}
			if e.ann(DrainDoneAnnotation) != "" {
				messages[machine] = "drain completed"
			} else if statusMsg == "" {
				messages[machine] = WaitingPlanMessage
			}
		case statusMsg != "":
			configuring = append(configuring, machine)
			messages[machine] = statusMsg
		default:
			done, err := p.undrain(ctx, e)
			if err != nil {
				errs = append(errs, err)
			}
			switch {
			case !done:
				uncordoning = append(uncordoning, machine)
				messages[machine] = "waiting for uncordon to finish"
			case !kubeletUpToDate(cl.Spec.KubernetesVersion, e.node.Status.NodeInfo.KubeletVersion):
				// fact 61: kubeletVersionUpToDate, major.minor.patch equality.
				configuring = append(configuring, machine)
				messages[machine] = WaitingKubeletMessage
			}
		}
	}
	// setMachineConditionStatus is called for uncordoned, draining, then outOfSync: the
	// first that waits is the error the control plane shows.
	for _, group := range []struct {
		verb  string
		names []string
	}{{"uncordoning", uncordoning}, {"draining", draining}, {"configuring", configuring}} {
		if len(group.names) > 0 {
			return fmt.Sprintf("%s %s node(s) %s%s", group.verb, tier, atMostThree(group.names), detailed(group.names, messages)), errors.Join(errs...)
		}
	}
	return "", errors.Join(errs...)
}

// planStatusMessage is Rancher's getPlanStatusReasonMessage (store.go) for a delivered
// plan.
func planStatusMessage(e *entry) string {
	switch {
	case !e.healthy():
		return "waiting for probes: kubelet" // probesMessage names the failing probes
	case e.inSync():
		return ""
	case e.failed():
		return FailedPlanMessage
	}
	return WaitingPlanMessage
}

func atMostThree(names []string) string {
	sort.Strings(names)
	if len(names) > 3 {
		return fmt.Sprintf("%s and %d more", strings.Join(names[:3], ","), len(names)-3)
	}
	return strings.Join(names, ",")
}

func detailed(names []string, messages map[string]string) string {
	if len(names) != 1 || messages[names[0]] == "" {
		return ""
	}
	return ": " + messages[names[0]]
}

// kubeletUpToDate is Rancher's kubeletVersionUpToDate (planner.go): major, minor and
// patch equal, pre-release and build ignored; a version that does not parse is not up
// to date.
func kubeletUpToDate(declared, kubelet string) bool {
	d, err1 := version.ParseGeneric(declared)
	k, err2 := version.ParseGeneric(kubelet)
	if err1 != nil || err2 != nil {
		return false
	}
	return d.Major() == k.Major() && d.Minor() == k.Minor() && d.Patch() == k.Patch()
}

// drainOptionString is the value Rancher writes into the drain annotations and hook
// requests: the options' JSON, drain disabled on a one-machine cluster (drain.go
// optionsToString). Rancher encodes its full rkev1.DrainOptions; this is our subset.
func drainOptionString(opts provisioningv1.DrainOptions, machines int) string {
	if machines == 1 {
		opts.Enabled = false
	}
	b, _ := json.Marshal(opts)
	return string(b)
}

func hooksAnswered(e *entry, hooks []provisioningv1.DrainHook, value string) bool {
	for _, h := range hooks {
		if h.Annotation != "" && e.ann(h.Annotation) != value {
			return false
		}
	}
	return true
}

// drain is the planner's drain (rancher@v2.14.4 pkg/capr/planner/drain.go drain): it
// says whether the node is ready for its new plan. With no drain (or a single machine)
// and no hooks there is nothing to wait for, whatever annotations a drain started under
// another strategy left (the short circuit). Otherwise it waits only when the plan's
// restart stamp changes (shouldDrain: the applied plan against the desired one), writes
// the drain options into drain-options and waits until the machine-drain controller
// (machineDrain) has set drain-done to the same value.
func (p *RancherPlanner) drain(ctx context.Context, e *entry, desired string, opts provisioningv1.DrainOptions, machines int) (bool, error) {
	if (!opts.Enabled || machines == 1) && len(opts.PreDrainHooks) == 0 && len(opts.PostDrainHooks) == 0 {
		return true, nil
	}
	applied := e.ann(AppliedPlanAnnotation)
	if applied == "" || applied == desired {
		return true, nil
	}
	value := drainOptionString(opts, machines)
	if e.ann(DrainOptionsAnnotation) != value {
		if p.TakeDelay > 0 {
			p.mu.Lock()
			p.taking = e.node.Name
			p.mu.Unlock()
			select {
			case <-time.After(p.TakeDelay):
			case <-ctx.Done():
				return false, ctx.Err()
			}
			p.mu.Lock()
			p.taking = ""
			p.mu.Unlock()
		}
		return false, p.annotate(ctx, e, map[string]string{DrainOptionsAnnotation: value})
	}
	return e.ann(DrainDoneAnnotation) == value, nil
}

// undrain is the planner's undrain (drain.go): once the new plan is applied it asks for
// the uncordon (uncordon set to drain-options' value) and waits until the machine-drain
// controller has removed it with every other drain annotation.
func (p *RancherPlanner) undrain(ctx context.Context, e *entry) (bool, error) {
	if d := e.ann(DrainOptionsAnnotation); d != "" && d != e.ann(UnCordonAnnotation) {
		return false, p.annotate(ctx, e, map[string]string{UnCordonAnnotation: d})
	}
	return e.ann(UnCordonAnnotation) == "", nil
}

// machineDrain is Rancher's machine-drain controller on one plan Secret (rancher@v2.14.4
// pkg/controllers/capr/machinedrain/machinedrain.go OnChange), which runs on every change
// of the Secret, paused planner or not: while drain-options is set and drain-done differs
// from it, it drains (cordon, the pre-drain hooks the options name, the drain when
// enabled, then drain-done); only after that, when uncordon is set, it undrains
// (post-drain hooks, uncordon, every drain annotation removed). The hooks are those the
// drain-options value names, not the cluster's current strategy: a drain started under
// our hooks waits for our hooks even after the strategy lost them.
func (p *RancherPlanner) machineDrain(ctx context.Context, e *entry) error {
	value := e.ann(DrainOptionsAnnotation)
	switch {
	case value != "" && e.ann(DrainDoneAnnotation) != value:
		return p.drainMachine(ctx, e, value)
	case e.ann(UnCordonAnnotation) != "":
		return p.undrainMachine(ctx, e, value)
	}
	return nil
}

// drainMachine is machinedrain.go drain: cordon first, whatever the options
// (RunCordonOrUncordon), then the pre-drain hooks, then the drain when enabled, then
// drain-done.
func (p *RancherPlanner) drainMachine(ctx context.Context, e *entry, value string) error {
	var opts provisioningv1.DrainOptions
	if err := json.Unmarshal([]byte(value), &opts); err != nil {
		return err
	}
	if p.DrainDelay > 0 {
		select {
		case <-time.After(p.DrainDelay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := p.cordon(ctx, e.node, true); err != nil {
		return err
	}
	if len(opts.PreDrainHooks) > 0 {
		if e.ann(PreDrainAnnotation) != value {
			p.event(e.node.Name, PreDrainAnnotation)
			return p.annotate(ctx, e, map[string]string{PreDrainAnnotation: value})
		}
		if !hooksAnswered(e, opts.PreDrainHooks, value) {
			return nil
		}
	}
	if opts.Enabled {
		// kubectl drain's eviction is not played: the simulator has no pods to evict.
		p.event(e.node.Name, "drain")
	}
	return p.annotate(ctx, e, map[string]string{DrainDoneAnnotation: value})
}

// undrainMachine is machinedrain.go unDrain: the post-drain hooks the drain-options value
// names, then the uncordon, then every drain annotation and the hooks' own answers
// removed (cleanSecretAnnotationsIfCheckTrue). drain-options empty is an error there
// (its JSON does not parse): the Secret is left as it is.
func (p *RancherPlanner) undrainMachine(ctx context.Context, e *entry, value string) error {
	var opts provisioningv1.DrainOptions
	if err := json.Unmarshal([]byte(value), &opts); err != nil {
		return err
	}
	if len(opts.PostDrainHooks) > 0 {
		if e.ann(PostDrainAnnotation) != value {
			p.event(e.node.Name, PostDrainAnnotation)
			return p.annotate(ctx, e, map[string]string{PostDrainAnnotation: value})
		}
		if !hooksAnswered(e, opts.PostDrainHooks, value) {
			return nil
		}
	}
	if err := p.cordon(ctx, e.node, false); err != nil {
		return err
	}
	clear := map[string]string{PreDrainAnnotation: "", PostDrainAnnotation: "", DrainOptionsAnnotation: "", DrainDoneAnnotation: "", UnCordonAnnotation: ""}
	for _, h := range append(append([]provisioningv1.DrainHook{}, opts.PreDrainHooks...), opts.PostDrainHooks...) {
		if h.Annotation != "" {
			clear[h.Annotation] = ""
		}
	}
	return p.annotate(ctx, e, clear)
}

// cordon is RunCordonOrUncordon on the Node the machine-drain controller reads just
// before (machinedrain.go getHelper: Nodes().Get): the node as it is now, not as the pass
// read it, so a node uncordoned since the pass began is cordoned again.
func (p *RancherPlanner) cordon(ctx context.Context, n *corev1.Node, on bool) error {
	cur := &corev1.Node{}
	if err := p.Client.Get(ctx, client.ObjectKey{Name: n.Name}, cur); err != nil {
		return err
	}
	if cur.Spec.Unschedulable == on {
		n.Spec.Unschedulable = on
		return nil
	}
	if err := p.Kubelet.SetUnschedulable(ctx, n.Name, on); err != nil {
		return err
	}
	n.Spec.Unschedulable = on
	if on {
		p.event(n.Name, "cordon")
	} else {
		p.event(n.Name, "uncordon")
	}
	return nil
}

// annotate sets (an empty value removes) annotations on e's Secret and keeps e's copy
// up to date.
func (p *RancherPlanner) annotate(ctx context.Context, e *entry, set map[string]string) error {
	return p.updateSecret(ctx, e, func(s *corev1.Secret) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		for k, v := range set {
			if v == "" {
				delete(s.Annotations, k)
			} else {
				s.Annotations[k] = v
			}
		}
	})
}

func (p *RancherPlanner) updateSecret(ctx context.Context, e *entry, mutate func(*corev1.Secret)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Secret{}
		if err := p.Client.Get(ctx, client.ObjectKeyFromObject(e.secret), cur); err != nil {
			return err
		}
		mutate(cur)
		if err := p.Client.Update(ctx, cur); err != nil {
			return err
		}
		e.secret = cur
		return nil
	})
}

// deliver writes the desired plan into the Secret (store.go UpdatePlan), remembering
// what the node's drain state was for the run's record; a new plan resets the failure
// count.
func (p *RancherPlanner) deliver(ctx context.Context, e *entry, cl *provisioningv1.Cluster, desired string) error {
	var opts provisioningv1.DrainOptions
	value := e.ann(DrainOptionsAnnotation)
	_ = json.Unmarshal([]byte(value), &opts)
	a := PlanApply{
		Node: e.node.Name, Machine: e.secret.Labels[MachineNameLabel], Plan: desired, To: cl.Spec.KubernetesVersion,
		Cordoned: e.node.Spec.Unschedulable,
		Drained:  value != "" && opts.Enabled && e.ann(DrainDoneAnnotation) == value,
		InHooks:  value != "" && len(opts.PreDrainHooks) > 0 && e.ann(PreDrainAnnotation) == value && hooksAnswered(e, opts.PreDrainHooks, value),
	}
	p.mu.Lock()
	if p.delivered == nil {
		p.delivered = map[string]PlanApply{}
	}
	p.delivered[e.node.Name] = a
	p.mu.Unlock()
	return p.updateSecret(ctx, e, func(s *corev1.Secret) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[PlanAnnotation] = desired
		s.Annotations[PlanVersionAnnotation] = cl.Spec.KubernetesVersion
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[PlanDataKey] = PlanData(cl.Spec.KubernetesVersion, desired)
		delete(s.Data, FailureCountKey)
	})
}

// agents plays rancher-system-agent on every node: a delivered plan not yet applied is
// run, one run at a time per node, again after RetryDelay when it failed; nothing runs
// on a node whose agent is stopped (StopAgent).
func (p *RancherPlanner) agents(ctx context.Context, entries []*entry) error {
	for _, e := range entries {
		if e.inSync() {
			continue
		}
		node := e.node.Name
		p.mu.Lock()
		busy := p.applying[node] || p.appliedBy[node] == e.ann(PlanAnnotation) || p.stopped[node]
		retryAt := p.retryAt[node]
		p.mu.Unlock()
		if busy {
			continue
		}
		if !retryAt.IsZero() && time.Now().Before(retryAt) {
			p.loop.dueAt(retryAt)
			continue
		}
		p.mu.Lock()
		if p.applying == nil {
			p.applying = map[string]bool{}
		}
		p.applying[node] = true
		a := p.delivered[node]
		p.mu.Unlock()
		a.Node, a.Machine = node, e.secret.Labels[MachineNameLabel]
		a.Plan, a.To = e.ann(PlanAnnotation), e.ann(PlanVersionAnnotation)
		a.From = e.node.Status.NodeInfo.KubeletVersion
		server := e.secret.Labels[EtcdRoleLabel] == "true" || e.secret.Labels[ControlPlaneRoleLabel] == "true"
		go p.install(ctx, client.ObjectKeyFromObject(e.secret), a, server)
	}
	return nil
}

// install runs the install instruction of plan a.Plan on a.Node: the RKE2 installer
// image at the declared version, run.sh (fact 58). rancher/system-agent-installer-rke2
// package/run.sh (2c401a9) installs the binaries, writes RESTART_STAMP, reloads systemd
// and then: with INSTALL_RKE2_SKIP_ENABLE=true it exits (no enable, no restart: the new
// binaries sit on disk, to be started at the next restart of rke2, e.g. the reboot);
// otherwise it enables rke2-server/agent and restarts it when the restart stamp changed
// (every plan change here, fact 58). The restart brings the node NotReady for
// RestartDuration and back at the declared version, whatever it ran before (fact 62b: a
// downgrade of a node upgraded behind Rancher's back).
func (p *RancherPlanner) install(ctx context.Context, key client.ObjectKey, a PlanApply, server bool) {
	defer func() {
		p.mu.Lock()
		delete(p.applying, a.Node)
		p.mu.Unlock()
		p.loop.wake()
	}()
	a.Start = time.Now()
	if !sleepCtx(ctx, orDefault(p.InstallDuration, 20*time.Millisecond)) {
		return
	}
	p.mu.Lock()
	message, fail := p.fails[a.Node]
	p.mu.Unlock()
	a.Guarded = p.Guarded != nil && p.Guarded(a.Node)
	if fail {
		a.Failed, a.Message, a.End = true, message, time.Now()
		p.recordApply(a)
		p.mu.Lock()
		if p.retryAt == nil {
			p.retryAt = map[string]time.Time{}
		}
		p.retryAt[a.Node] = time.Now().Add(orDefault(p.RetryDelay, 300*time.Millisecond))
		p.mu.Unlock()
		_ = p.mutateSecret(ctx, key, func(s *corev1.Secret) {
			n, _ := strconv.Atoi(string(s.Data[FailureCountKey]))
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			s.Data[FailureCountKey] = []byte(strconv.Itoa(n + 1))
		})
		return
	}
	if a.Guarded {
		// run.sh installed the binaries and wrote the restart stamp, then exited on
		// INSTALL_RKE2_SKIP_ENABLE=true: the new RKE2 starts at the next reboot or
		// restart of the service (Kubelet.InstallRKE2), and the agent counts the plan
		// as applied.
		p.Kubelet.InstallRKE2(a.Node, a.To)
	} else {
		a.Restarted = true
		p.mu.Lock()
		p.restarting++
		p.maxRestart = max(p.maxRestart, p.restarting)
		p.mu.Unlock()
		err := p.Kubelet.SetReady(ctx, a.Node, false, "RKE2Restarting")
		if err == nil && sleepCtx(ctx, orDefault(p.RestartDuration, 150*time.Millisecond)) {
			err = p.Kubelet.SetVersion(ctx, a.Node, a.To, "")
			if err == nil && server && p.Multus != nil {
				err = p.Multus.RKE2Restarted(ctx, a.Node, a.To)
			}
			err = errors.Join(err, p.Kubelet.SetReady(ctx, a.Node, true, "KubeletReady"))
		}
		p.mu.Lock()
		p.restarting--
		p.mu.Unlock()
		if err != nil || ctx.Err() != nil {
			return
		}
	}
	a.End = time.Now()
	p.recordApply(a)
	p.mu.Lock()
	delete(p.retryAt, a.Node)
	if p.appliedBy == nil {
		p.appliedBy = map[string]string{}
	}
	p.appliedBy[a.Node] = a.Plan
	p.mu.Unlock()
	_ = p.mutateSecret(ctx, key, func(s *corev1.Secret) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[AppliedPlanAnnotation] = a.Plan
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[AppliedPlanDataKey] = PlanData(a.To, a.Plan)
		delete(s.Data, FailureCountKey)
	})
}

func (p *RancherPlanner) recordApply(a PlanApply) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applies = append(p.applies, a)
}

func (p *RancherPlanner) mutateSecret(ctx context.Context, key client.ObjectKey, mutate func(*corev1.Secret)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Secret{}
		if err := p.Client.Get(ctx, key, cur); err != nil {
			return err
		}
		mutate(cur)
		return p.Client.Update(ctx, cur)
	})
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// writeStatus writes what Rancher shows on fleet-local/local. The provisioning Cluster's
// Updated condition is the RKEControlPlane's Ready, which the planner controller sets
// Unknown, reason Waiting, with the planner's message while a tier waits, and True when
// Process ends without error (rancher@v2.14.4 pkg/controllers/capr/planner/controller.go;
// pkg/controllers/provisioningv2/provisioningcluster/controller.go reconcileCondition
// Updated). Its Ready condition comes from the management cluster while the control
// plane is Stable (same function), and status.ready is never set back to false
// (pkg/controllers/provisioningv2/cluster/controller.go: "Never set ready back to
// false"); observedGeneration follows the generation. So a cluster waiting for its
// kubelets is ready at its generation with Ready True and only Updated says it is not
// settled: the simulator keeps Ready as it is.
func (p *RancherPlanner) writeStatus(ctx context.Context, waiting string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := &provisioningv1.Cluster{}
		if err := p.Client.Get(ctx, localClusterKey, cl); err != nil {
			return client.IgnoreNotFound(err)
		}
		updated := genericcondition.GenericCondition{Type: "Updated", Status: corev1.ConditionTrue}
		if waiting != "" {
			updated.Status, updated.Reason, updated.Message = corev1.ConditionUnknown, "Waiting", waiting
		}
		before := cl.Status.DeepCopy()
		cl.Status.ObservedGeneration = cl.Generation
		cl.Status.Ready = true
		cl.Status.ClusterName = rancher.LocalCluster
		now := time.Now().UTC().Format(time.RFC3339)
		setGenericCondition(&cl.Status.Conditions, genericcondition.GenericCondition{Type: "Provisioned", Status: corev1.ConditionTrue}, now)
		setGenericCondition(&cl.Status.Conditions, updated, now)
		if condition(cl.Status.Conditions, "Ready") == nil {
			setGenericCondition(&cl.Status.Conditions, genericcondition.GenericCondition{Type: "Ready", Status: corev1.ConditionTrue}, now)
		}
		if sameStatus(before, &cl.Status) {
			return nil
		}
		return p.Client.Status().Update(ctx, cl)
	})
}

func condition(conds []genericcondition.GenericCondition, t string) *genericcondition.GenericCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// setGenericCondition sets c by type, keeping the times when nothing else changed.
func setGenericCondition(conds *[]genericcondition.GenericCondition, c genericcondition.GenericCondition, now string) {
	if cur := condition(*conds, c.Type); cur != nil {
		if cur.Status == c.Status && cur.Reason == c.Reason && cur.Message == c.Message {
			return
		}
		c.LastUpdateTime = now
		c.LastTransitionTime = cur.LastTransitionTime
		if cur.Status != c.Status {
			c.LastTransitionTime = now
		}
		*cur = c
		return
	}
	c.LastUpdateTime, c.LastTransitionTime = now, now
	*conds = append(*conds, c)
}

func sameStatus(a, b *provisioningv1.ClusterStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
