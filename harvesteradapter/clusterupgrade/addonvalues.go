package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// The add-ons whose values the release edits rather than replaces (harvester-release-steps.md
// fact 29; lib.sh at v1.7.0 to v1.8.2: upgrade_addon_rancher_monitoring_with_patches,
// upgrade_addon_rancher_logging_with_patch_eventrouter_image,
// upgrade_nvidia_driver_toolkit_addon). Their valuesContent holds what the user set
// (storage, retention, alerting, the driver's location), so the release keeps it and
// changes only named fields. An add-on that is not on the cluster is left, as the
// script's "addon is not found, nothing to do".

var (
	monitoringAddon = client.ObjectKey{Namespace: "cattle-monitoring-system", Name: "rancher-monitoring"}
	loggingAddon    = client.ObjectKey{Namespace: "cattle-logging-system", Name: "rancher-logging"}
	nvidiaAddon     = client.ObjectKey{Namespace: "harvester-system", Name: "nvidia-driver-toolkit"}
)

// nvidiaDriverPlaceholder is the driver location the release's nvidia-driver-toolkit file
// ships, which the script replaces with the user's (sed in upgrade_nvidia_driver_toolkit_addon).
const nvidiaDriverPlaceholder = "HTTPENDPOINT/NVIDIA-Linux-x86_64-vgpu-kvm.run"

// addonValues are an add-on's valuesContent as YAML, every field kept.
type addonValues map[string]any

func parseAddonValues(a *harvesterapi.Addon) (addonValues, error) {
	v := addonValues{}
	if strings.TrimSpace(a.Spec.ValuesContent) == "" {
		return v, nil
	}
	if err := yaml.Unmarshal([]byte(a.Spec.ValuesContent), &v); err != nil {
		return nil, fmt.Errorf("the valuesContent of add-on %s/%s is not YAML: %w; fix it (kubectl -n %s edit addons.harvesterhci.io %s) and run again", a.Namespace, a.Name, err, a.Namespace, a.Name)
	}
	return v, nil
}

// lookup is the value at path (map keys, or a number for a list index as "0"), and
// whether it is there and not null (yq's "null").
func (v addonValues) lookup(path ...string) (any, bool) {
	var cur any = map[string]any(v)
	for _, p := range path {
		switch node := cur.(type) {
		case map[string]any:
			cur = node[p]
		case []any:
			var i int
			if _, err := fmt.Sscanf(p, "%d", &i); err != nil || i < 0 || i >= len(node) {
				return nil, false
			}
			cur = node[i]
		default:
			return nil, false
		}
	}
	return cur, cur != nil
}

// child is the map at key of m, made when missing or not a map (as yq's assignment does).
func child(m map[string]any, key string) map[string]any {
	c, ok := m[key].(map[string]any)
	if !ok {
		c = map[string]any{}
		m[key] = c
	}
	return c
}

func (v addonValues) render() (string, error) {
	raw, err := yaml.Marshal(map[string]any(v))
	return string(raw), err
}

// upgradeMonitoringAddon brings rancher-monitoring to the release's monitoring chart:
// rancherMonitoring.enabled false and kube-state-metrics.metricLabelsAllowlist ["nodes=[*]"]
// are added where the values lack them (what v1.7.0 introduced), the rest of the values
// kept, and the version set.
func (r *runner) upgradeMonitoringAddon(ctx context.Context) (string, string, error) {
	return r.editAddon(ctx, monitoringAddon, r.in.MonitoringChartVersion, "monitoringChart", func(v addonValues) (bool, error) {
		changed := false
		if _, ok := v.lookup("rancherMonitoring", "enabled"); !ok {
			child(v, "rancherMonitoring")["enabled"] = false
			changed = true
		}
		if _, ok := v.lookup("kube-state-metrics", "metricLabelsAllowlist"); !ok {
			child(v, "kube-state-metrics")["metricLabelsAllowlist"] = []any{"nodes=[*]"}
			changed = true
		}
		return changed, nil
	})
}

// upgradeLoggingAddon brings rancher-logging to the release's logging chart, and, when
// its values name an eventrouter image (eventTailer.workloadOverrides.containers[0].image),
// sets it to the release's (its image tag follows Harvester's).
func (r *runner) upgradeLoggingAddon(ctx context.Context) (string, string, error) {
	return r.editAddon(ctx, loggingAddon, r.in.LoggingChartVersion, "loggingChart", func(v addonValues) (bool, error) {
		image, ok := v.lookup("eventTailer", "workloadOverrides", "containers", "0", "image")
		if !ok || r.in.LoggingEventRouterImage == "" || image == r.in.LoggingEventRouterImage {
			return false, nil
		}
		containers, _ := v.lookup("eventTailer", "workloadOverrides", "containers")
		first, isMap := containers.([]any)[0].(map[string]any)
		if !isMap {
			return false, fmt.Errorf("eventTailer.workloadOverrides.containers[0] of add-on %s is not an object", loggingAddon)
		}
		first["image"] = r.in.LoggingEventRouterImage
		return true, nil
	})
}

// editAddon sets the add-on at key to version with its values edited by edit, in one
// merge patch; an add-on already there is named as kept, a missing one left. An empty
// version (the release names none) leaves the add-on. After changing an add-on that was
// enabled and deployed it waits for it to be deployed again, as the script does
// (addonwait.go), and says how that ended, or why it did not wait.
func (r *runner) editAddon(ctx context.Context, key client.ObjectKey, version, field string, edit func(addonValues) (bool, error)) (string, string, error) {
	if version == "" {
		return "", fmt.Sprintf("%s left (the release metadata names no %s)", key.Name, field), nil
	}
	a := &harvesterapi.Addon{}
	if err := r.c.Get(ctx, key, a); apierrors.IsNotFound(err) {
		return "", fmt.Sprintf("%s not installed, nothing to bring", key.Name), nil
	} else if err != nil {
		return "", "", fmt.Errorf("read add-on %s: %w", key, err)
	}
	values, err := parseAddonValues(a)
	if err != nil {
		return "", "", err
	}
	changed, err := edit(values)
	if err != nil {
		return "", "", err
	}
	content := a.Spec.ValuesContent
	if changed {
		if content, err = values.render(); err != nil {
			return "", "", err
		}
	}
	if a.Spec.Version == version && content == a.Spec.ValuesContent {
		return "", fmt.Sprintf("%s at %s", key.Name, version), nil
	}
	wait, note := addonWaitAfterChange(a)
	did, kept, err := r.patchAddon(ctx, a, version, content)
	if err != nil {
		return "", "", err
	}
	if changed {
		did += " with its values edited as the release does"
	}
	if wait {
		if note, err = r.waitAddonRedeployed(ctx, key); err != nil {
			return "", "", err
		}
	}
	return did + " (" + note + ")", kept, nil
}

// upgradeNvidiaAddon is upgrade_addon of nvidia-driver-toolkit with the release's file,
// whose driver location placeholder is replaced by the driverLocation the add-on on the
// cluster has, when it has one. os.ErrNotExist when the release ships no file for it.
func (r *runner) upgradeNvidiaAddon(ctx context.Context) (string, string, error) {
	want, err := readAddon(filepath.Join(r.in.ReleaseFiles, addonsDir, nvidiaAddon.Name+".yaml"))
	if err != nil {
		return "", "", err
	}
	cur := &harvesterapi.Addon{}
	switch err := r.c.Get(ctx, nvidiaAddon, cur); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", "", fmt.Errorf("read add-on %s: %w", nvidiaAddon, err)
	default:
		values, err := parseAddonValues(cur)
		if err != nil {
			return "", "", err
		}
		if loc, ok := values.lookup("driverLocation"); ok {
			want.Spec.ValuesContent = strings.ReplaceAll(want.Spec.ValuesContent, nvidiaDriverPlaceholder, fmt.Sprint(loc))
		}
	}
	return r.bringAddon(ctx, nvidiaAddon, want)
}

// kube-ovn (lib.sh manage_kubeovn, v1.7.0 to v1.8.2): the ManagedChart
// fleet-local/kubeovn-operator-crd at the version of the release's kubeovn-operator add-on
// file, a bounded wait for it to be ready, then the add-on kube-system/kubeovn-operator at
// that version (its values kept), or installed from the file when missing.
var (
	kubeOVNAddon    = client.ObjectKey{Namespace: "kube-system", Name: "kubeovn-operator"}
	kubeOVNCRDChart = client.ObjectKey{Namespace: "fleet-local", Name: "kubeovn-operator-crd"}
)

// kubeOVNChartReadyWait bounds the wait for kubeovn-operator-crd to be ready: the script
// looks 30 times, 2 s apart, and goes on.
const kubeOVNChartReadyWait = 60 * time.Second

// upgradeKubeOVN is manage_kubeovn (see above); os.ErrNotExist when the release ships no
// kubeovn-operator add-on file.
func (r *runner) upgradeKubeOVN(ctx context.Context) (string, string, error) {
	want, err := readAddon(filepath.Join(r.in.ReleaseFiles, addonsDir, kubeOVNAddon.Name+".yaml"))
	if err != nil {
		return "", "", err
	}
	version := want.Spec.Version
	var did []string
	chart := &unstructured.Unstructured{}
	chart.SetGroupVersionKind(managementv3.GroupVersion.WithKind("ManagedChart"))
	spec := map[string]any{
		"chart": kubeOVNCRDChart.Name, "releaseName": kubeOVNCRDChart.Name, "version": version,
		"defaultNamespace": "kube-system", "repoName": rancher.HarvesterChartsRepo, "timeoutSeconds": int64(600),
		"targets": []any{map[string]any{
			"clusterName": rancher.LocalCluster,
			"clusterSelector": map[string]any{"matchExpressions": []any{map[string]any{
				"key": "provisioning.cattle.io/unmanaged-system-agent", "operator": "DoesNotExist",
			}}},
		}},
	}
	err = r.c.Get(ctx, kubeOVNCRDChart, chart)
	if apierrors.IsNotFound(err) {
		created := chart.DeepCopy()
		created.SetNamespace(kubeOVNCRDChart.Namespace)
		created.SetName(kubeOVNCRDChart.Name)
		created.Object["spec"] = spec
		switch err = r.c.Create(ctx, created); {
		case err == nil:
			did = append(did, fmt.Sprintf("ManagedChart %s created at %s", kubeOVNCRDChart.Name, version))
		case apierrors.IsAlreadyExists(err):
			// Created by someone else between the read and the create (the pod of a plan
			// deleted a moment before; the release's kubectl apply does not mind either):
			// brought to the version as one that exists.
			err = r.c.Get(ctx, kubeOVNCRDChart, chart)
		default:
			return "", "", fmt.Errorf("create ManagedChart %s at %s: %w", kubeOVNCRDChart, version, err)
		}
	}
	switch {
	case err != nil:
		return "", "", fmt.Errorf("read ManagedChart %s: %w", kubeOVNCRDChart, err)
	case len(did) > 0: // created above
	default:
		if cur, _, _ := unstructured.NestedString(chart.Object, "spec", "version"); cur != version {
			patch, err := json.Marshal(map[string]any{"spec": spec})
			if err != nil {
				return "", "", err
			}
			if err := r.c.Patch(ctx, chart, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return "", "", fmt.Errorf("set ManagedChart %s to %s: %w", kubeOVNCRDChart, version, err)
			}
			did = append(did, fmt.Sprintf("ManagedChart %s %s (was %s)", kubeOVNCRDChart.Name, version, cur))
		}
	}
	ready, err := r.kubeOVNChartReady(ctx)
	if err != nil {
		return "", "", err
	}
	a := &harvesterapi.Addon{}
	switch err := r.c.Get(ctx, kubeOVNAddon, a); {
	case apierrors.IsNotFound(err):
		d, _, err := r.bringAddon(ctx, kubeOVNAddon, want)
		if err != nil {
			return "", "", err
		}
		did = append(did, d)
	case err != nil:
		return "", "", fmt.Errorf("read add-on %s: %w", kubeOVNAddon, err)
	case a.Spec.Version != version:
		d, _, err := r.patchAddon(ctx, a, version, a.Spec.ValuesContent)
		if err != nil {
			return "", "", err
		}
		did = append(did, d)
	}
	if len(did) == 0 {
		return "", fmt.Sprintf("%s and ManagedChart %s at %s", kubeOVNAddon.Name, kubeOVNCRDChart.Name, version), nil
	}
	return strings.Join(did, ", ") + " (" + ready + ")", "", nil
}

// kubeOVNChartReady waits at most kubeOVNChartReadyWait for kubeovn-operator-crd to count
// a ready deployment (wait_managedchart_ready) and says what it saw; it never fails on it.
func (r *runner) kubeOVNChartReady(ctx context.Context) (string, error) {
	ready, _, err := r.pollBounded(ctx, kubeOVNChartReadyWait, func(ctx context.Context) (bool, string, error) {
		mc := &managementv3.ManagedChart{}
		if err := r.c.Get(ctx, kubeOVNCRDChart, mc); err != nil {
			return false, "", fmt.Errorf("read ManagedChart %s: %w", kubeOVNCRDChart, err)
		}
		return mc.Status.Summary.Ready > 0, "", nil
	})
	switch {
	case err != nil:
		return "", err
	case ready:
		return kubeOVNCRDChart.Name + " ready", nil
	}
	return fmt.Sprintf("%s not ready after %s, gone on as the release's script does", kubeOVNCRDChart.Name, kubeOVNChartReadyWait), nil
}
