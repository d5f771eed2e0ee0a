package harvesteradapter

import (
	"context"
	"fmt"
	"slices"
	"strings"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Names of the Harvester updater's own preflight checks besides Longhorn's.
const (
	CheckHarvesterUpgraderFound = "HarvesterUpgraderFound"
	CheckSUCInstalled           = "SystemUpgradeControllerInstalled"
	// CheckRancherTurn, on a node whose RKE2 Rancher provisions: Rancher takes this node
	// now or next (step_rancher.go).
	CheckRancherTurn = "RancherTurn"
)

// Preflight runs the Harvester updater's checks for a node: its configuration exists, SUC
// is installed (its Plan kind served, its service account present), no other upgrader
// runs on the cluster (NoOtherUpgrade), and Longhorn lets
// the node go (see longhornChecks). A check that cannot be evaluated fails with the
// reason, so a node is never started on a guess.
func (u *Updater) Preflight(ctx context.Context, target nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	fail := func(name, format string, args ...any) []nodeupdater.CheckResult {
		return []nodeupdater.CheckResult{{Name: name, Message: fmt.Sprintf(format, args...)}}
	}
	cfg := &harvesterv1.HarvesterUpgrader{}
	if err := u.Client.Get(ctx, client.ObjectKey{Namespace: target.Namespace, Name: target.UpdaterRef.Name}, cfg); err != nil {
		return fail(CheckHarvesterUpgraderFound, "HarvesterUpgrader %s/%s: %v", target.Namespace, target.UpdaterRef.Name, err)
	}
	results := []nodeupdater.CheckResult{{Name: CheckHarvesterUpgraderFound, Passed: true}}

	wc, err := u.workloadClient(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.ClusterName})
	if err != nil {
		return append(results, nodeupdater.CheckResult{Name: CheckSUCInstalled, Message: fmt.Sprintf("cannot reach the workload cluster %s: %v", target.ClusterName, err)})
	}
	results = append(results, sucInstalled(ctx, wc, cfg.Spec.SystemUpgradeController), noOtherUpgrade(ctx, wc))
	if turn, ok := rancherTurn(ctx, wc, target); ok {
		results = append(results, turn)
	}

	served, err := kube.KindServed(wc, schema.GroupKind{Group: "longhorn.io", Kind: "Volume"}, "v1beta2")
	if err != nil {
		return append(results, nodeupdater.CheckResult{Name: longhorn.CheckLonghornVolumesHealthy, Message: err.Error()})
	}
	if !served {
		return results // not a Longhorn cluster: nothing to protect
	}
	state, err := longhorn.Read(ctx, wc)
	if err != nil {
		return append(results, nodeupdater.CheckResult{Name: longhorn.CheckLonghornVolumesHealthy, Message: err.Error()})
	}
	live, err := longhorn.ReadLiveUpgrade(ctx, wc)
	if err != nil {
		return append(results, nodeupdater.CheckResult{Name: longhorn.CheckLonghornLiveUpgradeIdle, Message: err.Error()})
	}
	down := longhorn.DownSet{Candidate: target.NodeName, Disrupted: target.Disrupted, Picked: target.Picked,
		Leaving: nodeLeaving(ctx, wc, target.NodeName, cfg.Spec.Drain)}
	return append(results, state.Checks(down, live, cfg.Spec.LonghornV2Swap == harvesterv1.LonghornV2SwapSkip)...)
}

// noOtherUpgrade is the NoOtherUpgrade check for a node: no node is picked while
// Harvester's own upgrade or upgrade-toolkit's runs on its cluster.
func noOtherUpgrade(ctx context.Context, wc client.Client) nodeupdater.CheckResult {
	r := nodeupdater.CheckResult{Name: clusterchecks.CheckNoOtherUpgrade}
	others, err := clusterchecks.OtherUpgrades(ctx, wc)
	switch {
	case err != nil:
		r.Message = err.Error()
	case len(others) > 0:
		r.Message = clusterchecks.OtherUpgradeHold(others)
	default:
		r.Passed = true
	}
	return r
}

func sucInstalled(ctx context.Context, wc client.Client, suc harvesterv1.SystemUpgradeController) nodeupdater.CheckResult {
	r := nodeupdater.CheckResult{Name: CheckSUCInstalled}
	served, err := kube.KindServed(wc, schema.GroupKind{Group: sucv1.SchemeGroupVersion.Group, Kind: "Plan"}, sucv1.SchemeGroupVersion.Version)
	switch {
	case err != nil:
		r.Message = err.Error()
		return r
	case !served:
		r.Message = "System Upgrade Controller is not installed on the workload cluster (it serves no upgrade.cattle.io Plan); install it first"
		return r
	}
	sa := &corev1.ServiceAccount{}
	if err := wc.Get(ctx, client.ObjectKey{Namespace: suc.Namespace, Name: suc.ServiceAccountName}, sa); err != nil {
		if apierrors.IsNotFound(err) {
			r.Message = fmt.Sprintf("System Upgrade Controller's service account %s/%s does not exist; check systemUpgradeController in the HarvesterUpgrader", suc.Namespace, suc.ServiceAccountName)
		} else {
			r.Message = fmt.Sprintf("read service account %s/%s: %v", suc.Namespace, suc.ServiceAccountName, err)
		}
		return r
	}
	r.Passed = true
	return r
}

// rancherTurn is the RancherTurn check, for a node whose RKE2 Rancher provisions (ok is
// false for any other node). Rancher chooses the order of the nodes (its tiers: the init
// node, the other etcd nodes, control plane, workers, each by machine name;
// harvester-release-steps.md fact 60) and waits at each node's drain hooks; selection
// approves Rancher's choice rather than fight it: the node passes when Rancher waits at
// its drain hooks, or, while Rancher waits for no node, when it is the first Rancher will
// take. A node that runs the target Kubernetes already passes: Rancher has nothing to do
// there. pauseNodes, windows and maxUnavailable still hold whatever Rancher wants.
func rancherTurn(ctx context.Context, wc client.Client, target nodeupdater.PreflightTarget) (nodeupdater.CheckResult, bool) {
	res := nodeupdater.CheckResult{Name: CheckRancherTurn}
	node := &corev1.Node{}
	if err := wc.Get(ctx, client.ObjectKey{Name: target.NodeName}, node); err != nil {
		return res, false // the generic checks report a missing node
	}
	owner, err := rancher.ProvisionedNode(ctx, wc, node)
	if err != nil {
		res.Message = err.Error()
		return res, true
	}
	if owner == nil {
		return res, false
	}
	if rancher.Asked(owner.Secret, rancher.PreDrainRequest) == "" && releases.SameVersion(node.Status.NodeInfo.KubeletVersion, target.Version) {
		res.Passed = true
		return res, true
	}
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes); err != nil {
		res.Message = fmt.Sprintf("list the nodes: %v", err)
		return res, true
	}
	waiting, err := rancher.Waiting(ctx, wc, nodes.Items)
	if err != nil {
		res.Message = err.Error()
		return res, true
	}
	switch {
	case slices.Contains(waiting, target.NodeName):
		res.Passed = true
	case len(waiting) > 0:
		res.Message = fmt.Sprintf("Rancher rolls RKE2 on node(s) %s now and waits at their drain hooks; node %s waits its turn (Rancher chooses the order: etcd, control plane, workers)",
			strings.Join(waiting, ", "), target.NodeName)
	default:
		order, err := rancher.RolloutOrder(ctx, wc, nodes.Items, target.Version)
		switch {
		case err != nil:
			res.Message = err.Error()
		case len(order) > 0 && order[0] == target.NodeName:
			res.Passed = true
		case len(order) > 0:
			res.Message = fmt.Sprintf("Rancher will take node %s first (the init node, then the etcd, control plane and worker nodes, each by machine name); node %s waits its turn",
				order[0], target.NodeName)
		default:
			res.Passed = true
		}
	}
	return res, true
}
