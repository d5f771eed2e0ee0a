package suc

import (
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// The label values of LabelPlanKind of the two ManifestSkipPlans: PlanManifestSkip
// places rke2-multus.yaml.skip on the nodes it selects, PlanManifestUnskip removes it
// (shared/facts/harvester-release-steps.md fact 34: Harvester's
// <upgrade>-skip-manifests-apply and -remove).
const (
	PlanManifestSkip   PlanKind = "manifest-skip"
	PlanManifestUnskip PlanKind = "manifest-unskip"
)

// manifestSkipTimeout bounds one node's Job of a ManifestSkipPlan: a fixed 10 minutes,
// SUC's code default (shared/facts/suc.md, facts 4 and 36) said in the Plan, as the
// restart guard's (restartGuardTimeout). The work is one small file; none of the
// HarvesterUpgrader's timeouts is about it.
const manifestSkipTimeout = 10 * time.Minute

// ManifestSkipPlan is the SUC Plan of Harvester's skip-manifests Plans
// (shared/facts/harvester-release-steps.md fact 34; Harvester v1.8.2
// pkg/controller/master/upgrade/common.go prepareSkipManifestPlan), named name: each node
// it selects runs the node program's rke2-manifest-skip, which touches
// /var/lib/rancher/rke2/server/manifests/rke2-multus.yaml.skip, or with remove deletes
// it; on a node without that directory (an agent) it does nothing. With the file in place
// RKE2 restarting at the release during the node phase does not re-deploy the multus
// chart on every node (fact 9's window for the NAD CRD); removed at the end, the chart is
// upgraded once.
//
// concurrency is how many nodes run it at once: the caller passes the node count, as
// Harvester does (len(upgrade.Status.NodeStatuses)): writing a file disturbs nothing on
// the node, and the node phase waits for every node. The caller sets the NodeSelector
// and adds its own labels; the Plan has no NodeSelector, which selects no node (SUC
// reads a nil selector as nothing). Every taint tolerated, root (the file is the host's,
// owned by root), the version the release, written for SUC as NodePlan is (no volume, a
// tagged image, a deadline, no cordon or drain).
func ManifestSkipPlan(cfg *harvesterv1.HarvesterUpgrader, name, repositoryURL string, remove bool, concurrency int64) *sucv1.Plan {
	spec := cfg.Spec
	release := spec.Release.Version
	kind, args := PlanManifestSkip, []string{"rke2-manifest-skip"}
	if remove {
		kind, args = PlanManifestUnskip, []string{"rke2-manifest-skip", "--remove"}
	}
	return &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: spec.SystemUpgradeController.Namespace,
			Labels:    map[string]string{LabelPlanKind: string(kind)},
		},
		Spec: sucv1.PlanSpec{
			Concurrency:           max(concurrency, 1),
			Version:               release,
			ServiceAccountName:    spec.SystemUpgradeController.ServiceAccountName,
			JobActiveDeadlineSecs: ptr.To(DeadlineSeconds(manifestSkipTimeout)),
			// As NodePlan: Harvester nodes carry control plane and etcd taints.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Upgrade:     NodeProgram(spec.Images.Node, args, repositoryURL, release, HostRootUser()),
		},
	}
}
