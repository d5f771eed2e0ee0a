package clusterupgrade

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// runner is one Run: its input, where it reports, and what earlier runs recorded.
type runner struct {
	c  client.Client
	in Input
	p  Progress
	// prior is the progress an earlier run left; current what this run recorded.
	prior   map[string]StepProgress
	current map[string]StepProgress
}

// step is one sub-step. It returns StateDone or StateSkipped with a message saying what
// it found or did, or an error.
type step struct {
	name string
	run  func(r *runner, ctx context.Context) (StepState, string, error)
}

func steps() []step {
	return []step{
		{StepPatchMultusFailurePolicy, (*runner).patchMultusFailurePolicy},
		{StepPreserveOvercommitConfig, (*runner).preserveOvercommitConfig},
		{StepPauseCharts, (*runner).pauseCharts},
		{StepDisableKubeVirtWorkloadUpdates, (*runner).disableKubeVirtWorkloadUpdates},
		{StepCleanCAPILegacyWebhooks, (*runner).cleanCAPILegacyWebhooks},
		{StepUpgradeRancher, (*runner).upgradeRancher},
		{StepWaitRancherDependencies, (*runner).waitRancherDependencies},
		{StepSettleFleetAgent, (*runner).settleFleetAgent},
		{StepPatchLocalClusterDetails, (*runner).patchLocalClusterDetails},
		{StepUpdateLocalRKEStateSecret, (*runner).updateLocalRKEStateSecret},
		{StepMigrateLonghornV1beta1CRDs, (*runner).migrateLonghornV1beta1CRDs},
		{StepUpgradeClusterRepo, (*runner).upgradeClusterRepo},
		{StepRefreshHarvesterCharts, (*runner).refreshHarvesterCharts},
		{StepEnsureIngressClassName, (*runner).ensureIngressClassName},
		{StepApplyExtraManifests, (*runner).applyExtraManifests},
		{StepUpgradeHarvesterCRDChart, func(r *runner, ctx context.Context) (StepState, string, error) {
			return r.upgradeChart(ctx, harvesterCRDChart, r.in.HarvesterChartVersion)
		}},
		{StepUpgradeHarvesterChart, func(r *runner, ctx context.Context) (StepState, string, error) {
			return r.upgradeChart(ctx, harvesterChart, r.in.HarvesterChartVersion)
		}},
		{StepWaitKubeVirt, (*runner).waitKubeVirt},
		{StepSyncContainerdRegistry, (*runner).syncContainerdRegistry},
		{StepWaitLonghorn, (*runner).waitLonghorn},
		{StepUpgradeMonitoringCRDChart, func(r *runner, ctx context.Context) (StepState, string, error) {
			return r.upgradeAddonCRDChart(ctx, rancher.MonitoringCRDChart, r.in.MonitoringChartVersion, "monitoringChart")
		}},
		{StepUpgradeLoggingCRDChart, func(r *runner, ctx context.Context) (StepState, string, error) {
			return r.upgradeAddonCRDChart(ctx, rancher.LoggingCRDChart, r.in.LoggingChartVersion, "loggingChart")
		}},
		{StepUpgradeAddons, (*runner).upgradeAddons},
		{StepWaitFleetBundles, (*runner).waitFleetBundles},
	}
}

// Run upgrades the cluster-level parts of a Harvester cluster to the release in, as
// Harvester's upgrade_manifests.sh does (shared/facts/harvester-node-upgrade.md, fact 41),
// in the sub-steps of StepNames, recording each one's state in the ConfigMap p names. A
// sub-step whose work is already done (by an earlier run, or before the upgrade) is not
// done again. The error names the sub-step, the object, what was expected and what to do.
//
// Of the script (harvester-release-steps.md section B) it does: rke2-multus's failure
// policy abort (fact 9), for a hop from v1.7 preserve_overcommit_config (fact 10),
// pause_all_charts (fact 11; the paused value recorded, see roll.go), KubeVirt's
// workloadUpdateMethods emptied in the harvester chart (fact 13, recorded), for a hop
// from v1.7 clean_capi_legacy_webhooks (fact 16.8, deleting only webhooks that call the
// legacy CAPI), the Rancher upgrade (fact 16: helm upgrade with the chart and helm of
// Rancher's installer image and the release's values and features, facts 41 and 42,
// rancherchart.go) with wait_capi_cluster before it (16.3: the Cluster API Cluster
// fleet-local/local Provisioned, as the target release waits for it, fact 40,
// capicluster.go) and its waits for the charts Rancher installs, the rollouts and
// stv-aggregation (16.11 to 16.13, rancherdeps.go), the fleet-agent's rollout and
// wait_capi_cluster again, the fleet-agent redeploy and the Fleet local cluster's wait
// (16.14 to 16.16, fleetagent.go),
// patch_local_cluster_details (fact 17), update_local_rke_state_secret (fact 18,
// rkestate.go), for a hop from v1.6
// migrate_longhorn_v1beta1_crds (fact 19; the validator's UPDATE on settings recorded),
// the cluster repository (fact 20), rancher-expose's ingress class (fact 21, ingress.go),
// apply_extra_nonversion_manifests (fact 22, from the release's upgrade image,
// releasefiles.go), the harvester-crd and harvester ManagedCharts (fact 23: the version,
// and for harvester the values its script adds, chartvalues.go), wait_kubevirt (fact
// 23.5, when the release names its KubeVirt), sync_containerd_registry_to_rancher (fact
// 24, registry.go), wait_longhorn_upgrade (fact 25, longhorn.go), the
// rancher-monitoring-crd and rancher-logging-crd charts (fact 27, when the metadata names
// their versions) and upgrade_addons (fact 29: releasefiles.go, addonvalues.go, with the
// bounded, never failing wait for rancher-monitoring and rancher-logging to be deployed
// again, addonwait.go), and wait_for_fleet_bundles (fact 31, bounded and never failing,
// bundles.go). The hop-keyed sub-steps key on Input.PreviousVersion with the
// script's own regexes (facts 1, 2; migrations.go). Restore gives back what was
// recorded; the UpgradePlan runs it when the plan ends, whatever the outcome. Not here:
// the guard against RKE2 restarts (fact 12; the UpgradePlan places it before the Job).
// Still left out: the v1.9 hop's migrations (facts 14, 15).
func Run(ctx context.Context, c client.Client, in Input, p Progress) error {
	if err := errors.Join(in.Validate(), p.Validate()); err != nil {
		return fmt.Errorf("cluster upgrade: bad input, nothing was changed: %w", err)
	}
	in = in.withDefaults()
	if in.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, in.Timeout)
		defer cancel()
	}
	r := &runner{c: c, in: in, p: p, current: map[string]StepProgress{}}
	prior, err := r.ensureProgress(ctx)
	if err != nil {
		return fmt.Errorf("cluster upgrade: %w", err)
	}
	r.prior = prior
	for _, s := range steps() {
		r.logf("%s: started", s.name)
		if err := r.record(ctx, s.name, StateRunning, "started"); err != nil {
			return fmt.Errorf("cluster upgrade: %w", err)
		}
		state, message, err := s.run(r, ctx)
		// A write that lost a race with another writer (an optimistic lock: a controller
		// wrote the object between the step's read and its write) is run again: every
		// step reads afresh and is idempotent, as a resumed Job relies on.
		for tries := 1; err != nil && apierrors.IsConflict(err) && tries < conflictRuns && ctx.Err() == nil; tries++ {
			r.logf("%s: another writer changed an object first (%v): running the step again", s.name, err)
			state, message, err = s.run(r, ctx)
		}
		if err != nil {
			r.logf("%s: failed: %v", s.name, err)
			// The context may be what ended the step; the record still has to be written.
			if rerr := r.record(context.WithoutCancel(ctx), s.name, StateFailed, err.Error()); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return fmt.Errorf("cluster upgrade step %s: %w", s.name, err)
		}
		r.logf("%s: %s: %s", s.name, state, message)
		if err := r.record(ctx, s.name, state, message); err != nil {
			return fmt.Errorf("cluster upgrade: %w", err)
		}
	}
	return nil
}

// conflictRuns is how many times a step is run in all when its writes keep losing races
// with other writers (Run).
const conflictRuns = 5

// already is how a sub-step whose work it finds done ends: Done when this upgrade did
// it (ours: the object carries this plan's last-upgrade-name, or an earlier run recorded
// the sub-step Done), Skipped when the cluster was there before.
func (r *runner) already(name, message string, ours bool) (StepState, string, error) {
	if ours || r.prior[name].State == StateDone {
		return StateDone, message + " (done by an earlier run)", nil
	}
	return StateSkipped, message, nil
}

func (r *runner) logf(format string, args ...any) {
	if r.p.Log != nil {
		_, _ = fmt.Fprintf(r.p.Log, "%s "+format+"\n", append([]any{r.in.Clock.Now().UTC().Format("2006-01-02T15:04:05Z")}, args...)...)
	}
}

// poll calls check every PollInterval until it reports done or fails, or ctx ends. what
// names what is awaited for the error: "<object>: expected <what>".
func (r *runner) poll(ctx context.Context, what, remedy string, check func(ctx context.Context) (done bool, status string, err error)) error {
	last := ""
	for {
		done, status, err := check(ctx)
		if err != nil && deadlineEnded(ctx) {
			// The deadline ended a read: say what was awaited, not how the read ended.
			return fmt.Errorf("gave up waiting for %s (%w); last seen: %s; %s", what, context.DeadlineExceeded, last, remedy)
		}
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if status != last {
			r.logf("waiting for %s: %s", what, status)
			last = status
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting for %s (%w); last seen: %s; %s", what, ctx.Err(), last, remedy)
		case <-r.in.Clock.After(r.in.PollInterval):
		}
	}
}

// deadlineEnded says whether ctx has ended, or is about to: client-go's rate limiter
// refuses a request it could not send before the deadline, a moment before the context
// itself ends.
func deadlineEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) < time.Second
}
