package upgradeplan

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
)

// DeschedulerAddon is Harvester's descheduler add-on (harvester/harvester
// pkg/util/constants.go DeschedulerName, in kube-system; PR #9702).
var DeschedulerAddon = client.ObjectKey{Namespace: "kube-system", Name: "descheduler"}

// disableDescheduler turns Harvester's descheduler add-on off for the node phase of a
// multi-node cluster, as Harvester's upgrade controller does since v1.7.0 right before its
// node phase (harvester-release-steps.md fact 36; ctl/upgrade_controller.go@v1.8.2
// addUpgradeLabelToDeschedulerAddons and addon_controller.go, which set spec.enabled
// false): the descheduler's evictions of VM pods are live migrations, and they would run
// beside our evacuations and drains, outside the budget, possibly onto the next node to
// go. Where it was enabled, the value is recorded in the cluster upgrade's progress
// ConfigMap first (clusterupgrade.Record), and clusterupgrade.Restore turns it on again on
// every end of the plan, as Harvester's cleanup does (fact 37, reenableAddons). Harvester's
// own upgrade label is not set: no Harvester Upgrade exists for it to name. Nothing on a
// single node, where the add-on has nowhere to move anything, or on a cluster without it.
func disableDescheduler(ctx context.Context, pr *PlanRun) (string, error) {
	if pr.Plan.Status.SingleNode {
		return "", nil
	}
	addon := &harvesterapi.Addon{}
	if err := pr.Workload.Get(ctx, DeschedulerAddon, addon); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return "", nil
		}
		return "", fmt.Errorf("read Harvester's add-on %s: %w", DeschedulerAddon, err)
	}
	if !addon.Spec.Enabled {
		return "", nil
	}
	progress := clusterupgrade.ProgressKey(repository.Namespace, pr.Plan.Name)
	if err := clusterupgrade.Record(ctx, pr.Workload, progress, DeschedulerAddon, clusterupgrade.FieldAddonEnabled, json.RawMessage("true")); err != nil {
		return "", err
	}
	patched := addon.DeepCopy()
	patched.Spec.Enabled = false
	if err := pr.Workload.Patch(ctx, patched, client.MergeFrom(addon)); err != nil {
		return "", fmt.Errorf("turn Harvester's add-on %s off for the nodes: %w", DeschedulerAddon, err)
	}
	return fmt.Sprintf("; Harvester's descheduler add-on %s turned off for the nodes", DeschedulerAddon), nil
}
