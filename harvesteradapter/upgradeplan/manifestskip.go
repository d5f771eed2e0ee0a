package upgradeplan

import (
	"context"
	"fmt"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// labelSUCPlan is the label SUC puts on each Job of a Plan: the Plan's name
// (shared/facts/suc.md, fact 25).
const labelSUCPlan = "upgrade.cattle.io/plan"

// The names of the plan's two skip-manifests Plans on the workload cluster.
func skipPlanName(plan *PlanRun) string { return ObjectName(string(suc.PlanManifestSkip), plan.Plan) }
func unskipPlanName(plan *PlanRun) string {
	return ObjectName(string(suc.PlanManifestUnskip), plan.Plan)
}

// skipMultusManifest places rke2-multus.yaml.skip on every node of a multi-node cluster
// once the cluster upgrade Job has succeeded and before the node phase, and waits until
// every node has it, as Harvester's controller does with its
// <upgrade>-skip-manifests-apply Plan (harvester-release-steps.md fact 34; Harvester
// v1.8.2 upgrade_controller.go ensureSkipManifestPlanCompleted): each node's RKE2 restart
// at the release then does not re-deploy the multus chart, whose failed helm-install can
// delete the NAD CRD and every VM network (fact 9); the chart is upgraded once, when the
// file comes off at the plan's end (unskipMultusManifest). The node program's
// rke2-manifest-skip does nothing on a node that is not an RKE2 server. The Plan stays
// until the plan's cleanup, so that SUC does not run it again. Nothing on a single-node
// cluster, as Harvester (its single-node branch has no skip). It says what it did, for
// the phase's message.
func (r *PlanReconciler) skipMultusManifest(ctx context.Context, pr *PlanRun) (bool, string, error) {
	if pr.Plan.Status.SingleNode {
		return true, "", nil
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return false, "", err
	}
	want := suc.ManifestSkipPlan(pr.Config, skipPlanName(pr), pr.repo, false, int64(len(nodes)))
	want.Labels[LabelUpgradePlan] = pr.Plan.Name
	want.Spec.NodeSelector = planNodes(pr.Plan)
	done, message, _, err := applyClusterPlan(ctx, pr, want, nodes)
	if err != nil || !done {
		return false, "placing rke2-multus.yaml.skip on the RKE2 servers before the nodes restart RKE2 (fact 34): " + message, err
	}
	return true, "; rke2-multus.yaml.skip placed for the node phase (fact 34)", nil
}

// unskipMultusManifest removes rke2-multus.yaml.skip from every node where the plan's
// skip Plan was created (skipMultusManifest), as Harvester's
// <upgrade>-skip-manifests-remove does at the end of an upgrade, whether it succeeded,
// failed or was deleted (fact 34): the skip Plan is deleted first, so that SUC starts no
// Job of it after the removal, then the removal Plan runs on every node of the plan. It
// returns the removal Plan's name while it has not completed on every node (with what it
// waits for), so that the plan's cleanup keeps it; "" once it has, or when there was no
// skip to remove. On the next end after that, neither Plan is there: nothing to do.
func unskipMultusManifest(ctx context.Context, pr *PlanRun) (string, string, error) {
	ns := pr.Config.Spec.SystemUpgradeController.Namespace
	skip := &sucv1.Plan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: skipPlanName(pr)}}
	skipped, err := planExists(ctx, pr.Workload, skip)
	if err != nil {
		return "", "", err
	}
	unskip := unskipPlanName(pr)
	removing, err := planExists(ctx, pr.Workload, &sucv1.Plan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: unskip}})
	if err != nil || (!skipped && !removing) {
		return "", "", err
	}
	if skipped {
		if err := pr.Workload.Delete(ctx, skip, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return "", "", fmt.Errorf("delete the SUC Plan %s/%s placing rke2-multus.yaml.skip: %w", ns, skip.Name, err)
		}
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return "", "", err
	}
	want := suc.ManifestSkipPlan(pr.Config, unskip, pr.repo, true, int64(len(nodes)))
	want.Labels[LabelUpgradePlan] = pr.Plan.Name
	want.Spec.NodeSelector = planNodes(pr.Plan)
	done, message, _, err := applyClusterPlan(ctx, pr, want, nodes)
	if err != nil {
		return unskip, "", fmt.Errorf("removing rke2-multus.yaml.skip from the nodes (fact 34): %w; until it is gone, RKE2 on those nodes does not apply rke2-multus.yaml: see the Job's log, or remove /var/lib/rancher/rke2/server/manifests/rke2-multus.yaml.skip on the node", err)
	}
	if !done {
		return unskip, "removing rke2-multus.yaml.skip from the nodes, so that RKE2 upgrades the multus chart once (fact 34): " + message, nil
	}
	return "", "", nil
}

// planExists tells whether a SUC Plan exists; no Plan kind served (SUC not installed)
// is none.
func planExists(ctx context.Context, c client.Client, p *sucv1.Plan) (bool, error) {
	err := c.Get(ctx, client.ObjectKeyFromObject(p), &sucv1.Plan{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return false, nil
	default:
		return false, fmt.Errorf("get the SUC Plan %s/%s: %w", p.Namespace, p.Name, err)
	}
}
