package sim

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
)

// HarvesterAddons plays Harvester's add-on controller (harvester/harvester
// pkg/controller/master/addon at v1.8.2: addon.go MonitorAddonPerStatus, addon_processing.go,
// common.go) and, for the HelmCharts it makes, RKE2's helm-controller, on every Addon of the
// cluster. One step per Addon and pass, as each of the controller's handlers returns after
// one status write:
//
//   - enabled, status none or AddonDisabled (processEnableAddon): the InProgress condition
//     first, then the HelmChart <namespace>/<name>, owned by the Addon, with its chart, repo,
//     version and values (deployHelmChart; defaultValues: spec.valuesContent, else the
//     harvesterhci.io/addon-defaults annotation), and AddonEnabling. A HelmChart of that name
//     the Addon does not own blocks it, as there;
//   - AddonEnabling or AddonUpdating (processEnablingAddon, reconcileCurrentInstallationJob):
//     nothing while OperationFailed is True (the controller leaves a failed add-on until
//     someone disables it); once the helm-install Job of the HelmChart's current spec ended,
//     JobDelay after the simulator first saw that spec: succeeded, the Completed condition and
//     AddonDeploySuccessful; failed (FailAddon), OperationFailed True with "addon deployment
//     job helm-install-<name> failed" and the status left as it is, so such an add-on never
//     reports AddonDeploySuccessful again. A held add-on's Job (HoldAddon) does not end;
//   - AddonDeploySuccessful (processAddonUpgrades): when the HelmChart's chart, repo, version
//     or values differ from the Addon's (isHelmchartUpdateNeeded), first the InProgress
//     condition alone, the status still AddonDeploySuccessful, then, on the next pass, the
//     HelmChart updated and AddonUpdating. A missing HelmChart is created again;
//   - disabled (processDisabledAddons, waitForAddonDisable): AddonDisabling, the HelmChart
//     deleted (helm-controller's uninstall is immediate here: no finalizer, no helm-delete
//     Job), then the Completed condition and AddonDisabled.
//
// A HelmChart whose owning Addon is gone is deleted, as the garbage collector does. The
// rancher-monitoring add-on's Grafana volume handler (patch_grafana.go) is not played.
//
// Time is real time; the simulator looks at the cluster every Interval, or, with Cache, on
// the events of Addons and HelmCharts and when a Job's end is due (passLoop).
type HarvesterAddons struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Cache, when set, is a started cache of the workload cluster whose Addon and HelmChart
	// events start the passes. Reads still go to Client.
	Cache ctrlcache.Cache
	// JobDelay is how long a helm-install Job takes. Default 100ms.
	JobDelay time.Duration
	// Interval is how often the cluster is looked at: without Cache, default 20ms; with it,
	// when no event came, default 1s.
	Interval time.Duration

	loop  passLoop
	mu    sync.Mutex
	fails map[client.ObjectKey]string // add-on -> the chart version whose Job fails ("" every one)
	held  map[client.ObjectKey]bool
	seen  map[string]time.Time // a HelmChart spec (uid/generation) -> when its Job started
}

// Start plays the add-on controller until ctx ends.
func (h *HarvesterAddons) Start(ctx context.Context) {
	hc := &unstructured.Unstructured{}
	hc.SetGroupVersionKind(HelmChartGVK)
	go h.loop.run(ctx, h.Interval, h.Cache, []client.Object{&harvesterapi.Addon{}, hc}, func(ctx context.Context) { _ = h.pass(ctx) })
}

// FailAddon makes the helm-install Jobs of the add-on at key fail when they install version
// (any version when empty), from its next Job on: the add-on then stays AddonEnabling or
// AddonUpdating with OperationFailed True.
func (h *HarvesterAddons) FailAddon(key client.ObjectKey, version string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fails == nil {
		h.fails = map[client.ObjectKey]string{}
	}
	h.fails[key] = version
	h.loop.wake()
}

// HoldAddon keeps the helm-install Jobs of the add-on at key running until UnholdAddon.
func (h *HarvesterAddons) HoldAddon(key client.ObjectKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = map[client.ObjectKey]bool{}
	}
	h.held[key] = true
}

// UnholdAddon lets the add-on's Jobs end (JobDelay after they started, or now).
func (h *HarvesterAddons) UnholdAddon(key client.ObjectKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.held, key)
	h.loop.wake()
}

// jobEnded says whether the helm-install Job of hc's current spec has ended, and whether it
// failed.
func (h *HarvesterAddons) jobEnded(key client.ObjectKey, hc *unstructured.Unstructured) (ended, failed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[string]time.Time{}
	}
	job := fmt.Sprintf("%s/%d", hc.GetUID(), hc.GetGeneration())
	started, ok := h.seen[job]
	if !ok {
		started = time.Now()
		h.seen[job] = started
	}
	if h.held[key] {
		return false, false
	}
	if end := started.Add(orDefault(h.JobDelay, 100*time.Millisecond)); time.Now().Before(end) {
		h.loop.dueAt(end)
		return false, false
	}
	version, fails := h.fails[key]
	chartVersion, _, _ := unstructured.NestedString(hc.Object, "spec", "version")
	return true, fails && (version == "" || version == chartVersion)
}

func (h *HarvesterAddons) pass(ctx context.Context) error {
	list := &harvesterapi.AddonList{}
	if err := h.Client.List(ctx, list); err != nil {
		return err
	}
	errs := []error{h.collectGarbage(ctx, list.Items)}
	for i := range list.Items {
		a := &list.Items[i]
		if a.DeletionTimestamp != nil {
			continue
		}
		wrote, err := h.reconcile(ctx, a)
		errs = append(errs, err)
		if wrote {
			h.loop.wake() // the controller's own write is its next event
		}
	}
	return errors.Join(errs...)
}

// reconcile is MonitorAddonPerStatus for one Addon: one step, and whether it wrote.
func (h *HarvesterAddons) reconcile(ctx context.Context, a *harvesterapi.Addon) (bool, error) {
	hc, owned, err := h.helmChart(ctx, a)
	if err != nil {
		return false, err
	}
	if !a.Spec.Enabled {
		return h.disable(ctx, a, hc, owned)
	}
	switch a.Status.Status {
	case "", harvesterapi.AddonDisabled: // processEnableAddon
		if hc != nil && (!owned || hc.GetDeletionTimestamp() != nil) {
			return false, nil // wait for the other chart to go
		}
		if !a.Status.IsTrue(harvesterapi.AddonOperationInProgress) {
			markAddonInProgress(a)
			return true, h.Client.Status().Update(ctx, a)
		}
		if hc == nil {
			if err := h.Client.Create(ctx, addonHelmChart(a)); err != nil {
				return false, err
			}
		}
		a.Status.Status = harvesterapi.AddonEnabling
		return true, h.Client.Status().Update(ctx, a)
	case harvesterapi.AddonEnabling, harvesterapi.AddonUpdating: // processEnablingAddon
		if a.Status.IsTrue(harvesterapi.AddonOperationFailed) {
			return false, nil
		}
		if hc == nil {
			markAddonCondition(a, harvesterapi.AddonOperationCompleted, "")
			a.Status.Status = harvesterapi.AddonDisabled
			return true, h.Client.Status().Update(ctx, a)
		}
		ended, failed := h.jobEnded(client.ObjectKeyFromObject(a), hc)
		switch {
		case !ended:
			return false, nil
		case failed:
			markAddonCondition(a, harvesterapi.AddonOperationFailed, fmt.Sprintf("addon deployment job helm-install-%s failed", hc.GetName()))
		default:
			markAddonCondition(a, harvesterapi.AddonOperationCompleted, "")
			a.Status.Status = harvesterapi.AddonDeployed
		}
		return true, h.Client.Status().Update(ctx, a)
	case harvesterapi.AddonDeployed: // processAddonUpgrades
		if hc == nil {
			return true, h.Client.Create(ctx, addonHelmChart(a))
		}
		want := addonHelmChart(a)
		if helmChartSpec(hc) == helmChartSpec(want) {
			return false, nil
		}
		if !a.Status.IsTrue(harvesterapi.AddonOperationInProgress) {
			markAddonInProgress(a)
			return true, h.Client.Status().Update(ctx, a)
		}
		for _, f := range []string{"chart", "repo", "version", "valuesContent"} {
			v, _, _ := unstructured.NestedString(want.Object, "spec", f)
			if err := unstructured.SetNestedField(hc.Object, v, "spec", f); err != nil {
				return false, err
			}
		}
		if err := h.Client.Update(ctx, hc); err != nil {
			return false, err
		}
		a.Status.Status = harvesterapi.AddonUpdating
		return true, h.Client.Status().Update(ctx, a)
	}
	return false, nil
}

// disable is processDisabledAddons and waitForAddonDisable.
func (h *HarvesterAddons) disable(ctx context.Context, a *harvesterapi.Addon, hc *unstructured.Unstructured, owned bool) (bool, error) {
	switch {
	case a.Status.Status == harvesterapi.AddonDisabled:
		return false, nil
	case a.Status.Status != harvesterapi.AddonDisabling && a.Status.IsTrue(harvesterapi.AddonOperationInProgress):
		return false, nil // the last operation's Job is still running
	case a.Status.Status != harvesterapi.AddonDisabling:
		a.Status.Status = harvesterapi.AddonDisabling
		return true, h.Client.Status().Update(ctx, a)
	case hc == nil:
		markAddonCondition(a, harvesterapi.AddonOperationCompleted, "")
		a.Status.Status = harvesterapi.AddonDisabled
		return true, h.Client.Status().Update(ctx, a)
	case !owned:
		if a.Status.IsTrue(harvesterapi.AddonOperationFailed) {
			return false, nil
		}
		markAddonCondition(a, harvesterapi.AddonOperationFailed, fmt.Sprintf("helmChart %s exists and is now owned by Addon %s. cannot proceed further", hc.GetName(), a.Name))
		return true, h.Client.Status().Update(ctx, a)
	}
	return true, client.IgnoreNotFound(h.Client.Delete(ctx, hc))
}

// helmChart is getAddonHelmChart: the HelmChart of the Addon's namespace and name, nil
// when there is none, and whether the Addon owns it.
func (h *HarvesterAddons) helmChart(ctx context.Context, a *harvesterapi.Addon) (*unstructured.Unstructured, bool, error) {
	hc := &unstructured.Unstructured{}
	hc.SetGroupVersionKind(HelmChartGVK)
	if err := h.Client.Get(ctx, client.ObjectKeyFromObject(a), hc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	for _, o := range hc.GetOwnerReferences() {
		if o.Kind == "Addon" && o.UID == a.UID && o.Name == a.Name {
			return hc, true, nil
		}
	}
	return hc, false, nil
}

// collectGarbage deletes the HelmCharts an Addon owned that is gone.
func (h *HarvesterAddons) collectGarbage(ctx context.Context, addons []harvesterapi.Addon) error {
	charts := &unstructured.UnstructuredList{}
	charts.SetGroupVersionKind(HelmChartGVK.GroupVersion().WithKind("HelmChartList"))
	if err := h.Client.List(ctx, charts); err != nil {
		return err
	}
	live := map[string]bool{}
	for _, a := range addons {
		live[string(a.UID)] = true
	}
	var errs []error
	for i := range charts.Items {
		hc := &charts.Items[i]
		for _, o := range hc.GetOwnerReferences() {
			if o.Kind == "Addon" && !live[string(o.UID)] && hc.GetDeletionTimestamp() == nil {
				errs = append(errs, client.IgnoreNotFound(h.Client.Delete(ctx, hc)))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// addonHelmChartValues is what the add-on controller puts into the HelmChart's
// valuesContent (defaultValues): the Addon's valuesContent, else its
// harvesterhci.io/addon-defaults annotation (base64), else nothing.
func addonHelmChartValues(a *harvesterapi.Addon) string {
	if a.Spec.ValuesContent != "" {
		return a.Spec.ValuesContent
	}
	if raw, err := base64.StdEncoding.DecodeString(a.Annotations["harvesterhci.io/addon-defaults"]); err == nil {
		return string(raw)
	}
	return ""
}

// addonHelmChart is the HelmChart deployHelmChart makes of a.
func addonHelmChart(a *harvesterapi.Addon) *unstructured.Unstructured {
	hc := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"chart": a.Spec.Chart, "repo": a.Spec.Repo, "version": a.Spec.Version,
		"valuesContent": addonHelmChartValues(a), "backOffLimit": int64(5),
	}}}
	hc.SetGroupVersionKind(HelmChartGVK)
	hc.SetNamespace(a.Namespace)
	hc.SetName(a.Name)
	hc.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: harvesterapi.GroupVersion.String(), Kind: "Addon", Name: a.Name, UID: a.UID}})
	return hc
}

// helmChartSpec is what isHelmchartUpdateNeeded compares of a HelmChart.
func helmChartSpec(hc *unstructured.Unstructured) [4]string {
	var out [4]string
	for i, f := range []string{"chart", "repo", "version", "valuesContent"} {
		out[i], _, _ = unstructured.NestedString(hc.Object, "spec", f)
	}
	return out
}

// markAddonInProgress is markInProgressCondition: InProgress True (its time the
// operation's start), Completed and OperationFailed False.
func markAddonInProgress(a *harvesterapi.Addon) {
	markAddonCondition(a, harvesterapi.AddonOperationInProgress, "")
}

// markAddonCondition sets the condition of type t True (with message) and the other two of
// InProgress, Completed and OperationFailed False, as markInProgressCondition,
// markCompletedCondition and markErrorCondition do.
func markAddonCondition(a *harvesterapi.Addon, t, message string) {
	now := time.Now().UTC().Format(time.RFC3339)
	for _, ct := range []string{harvesterapi.AddonOperationInProgress, harvesterapi.AddonOperationCompleted, harvesterapi.AddonOperationFailed} {
		c := a.Status.Condition(ct)
		if c == nil {
			a.Status.Conditions = append(a.Status.Conditions, harvesterapi.SettingCondition{Type: ct})
			c = &a.Status.Conditions[len(a.Status.Conditions)-1]
		}
		status := corev1.ConditionFalse
		if ct == t {
			status = corev1.ConditionTrue
		}
		if c.Status != status {
			c.LastTransitionTime = now
		}
		c.Status = status
		c.Message, c.Reason = "", ""
		if ct == t {
			c.LastUpdateTime = now
			if message != "" && ct == harvesterapi.AddonOperationFailed {
				c.Reason, c.Message = "Error", message
			}
		}
	}
}
