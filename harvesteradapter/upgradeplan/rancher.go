package upgradeplan

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// rollThroughRancher hands the Kubernetes upgrade of the nodes to their owner when
// Rancher provisions RKE2 on them (fleet-local/local with an rkeConfig and the nodes'
// machine-plan Secrets, harvester-release-steps.md facts 58-61), as Harvester's
// controller does when its node phase starts (node sheet fact 11.4; upgrade-toolkit's
// node phase, fact 76): the release's RKE2 is declared as spec.kubernetesVersion, and the
// upgrade strategy gets our pre- and post-drain hooks (rancher.Strategy), so that Rancher
// takes one node after the other and waits at each node's pre-drain request until its
// NodeUpdate has made it safe and answers. The strategy it had is recorded first in the
// progress ConfigMap and given back when the plan ends (clusterupgrade.Restore); the
// version stays the release's then, as Harvester's cleanup leaves it (fact 59). Rancher's
// planner is paused before the version is declared (rancher.PausePlanner), and from then
// on steerRancher lets it go only for the node a running NodeUpdate waits for; the
// concurrency is 1, as Harvester's (upgrade_controller.go@v1.8.2), whatever the tasks'
// maxUnavailable: Rancher never has two nodes cordoned at once. Harvester also raises
// provisionGeneration (fact 11.4): not done, the version change alone changes every
// node's plan (fact 58). It says what it did, for the phase's message; nothing when
// Rancher provisions no node of the cluster.
func (r *PlanReconciler) rollThroughRancher(ctx context.Context, pr *PlanRun, nodes []clusterNode) (string, error) {
	release := pr.Plan.Status.ReleaseMetadata
	if release == nil {
		return "", nil
	}
	cl, err := rancher.ProvisioningCluster(ctx, pr.Workload)
	if err != nil || cl == nil {
		return "", err
	}
	provisioned := asNodes(nodes)
	if any, err := rancher.AnyProvisioned(ctx, pr.Workload, provisioned); err != nil || !any {
		return "", err // Rancher provisions none of these nodes: SUC upgrades RKE2
	}
	want := rancher.Strategy(1)
	if cl.Spec.KubernetesVersion == release.Kubernetes && rancher.HasOurHooks(cl) &&
		cl.Spec.RKEConfig.UpgradeStrategy.WorkerConcurrency == want["workerConcurrency"] {
		turns, err := markTurns(ctx, pr.Workload, provisioned)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("; Rancher rolls RKE2 %s (fleet-local/local), each node behind our drain hooks%s", release.Kubernetes, turns), nil
	}
	if held, err := pauseLonghornLiveUpgrade(ctx, pr); err != nil || held != "" {
		return held, err
	}
	before, err := rancher.ReadStrategy(ctx, pr.Workload)
	if err != nil {
		return "", err
	}
	progress := clusterupgrade.ProgressKey(repository.Namespace, pr.Plan.Name)
	if err := clusterupgrade.Record(ctx, pr.Workload, progress, rancher.LocalClusterKey, rancher.FieldUpgradeStrategy, before); err != nil {
		return "", err
	}
	raw, err := json.Marshal(want)
	if err != nil {
		return "", err
	}
	if _, err := rancher.PausePlanner(ctx, pr.Workload, pr.Plan.Name); err != nil {
		return "", err
	}
	if err := rancher.SetRoll(ctx, pr.Workload, release.Kubernetes, raw); err != nil {
		return "", err
	}
	if _, err := markTurns(ctx, pr.Workload, provisioned); err != nil {
		return "", err
	}
	r.event(pr.Plan, corev1.EventTypeNormal, "RKE2ThroughRancher", "DeclareKubernetesVersion",
		"declared RKE2 %s on provisioning Cluster %s with our drain hooks (concurrency 1); Rancher restarts each node's RKE2 once its NodeUpdate answers",
		release.Kubernetes, rancher.LocalClusterKey)
	return fmt.Sprintf("; RKE2 %s declared on fleet-local/local, Rancher rolls it behind our drain hooks", release.Kubernetes), nil
}

// markTurns sets UpgradeTurnAnnotation on the nodes Rancher rolls now (it cordoned them
// and waits at their drain hooks: rancher.Waiting) and removes it from the others, so
// that selection picks the node Rancher waits for rather than holding it as cordoned by
// someone else. It says which nodes Rancher waits for.
func markTurns(ctx context.Context, c client.Client, nodes []corev1.Node) (string, error) {
	waiting, err := rancher.Waiting(ctx, c, nodes)
	if err != nil {
		return "", err
	}
	for i := range nodes {
		want := ""
		if slices.Contains(waiting, nodes[i].Name) {
			want = turnOwner
		}
		if err := setTurn(ctx, c, &nodes[i], want); err != nil {
			return "", err
		}
	}
	if len(waiting) == 0 {
		return "", nil
	}
	return fmt.Sprintf("; Rancher waits at the drain hooks of node(s) %s", strings.Join(waiting, ", ")), nil
}

// turnOwner is UpgradeTurnAnnotation's value for Rancher's provisioning.
const turnOwner = "rancher-provisioning"

// setTurn sets (want non-empty) or removes UpgradeTurnAnnotation on a node.
func setTurn(ctx context.Context, c client.Client, node *corev1.Node, want string) error {
	if node.Annotations[inplacev1.UpgradeTurnAnnotation] == want {
		return nil
	}
	var value any
	if want != "" {
		value = want
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{inplacev1.UpgradeTurnAnnotation: value}}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark node %s's turn (%s=%q): %w", node.Name, inplacev1.UpgradeTurnAnnotation, want, err)
	}
	return nil
}

// clearTurns removes UpgradeTurnAnnotation from every node of the plan's cluster, at the
// plan's end.
func clearTurns(ctx context.Context, pr *PlanRun) error {
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := setTurn(ctx, pr.Workload, n.node, ""); err != nil {
			return err
		}
	}
	return nil
}

func asNodes(nodes []clusterNode) []corev1.Node {
	out := make([]corev1.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, *n.node)
	}
	return out
}

// guardRestarts places the restart guard on every node before the cluster upgrade
// upgrades Rancher, where Rancher provisions the nodes' RKE2, as Harvester's
// skip_restart_rancher_system_agent does (harvester-release-steps.md fact 12; PR #4149):
// a Rancher upgrade re-renders every machine plan (fact 58), and rancher-system-agent
// would then restart RKE2 on every node, one after the other without a drain, outside
// any budget, taking etcd members and Longhorn replicas down. The guard (a runtime
// drop-in giving the agent INSTALL_RKE2_SKIP_ENABLE=true, the node program's
// rke2-restart-guard) lets the agent install the plan without a restart. A SUC Plan of
// the plan's own runs it on every node, ten at a time, and the cluster upgrade waits
// until every node has it. Each node's RemoveRestartGuard step takes it off before its
// pre-drain hook is answered (fact 44); a reboot takes it off too (it is under /run).
// The Plan stays until the plan's cleanup, so that SUC does not run it again. Nothing
// where Rancher provisions no node of the cluster.
func (r *PlanReconciler) guardRestarts(ctx context.Context, pr *PlanRun) (bool, string, error) {
	cl, err := rancher.ProvisioningCluster(ctx, pr.Workload)
	if err != nil || cl == nil {
		return true, "", err
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return false, "", err
	}
	if any, err := rancher.AnyProvisioned(ctx, pr.Workload, asNodes(nodes)); err != nil || !any {
		return err == nil, "", err
	}
	want := suc.RestartGuardPlan(pr.Config, ObjectName("restart-guard", pr.Plan), pr.repo)
	want.Labels[LabelUpgradePlan] = pr.Plan.Name
	want.Spec.NodeSelector = planNodes(pr.Plan)
	done, message, _, err := applyClusterPlan(ctx, pr, want, nodes)
	if err != nil || !done {
		return false, "placing the restart guard before Rancher is upgraded (fact 12): " + message, err
	}
	return true, message, nil
}

// pauseLonghornLiveUpgrade, where Longhorn serves its live upgrade of v2 instance
// managers, pauses it for the plan (its UID among the pausers, as each NodeUpdate
// pauses it for its node: longhorn.PauseV2AutomaticUpgrade) and says, while an upgrade
// of Longhorn's still runs, that the hand-over to Rancher waits: Rancher cordons each
// node it takes before any step of ours runs there (fact 60, machinedrain), and a cordon
// acts on Longhorn while it relocates engines (longhorn-v2-live-upgrade.md fact 37). The
// pause is given back when the plan ends (removeClusterObjects).
func pauseLonghornLiveUpgrade(ctx context.Context, pr *PlanRun) (string, error) {
	served, err := longhorn.LiveUpgradeServed(pr.Workload)
	if err != nil || !served {
		return "", err
	}
	if _, _, err := longhorn.PauseV2AutomaticUpgrade(ctx, pr.Workload, pr.Plan.UID); err != nil {
		return "", err
	}
	live, err := longhorn.ReadLiveUpgrade(ctx, pr.Workload)
	if err != nil {
		return "", err
	}
	if len(live.Running) > 0 {
		return fmt.Sprintf("; Longhorn's live upgrade is paused for the nodes and Rancher gets RKE2 once it is idle (it runs: %s)", strings.Join(live.Running, ", ")), nil
	}
	return "", nil
}
