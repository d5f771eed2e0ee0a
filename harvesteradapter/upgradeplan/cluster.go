package upgradeplan

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// clusterUpgradeJob is the Job that upgrades the cluster to the plan's release
// (harvester-node-upgrade.md, facts 40-42 and 51): the node image's
// `capi-inplace node cluster-upgrade`, every input a flag, in harvester-system, labelled
// with the plan so that cleanup finds it and its progress ConfigMap.
func (r *PlanReconciler) clusterUpgradeJob(pr *PlanRun) *batchv1.Job {
	rel := pr.Plan.Status.ReleaseMetadata
	labels := map[string]string{LabelUpgradePlan: pr.Plan.Name}
	// A release whose Rancher features are not known is outside the supported hops,
	// which the plan refused before; empty leaves Rancher's features as they are.
	features, _ := releases.RancherFeatures(rel.Harvester)
	return clusterupgrade.Job(clusterupgrade.JobInput{
		Plan:                  pr.Plan.Name,
		Image:                 pr.Config.Spec.Images.Node,
		UpgradeImage:          upgradeImage(pr.Config.Spec.Images.Upgrade, rel.Harvester),
		RancherInstallerImage: rancherInstallerImage(pr.Config.Spec.Images.RancherInstaller, rel.Rancher),
		Namespace:             repository.Namespace,
		ServiceAccount:        pr.Config.Spec.ClusterUpgrade.ServiceAccountName,
		Labels:                labels,
		Input: clusterupgrade.Input{
			Plan:                    pr.Plan.Name,
			HarvesterVersion:        rel.Harvester,
			PreviousVersion:         pr.Plan.Status.PreviousVersion,
			KubeVirtVersion:         rel.KubeVirt,
			HarvesterChartVersion:   rel.HarvesterChart,
			MonitoringChartVersion:  rel.MonitoringChart,
			LoggingChartVersion:     rel.LoggingChart,
			LoggingEventRouterImage: rel.LoggingChartHarvesterEventRouter,
			RancherVersion:          rel.Rancher,
			RancherFeatures:         features,
			RancherDependencies:     releases.DependenciesOf(rel.RancherDependencies),
			PollInterval:            r.ClusterUpgradePollInterval,
			CAPIStableFor:           r.ClusterUpgradeCAPIStableFor,
		},
	})
}

// upgradeImage is the release's upgrade image (harvester-node-upgrade.md fact 3: the
// apply-manifests Job runs rancher/harvester-upgrade at the new release): image with the
// release as its tag unless it has one; empty when no image is configured.
func upgradeImage(image, release string) string {
	if image == "" {
		return ""
	}
	return suc.ImageWithTag(image, release)
}

// rancherInstallerImage is Rancher's installer image at the release's Rancher (fact 16.1):
// image with the Rancher version as its tag unless it has one; the default image when none
// is configured (a HarvesterUpgrader written before the field existed).
func rancherInstallerImage(image, rancherVersion string) string {
	if image == "" {
		image = clusterupgrade.DefaultRancherInstallerImage
	}
	return suc.ImageWithTag(image, rancherVersion)
}

// upgradeCluster runs the cluster upgrade Job and copies its sub-steps' progress into the
// plan's status. A failed Job fails the plan (fact 51) with its pod's own words, kept in
// the plan's job-logs ConfigMap (keepFailedJobLogs); the sub-steps are resumable, so a
// plan created again continues where this one stopped.
func (r *PlanReconciler) upgradeCluster(ctx context.Context, pr *PlanRun) (bool, string, error) {
	rel := pr.Plan.Status.ReleaseMetadata
	if rel == nil || rel.HarvesterChart == "" || rel.Rancher == "" {
		return false, "", nodeupdater.Permanentf("InvalidReleaseMetadata", "the release metadata of Harvester %s names no harvesterChart or rancher version: the cluster upgrade needs both", pr.Plan.Spec.Version)
	}
	want := r.clusterUpgradeJob(pr)
	job := &batchv1.Job{}
	err := pr.Workload.Get(ctx, client.ObjectKeyFromObject(want), job)
	switch {
	case apierrors.IsNotFound(err):
		clear, message, err := r.clearV2Volumes(ctx, pr)
		setClusterUpgrade(pr.Plan, nil, planStepState(pr.Plan, PlanStepFreeV2Volumes, clear, message, "no Longhorn v2 volume is attached", err))
		if err != nil || !clear {
			return false, message, err
		}
		guarded, message, err := r.guardRestarts(ctx, pr)
		setClusterUpgrade(pr.Plan, nil, planStepState(pr.Plan, PlanStepPlaceRestartGuard, guarded, message, "Rancher provisions no node of this cluster: no RKE2 restart of Rancher's to guard against", err))
		if err != nil || !guarded {
			return false, message, err
		}
		if err := pr.Workload.Create(ctx, want); err != nil {
			return false, "", fmt.Errorf("create the cluster upgrade Job %s/%s: %w", want.Namespace, want.Name, err)
		}
		return false, fmt.Sprintf("created the cluster upgrade Job %s/%s", want.Namespace, want.Name), nil
	case err != nil:
		return false, "", fmt.Errorf("get the cluster upgrade Job %s: %w", want.Name, err)
	case job.DeletionTimestamp != nil:
		// An earlier plan of this name ended while its pod did not stop in time
		// (stopClusterUpgrade): this plan's Job comes once that one is gone.
		return false, fmt.Sprintf("waiting for the cluster upgrade Job %s/%s of an earlier plan of this name to be gone (its pod is still being stopped)", job.Namespace, job.Name), nil
	}
	steps, err := clusterupgrade.ReadProgress(ctx, pr.Workload, clusterupgrade.ProgressKey(want.Namespace, pr.Plan.Name))
	if err != nil {
		return false, "", err
	}
	setClusterUpgrade(pr.Plan, steps)
	var current []string
	for _, s := range steps {
		if s.State == clusterupgrade.StateRunning || s.State == clusterupgrade.StateFailed {
			current = append(current, fmt.Sprintf("%s: %s", s.Name, s.Message))
		}
	}
	done, failed, _ := clusterupgrade.JobState(job)
	switch {
	case failed:
		// The Job's condition says only the Job controller's reason; what failed is on the
		// Job's pod, which the plan's cleanup deletes with the Job: it is kept first. Not
		// kept (an error) holds the plan here, the Job still there, and is tried again.
		kept, err := r.keepFailedJobLogs(ctx, pr)
		if err != nil {
			return false, "", err
		}
		return false, "", nodeupdater.Permanentf("ClusterUpgradeFailed", "%s",
			jobFailure("the cluster upgrade Job", job, kept[client.ObjectKeyFromObject(job)], jobLogsKey(pr.Plan.Name)))
	case done:
		return r.afterClusterUpgradeJob(ctx, pr, job.Name)
	}
	if len(current) == 0 {
		return false, fmt.Sprintf("the cluster upgrade Job %s/%s runs", job.Namespace, job.Name), nil
	}
	return false, "cluster upgrade: " + strings.Join(current, "; "), nil
}

// afterClusterUpgradeJob runs the plan's sub-steps once the cluster upgrade Job has
// succeeded (planStepsAfterJob), each listed in status.clusterUpgrade, and says whether
// they are all done.
func (r *PlanReconciler) afterClusterUpgradeJob(ctx context.Context, pr *PlanRun, job string) (bool, string, error) {
	rel := pr.Plan.Status.ReleaseMetadata
	started, err := startStoppedVMs(ctx, pr)
	setClusterUpgrade(pr.Plan, nil, planStepState(pr.Plan, PlanStepStartStoppedVMs, true, started, "no virtual machine was stopped for the cluster upgrade", err))
	if err != nil {
		return false, "", err
	}
	raised, err := raiseReplicaReplenishment(ctx, pr)
	setClusterUpgrade(pr.Plan, nil, planStepState(pr.Plan, PlanStepRaiseReplicaReplenishment, true, raised,
		fmt.Sprintf("nothing to raise: a single-node cluster, no Longhorn, or %s already %d s or more", settingReplicaReplenishmentWaitInterval, replenishmentDuringRoll), err))
	if err != nil {
		return false, "", err
	}
	descheduler, err := disableDescheduler(ctx, pr)
	setClusterUpgrade(pr.Plan, nil, planStepState(pr.Plan, PlanStepDisableDescheduler, true, descheduler,
		fmt.Sprintf("nothing to turn off: a single-node cluster, or the add-on %s absent or off", DeschedulerAddon), err))
	if err != nil {
		return false, "", err
	}
	raised += descheduler
	skipped, message, err := r.skipMultusManifest(ctx, pr)
	setClusterUpgrade(pr.Plan, nil, planStepState(pr.Plan, PlanStepSkipMultusManifest, skipped, message, "a single-node cluster: Harvester places no skip file there", err))
	if err != nil || !skipped {
		return false, fmt.Sprintf("the cluster upgrade Job %s succeeded; %s", job, message), err
	}
	return true, fmt.Sprintf("the cluster upgrade Job %s upgraded Rancher %s and Harvester's charts %s%s%s%s", job, rel.Rancher, rel.HarvesterChart, started, raised, message), nil
}

// settingReplicaReplenishmentWaitInterval is Longhorn's replica-replenishment-wait-interval
// (seconds), and replenishmentDuringRoll what Harvester raises it to for its node phase.
const (
	settingReplicaReplenishmentWaitInterval = "replica-replenishment-wait-interval"
	replenishmentDuringRoll                 = 1800
)

// raiseReplicaReplenishment raises Longhorn's replica-replenishment-wait-interval to 1800
// seconds if it is lower, before the nodes go, as Harvester's upgrade controller does on a
// multi-node cluster (harvester-release-steps.md fact 35; node sheet fact 11.2): while a
// node reboots, Longhorn then waits for its replicas to come back instead of rebuilding
// them elsewhere after the default 600 s. The value it had is recorded in the cluster
// upgrade's progress ConfigMap first, and given back when the plan ends
// (clusterupgrade.Restore, run by removeLabelled). It says what it did, for the phase's
// message; nothing on a single-node cluster or one without Longhorn.
func raiseReplicaReplenishment(ctx context.Context, pr *PlanRun) (string, error) {
	if pr.Plan.Status.SingleNode {
		return "", nil
	}
	key := client.ObjectKey{Namespace: longhorn.Namespace, Name: settingReplicaReplenishmentWaitInterval}
	setting := &longhornv1.Setting{}
	if err := pr.Workload.Get(ctx, key, setting); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return "", nil
		}
		return "", fmt.Errorf("read Longhorn's setting %s: %w", key.Name, err)
	}
	if current, err := strconv.Atoi(setting.Value); err == nil && current >= replenishmentDuringRoll {
		return "", nil
	}
	before, err := json.Marshal(setting.Value)
	if err != nil {
		return "", err
	}
	progress := clusterupgrade.ProgressKey(repository.Namespace, pr.Plan.Name)
	if err := clusterupgrade.Record(ctx, pr.Workload, progress, key, clusterupgrade.FieldSettingValue, before); err != nil {
		return "", err
	}
	patched := setting.DeepCopy()
	patched.Value = strconv.Itoa(replenishmentDuringRoll)
	if err := pr.Workload.Patch(ctx, patched, client.MergeFrom(setting)); err != nil {
		return "", fmt.Errorf("raise Longhorn's setting %s to %d for the roll: %w", key.Name, replenishmentDuringRoll, err)
	}
	return fmt.Sprintf("; Longhorn's %s raised from %s to %d for the nodes", key.Name, setting.Value, replenishmentDuringRoll), nil
}

// clusterUpgradeStopWait bounds how long the end of a plan waits for its cluster upgrade
// Job's pod to stop (stopClusterUpgrade): the kubelet kills a container that ignores
// SIGTERM once its pod's terminationGracePeriodSeconds (30 s by default) have passed, so
// past this bound the pod's node is taken to be down, its container with it.
const clusterUpgradeStopWait = 3 * time.Minute

// stopClusterUpgrade deletes the plan's cluster upgrade Job, if it is there and has not
// ended, with its pod first (foreground propagation: the garbage collector removes the
// Job only once the kubelet has stopped the pod's container and the pod is gone), and
// says what it waits for while the Job is still there. Every end of a plan (success, failure, deletion)
// comes through here before it gives anything back: a container still running the
// cluster upgrade after that would change again what was given back, or race the run of
// a plan created again under the same name (the Rancher soak's seed 9). Past
// clusterUpgradeStopWait it goes on, and says so in the log.
func stopClusterUpgrade(ctx context.Context, wc client.Client, plan string, now time.Time) (string, error) {
	job := &batchv1.Job{}
	key := client.ObjectKey{Namespace: repository.Namespace, Name: clusterupgrade.JobName(plan)}
	switch err := wc.Get(ctx, key, job); {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read the cluster upgrade Job %s: %w", key, err)
	}
	if job.Labels[LabelUpgradePlan] != plan {
		return "", nil // not this plan's: removeLabelled leaves it too
	}
	if done, failed, _ := clusterupgrade.JobState(job); done || failed {
		// A Job is Complete or Failed only once its pods have terminated (kubernetes
		// pkg/controller/job/job_controller.go delayTerminalCondition: SuccessCriteriaMet
		// and FailureTarget first, with JobPodReplacementPolicy or JobManagedBy, on by
		// default since 1.29 and 1.32): nothing of it runs; removeLabelled deletes it.
		return "", nil
	}
	if job.DeletionTimestamp == nil {
		err := wc.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground), client.Preconditions{UID: &job.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return "", fmt.Errorf("delete the cluster upgrade Job %s: %w", key, err)
		}
		return fmt.Sprintf("stopping the cluster upgrade Job %s: its pod is deleted first; what the plan changed is given back once it is gone", key), nil
	}
	if waited := now.Sub(job.DeletionTimestamp.Time); waited > clusterUpgradeStopWait {
		logf.FromContext(ctx).Info("the cluster upgrade Job's pod did not stop in time; giving back what the plan changed all the same (its node may be down)",
			"job", key, "deleting", job.DeletionTimestamp.Time, "bound", clusterUpgradeStopWait)
		return "", nil
	}
	return fmt.Sprintf("stopping the cluster upgrade Job %s: waiting for its pod to be gone (deleted %s ago); what the plan changed is given back once it is", key,
		now.Sub(job.DeletionTimestamp.Time).Round(time.Second)), nil
}
