package harvesteradapter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
)

// cordonStep takes the node out of scheduling, once, before its virtual machines are
// evacuated and it is drained.
var cordonStep = step{
	name: StepCordon,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.Drain, harvesterv1.DefaultDrainTimeout)
	},
	skip: func(_ *Updater, _ context.Context, r *nodeRun) (string, error) {
		if singleNode(r) {
			return singleNodeSkip, nil
		}
		return "", nil
	},
	run: (*Updater).runCordon,
}

// runCordon cordons the node itself and records that the cordon is its own (cordon.go).
// The Plans neither cordon nor drain, so SUC never uncordons the node between them
// (shared/facts/suc.md, fact 46): the node stays cordoned until Finish. A node cordoned
// by someone else, or in Harvester maintenance mode, is held: the operator is doing
// something with it (the same rule as the NodeSchedulable preflight check, which keeps
// such a node from being picked).
//
// Before the node is touched it is judged again, as it was when it was picked, possibly
// long before (a NodeUpdate waits for its cluster's UpgradePlan to finish the cluster
// step, which upgrades Longhorn): no other upgrader runs on the cluster
// (noOtherUpgrade), the control plane keeps its quorum and no kubelet would be newer
// than an API server (quorumAndSkew), Longhorn's own roll has settled (longhornRolled),
// and its storage lets it go (storageSettled). The time of this judgement is the
// NodeUpdate's status.lastCheckTime. Once the node is cordoned as ours (a run that
// resumes), it was judged already.
func (u *Updater) runCordon(ctx context.Context, r *nodeRun) (bool, string, error) {
	if !u.cordonedAsOurs(ctx, r) {
		r.nu.Status.LastCheckTime = ptr.To(metav1.NewTime(time.Now()))
		nodes, err := u.planNodes(ctx, r)
		if err != nil {
			return false, "", err
		}
		for _, fresh := range []func(context.Context, *nodeRun, []corev1.Node) (string, error){u.noOtherUpgrade, u.quorumAndSkew, u.longhornRolled, u.storageSettled} {
			if held, err := fresh(ctx, r, nodes); err != nil || held != "" {
				return false, held, err
			}
		}
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	if held, err := u.admit(ctx, r, node, "be cordoned"); err != nil || held != "" {
		return false, held, err
	}
	held, err := u.cordonAsOurs(ctx, r)
	if err != nil || held != "" {
		return false, held, err
	}
	return true, fmt.Sprintf("node %s is cordoned", r.nu.Spec.NodeName), nil
}

// admit asks the Cluster's disruption ledger, read from the API server, whether the
// node may take its next disruptive step, and writes its claim down when it may
// (disruption.Admit): every NodeUpdate of the Cluster past its first disruption counts,
// whatever a cache says, and two NodeUpdates asking at once cannot both pass where the
// budget has room for one.
func (u *Updater) admit(ctx context.Context, r *nodeRun, node *corev1.Node, step string) (string, error) {
	live := u.APIReader
	if live == nil {
		live = u.Client
	}
	ledger := disruption.Ledger{Live: live, Client: u.Client}
	return ledger.Admit(ctx, r.nu, controlPlaneNode(node), step)
}

// freshBudget is the budget asked again before a disruptive step after the cordon (RKE2's
// restart, the reboot the OS upgrade arms): the ledger (admit), and for a control plane
// node the quorum on the nodes as they are now. "" when the node may go on.
func (u *Updater) freshBudget(ctx context.Context, r *nodeRun, node *corev1.Node, step string) (string, error) {
	if singleNode(r) {
		return "", nil // nothing else to keep up: the single node's steps run as they come
	}
	if held, err := u.admit(ctx, r, node, step); err != nil || held != "" {
		return held, err
	}
	if !controlPlaneNode(node) {
		return "", nil
	}
	nodes, err := u.planNodes(ctx, r)
	if err != nil {
		return "", err
	}
	var down []string
	for i := range nodes {
		n := &nodes[i]
		if n.Name != node.Name && controlPlaneNode(n) && nodeDown(n) {
			down = append(down, n.Name)
		}
	}
	if len(down) == 0 {
		return "", nil
	}
	slices.Sort(down)
	return fmt.Sprintf("holding control plane node %s before it is allowed to %s: control plane node(s) %s are down (not Ready or cordoned) now; one control plane node at a time keeps etcd's and the API server's quorum",
		node.Name, step, strings.Join(down, ", ")), nil
}

// disruptivePlanStep names what a node's Plan of a kind does to the node when it is
// disruptive (RKE2 restarts, the OS upgrade arms a reboot), "" when it is not.
func disruptivePlanStep(r *nodeRun, kind suc.PlanKind) string {
	switch kind {
	case suc.PlanKubernetes, suc.PlanRKE2Restart:
		return "restart RKE2"
	case suc.PlanOS:
		if releases.UpgradesOS(r.cfg) {
			return "reboot"
		}
	}
	return ""
}

// planNodes lists the cluster's nodes, as its UpgradePlan covers them (spec.nodeSelector).
func (u *Updater) planNodes(ctx context.Context, r *nodeRun) ([]corev1.Node, error) {
	var opts []client.ListOption
	if r.plan != nil && r.plan.Spec.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(r.plan.Spec.NodeSelector)
		if err != nil {
			return nil, fmt.Errorf("the UpgradePlan's spec.nodeSelector: %w", err)
		}
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	nodes := &corev1.NodeList{}
	if err := r.wc.List(ctx, nodes, opts...); err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	return nodes.Items, nil
}

// nodeDown reports whether a node is down now: not Ready, or cordoned.
func nodeDown(n *corev1.Node) bool {
	return n.Spec.Unschedulable || !kube.NodeReady(n)
}

// controlPlaneNode reports whether a node is a member of the control plane (an etcd,
// control-plane or master node, a witness included: it holds an etcd member).
func controlPlaneNode(n *corev1.Node) bool {
	for _, role := range []string{"control-plane", "master", "etcd"} {
		if n.Labels["node-role.kubernetes.io/"+role] == "true" {
			return true
		}
	}
	return kubevirt.IsWitness(n)
}

// quorumAndSkew says why the node may not be touched as far as the control plane goes,
// "" when it may: the two rules the UpgradeTask judged when the node was picked
// (ControlPlaneQuorum and VersionSkew, docs/upgradetask.md), judged again now on the
// live nodes. A control plane node waits while another control plane node is down (one
// at a time keeps etcd's and the API server's quorum: two of three etcd members down
// lose it); any other node waits while a control plane node's kubelet is older than the
// target (its API server would be older than this node's new kubelet, which Kubernetes'
// version skew policy does not support).
func (u *Updater) quorumAndSkew(_ context.Context, r *nodeRun, nodes []corev1.Node) (string, error) {
	self := r.nu.Spec.NodeName
	var own *corev1.Node
	for i := range nodes {
		if nodes[i].Name == self {
			own = &nodes[i]
		}
	}
	if own == nil {
		return "", nil // a node the plan does not cover: the generic checks judged it
	}
	var down, behind []string
	for i := range nodes {
		n := &nodes[i]
		if n.Name == self || !controlPlaneNode(n) {
			continue
		}
		if nodeDown(n) {
			down = append(down, n.Name)
		}
		v := n.Status.NodeInfo.KubeletVersion
		if order, err := kubeversion.CompareStrings(v, r.nu.Spec.Version); err == nil && order < 0 {
			behind = append(behind, fmt.Sprintf("%s (%s)", n.Name, v))
		}
	}
	ownIsControlPlane := controlPlaneNode(own)
	switch {
	case ownIsControlPlane && len(down) > 0:
		return fmt.Sprintf("holding control plane node %s before it is cordoned: control plane node(s) %s are down (not Ready or cordoned) now; one control plane node at a time keeps etcd's and the API server's quorum",
			self, strings.Join(down, ", ")), nil
	case !ownIsControlPlane && len(behind) > 0:
		return fmt.Sprintf("holding node %s before it is cordoned: control plane node(s) %s run a kubelet older than %s; a node is not upgraded past its API server (version skew)",
			self, strings.Join(behind, ", "), r.nu.Spec.Version), nil
	}
	return "", nil
}

// longhornRolled says why the node may not be touched while Longhorn's own upgrade rolls
// (its longhorn-manager DaemonSet, which the harvester chart renders, not yet updated on
// every node), "" when it may or the cluster has no such DaemonSet. The cluster step
// waits for this roll once (harvester-release-steps.md fact 25, wait_longhorn_upgrade);
// a chart deployed again since (Fleet, a user) would roll Longhorn's managers while the
// node's replicas go down.
func (u *Updater) longhornRolled(ctx context.Context, r *nodeRun, _ []corev1.Node) (string, error) {
	ds := &appsv1.DaemonSet{}
	if err := r.wc.Get(ctx, clusterupgrade.LonghornManagerKey, ds); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return "", nil
		}
		return "", fmt.Errorf("read DaemonSet %s: %w", clusterupgrade.LonghornManagerKey, err)
	}
	st := ds.Status
	if st.ObservedGeneration >= ds.Generation && st.UpdatedNumberScheduled >= st.DesiredNumberScheduled {
		return "", nil
	}
	return fmt.Sprintf("holding node %s before it is cordoned: Longhorn's managers are rolling out (DaemonSet %s: generation %d observed %d, %d of %d pods updated); the node waits until they are",
		r.nu.Spec.NodeName, clusterupgrade.LonghornManagerKey, ds.Generation, st.ObservedGeneration, st.UpdatedNumberScheduled, st.DesiredNumberScheduled), nil
}

// cordonedAsOurs reports whether the node carries this NodeUpdate's cordon.
func (u *Updater) cordonedAsOurs(ctx context.Context, r *nodeRun) bool {
	node, err := u.node(ctx, r)
	return err == nil && node.Annotations[AnnotationCordonedBy] == string(r.nu.UID)
}

// noOtherUpgrade says why the node may not be touched while Harvester's own upgrade or
// upgrade-toolkit's runs on the cluster (clusterchecks.OtherUpgrades), "" when none
// does: two upgraders would each take nodes down within their own budget, not within
// one.
func (u *Updater) noOtherUpgrade(ctx context.Context, r *nodeRun, _ []corev1.Node) (string, error) {
	others, err := clusterchecks.OtherUpgrades(ctx, r.wc)
	if err != nil {
		return "", err
	}
	if hold := clusterchecks.OtherUpgradeHold(others); hold != "" {
		return fmt.Sprintf("holding node %s before it is cordoned: %s", r.nu.Spec.NodeName, hold), nil
	}
	return "", nil
}

// freshStorageChecks are the Longhorn preflight checks storageSettled asks again: the
// volumes' health and the replicas left outside the nodes down together. The v2 data
// engine's own holds are the LonghornDataEngine step's.
var freshStorageChecks = []string{longhorn.CheckLonghornVolumesHealthy, longhorn.CheckLonghornV1ReplicaElsewhere, longhorn.CheckLonghornV2ReplicaElsewhere}

// storageSettled says why the node may not be touched yet as far as Longhorn goes, ""
// when it may: Harvester's pre-drain waits, right before it evacuates and drains each
// node, until a full pass over the running engines finds every volume healthy
// (wait_longhorn_engines, harvester-release-steps.md fact 45; the node sheet's fact 36),
// and so does this, with the preflight's own Longhorn checks (longhorn.State.Checks) of
// the volumes' health and of the replicas left outside the nodes that are down together:
// this node and every other node of the cluster (the UpgradePlan's nodes) that is not
// Ready or is cordoned now. Nothing to judge on a cluster without Longhorn.
func (u *Updater) storageSettled(ctx context.Context, r *nodeRun, nodes []corev1.Node) (string, error) {
	served, err := kube.KindServed(r.wc, schema.GroupKind{Group: "longhorn.io", Kind: "Volume"}, "v1beta2")
	if err != nil || !served {
		return "", err
	}
	state, err := longhorn.Read(ctx, r.wc)
	if err != nil {
		return "", err
	}
	var down []string
	for i := range nodes {
		n := &nodes[i]
		if n.Name != r.nu.Spec.NodeName && nodeDown(n) {
			down = append(down, n.Name)
		}
	}
	var held []string
	for _, c := range state.Checks(longhorn.DownSet{Candidate: r.nu.Spec.NodeName, Disrupted: down}, longhorn.LiveUpgrade{}, true) {
		if !c.Passed && slices.Contains(freshStorageChecks, c.Name) {
			held = append(held, fmt.Sprintf("%s: %s", c.Name, c.Message))
		}
	}
	if len(held) == 0 {
		return "", nil
	}
	return fmt.Sprintf("holding node %s before it is cordoned: Longhorn's volumes are judged again right before each node is taken down, as Harvester's pre-drain does (wait_longhorn_engines): %s",
		r.nu.Spec.NodeName, strings.Join(held, "; ")), nil
}
