package rancher

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
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
	// ResourceVersion is the RKEControlPlane's as read: ResumeSeenPlanner lifts a pause
	// only if nothing wrote the object since.
	ResourceVersion string
	// Unsynced says what of fleet-local/local's kubernetesVersion and upgradeStrategy the
	// RKEControlPlane does not carry yet ("" when it carries both as the provisioning
	// Cluster declares them). Rancher's planner reads them from the RKEControlPlane, the
	// object the pause is on, and Rancher's provisioningcluster controller copies them
	// there from the provisioning Cluster, which is where the upgrade writes them: a
	// pause lifted before the copy lands lets the planner roll with what it had, our
	// hooks after the strategy was given back among them (no one would answer them). The
	// Resume functions leave such a pause in place.
	Unsynced string
}

func controlPlaneMeta() *metav1.PartialObjectMetadata {
	cp := &metav1.PartialObjectMetadata{}
	cp.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	cp.SetNamespace(FleetLocal)
	cp.SetName(LocalCluster)
	return cp
}

// ReadPlannerPause reads the pause of fleet-local/local's planner, and whether its
// RKEControlPlane carries what the provisioning Cluster declares (Unsynced).
func ReadPlannerPause(ctx context.Context, c client.Client) (PlannerPause, error) {
	return readPause(ctx, c, true)
}

// readPause reads the pause; Unsynced only when synced is asked for, which costs a read
// of the provisioning Cluster that pausing does not need.
func readPause(ctx context.Context, c client.Client, synced bool) (PlannerPause, error) {
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	if err := c.Get(ctx, client.ObjectKey{Namespace: FleetLocal, Name: LocalCluster}, cp); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return PlannerPause{}, nil
		}
		return PlannerPause{}, fmt.Errorf("read RKEControlPlane %s/%s: %w", FleetLocal, LocalCluster, err)
	}
	annotations := cp.GetAnnotations()
	_, paused := annotations[clusterv1.PausedAnnotation]
	by := annotations[PausedByAnnotation]
	if !paused {
		by = ""
	}
	p := PlannerPause{Served: true, Paused: paused, By: by, ResourceVersion: cp.GetResourceVersion()}
	if !synced {
		return p, nil
	}
	cl, err := ProvisioningCluster(ctx, c)
	if err != nil {
		return PlannerPause{}, err
	}
	if p.Unsynced, err = unsynced(cp, cl); err != nil {
		return PlannerPause{}, err
	}
	return p, nil
}

// controlPlaneSpec is what Rancher's planner reads of the RKEControlPlane's spec for a
// roll (rancher@v2.14.4 pkg/capr/planner/planner.go fullReconcile:
// controlPlane.Spec.UpgradeStrategy; the version goes into every plan, fact 58).
type controlPlaneSpec struct {
	KubernetesVersion string                                `json:"kubernetesVersion,omitempty"`
	UpgradeStrategy   provisioningv1.ClusterUpgradeStrategy `json:"upgradeStrategy,omitempty"`
}

// unsynced says what of the provisioning Cluster's kubernetesVersion and
// upgradeStrategy the RKEControlPlane cp does not carry ("" when nothing, or when there
// is no provisioning Cluster to copy). Compared as typed values: an absent field and its
// zero value are the same to the planner.
func unsynced(cp *unstructured.Unstructured, cl *provisioningv1.Cluster) (string, error) {
	if cl == nil {
		return "", nil
	}
	var have controlPlaneSpec
	if spec, ok := cp.Object["spec"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &have); err != nil {
			return "", fmt.Errorf("read the spec of RKEControlPlane %s/%s: %w", FleetLocal, LocalCluster, err)
		}
	}
	var differ []string
	if have.KubernetesVersion != cl.Spec.KubernetesVersion {
		differ = append(differ, fmt.Sprintf("kubernetesVersion %s (the provisioning Cluster declares %s)", have.KubernetesVersion, cl.Spec.KubernetesVersion))
	}
	if !equality.Semantic.DeepEqual(have.UpgradeStrategy, cl.Spec.RKEConfig.UpgradeStrategy) {
		differ = append(differ, "an upgradeStrategy other than the provisioning Cluster's")
	}
	if len(differ) == 0 {
		return "", nil
	}
	return fmt.Sprintf("RKEControlPlane %s/%s, which Rancher's planner reads, still carries %s: Rancher's provisioningcluster controller has not copied fleet-local/local's spec there yet",
		FleetLocal, LocalCluster, strings.Join(differ, " and ")), nil
}

// PausePlanner pauses fleet-local/local's planner for the UpgradePlan by (nothing when
// there is no RKEControlPlane, or it is paused already). A pause someone else set is left
// theirs: it is not recorded as ours.
func PausePlanner(ctx context.Context, c client.Client, by string) (PlannerPause, error) {
	p, err := readPause(ctx, c, false)
	if err != nil || !p.Served || p.Paused {
		return p, err
	}
	if err := patchControlPlane(ctx, c, map[string]any{clusterv1.PausedAnnotation: "true", PausedByAnnotation: by}); err != nil {
		return p, err
	}
	return PlannerPause{Served: true, Paused: true, By: by}, nil
}

// HeldForAnnotation says, on the RKEControlPlane, why a NodeUpdate last held the planner
// (HoldPlanner).
const HeldForAnnotation = "harvester.inplace.cluster.x-k8s.io/held-for"

// HoldPlanner pauses fleet-local/local's planner for the UpgradePlan by, as PausePlanner
// does, and writes why (HeldForAnnotation) even when it is paused already: the write
// changes the RKEControlPlane's resourceVersion, so that a decision to let the planner
// go made from what was read before the hold cannot lift it (ResumeSeenPlanner). A
// pause someone else set stays theirs, untouched.
func HoldPlanner(ctx context.Context, c client.Client, by, reason string) (PlannerPause, error) {
	p, err := readPause(ctx, c, false)
	if err != nil || !p.Served || (p.Paused && p.By != by) {
		return p, err
	}
	annotations := map[string]any{HeldForAnnotation: reason}
	if !p.Paused {
		annotations[clusterv1.PausedAnnotation] = "true"
		annotations[PausedByAnnotation] = by
		p = PlannerPause{Served: true, Paused: true, By: by}
	}
	return p, patchControlPlane(ctx, c, annotations)
}

// ResumePlanner lifts the pause of fleet-local/local's planner when the UpgradePlan by
// set it and the RKEControlPlane carries what the provisioning Cluster declares; a pause
// of someone else's stays. It returns the pause as it is after: still ours and paused
// when the copy has not landed (Unsynced says so) or the RKEControlPlane was written
// since it was read (the next call reads it again).
func ResumePlanner(ctx context.Context, c client.Client, by string) (PlannerPause, error) {
	p, err := ReadPlannerPause(ctx, c)
	if err != nil || !p.Paused || p.By != by || p.Unsynced != "" {
		return p, err
	}
	err = patchControlPlaneAt(ctx, c, p.ResourceVersion, map[string]any{clusterv1.PausedAnnotation: nil, PausedByAnnotation: nil, HeldForAnnotation: nil})
	if apierrors.IsConflict(err) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	return PlannerPause{Served: true}, nil
}

// ResumeSeenPlanner lifts the pause seen, read before what the decision to let the
// planner go was made from, when it is the UpgradePlan by's and nothing wrote the
// RKEControlPlane since (the patch carries the resourceVersion seen: a conflict, and the
// pause stays). A NodeUpdate holds the planner before it answers a post-drain hook
// (harvesteradapter answerPostDrain); a decision made from plan Secrets read before
// that answer must not lift that pause, or Rancher takes the next node, cordoning it,
// as soon as the answered node is uncordoned: the NodeUpdate holds it with HoldPlanner,
// which writes the object whether or not it was paused. Nor is a pause seen with the
// RKEControlPlane behind the provisioning Cluster (Unsynced) lifted. It says whether the
// pause was lifted.
func ResumeSeenPlanner(ctx context.Context, c client.Client, by string, seen PlannerPause) (bool, error) {
	if !seen.Paused || seen.By != by || seen.Unsynced != "" {
		return false, nil
	}
	err := patchControlPlaneAt(ctx, c, seen.ResourceVersion, map[string]any{clusterv1.PausedAnnotation: nil, PausedByAnnotation: nil, HeldForAnnotation: nil})
	if apierrors.IsConflict(err) {
		return false, nil
	}
	return err == nil, err
}

func patchControlPlane(ctx context.Context, c client.Client, annotations map[string]any) error {
	return patchControlPlaneAt(ctx, c, "", annotations)
}

// patchControlPlaneAt patches the RKEControlPlane's annotations; with a resourceVersion
// the patch applies only to that version of it (a conflict otherwise).
func patchControlPlaneAt(ctx context.Context, c client.Client, resourceVersion string, annotations map[string]any) error {
	md := map[string]any{"annotations": annotations}
	if resourceVersion != "" {
		md["resourceVersion"] = resourceVersion
	}
	patch, err := json.Marshal(map[string]any{"metadata": md})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, controlPlaneMeta(), client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotate RKEControlPlane %s/%s (%v): %w", FleetLocal, LocalCluster, annotations, err)
	}
	return nil
}
