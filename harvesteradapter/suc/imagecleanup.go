package suc

import (
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// planImageCleanup removes, on every node, the images of the previous release that the
// new one no longer lists, once all nodes run the new release.
const PlanImageCleanup PlanKind = "image-cleanup"

// imageCleanupTimeout bounds one node's image cleanup: a few hundred `crictl rmi`, each
// quick. It is the Job's activeDeadlineSeconds.
const imageCleanupTimeout = 30 * time.Minute

// imageCleanupPlan is the SUC Plan of upgrade-toolkit's image cleanup (shared/facts/
// harvester-node-upgrade.md, fact 55), named name: every node (any node with a hostname,
// that is every node) runs the node program's remove-images, which removes with the
// host's crictl the images of previous that the repository's release no longer lists,
// one node at a time as the toolkit does, so that the nodes' registries are never all
// busy at once. Privileged and root: crictl talks to containerd's socket on the host. The
// Plan's version is the release, so that SUC runs it once per node and release; it is
// written for SUC as planForNode is (no volume, a tagged image, a deadline, no cordon
// or drain: removing unused images does not disturb the node's workloads).
func ImageCleanupPlan(cfg *harvesterv1.HarvesterUpgrader, name, repositoryURL, previous string) *sucv1.Plan {
	spec := cfg.Spec
	release := spec.Release.Version
	return &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: spec.SystemUpgradeController.Namespace,
			Labels:    map[string]string{LabelPlanKind: string(PlanImageCleanup)},
		},
		Spec: sucv1.PlanSpec{
			Concurrency:           1,
			Version:               release,
			ServiceAccountName:    spec.SystemUpgradeController.ServiceAccountName,
			JobActiveDeadlineSecs: ptr.To(DeadlineSeconds(imageCleanupTimeout)),
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpExists,
			}}},
			// As planForNode: Harvester nodes carry control plane and etcd taints.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Upgrade: NodeProgram(spec.Images.Node, []string{"remove-images", "--previous-version=" + previous},
				repositoryURL, release, PrivilegedRoot()),
		},
	}
}
