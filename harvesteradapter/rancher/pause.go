package rancher

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/rkev1"
)

// Rancher's planner takes the next node of a roll as soon as the one before is done: it
// cordons it and asks for its pre-drain hook on its own schedule (harvester-release-steps.md
// fact 60), whether or not an UpgradeTask wants that node now. The one lever that holds
// it between nodes is Cluster API's pause of its control plane: with the RKEControlPlane
// fleet-local/local annotated cluster.x-k8s.io/paused, the planner starts no drain,
// delivers no plan and asks for no uncordon ("pausing the control plane only affects
// machine reconciliation", rancher@v2.14.4 pkg/capr/planner/planner.go Process), while
// its machine-drain controller, a separate handler of the plan Secrets
// (pkg/controllers/capr/machinedrain/machinedrain.go), still finishes the drain or
// undrain that a Secret's annotations ask for. Rancher applies the RKEControlPlane it
// generates with wrangler's three-way apply, which leaves annotations it did not set
// (inferred from wrangler's apply; the template, provisioningcluster/template.go
// rkeControlPlane, sets its own annotations only). PausedByAnnotation records that the
// pause is ours, so that only our own pause is ever lifted.

// PausedByAnnotation names, on the RKEControlPlane, the UpgradePlan that paused its
// planner.
const PausedByAnnotation = "harvester.inplace.cluster.x-k8s.io/paused-by"

// PlannerPause is what the RKEControlPlane fleet-local/local says of its pause.
type PlannerPause struct {
	// Served is false when there is no RKEControlPlane fleet-local/local (Rancher does not
	// provision the cluster, or the kind is not served): nothing can be paused.
	Served bool
	// Paused says whether the planner is paused, by anyone.
	Paused bool
	// By is the UpgradePlan that paused it, "" when it was not us.
	By string
}

func controlPlaneMeta() *metav1.PartialObjectMetadata {
	cp := &metav1.PartialObjectMetadata{}
	cp.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	cp.SetNamespace(FleetLocal)
	cp.SetName(LocalCluster)
	return cp
}

// ReadPlannerPause reads the pause of fleet-local/local's planner.
func ReadPlannerPause(ctx context.Context, c client.Client) (PlannerPause, error) {
	cp := controlPlaneMeta()
	if err := c.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return PlannerPause{}, nil
		}
		return PlannerPause{}, fmt.Errorf("read RKEControlPlane %s/%s: %w", FleetLocal, LocalCluster, err)
	}
	_, paused := cp.Annotations[clusterv1.PausedAnnotation]
	by := cp.Annotations[PausedByAnnotation]
	if !paused {
		by = ""
	}
	return PlannerPause{Served: true, Paused: paused, By: by}, nil
}

// PausePlanner pauses fleet-local/local's planner for the UpgradePlan by (nothing when
// there is no RKEControlPlane, or it is paused already). A pause someone else set is left
// theirs: it is not recorded as ours.
func PausePlanner(ctx context.Context, c client.Client, by string) (PlannerPause, error) {
	p, err := ReadPlannerPause(ctx, c)
	if err != nil || !p.Served || p.Paused {
		return p, err
	}
	if err := patchControlPlane(ctx, c, map[string]any{clusterv1.PausedAnnotation: "true", PausedByAnnotation: by}); err != nil {
		return p, err
	}
	return PlannerPause{Served: true, Paused: true, By: by}, nil
}

// ResumePlanner lifts the pause of fleet-local/local's planner when the UpgradePlan by
// set it; a pause of someone else's stays.
func ResumePlanner(ctx context.Context, c client.Client, by string) (PlannerPause, error) {
	p, err := ReadPlannerPause(ctx, c)
	if err != nil || !p.Paused || p.By != by {
		return p, err
	}
	if err := patchControlPlane(ctx, c, map[string]any{clusterv1.PausedAnnotation: nil, PausedByAnnotation: nil}); err != nil {
		return p, err
	}
	return PlannerPause{Served: true}, nil
}

func patchControlPlane(ctx context.Context, c client.Client, annotations map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, controlPlaneMeta(), client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotate RKEControlPlane %s/%s (%v): %w", FleetLocal, LocalCluster, annotations, err)
	}
	return nil
}
