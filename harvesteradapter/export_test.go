package harvesteradapter

import (
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
)

// PlanName is planName for the package's external tests; kind is preload, rke2 or os.
func PlanName(kind string, nu *inplacev1.NodeUpdate) string {
	return suc.PlanName(suc.PlanKind(kind), nu)
}

// PlanForNode is planForNode for the package's external tests, with cfg's images
// resolved by u as they are when a node starts.
func PlanForNode(u *Updater, cfg *harvesterv1.HarvesterUpgrader, nu *inplacev1.NodeUpdate, kind, repositoryURL string) *sucv1.Plan {
	cfg = cfg.DeepCopy()
	if err := u.configs().ResolveImages(cfg); err != nil {
		panic(err)
	}
	return suc.NodePlan(cfg, nu, suc.PlanKind(kind), repositoryURL)
}

// ClusterObjectName is clusterObjectName, for specs.
func ClusterObjectName(what string, plan *harvesterv1.UpgradePlan) string {
	return upgradeplan.ObjectName(what, plan)
}

// NewReadOnce is newReadOnce, for specs.
func NewReadOnce(c client.Client) client.Client { return newReadOnce(c) }
