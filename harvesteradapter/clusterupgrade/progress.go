package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StepState is where one sub-step stands.
type StepState string

// The states of a sub-step.
const (
	// StatePending: not started.
	StatePending StepState = "Pending"
	// StateRunning: started and not finished (or the run that started it ended without
	// finishing it: the next run looks again).
	StateRunning StepState = "Running"
	// StateDone: this upgrade did the sub-step's work.
	StateDone StepState = "Done"
	// StateSkipped: there was nothing to do, the cluster was already there.
	StateSkipped StepState = "Skipped"
	// StateFailed: the sub-step failed; Message says why and what to do.
	StateFailed StepState = "Failed"
)

// The sub-steps, in the order Run runs them.
const (
	StepPatchMultusFailurePolicy       = "PatchMultusFailurePolicy"
	StepPreserveOvercommitConfig       = "PreserveOvercommitConfig"
	StepPauseCharts                    = "PauseCharts"
	StepDisableKubeVirtWorkloadUpdates = "DisableKubeVirtWorkloadUpdates"
	StepCleanCAPILegacyWebhooks        = "CleanCAPILegacyWebhooks"
	StepUpgradeRancher                 = "UpgradeRancher"
	StepWaitRancherDependencies        = "WaitRancherDependencies"
	StepSettleFleetAgent               = "SettleFleetAgent"
	StepPatchLocalClusterDetails       = "PatchLocalClusterDetails"
	StepUpdateLocalRKEStateSecret      = "UpdateLocalRKEStateSecret"
	StepMigrateLonghornV1beta1CRDs     = "MigrateLonghornV1beta1CRDs"
	StepUpgradeClusterRepo             = "UpgradeClusterRepo"
	StepRefreshHarvesterCharts         = "RefreshHarvesterCharts"
	StepEnsureIngressClassName         = "EnsureIngressClassName"
	StepApplyExtraManifests            = "ApplyExtraManifests"
	StepUpgradeHarvesterCRDChart       = "UpgradeHarvesterCRDChart"
	StepUpgradeHarvesterChart          = "UpgradeHarvesterChart"
	StepWaitKubeVirt                   = "WaitKubeVirt"
	StepSyncContainerdRegistry         = "SyncContainerdRegistry"
	StepWaitLonghorn                   = "WaitLonghorn"
	StepUpgradeMonitoringCRDChart      = "UpgradeMonitoringCRDChart"
	StepUpgradeLoggingCRDChart         = "UpgradeLoggingCRDChart"
	StepUpgradeAddons                  = "UpgradeAddons"
	StepWaitFleetBundles               = "WaitFleetBundles"
)

// StepNames are the sub-steps in the order Run runs them, the script's order
// (harvester-release-steps.md section B): rke2-multus's failure policy (fact 9),
// overcommit-config kept for a hop from v1.7 (fact 10), Harvester's charts paused (fact
// 11) and KubeVirt's workload updates emptied (fact 13) before Rancher (fact 16, whose
// clean_capi_legacy_webhooks for a hop from v1.7, 16.8, comes first, and whose waits
// for Rancher's own charts, 16.11 to 16.13, and the local Fleet agent's redeploy with
// fleet-controller's API server fields put back, 16.5 and 16.14 to 16.16, follow it), the local
// cluster's details (fact 17), the local-rke-state Secret's type (fact 18), Longhorn's v1beta1 storage migration for a hop from v1.6
// (fact 19), the chart repository (fact 20), Rancher's Ingress class (fact 21), the
// release's extra manifests (fact 22), Harvester's charts (fact 23), the wait for KubeVirt
// (fact 23.5), the containerd registries synced to Rancher (fact 24), the wait for
// Longhorn's own upgrade (fact 25), the monitoring and logging CRD charts (fact 27) and
// the add-ons (fact 29), and last a bounded wait for Fleet's bundles (fact 31).
func StepNames() []string {
	return []string{
		StepPatchMultusFailurePolicy,
		StepPreserveOvercommitConfig,
		StepPauseCharts,
		StepDisableKubeVirtWorkloadUpdates,
		StepCleanCAPILegacyWebhooks,
		StepUpgradeRancher,
		StepWaitRancherDependencies,
		StepSettleFleetAgent,
		StepPatchLocalClusterDetails,
		StepUpdateLocalRKEStateSecret,
		StepMigrateLonghornV1beta1CRDs,
		StepUpgradeClusterRepo,
		StepRefreshHarvesterCharts,
		StepEnsureIngressClassName,
		StepApplyExtraManifests,
		StepUpgradeHarvesterCRDChart,
		StepUpgradeHarvesterChart,
		StepWaitKubeVirt,
		StepSyncContainerdRegistry,
		StepWaitLonghorn,
		StepUpgradeMonitoringCRDChart,
		StepUpgradeLoggingCRDChart,
		StepUpgradeAddons,
		StepWaitFleetBundles,
	}
}

// StepProgress is one sub-step's state, as the progress ConfigMap holds it.
type StepProgress struct {
	// Name is the sub-step (one of StepNames).
	Name string `json:"name"`
	// State is where it stands.
	State StepState `json:"state"`
	// Message says what was done, what is awaited, or why it failed.
	Message string `json:"message,omitempty"`
	// Time is when State was last set.
	Time metav1.Time `json:"time,omitzero"`
}

// ProgressLabel marks the ConfigMaps that hold a cluster upgrade's progress.
const ProgressLabel = "inplace.cluster.x-k8s.io/cluster-upgrade-progress"

// ReadProgress reads the progress ConfigMap at key: every sub-step in StepNames order,
// Pending when the ConfigMap does not say. A missing ConfigMap is all Pending, not an
// error (the Job has not written it yet).
func ReadProgress(ctx context.Context, c client.Client, key client.ObjectKey) ([]StepProgress, error) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, key, cm); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("read the cluster upgrade's progress ConfigMap %s: %w", key, err)
	}
	return decodeProgress(cm.Data)
}

func decodeProgress(data map[string]string) ([]StepProgress, error) {
	steps := make([]StepProgress, 0, len(StepNames()))
	for _, name := range StepNames() {
		sp := StepProgress{Name: name, State: StatePending}
		if raw, ok := data[name]; ok {
			if err := json.Unmarshal([]byte(raw), &sp); err != nil {
				return nil, fmt.Errorf("progress of %s is not what the cluster upgrade writes (%q): %w", name, raw, err)
			}
			sp.Name = name
		}
		steps = append(steps, sp)
	}
	return steps, nil
}

// ensureProgress creates the progress ConfigMap when missing and returns what it holds.
func (r *runner) ensureProgress(ctx context.Context) (map[string]StepProgress, error) {
	key := r.p.ConfigMap
	cm := &corev1.ConfigMap{}
	err := r.c.Get(ctx, key, cm)
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{ProgressLabel: "true"},
		}}
		if err := r.c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create the progress ConfigMap %s: %w", key, err)
		}
		return map[string]StepProgress{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the progress ConfigMap %s: %w", key, err)
	}
	steps, err := decodeProgress(cm.Data)
	if err != nil {
		return nil, err
	}
	prior := map[string]StepProgress{}
	for _, s := range steps {
		prior[s.Name] = s
	}
	return prior, nil
}

// record writes one sub-step's state into the progress ConfigMap (a merge patch of its
// one key, so nothing else there is touched).
func (r *runner) record(ctx context.Context, name string, state StepState, message string) error {
	sp := StepProgress{Name: name, State: state, Message: message, Time: metav1.NewTime(r.in.Clock.Now())}
	r.current[name] = sp
	raw, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	if err := patchData(ctx, r.c, r.p.ConfigMap, name, string(raw)); err != nil {
		return fmt.Errorf("record %s %s in the progress ConfigMap %s: %w", name, state, r.p.ConfigMap, err)
	}
	return nil
}

// patchData sets one key of the ConfigMap at key's data with a merge patch, so nothing
// else there is touched.
func patchData(ctx context.Context, c client.Client, key client.ObjectKey, dataKey, value string) error {
	patch, err := json.Marshal(map[string]any{"data": map[string]string{dataKey: value}})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	return c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
}
