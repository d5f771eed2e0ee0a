package clusterupgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// This file is what the cluster upgrade changes for the duration of the roll and gives
// back afterwards, as Harvester's upgrade does (harvester-release-steps.md facts 11, 13
// and 37): each change is recorded, with the value it replaced, in the progress ConfigMap
// before it is made; Restore puts every recorded value back, and the UpgradePlan calls it
// on every end (success, failure, deletion).

// restoreKey is the progress ConfigMap's key that holds the recorded changes.
const restoreKey = "restore"

// FieldPaused is a ManagedChart's spec.paused.
const FieldPaused = "spec.paused"

// FieldSettingValue is a Longhorn Setting's value.
const FieldSettingValue = "longhorn.value"

// FieldAddonEnabled is a Harvester Addon's spec.enabled (the descheduler's, fact 36).
const FieldAddonEnabled = "addon.spec.enabled"

// workloadUpdateMethodsPath is where the harvester chart keeps KubeVirt's
// workloadUpdateMethods in its values (fact 13).
var workloadUpdateMethodsPath = []string{"kubevirt", "spec", "workloadUpdateStrategy", "workloadUpdateMethods"}

// FieldWorkloadUpdateMethods is the harvester chart's value that is KubeVirt's
// workloadUpdateMethods (fact 13).
var FieldWorkloadUpdateMethods = "values." + strings.Join(workloadUpdateMethodsPath, ".")

// Change is one setting the cluster upgrade changed for the roll.
type Change struct {
	// Object is what was changed, namespace/name: a ManagedChart, for
	// FieldSettingValue a Longhorn Setting, for FieldAddonEnabled a Harvester Addon, for
	// rancher.FieldUpgradeStrategy the provisioning Cluster; for
	// FieldLonghornSettingsUpdate "/longhorn-webhook-validator", Longhorn's
	// (cluster-scoped) ValidatingWebhookConfiguration.
	Object string `json:"object"`
	// Field is what of it: FieldPaused, FieldWorkloadUpdateMethods, FieldSettingValue or
	// FieldLonghornSettingsUpdate.
	Field string `json:"field"`
	// Before is the value it had before the upgrade changed it, as JSON; null when it was
	// not set.
	Before json.RawMessage `json:"before"`
}

// ReadChanges reads the changes recorded in the progress ConfigMap at key, in the order
// they were made; none when the ConfigMap or the record is missing.
func ReadChanges(ctx context.Context, c client.Client, key client.ObjectKey) ([]Change, error) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read the cluster upgrade's progress ConfigMap %s: %w", key, err)
	}
	return decodeChanges(cm.Data[restoreKey])
}

func decodeChanges(raw string) ([]Change, error) {
	if raw == "" {
		return nil, nil
	}
	var changes []Change
	if err := json.Unmarshal([]byte(raw), &changes); err != nil {
		return nil, fmt.Errorf("the changes recorded for the roll are not what the cluster upgrade writes (%q): %w", raw, err)
	}
	return changes, nil
}

// remember records that the object at key is about to change its field from before
// (Record), in this run's progress ConfigMap.
func (r *runner) remember(ctx context.Context, key client.ObjectKey, field string, before json.RawMessage) error {
	return Record(ctx, r.c, r.p.ConfigMap, key, field, before)
}

// Record records, in the progress ConfigMap at progress, that the object at key is about
// to change its field from before (nil: it was not set), unless a change of it is
// recorded already: the first value is the one from before the upgrade (a run that
// resumes finds its own value there), as Harvester's backups are written only once
// (fact 13). Restore gives it back. The UpgradePlan records there too what it changes
// for the roll itself (fact 35).
func Record(ctx context.Context, c client.Client, progress, key client.ObjectKey, field string, before json.RawMessage) error {
	changes, err := ReadChanges(ctx, c, progress)
	if err != nil {
		return err
	}
	object := key.String()
	if slices.ContainsFunc(changes, func(ch Change) bool { return ch.Object == object && ch.Field == field }) {
		return nil
	}
	if before == nil {
		before = json.RawMessage("null")
	}
	changes = append(changes, Change{Object: object, Field: field, Before: before})
	raw, err := json.Marshal(changes)
	if err != nil {
		return err
	}
	if err := patchData(ctx, c, progress, restoreKey, string(raw)); err != nil {
		return fmt.Errorf("record the %s of %s before changing it, in the progress ConfigMap %s: %w", field, object, progress, err)
	}
	return nil
}

// pausedCharts are the ManagedCharts pause_all_charts pauses (fact 11).
var pausedCharts = []string{rancher.HarvesterChart, rancher.HarvesterCRDChart, rancher.MonitoringCRDChart, rancher.LoggingCRDChart}

// pauseCharts is pause_all_charts (fact 11): while Rancher, Fleet and the chart
// repository change, Fleet must not re-apply Harvester's charts half-way (issue #1982).
// The charts the upgrade then upgrades are un-paused by their own sub-step, as the script
// does; the others come back when Restore runs. A chart the cluster does not have is
// skipped. Once Done it is not done again by a run that resumes.
func (r *runner) pauseCharts(ctx context.Context) (StepState, string, error) {
	if r.prior[StepPauseCharts].State == StateDone {
		// Later sub-steps un-pause the charts they upgrade: pausing them again would
		// undo that.
		return StateDone, "the charts were paused (done by an earlier run)", nil
	}
	var paused, already, missing []string
	for _, name := range pausedCharts {
		key := client.ObjectKey{Namespace: rancher.FleetLocal, Name: name}
		mc := &managementv3.ManagedChart{}
		if err := r.c.Get(ctx, key, mc); err != nil {
			if apierrors.IsNotFound(err) {
				missing = append(missing, name)
				continue
			}
			return "", "", fmt.Errorf("read ManagedChart %s: %w", key, err)
		}
		if mc.Spec.Paused {
			already = append(already, name)
			continue
		}
		if err := r.remember(ctx, key, FieldPaused, json.RawMessage("false")); err != nil {
			return "", "", err
		}
		if err := r.setPaused(ctx, mc, true); err != nil {
			return "", "", err
		}
		if err := r.waitObserved(ctx, key, mc.Generation); err != nil {
			return "", "", err
		}
		paused = append(paused, name)
	}
	message := describeCharts("paused", paused, already, missing)
	if len(paused) == 0 {
		return r.already(StepPauseCharts, message, false)
	}
	return StateDone, message, nil
}

// waitObserved waits until Rancher has reconciled the ManagedChart at key at generation
// (a pause): the sub-steps after judge a chart Rancher has taken in, not one whose
// generation is still ahead of its status.
func (r *runner) waitObserved(ctx context.Context, key client.ObjectKey, generation int64) error {
	return r.poll(ctx, fmt.Sprintf("ManagedChart %s to be reconciled at generation %d", key, generation),
		"Rancher reconciles it; look at the chart's status (kubectl -n fleet-local get managedchart "+key.Name+" -o yaml)",
		func(ctx context.Context) (bool, string, error) {
			cur := &managementv3.ManagedChart{}
			if err := r.c.Get(ctx, key, cur); err != nil {
				return false, "", fmt.Errorf("read ManagedChart %s: %w", key, err)
			}
			return cur.Status.ObservedGeneration >= generation, fmt.Sprintf("observedGeneration %d", cur.Status.ObservedGeneration), nil
		})
}

func describeCharts(did string, done, already, missing []string) string {
	var parts []string
	if len(done) > 0 {
		parts = append(parts, fmt.Sprintf("ManagedCharts %s %s", strings.Join(done, ", "), did))
	}
	if len(already) > 0 {
		parts = append(parts, fmt.Sprintf("%s already %s", strings.Join(already, ", "), did))
	}
	if len(missing) > 0 {
		parts = append(parts, fmt.Sprintf("%s not on the cluster", strings.Join(missing, ", ")))
	}
	return strings.Join(parts, "; ")
}

func (r *runner) setPaused(ctx context.Context, mc *managementv3.ManagedChart, paused bool) error {
	before := mc.DeepCopy()
	mc.Spec.Paused = paused
	if err := r.c.Patch(ctx, mc, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("set spec.paused of ManagedChart %s/%s to %t: %w", mc.Namespace, mc.Name, paused, err)
	}
	return nil
}

// disableKubeVirtWorkloadUpdates is disable_kubevirt_workload_live_migration of v1.7.2+
// and v1.8.1+ (fact 13): the harvester chart's KubeVirt workloadUpdateMethods is recorded
// and emptied, and the chart deployed with it (un-paused, waited for, paused again), so
// that KubeVirt's upgrade with the chart does not live-migrate every running VM at once
// while the nodes are evacuated one by one. The chart value is changed, not the KubeVirt
// CR, because Fleet owns the CR (v1.8.0's patch of the CR lost to fleet-agent, fact 13).
// Restore gives the value back.
func (r *runner) disableKubeVirtWorkloadUpdates(ctx context.Context) (StepState, string, error) {
	if r.prior[StepDisableKubeVirtWorkloadUpdates].State == StateDone {
		// The harvester chart's own upgrade un-paused it since.
		return StateDone, "KubeVirt's workload updates were emptied in the harvester chart (done by an earlier run)", nil
	}
	mc := &managementv3.ManagedChart{}
	if err := r.c.Get(ctx, harvesterChart, mc); err != nil {
		return "", "", fmt.Errorf("read ManagedChart %s: %w", harvesterChart, err)
	}
	values, err := chartValues(mc)
	if err != nil {
		return "", "", err
	}
	current, set := lookup(values, workloadUpdateMethodsPath)
	emptied := set && bytes.Equal(bytes.TrimSpace(current), []byte("[]"))
	if emptied && mc.Status.ObservedGeneration == mc.Generation {
		// Fleet has deployed the chart with [] already; it stays paused for the roll.
		if !mc.Spec.Paused {
			if err := r.setPaused(ctx, mc, true); err != nil {
				return "", "", err
			}
			if err := r.waitObserved(ctx, harvesterChart, mc.Generation); err != nil {
				return "", "", err
			}
		}
		changes, err := ReadChanges(ctx, r.c, r.p.ConfigMap)
		if err != nil {
			return "", "", err
		}
		ours := slices.ContainsFunc(changes, func(ch Change) bool {
			return ch.Object == harvesterChart.String() && ch.Field == FieldWorkloadUpdateMethods
		})
		return r.already(StepDisableKubeVirtWorkloadUpdates, fmt.Sprintf("ManagedChart %s deploys KubeVirt with workloadUpdateMethods []", harvesterChart), ours)
	}
	if !emptied {
		before := json.RawMessage(nil)
		if set {
			before = current
		}
		if err := r.remember(ctx, harvesterChart, FieldWorkloadUpdateMethods, before); err != nil {
			return "", "", err
		}
		if err := assign(values, workloadUpdateMethodsPath, json.RawMessage("[]")); err != nil {
			return "", "", fmt.Errorf("ManagedChart %s: %w", harvesterChart, err)
		}
	}
	from := mc.Generation
	if !emptied {
		patched := mc.DeepCopy()
		raw, err := json.Marshal(values)
		if err != nil {
			return "", "", err
		}
		patched.Spec.Values = &apiextensionsv1.JSON{Raw: raw}
		patched.Spec.Paused = false
		if err := r.c.Patch(ctx, patched, client.MergeFrom(mc)); err != nil {
			return "", "", fmt.Errorf("set %s of ManagedChart %s to []: %w", FieldWorkloadUpdateMethods, harvesterChart, err)
		}
		mc = patched
	} else {
		// An earlier run emptied the value and stopped before Fleet deployed it.
		from = mc.Status.ObservedGeneration
		if mc.Spec.Paused {
			if err := r.setPaused(ctx, mc, false); err != nil {
				return "", "", err
			}
		}
	}
	if err := r.waitChart(ctx, harvesterChart, mc.Spec.Version, from); err != nil {
		return "", "", err
	}
	if err := r.setPaused(ctx, mc, true); err != nil {
		return "", "", err
	}
	if err := r.waitObserved(ctx, harvesterChart, mc.Generation); err != nil {
		return "", "", err
	}
	return StateDone, fmt.Sprintf("ManagedChart %s deploys KubeVirt with workloadUpdateMethods [] (it had %s), paused again", harvesterChart, describeBefore(current, set)), nil
}

func describeBefore(v json.RawMessage, set bool) string {
	if !set {
		return "none"
	}
	return string(v)
}

// Restore puts back every value the cluster upgrade recorded in the progress ConfigMap
// at key (ReadChanges), the last change first: the ManagedCharts it paused are
// un-paused and the harvester chart's KubeVirt workloadUpdateMethods is what it was, or
// unset if it was unset (fact 37: Harvester's cleanup does the same, a backup of null
// deleting the key); Longhorn's validator gets UPDATE back on longhorn.io settings when
// MigrateLonghornV1beta1CRDs stopped between taking and giving it back (fact 19); a
// local-rke-state conversion UpdateLocalRKEStateSecret left half-way is finished from its
// copy and Rancher brought back to its replicas (fact 18). A value that is already back is left alone, so Restore can run any
// number of times; a chart that is gone has nothing to restore. Then the records, and the
// progress of the sub-steps that made them, are removed from the ConfigMap, which stays.
func Restore(ctx context.Context, c client.Client, key client.ObjectKey) error {
	changes, err := ReadChanges(ctx, c, key)
	if err != nil {
		return err
	}
	for i := len(changes) - 1; i >= 0; i-- {
		if err := restoreChange(ctx, c, changes[i]); err != nil {
			return fmt.Errorf("restore the %s of %s recorded in %s: %w", changes[i].Field, changes[i].Object, key, err)
		}
	}
	if len(changes) == 0 {
		return nil
	}
	// Given back: the records go, and so does the progress of the sub-steps that made
	// them, so that a run that resumes from this ConfigMap (an UpgradePlan of the same
	// name created again) makes those changes again instead of finding them done.
	patch, err := json.Marshal(map[string]any{"data": map[string]any{
		restoreKey: nil, StepPauseCharts: nil, StepDisableKubeVirtWorkloadUpdates: nil,
	}})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{}
	cm.Namespace, cm.Name = key.Namespace, key.Name
	if err := c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

func restoreChange(ctx context.Context, c client.Client, ch Change) error {
	if ch.Field == FieldLonghornSettingsUpdate {
		// A cluster-scoped object: Object is "/" and its name.
		return restoreSettingsUpdate(ctx, c, ch.Before)
	}
	namespace, name, ok := strings.Cut(ch.Object, "/")
	if !ok {
		return fmt.Errorf("%q names no namespace/name", ch.Object)
	}
	switch ch.Field {
	case FieldSettingValue:
		return restoreSetting(ctx, c, client.ObjectKey{Namespace: namespace, Name: name}, ch.Before)
	case rancher.FieldUpgradeStrategy:
		return restoreStrategy(ctx, c, ch.Before)
	case FieldAddonEnabled:
		return restoreAddon(ctx, c, client.ObjectKey{Namespace: namespace, Name: name}, ch.Before)
	case FieldRancherReplicas:
		return restoreRancherReplicas(ctx, c, ch.Before)
	case FieldFleetAPIServer:
		_, err := restoreFleetAPIServer(ctx, c, ch.Before)
		return err
	}
	mc := &managementv3.ManagedChart{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, mc); err != nil {
		return client.IgnoreNotFound(err)
	}
	patched := mc.DeepCopy()
	switch ch.Field {
	case FieldPaused:
		var paused bool
		if err := json.Unmarshal(ch.Before, &paused); err != nil {
			return fmt.Errorf("the recorded value %s is not a boolean: %w", ch.Before, err)
		}
		patched.Spec.Paused = paused
	case FieldWorkloadUpdateMethods:
		values, err := chartValues(mc)
		if err != nil {
			return err
		}
		if bytes.Equal(bytes.TrimSpace(ch.Before), []byte("null")) {
			remove(values, workloadUpdateMethodsPath)
		} else if err := assign(values, workloadUpdateMethodsPath, ch.Before); err != nil {
			return err
		}
		raw, err := json.Marshal(values)
		if err != nil {
			return err
		}
		patched.Spec.Values = &apiextensionsv1.JSON{Raw: raw}
	default:
		return fmt.Errorf("field %q is not one the cluster upgrade changes", ch.Field)
	}
	if patched.Spec.Paused == mc.Spec.Paused && valuesEqual(patched.Spec.Values, mc.Spec.Values) {
		return nil
	}
	return c.Patch(ctx, patched, client.MergeFrom(mc))
}

// chartValues are a ManagedChart's values as a JSON object, each value kept as it is.
func chartValues(mc *managementv3.ManagedChart) (map[string]json.RawMessage, error) {
	values := map[string]json.RawMessage{}
	if mc.Spec.Values == nil || len(mc.Spec.Values.Raw) == 0 {
		return values, nil
	}
	if err := json.Unmarshal(mc.Spec.Values.Raw, &values); err != nil {
		return nil, fmt.Errorf("the values of ManagedChart %s/%s are not a JSON object: %w", mc.Namespace, mc.Name, err)
	}
	return values, nil
}

func valuesEqual(a, b *apiextensionsv1.JSON) bool {
	var va, vb any
	if a != nil && len(a.Raw) > 0 {
		_ = json.Unmarshal(a.Raw, &va)
	}
	if b != nil && len(b.Raw) > 0 {
		_ = json.Unmarshal(b.Raw, &vb)
	}
	ra, _ := json.Marshal(va)
	rb, _ := json.Marshal(vb)
	return bytes.Equal(ra, rb)
}

// lookup is the value at path in values, and whether it is set.
func lookup(values map[string]json.RawMessage, path []string) (json.RawMessage, bool) {
	raw, ok := values[path[0]]
	if !ok {
		return nil, false
	}
	if len(path) == 1 {
		return raw, true
	}
	inner := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &inner); err != nil {
		return nil, false
	}
	return lookup(inner, path[1:])
}

// assign sets the value at path in values, creating the objects on the way.
func assign(values map[string]json.RawMessage, path []string, v json.RawMessage) error {
	if len(path) == 1 {
		values[path[0]] = v
		return nil
	}
	inner := map[string]json.RawMessage{}
	if raw, ok := values[path[0]]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &inner); err != nil {
			return fmt.Errorf("value %s is not an object: %w", path[0], err)
		}
	}
	if err := assign(inner, path[1:], v); err != nil {
		return err
	}
	raw, err := json.Marshal(inner)
	if err != nil {
		return err
	}
	values[path[0]] = raw
	return nil
}

// remove deletes the value at path from values; the objects on the way stay.
func remove(values map[string]json.RawMessage, path []string) {
	if len(path) == 1 {
		delete(values, path[0])
		return
	}
	raw, ok := values[path[0]]
	if !ok {
		return
	}
	inner := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &inner); err != nil {
		return
	}
	remove(inner, path[1:])
	if raw, err := json.Marshal(inner); err == nil {
		values[path[0]] = raw
	}
}

// restoreStrategy gives fleet-local/local back the upgrade strategy it had before the
// roll (rancher.FieldUpgradeStrategy; null: none), which also takes our drain hooks off;
// its kubernetesVersion stays the release's, as Harvester's cleanup leaves it (fact 59).
// A provisioning Cluster that is gone, or not served, has nothing to restore.
func restoreStrategy(ctx context.Context, c client.Client, before json.RawMessage) error {
	current, err := rancher.ReadStrategy(ctx, c)
	if err != nil {
		if apierrors.IsNotFound(errors.Unwrap(err)) || meta.IsNoMatchError(errors.Unwrap(err)) {
			return nil
		}
		return err
	}
	if valuesEqual(&apiextensionsv1.JSON{Raw: current}, &apiextensionsv1.JSON{Raw: before}) {
		return nil
	}
	return rancher.SetRoll(ctx, c, "", before)
}

// restoreSetting gives a Longhorn Setting back the value it had (a JSON string); a
// Setting that is gone has nothing to restore.
func restoreSetting(ctx context.Context, c client.Client, key client.ObjectKey, before json.RawMessage) error {
	var value string
	if err := json.Unmarshal(before, &value); err != nil {
		return fmt.Errorf("the recorded value %s is not a string: %w", before, err)
	}
	setting := &longhornv1.Setting{}
	if err := c.Get(ctx, key, setting); err != nil {
		return client.IgnoreNotFound(err)
	}
	if setting.Value == value {
		return nil
	}
	patched := setting.DeepCopy()
	patched.Value = value
	return c.Patch(ctx, patched, client.MergeFrom(setting))
}

// restoreAddon gives a Harvester Addon the spec.enabled it had (fact 37, Harvester's
// reenableAddons). An Addon that is gone, or not served, has nothing to restore.
func restoreAddon(ctx context.Context, c client.Client, key client.ObjectKey, before json.RawMessage) error {
	var enabled bool
	if err := json.Unmarshal(before, &enabled); err != nil {
		return fmt.Errorf("the recorded value %s is not a boolean: %w", before, err)
	}
	addon := &harvesterapi.Addon{}
	if err := c.Get(ctx, key, addon); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil
		}
		return err
	}
	if addon.Spec.Enabled == enabled {
		return nil
	}
	patched := addon.DeepCopy()
	patched.Spec.Enabled = enabled
	return c.Patch(ctx, patched, client.MergeFrom(addon))
}
