package clusterupgrade

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// upgradeChart brings the ManagedChart key to the release's Harvester chart version
// (fact 41.13) and waits as wait_managed_chart does (fact 42).
//
// It is done, without a write, when the chart is already at the version, not paused,
// reconciled at its generation and ready. When an earlier run of this upgrade patched it
// (its last-upgrade-name is this plan and FromGenerationAnnotation is set) it only waits
// again, from the generation that run recorded. Otherwise it patches: spec.version,
// paused false, timeoutSeconds bumped so that the generation changes even when nothing
// else does (fact 41.13), Harvester's last-upgrade annotations and the generation it
// starts from; for the harvester chart, the values the release's script adds too
// (harvesterChartValues, fact 23.2).
func (r *runner) upgradeChart(ctx context.Context, key client.ObjectKey, target string) (StepState, string, error) {
	name := stepOfChart(key)
	mc := &managementv3.ManagedChart{}
	if err := r.c.Get(ctx, key, mc); err != nil {
		return "", "", fmt.Errorf("read ManagedChart %s: %w", key, err)
	}
	if mc.Spec.Version == target && mc.Status.ObservedGeneration == mc.Generation {
		if ok, _ := chartReady(mc); ok && !mc.Spec.Paused {
			return r.already(name, fmt.Sprintf("ManagedChart %s is already at %s and ready", key, target), r.ours(mc))
		} else if ok {
			// Paused for the roll by PauseCharts, at the release already: un-paused, as
			// the script un-pauses each chart it upgrades (fact 23.3), without a redeploy.
			if err := r.setPaused(ctx, mc, false); err != nil {
				return "", "", err
			}
			return r.already(name, fmt.Sprintf("ManagedChart %s is already at %s and ready; un-paused", key, target), r.ours(mc))
		}
	}
	from, resumed, valuesNote := int64(0), false, ""
	if mc.Spec.Version == target && !mc.Spec.Paused && mc.Annotations[lastUpgradeNameAnnotation] == r.in.Plan {
		if g, err := strconv.ParseInt(mc.Annotations[FromGenerationAnnotation], 10, 64); err == nil && g < mc.Generation {
			from, resumed = g, true
		}
	}
	if !resumed {
		from = mc.Generation
		before := mc.DeepCopy()
		if mc.Annotations == nil {
			mc.Annotations = map[string]string{}
		}
		mc.Annotations[lastUpgradeNameAnnotation] = r.in.Plan
		mc.Annotations[lastUpgradeTargetAnnotation] = target
		mc.Annotations[lastUpgradeTimeAnnotation] = r.in.Clock.Now().UTC().Format(time.RFC3339)
		mc.Annotations[FromGenerationAnnotation] = strconv.FormatInt(from, 10)
		mc.Spec.Version = target
		mc.Spec.Paused = false
		mc.Spec.TimeoutSeconds = bumpTimeout(mc.Spec.TimeoutSeconds)
		if key == harvesterChart {
			changed, err := r.harvesterChartValues(ctx, mc)
			if err != nil {
				return "", "", err
			}
			for _, c := range changed {
				r.logf("ManagedChart %s: value %s", key, c)
			}
			valuesNote = strings.Join(changed, ", ")
		}
		if err := r.c.Patch(ctx, mc, client.MergeFrom(before)); err != nil {
			return "", "", fmt.Errorf("set ManagedChart %s to version %s: %w", key, target, err)
		}
		if mc.Generation <= from {
			return "", "", fmt.Errorf("ManagedChart %s: the patch to version %s left its generation at %d; the API server did not take the change", key, target, mc.Generation)
		}
		r.logf("ManagedChart %s: version %s, generation %d -> %d", key, target, from, mc.Generation)
	}
	if err := r.waitChart(ctx, key, target, from); err != nil {
		return "", "", err
	}
	message := fmt.Sprintf("ManagedChart %s is at %s and ready", key, target)
	if valuesNote != "" {
		message += "; values set: " + valuesNote
	}
	return StateDone, message, nil
}

func stepOfChart(key client.ObjectKey) string {
	switch key.Name {
	case rancher.HarvesterCRDChart:
		return StepUpgradeHarvesterCRDChart
	case rancher.MonitoringCRDChart:
		return StepUpgradeMonitoringCRDChart
	case rancher.LoggingCRDChart:
		return StepUpgradeLoggingCRDChart
	}
	return StepUpgradeHarvesterChart
}

// upgradeAddonCRDChart is upgrade_monitoring or upgrade_logging_event_audit (fact 27):
// since Harvester v1.2 only the CRD chart, brought to the release's chart version as
// the harvester charts are; the release's metadata naming none leaves it as it is.
func (r *runner) upgradeAddonCRDChart(ctx context.Context, chart, target, field string) (StepState, string, error) {
	if target == "" {
		return StateSkipped, fmt.Sprintf("the release metadata names no %s: ManagedChart %s/%s left as it is", field, rancher.FleetLocal, chart), nil
	}
	return r.upgradeChart(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: chart}, target)
}

// bumpTimeout is the script's timeoutSeconds change: the current value plus one, 599 taken
// for unset, and back to 600 once above 800 (fact 41.13). It always differs from cur.
func bumpTimeout(cur int) int {
	if cur == 0 {
		cur = 599
	}
	next := cur + 1
	if next > 800 {
		next = 600
	}
	return next
}

// waitChart is wait_managed_chart (fact 42): spec.version is the target, Rancher has
// reconciled a generation after from, and the bundle is ready with nothing unavailable.
// A chart whose apply failed (summary.errApplied > 0 on a generation after from, which
// Fleet reports with Ready False and Helm's error as the message) for ChartFailAfter
// fails the wait with that message; Fleet retries Helm meanwhile, so a passing error
// does not fail the upgrade.
func (r *runner) waitChart(ctx context.Context, key client.ObjectKey, target string, from int64) error {
	var failingSince time.Time
	return r.poll(ctx, fmt.Sprintf("ManagedChart %s at %s to be deployed and ready (observedGeneration after %d)", key, target, from),
		"Fleet deploys it; look at the chart's status and its bundle (kubectl -n fleet-local get managedchart,bundles -o yaml)",
		func(ctx context.Context) (bool, string, error) {
			mc := &managementv3.ManagedChart{}
			if err := r.c.Get(ctx, key, mc); err != nil {
				return false, "", fmt.Errorf("read ManagedChart %s: %w", key, err)
			}
			if mc.Spec.Version != target {
				return false, "", fmt.Errorf("ManagedChart %s: spec.version is %s, not %s as the upgrade set it: someone else changed it; find out who and run the upgrade again", key, mc.Spec.Version, target)
			}
			if mc.Status.ObservedGeneration <= from {
				return false, fmt.Sprintf("observedGeneration %d, waiting for Rancher to reconcile generation %d", mc.Status.ObservedGeneration, mc.Generation), nil
			}
			if msg, failed := chartFailed(mc); failed {
				now := r.in.Clock.Now()
				if failingSince.IsZero() {
					failingSince = now
				}
				if now.Sub(failingSince) >= r.in.ChartFailAfter {
					return false, "", fmt.Errorf("ManagedChart %s failed to deploy version %s for %s: %s; fix the cause (kubectl -n fleet-local get bundles; helm -n <namespace> history), then run the upgrade again", key, target, r.in.ChartFailAfter, msg)
				}
				return false, "apply failed, Fleet retries: " + msg, nil
			}
			failingSince = time.Time{}
			ready, msg := chartReady(mc)
			return ready, msg, nil
		})
}

// chartReady says whether a ManagedChart's bundle is deployed and ready: at least one
// ready deployment, as many as desired, none unavailable (fact 42).
func chartReady(mc *managementv3.ManagedChart) (bool, string) {
	s := mc.Status.Summary
	if s.Ready >= 1 && s.Ready >= s.DesiredReady && mc.Status.Unavailable == 0 {
		return true, "ready"
	}
	msg := fmt.Sprintf("%d of %d ready, %d unavailable", s.Ready, s.DesiredReady, mc.Status.Unavailable)
	if c := condition(mc.Status.Conditions, "Ready"); c != nil && c.Status != corev1.ConditionTrue && c.Message != "" {
		msg += ": " + c.Message
	}
	return false, msg
}

// chartFailed says whether Fleet reports the chart's apply as failed, and its message.
func chartFailed(mc *managementv3.ManagedChart) (string, bool) {
	if mc.Status.Summary.ErrApplied == 0 {
		return "", false
	}
	msg := fmt.Sprintf("%d deployment(s) in ErrApplied", mc.Status.Summary.ErrApplied)
	if c := condition(mc.Status.Conditions, "Ready"); c != nil && c.Message != "" {
		msg = c.Message
	}
	return msg, true
}

// ManagedChartsReady says whether every ManagedChart in fleet-local is reconciled at its
// generation and ready (what Harvester's upgrade webhook requires before an upgrade, fact
// 47), and if not, which are not and why.
func ManagedChartsReady(ctx context.Context, c client.Client) (ok bool, message string, err error) {
	list := &managementv3.ManagedChartList{}
	if err := c.List(ctx, list, client.InNamespace(rancher.FleetLocal)); err != nil {
		return false, "", fmt.Errorf("list the ManagedCharts in %s: %w", rancher.FleetLocal, err)
	}
	var problems []string
	for i := range list.Items {
		mc := &list.Items[i]
		switch ready, msg := chartReady(mc); {
		case mc.Status.ObservedGeneration != mc.Generation:
			problems = append(problems, fmt.Sprintf("%s: generation %d not yet reconciled (observed %d)", mc.Name, mc.Generation, mc.Status.ObservedGeneration))
		case !ready:
			problems = append(problems, fmt.Sprintf("%s: %s", mc.Name, msg))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return false, "ManagedCharts in fleet-local not ready: " + strings.Join(problems, "; "), nil
	}
	return true, fmt.Sprintf("all %d ManagedCharts in fleet-local are ready", len(list.Items)), nil
}
