package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// The values upgrade_managedchart_harvester adds to the harvester chart it re-applies
// (harvester-release-steps.md fact 23.2; Harvester's upgrade_manifests.sh at v1.8.2,
// upgrade_managedchart_harvester and patch_longhorn_settings).
const (
	// harvesterStorageClass is the StorageClass the harvester chart makes the default.
	harvesterStorageClass  = "harvester-longhorn"
	defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

	settingNodeDrainPolicy  = "node-drain-policy"
	settingDetachWhenCordon = "detach-manually-attached-volumes-when-cordoned"
)

var longhornSettingGVK = schema.GroupVersionKind{Group: "longhorn.io", Version: "v1beta2", Kind: "Setting"}

// longhornDefaultsPath is where the harvester chart's values hold Longhorn's default
// settings.
var longhornDefaultsPath = []string{"longhorn", "defaultSettings"}

// harvesterChartValues changes the values of the harvester ManagedChart mc in place, as
// the release's script does before it re-applies the chart, and says what it changed:
//   - storageClass.defaultStorageClass false when another StorageClass than
//     harvester-longhorn is the cluster's default, so that the chart does not make a
//     second default;
//   - Longhorn's nodeDrainPolicy allow-if-replica-is-stopped, when the values do not set
//     it and Longhorn's node-drain-policy is still Longhorn's default
//     block-if-contains-last-replica (an operator's own choice is kept);
//   - Longhorn's detachManuallyAttachedVolumesWhenCordoned true, when the values do not
//     set it and Longhorn's setting is still its default false;
//   - Longhorn's concurrentAutomaticEngineUpgradePerNodeLimit, when set, as a string (the
//     chart's schema wants one).
//
// A Longhorn setting that cannot be read is left alone, as the script's comparison fails
// on an empty value.
func (r *runner) harvesterChartValues(ctx context.Context, mc *managementv3.ManagedChart) ([]string, error) {
	values, err := chartValues(mc)
	if err != nil {
		return nil, err
	}
	var changed []string
	set := func(path []string, v any, why string) error {
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if cur, ok := lookup(values, path); ok && string(cur) == string(raw) {
			return nil
		}
		if err := assign(values, path, raw); err != nil {
			return fmt.Errorf("set %s in the values of ManagedChart %s/%s: %w", strings.Join(path, "."), mc.Namespace, mc.Name, err)
		}
		changed = append(changed, fmt.Sprintf("%s=%s (%s)", strings.Join(path, "."), raw, why))
		return nil
	}

	other, err := r.otherDefaultStorageClass(ctx)
	if err != nil {
		return nil, err
	}
	if other != "" {
		if err := set([]string{"storageClass", "defaultStorageClass"}, false, "StorageClass "+other+" is the default"); err != nil {
			return nil, err
		}
	}
	for _, d := range []struct {
		key, setting, atDefault string
		value                   any
	}{
		{"nodeDrainPolicy", settingNodeDrainPolicy, "block-if-contains-last-replica", "allow-if-replica-is-stopped"},
		{"detachManuallyAttachedVolumesWhenCordoned", settingDetachWhenCordon, "false", true},
	} {
		path := append(append([]string{}, longhornDefaultsPath...), d.key)
		if _, ok := lookup(values, path); ok {
			continue // the chart's values set it: kept
		}
		cur, err := r.longhornSetting(ctx, d.setting)
		if err != nil {
			return nil, err
		}
		if cur != d.atDefault {
			continue // changed by an operator (or unreadable): kept
		}
		if err := set(path, d.value, "Longhorn's "+d.setting+" was at its default "+d.atDefault); err != nil {
			return nil, err
		}
	}
	limit := append(append([]string{}, longhornDefaultsPath...), "concurrentAutomaticEngineUpgradePerNodeLimit")
	if raw, ok := lookup(values, limit); ok {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			if err := set(limit, strings.TrimSpace(string(raw)), "the chart wants a string"); err != nil {
				return nil, err
			}
		}
	}
	if len(changed) == 0 {
		return nil, nil
	}
	raw, err := json.Marshal(values)
	if err != nil {
		return nil, err
	}
	mc.Spec.Values = &apiextensionsv1.JSON{Raw: raw}
	return changed, nil
}

// otherDefaultStorageClass names a default StorageClass other than harvester-longhorn,
// or is empty.
func (r *runner) otherDefaultStorageClass(ctx context.Context) (string, error) {
	list := &storagev1.StorageClassList{}
	if err := r.c.List(ctx, list); err != nil {
		return "", fmt.Errorf("list the StorageClasses: %w", err)
	}
	for _, sc := range list.Items {
		if sc.Name != harvesterStorageClass && sc.Annotations[defaultClassAnnotation] == "true" {
			return sc.Name, nil
		}
	}
	return "", nil
}

// longhornSetting is the value of Longhorn's setting name, empty when it does not exist.
func (r *runner) longhornSetting(ctx context.Context, name string) (string, error) {
	s := &unstructured.Unstructured{}
	s.SetGroupVersionKind(longhornSettingGVK)
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: LonghornManagerKey.Namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return "", nil
		}
		return "", fmt.Errorf("read Longhorn setting %s: %w", name, err)
	}
	v, _, _ := unstructured.NestedString(s.Object, "value")
	return v, nil
}
