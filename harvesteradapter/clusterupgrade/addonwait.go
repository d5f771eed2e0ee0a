package clusterupgrade

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
)

// After the release changes rancher-monitoring or rancher-logging, its script waits for
// the add-on to be deployed again (harvester-release-steps.md fact 29; lib.sh at v1.8.2
// wait_for_addon_upgrade_deployment, called by upgrade_addon_try_patch_version_only,
// upgrade_addon_rancher_monitoring_with_patches and
// upgrade_addon_rancher_logging_with_patch_eventrouter_image; upgrade_addon, which brings
// the other add-ons, does not wait): only when the add-on was enabled and
// AddonDeploySuccessful before the change, up to 300 s (Input.AddonUpgradeWait), and an
// add-on still not deployed then is only reported ("recover it manually after the
// upgrade"): the upgrade goes on. A run that finds the add-on already changed (a Job run
// again) changes nothing and so, as the script, does not wait.

// helmChartGVK is RKE2's helm-controller's HelmChart (helm.cattle.io/v1), read as an
// unstructured object: Harvester's add-on controller installs an add-on through the
// HelmChart of its namespace and name.
var helmChartGVK = schema.GroupVersionKind{Group: "helm.cattle.io", Version: "v1", Kind: "HelmChart"}

// addonWaitAfterChange is the script's choice, made before it changes the add-on a:
// whether to wait for it afterwards, or else why not (for the step's message).
func addonWaitAfterChange(a *harvesterapi.Addon) (bool, string) {
	switch {
	case !a.Spec.Enabled:
		return false, "disabled, not waited for"
	case a.Status.Status != harvesterapi.AddonDeployed:
		return false, addonStatus(a.Status.Status) + " before the change, not waited for"
	}
	return true, ""
}

// waitAddonRedeployed waits, at most Input.AddonUpgradeWait, until Harvester has deployed
// the add-on at key again (addonRedeployed), and says how it ended. It fails only when it
// cannot read the add-on: an add-on not deployed in time is named in the returned note and
// in the log, and the upgrade goes on.
func (r *runner) waitAddonRedeployed(ctx context.Context, key client.ObjectKey) (string, error) {
	what := fmt.Sprintf("add-on %s to be %s again", key, harvesterapi.AddonDeployed)
	if err := r.record(ctx, StepUpgradeAddons, StateRunning, fmt.Sprintf("waiting up to %s for %s, as the release's script does", r.in.AddonUpgradeWait, what)); err != nil {
		return "", err
	}
	last := ""
	done, seen, err := r.pollBounded(ctx, r.in.AddonUpgradeWait, func(ctx context.Context) (bool, string, error) {
		done, seen, err := r.addonRedeployed(ctx, key)
		if err == nil && !done && seen != last {
			r.logf("waiting for %s: %s", what, seen)
			last = seen
		}
		return done, seen, err
	})
	switch {
	case err != nil:
		return "", err
	case done:
		r.logf("add-on %s is %s again", key, harvesterapi.AddonDeployed)
		return string(harvesterapi.AddonDeployed) + " again", nil
	}
	r.logf("add-on %s is not %s again after %s (%s): gone on as the release's script does; recover it manually after the upgrade", key, harvesterapi.AddonDeployed, r.in.AddonUpgradeWait, seen)
	return fmt.Sprintf("not %s again after %s: %s; gone on as the release's script does, recover it manually after the upgrade", harvesterapi.AddonDeployed, r.in.AddonUpgradeWait, seen), nil
}

// addonRedeployed says whether Harvester's add-on controller has deployed the add-on at
// key as it now is, and what it sees of it. The status alone does not tell: right after a
// change the add-on still reports the AddonDeploySuccessful of its old version. The
// controller first sets the InProgress condition, then puts the add-on's version and
// values into its HelmChart and reports AddonUpdating, and once the Helm job succeeded
// AddonDeploySuccessful with InProgress False; a failed job leaves it AddonUpdating with
// OperationFailed True (harvester pkg/controller/master/addon at v1.8.2,
// addon_processing.go processAddonUpgrades and reconcileCurrentInstallationJob,
// common.go isHelmchartUpdateNeeded). So it is deployed when its HelmChart has its
// version (and values, when it has its own), no operation is in progress, and the status
// is AddonDeploySuccessful. A missing add-on is not (the script looks until the bound).
func (r *runner) addonRedeployed(ctx context.Context, key client.ObjectKey) (bool, string, error) {
	a := &harvesterapi.Addon{}
	switch err := r.c.Get(ctx, key, a); {
	case apierrors.IsNotFound(err):
		return false, "the add-on is gone", nil
	case err != nil:
		return false, "", fmt.Errorf("read add-on %s: %w", key, err)
	}
	hc := &unstructured.Unstructured{}
	hc.SetGroupVersionKind(helmChartGVK)
	chartAt := false
	switch err := r.c.Get(ctx, key, hc); {
	case err == nil:
		version, _, _ := unstructured.NestedString(hc.Object, "spec", "version")
		values, _, _ := unstructured.NestedString(hc.Object, "spec", "valuesContent")
		chartAt = version == a.Spec.Version && (a.Spec.ValuesContent == "" || values == a.Spec.ValuesContent)
	case !apierrors.IsNotFound(err):
		return false, "", fmt.Errorf("read HelmChart %s of add-on %s: %w", key, key, err)
	}
	inProgress := a.Status.IsTrue(harvesterapi.AddonOperationInProgress)
	seen := addonStatus(a.Status.Status)
	switch {
	case !chartAt:
		seen += ", its HelmChart not yet at its version and values"
	case inProgress && a.Status.Status == harvesterapi.AddonDeployed:
		seen += ", " + harvesterapi.AddonOperationInProgress
	}
	if a.Status.IsTrue(harvesterapi.AddonOperationFailed) {
		seen += ", " + harvesterapi.AddonOperationFailed
		if m := a.Status.Condition(harvesterapi.AddonOperationFailed).Message; m != "" {
			seen += ": " + m
		}
	}
	return chartAt && !inProgress && a.Status.Status == harvesterapi.AddonDeployed, seen, nil
}

// addonStatus names an add-on's status for a message.
func addonStatus(s harvesterapi.AddonState) string {
	if s == "" {
		return "no status"
	}
	return string(s)
}
