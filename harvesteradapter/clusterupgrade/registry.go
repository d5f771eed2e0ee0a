package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
)

const (
	// ContainerdRegistrySetting is Harvester's Setting of the nodes' containerd mirrors
	// and registry configs.
	ContainerdRegistrySetting = "containerd-registry"
	// UpgradePatchedAnnotation is what sync_containerd_registry_to_rancher writes on it,
	// with the release as value, so that Harvester's setting controller handles it again.
	UpgradePatchedAnnotation = "harvesterhci.io/upgrade-patched"
)

// syncContainerdRegistry is sync_containerd_registry_to_rancher (harvester-release-steps.md
// fact 24; upgrade_manifests.sh at v1.8.2): when fleet-local/local's
// spec.rkeConfig.registries is empty, Harvester's Setting containerd-registry is annotated
// harvesterhci.io/upgrade-patched=<release>, so that Harvester's setting controller
// (pkg/controller/master/setting/containerd_registry.go) writes the setting's mirrors and
// configs into rkeConfig.registries, where Rancher renders them into every node's plan.
// That plan change reaches every node while the restart guard is on them (the plan
// placed it before this Job, fact 12), so it restarts no RKE2. Registries already there
// have been synced: Skipped. Where the script's kubectl annotate would fail on a missing
// Setting, this is Skipped and says so: there is nothing to sync.
func (r *runner) syncContainerdRegistry(ctx context.Context) (StepState, string, error) {
	cl := &provisioningv1.Cluster{}
	if err := r.c.Get(ctx, localClusterKey, cl); err != nil {
		return "", "", fmt.Errorf("read provisioning Cluster %s: %w", localClusterKey, err)
	}
	if n := registryKeys(cl); n > 0 {
		return r.already(StepSyncContainerdRegistry, fmt.Sprintf("provisioning Cluster %s already has spec.rkeConfig.registries (%d keys): Rancher has the registries", localClusterKey, n), false)
	}
	s := &harvesterapi.Setting{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: ContainerdRegistrySetting}, s); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return StateSkipped, fmt.Sprintf("Harvester's Setting %s does not exist: there are no registries to sync to Rancher", ContainerdRegistrySetting), nil
		}
		return "", "", fmt.Errorf("read Harvester's Setting %s: %w", ContainerdRegistrySetting, err)
	}
	if s.Annotations[UpgradePatchedAnnotation] == r.in.HarvesterVersion {
		return r.already(StepSyncContainerdRegistry, fmt.Sprintf("Harvester's Setting %s is already annotated %s=%s", ContainerdRegistrySetting, UpgradePatchedAnnotation, r.in.HarvesterVersion), false)
	}
	before := s.DeepCopy()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[UpgradePatchedAnnotation] = r.in.HarvesterVersion
	if err := r.c.Patch(ctx, s, client.MergeFrom(before)); err != nil {
		return "", "", fmt.Errorf("annotate Harvester's Setting %s %s=%s: %w", ContainerdRegistrySetting, UpgradePatchedAnnotation, r.in.HarvesterVersion, err)
	}
	return StateDone, fmt.Sprintf("provisioning Cluster %s has no spec.rkeConfig.registries: annotated Harvester's Setting %s %s=%s, so that Harvester's setting controller syncs it to Rancher",
		localClusterKey, ContainerdRegistrySetting, UpgradePatchedAnnotation, r.in.HarvesterVersion), nil
}

// registryKeys is the script's `yq '.spec.rkeConfig.registries | length'`: how many keys
// (mirrors, configs) the registries hold.
func registryKeys(cl *provisioningv1.Cluster) int {
	if cl.Spec.RKEConfig == nil || cl.Spec.RKEConfig.Registries == nil {
		return 0
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(cl.Spec.RKEConfig.Registries.Raw, &m); err != nil {
		return 0
	}
	return len(m)
}
