package clusterupgrade

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// helmChartConfigGVK is RKE2's helm-controller's HelmChartConfig (helm.cattle.io/v1),
// read and written as an unstructured object: the project carries no Go types of it.
var helmChartConfigGVK = schema.GroupVersionKind{Group: "helm.cattle.io", Version: "v1", Kind: "HelmChartConfig"}

// multusConfigKey is the HelmChartConfig of RKE2's rke2-multus chart.
var multusConfigKey = client.ObjectKey{Namespace: "kube-system", Name: "rke2-multus"}

// failurePolicyAbort is helm-controller's failure policy that leaves a failed release as
// it is ("waiting for operator intervention") instead of uninstalling it.
const failurePolicyAbort = "abort"

// patchMultusFailurePolicy is patch_rke2_multus_config (harvester-release-steps.md fact
// 9, in every upgrade_manifests.sh since v1.7.2 and v1.8.0): kube-system's HelmChartConfig
// rke2-multus gets failurePolicy abort, created when missing, everything else it says
// kept. With the default, reinstall, a failed helm upgrade of rke2-multus when a node's
// RKE2 restarts with a new version uninstalls the chart, whose templates carry the
// NetworkAttachmentDefinition CRD, and with it every VM network (harvester#10359). The
// release keeps abort for good (its cleanup gives nothing back here, fact 37), and so does
// this: it is not recorded for Restore.
func (r *runner) patchMultusFailurePolicy(ctx context.Context) (StepState, string, error) {
	cfg := &unstructured.Unstructured{}
	cfg.SetGroupVersionKind(helmChartConfigGVK)
	err := r.c.Get(ctx, multusConfigKey, cfg)
	if apierrors.IsNotFound(err) {
		created := &unstructured.Unstructured{}
		created.SetGroupVersionKind(helmChartConfigGVK)
		created.SetNamespace(multusConfigKey.Namespace)
		created.SetName(multusConfigKey.Name)
		if err := unstructured.SetNestedField(created.Object, failurePolicyAbort, "spec", "failurePolicy"); err != nil {
			return "", "", err
		}
		err = r.c.Create(ctx, created)
		switch {
		case err == nil:
			return StateDone, fmt.Sprintf("created HelmChartConfig %s with failurePolicy %s", multusConfigKey, failurePolicyAbort), nil
		case !apierrors.IsAlreadyExists(err):
			return "", "", fmt.Errorf("create HelmChartConfig %s with failurePolicy %s: %w", multusConfigKey, failurePolicyAbort, err)
		}
		// Created by someone else between the read and the create (RKE2, or the pod of a
		// plan deleted a moment before): set as one that exists.
		err = r.c.Get(ctx, multusConfigKey, cfg)
	}
	switch {
	case err != nil:
		return "", "", fmt.Errorf("read HelmChartConfig %s (RKE2's helm-controller serves it on every Harvester cluster): %w", multusConfigKey, err)
	}
	policy, _, _ := unstructured.NestedString(cfg.Object, "spec", "failurePolicy")
	if policy == failurePolicyAbort {
		return r.already(StepPatchMultusFailurePolicy, fmt.Sprintf("HelmChartConfig %s already has failurePolicy %s", multusConfigKey, failurePolicyAbort), false)
	}
	patch := []byte(`{"spec":{"failurePolicy":"` + failurePolicyAbort + `"}}`)
	if err := r.c.Patch(ctx, cfg, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return "", "", fmt.Errorf("set failurePolicy %s on HelmChartConfig %s: %w", failurePolicyAbort, multusConfigKey, err)
	}
	was := policy
	if was == "" {
		was = "unset, reinstall"
	}
	return StateDone, fmt.Sprintf("HelmChartConfig %s has failurePolicy %s (it was %s)", multusConfigKey, failurePolicyAbort, was), nil
}
