package harvesteradapter

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// planKind is one of the per-node Plans the adapter creates.
type planKind string

const (
	// planPreload pulls the release's images onto the node from the repository.
	planPreload planKind = "preload"
	// planKubernetes upgrades RKE2 on the node.
	planKubernetes planKind = "rke2"
	// planOS installs the release's operating system and reboots the node.
	planOS planKind = "os"
)

// Labels the adapter puts on what it creates in the workload cluster, so that it finds
// (and cleans up) exactly the objects of one NodeUpdate.
const (
	// LabelNodeUpdate is the UID of the NodeUpdate a Plan belongs to.
	LabelNodeUpdate = "harvester.inplace.cluster.x-k8s.io/node-update"
	// LabelPlanKind is the kind of per-node Plan: preload, rke2 or os.
	LabelPlanKind = "harvester.inplace.cluster.x-k8s.io/plan-kind"
	// AnnotationNode names the node a Plan is for.
	AnnotationNode = "harvester.inplace.cluster.x-k8s.io/node"
)

// upgradeScript is the entry point of the harvester-upgrade image's node phases:
// prepare (preload the release's images), pre-drain (evacuate virtual machines) and
// post-drain (install the operating system and reboot).
const upgradeScript = "upgrade_node.sh"

// planName is the deterministic name of one NodeUpdate's Plan of one kind:
// capi-inplace-<kind>-<node>-<hash>, the hash taken of the node and the NodeUpdate's UID.
// The NodeUpdate is in the name because SUC deletes a running Job when its Plan changes
// (shared/facts/suc.md, facts 43 and 49): with Plans named per node only, a second
// NodeUpdate for the same node, or one recreated under the same name, would rewrite the
// first one's Plan and kill its upgrade half-way. The UID, not the name, so that a
// recreated NodeUpdate never meets the Plans of its predecessor. SUC labels the node
// plan.upgrade.cattle.io/<plan name>, so the name must fit a label key's 63 characters
// (facts 25, 46): a long node name is shortened, and the hash, which covers it whole,
// keeps names apart. The kind comes first; test/scenario reads it from there.
func planName(kind planKind, nu *inplacev1.NodeUpdate) string {
	sum := sha256.Sum256([]byte(nu.Spec.NodeName + "/" + string(nu.UID)))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	base := fmt.Sprintf("capi-inplace-%s-%s", kind, nu.Spec.NodeName)
	if len(base)+len(suffix) > 63 {
		base = strings.TrimRight(base[:63-len(suffix)], "-.")
	}
	return base + suffix
}

// planForNode builds the SUC Plan of one kind for the node of a NodeUpdate. The Plan
// selects that node only (kubernetes.io/hostname), runs on one node at a time, and says
// in its labels which NodeUpdate it belongs to.
func planForNode(cfg *harvesterv1.HarvesterUpgrader, nu *inplacev1.NodeUpdate, kind planKind, repositoryURL string) *sucv1.Plan {
	spec := cfg.Spec
	release := spec.Release.Version
	env := []corev1.EnvVar{
		{Name: "UPGRADE_REPO_URL", Value: repositoryURL},
		{Name: "HARVESTER_UPGRADE_NODE_NAME", Value: nu.Spec.NodeName},
		{Name: "HARVESTER_RELEASE", Value: release},
		{Name: "KUBERNETES_VERSION", Value: nu.Spec.Version},
	}
	plan := &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{
			Name:        planName(kind, nu),
			Namespace:   spec.SystemUpgradeController.Namespace,
			Labels:      map[string]string{LabelNodeUpdate: string(nu.UID), LabelPlanKind: string(kind)},
			Annotations: map[string]string{AnnotationNode: nu.Spec.NodeName},
		},
		Spec: sucv1.PlanSpec{
			Concurrency:        1,
			ServiceAccountName: spec.SystemUpgradeController.ServiceAccountName,
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpIn, Values: []string{nu.Spec.NodeName},
			}}},
			// Harvester nodes carry control plane and etcd taints; the upgrade must run there.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}

	switch kind {
	case planPreload:
		plan.Spec.Version = release
		plan.Spec.Upgrade = &sucv1.ContainerSpec{Image: spec.Images.OSUpgrade, Command: []string{upgradeScript}, Args: []string{"prepare"}, Env: env}
	case planKubernetes:
		// SUC runs <image>:<version> with '+' turned into '-' (rancher/rke2-upgrade:v1.33.3-rke2r1).
		plan.Spec.Version = nu.Spec.Version
		plan.Spec.Cordon = true
		plan.Spec.Drain = drainSpec(spec.Drain)
		plan.Spec.Prepare = evacuateVMs(spec, env)
		plan.Spec.Upgrade = &sucv1.ContainerSpec{Image: spec.Images.RKE2Upgrade, Env: env}
	case planOS:
		plan.Spec.Version = release
		plan.Spec.Cordon = true
		plan.Spec.Drain = drainSpec(spec.Drain)
		plan.Spec.Prepare = evacuateVMs(spec, env)
		plan.Spec.Upgrade = &sucv1.ContainerSpec{
			Image: spec.Images.OSUpgrade, Command: []string{upgradeScript}, Args: []string{"post-drain"}, Env: env,
			SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			Volumes:         []sucv1.VolumeSpec{{Name: "host-root", Source: "/", Destination: "/host"}},
		}
	}
	return plan
}

// evacuateVMs is the Plans' prepare container: it live-migrates the node's virtual
// machines away before SUC cordons and drains it.
func evacuateVMs(spec harvesterv1.HarvesterUpgraderSpec, env []corev1.EnvVar) *sucv1.ContainerSpec {
	return &sucv1.ContainerSpec{Image: spec.Images.OSUpgrade, Command: []string{upgradeScript}, Args: []string{"pre-drain"}, Env: env}
}

// drainSpec turns the HarvesterUpgrader's drain options into SUC's; nil when draining is
// off (the Plan then only cordons).
func drainSpec(d harvesterv1.Drain) *sucv1.DrainSpec {
	if d.Enabled != nil && !*d.Enabled {
		return nil
	}
	return &sucv1.DrainSpec{
		Force:              d.Force,
		Timeout:            d.Timeout,
		GracePeriod:        d.GracePeriodSeconds,
		IgnoreDaemonSets:   ptr.To(d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets),
		DeleteEmptydirData: ptr.To(d.DeleteEmptyDirData == nil || *d.DeleteEmptyDirData),
	}
}
