package clusterchecks

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi/toolkit"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
)

// CheckNoOtherUpgrade: neither Harvester's own upgrade (an Upgrade of harvester-system
// in progress) nor upgrade-toolkit's (an UpgradePlan in progress) runs on the cluster.
const CheckNoOtherUpgrade = "NoOtherUpgrade"

// OtherUpgrades names the upgrades of the cluster that another upgrader runs now:
// Harvester's Upgrades in harvester-system whose harvesterhci.io/upgradeState label is
// absent or not final, and upgrade-toolkit's UpgradePlans whose status.currentPhase is
// not final, the same objects and rules by which Harvester itself tells that an upgrade
// is in progress (its node-down controller's isOnUpgrade and, since v1.9,
// isOnUpgradeV2; shared/facts/harvester-release-steps.md fact 38; the Upgrade webhook,
// harvester-node-upgrade.md fact 4a). A kind the cluster does not serve has none.
func OtherUpgrades(ctx context.Context, wc client.Client) ([]string, error) {
	var found []string
	served, err := kube.KindServed(wc, schema.GroupKind{Group: harvesterapi.GroupVersion.Group, Kind: "Upgrade"}, harvesterapi.GroupVersion.Version)
	if err != nil {
		return nil, err
	}
	if served {
		upgrades := &harvesterapi.UpgradeList{}
		if err := wc.List(ctx, upgrades, client.InNamespace(harvesterapi.UpgradeNamespace)); err != nil {
			return nil, fmt.Errorf("list Harvester's Upgrades: %w", err)
		}
		for i := range upgrades.Items {
			u := &upgrades.Items[i]
			if u.InProgress() {
				state := u.Labels[harvesterapi.LabelUpgradeState]
				if state == "" {
					state = "not started"
				}
				found = append(found, fmt.Sprintf("Harvester's Upgrade %s/%s to %s (%s)", u.Namespace, u.Name, u.Spec.Version, state))
			}
		}
	}
	served, err = kube.KindServed(wc, schema.GroupKind{Group: toolkit.GroupVersion.Group, Kind: "UpgradePlan"}, toolkit.GroupVersion.Version)
	if err != nil {
		return nil, err
	}
	if served {
		plans := &toolkit.UpgradePlanList{}
		if err := wc.List(ctx, plans); err != nil {
			return nil, fmt.Errorf("list upgrade-toolkit's UpgradePlans: %w", err)
		}
		for i := range plans.Items {
			p := &plans.Items[i]
			if p.InProgress() {
				phase := p.Status.CurrentPhase
				if phase == "" {
					phase = "not started"
				}
				version := ""
				if p.Spec.Version != nil {
					version = " to " + *p.Spec.Version
				}
				found = append(found, fmt.Sprintf("upgrade-toolkit's UpgradePlan %s%s (%s)", p.Name, version, phase))
			}
		}
	}
	return found, nil
}

// OtherUpgradeHold is the message that holds capi-inplace while others run, "" when
// none does.
func OtherUpgradeHold(others []string) string {
	if len(others) == 0 {
		return ""
	}
	return fmt.Sprintf("another upgrader is upgrading this cluster: %s; capi-inplace waits until it has Succeeded or Failed (one upgrader at a time)", strings.Join(others, ", "))
}
