package clusterupgrade

import (
	"context"
	"fmt"
	"time"

	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
)

// Annotations the upgrade writes on what it changes: Harvester's own on the ManagedCharts
// (fact 41.13), which the Deployments get too, and ours recording the chart generation the
// upgrade started from, so that a run that resumes waits for the same change.
const (
	lastUpgradeNameAnnotation   = "upgrade.harvesterhci.io/last-upgrade-name"
	lastUpgradeTargetAnnotation = "upgrade.harvesterhci.io/last-upgrade-target-version"
	lastUpgradeTimeAnnotation   = "upgrade.harvesterhci.io/last-upgrade-time"
	FromGenerationAnnotation    = "inplace.cluster.x-k8s.io/cluster-upgrade-from-generation"
)

var (
	localClusterKey   = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}
	rancherKey        = client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}
	clusterRepoKey    = client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.ClusterRepoDeployment}
	serverVersionKey  = client.ObjectKey{Name: rancher.ServerVersionSetting}
	chartsRepoKey     = client.ObjectKey{Name: rancher.HarvesterChartsRepo}
	harvesterCRDChart = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.HarvesterCRDChart}
	harvesterChart    = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.HarvesterChart}
)

// deleteRancherChartRepos deletes Rancher's own ClusterRepos and its chart-default-branch
// Setting right before Rancher is changed, as the release does (fact 16.4, the workaround
// for rancher/rancher#36914 and harvester#2011): a ClusterRepo that outlives the old
// Rancher keeps the index of the old Rancher's charts, and the new Rancher then finds no
// fleet chart as new as it requires ("Failed to find system chart fleet"), never
// upgrades Fleet, and the wait for its charts never ends. The new Rancher creates them
// again when it starts, from its own charts. What is already gone is left.
func (r *runner) deleteRancherChartRepos(ctx context.Context) error {
	for _, name := range []string{rancher.RancherChartsRepo, rancher.RancherRKE2ChartsRepo, rancher.RancherPartnerChartsRepo} {
		repo := &catalogv1.ClusterRepo{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := r.c.Delete(ctx, repo); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete Rancher's ClusterRepo %s before its upgrade (the new Rancher creates it again): %w", name, err)
		}
	}
	setting := &managementv3.Setting{ObjectMeta: metav1.ObjectMeta{Name: rancher.ChartDefaultBranchSetting}}
	if err := r.c.Delete(ctx, setting); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete Rancher's Setting %s before its upgrade: %w", rancher.ChartDefaultBranchSetting, err)
	}
	return nil
}

// patchLocalClusterDetails is patch_local_cluster_details (harvester-release-steps.md
// fact 17): it labels fleet-local/local with its management cluster and sets its Fleet
// workspace in its status. It is not the HEP's "decouple" (removing kubernetesVersion and
// rkeConfig), which no Harvester release does and which in Rancher v2.14 prunes the
// objects Rancher generated for the local cluster (facts 64 to 66).
func (r *runner) patchLocalClusterDetails(ctx context.Context) (StepState, string, error) {
	cl := &provisioningv1.Cluster{}
	if err := r.c.Get(ctx, localClusterKey, cl); err != nil {
		return "", "", fmt.Errorf("read provisioning Cluster %s: %w", localClusterKey, err)
	}
	labelled := cl.Labels[rancher.ManagementClusterNameLabel] == rancher.LocalCluster
	workspace := cl.Status.FleetWorkspaceName == rancher.FleetLocal
	if labelled && workspace {
		return r.already(StepPatchLocalClusterDetails, fmt.Sprintf("provisioning Cluster %s is already labelled %s=%s with fleetWorkspaceName %s",
			localClusterKey, rancher.ManagementClusterNameLabel, rancher.LocalCluster, rancher.FleetLocal), false)
	}
	if !labelled {
		before := cl.DeepCopy()
		if cl.Labels == nil {
			cl.Labels = map[string]string{}
		}
		cl.Labels[rancher.ManagementClusterNameLabel] = rancher.LocalCluster
		if err := r.c.Patch(ctx, cl, client.MergeFrom(before)); err != nil {
			return "", "", fmt.Errorf("label provisioning Cluster %s %s=%s: %w", localClusterKey, rancher.ManagementClusterNameLabel, rancher.LocalCluster, err)
		}
	}
	if !workspace {
		before := cl.DeepCopy()
		cl.Status.FleetWorkspaceName = rancher.FleetLocal
		if err := r.c.Status().Patch(ctx, cl, client.MergeFrom(before)); err != nil {
			return "", "", fmt.Errorf("set status.fleetWorkspaceName of provisioning Cluster %s to %s: %w", localClusterKey, rancher.FleetLocal, err)
		}
	}
	return StateDone, fmt.Sprintf("provisioning Cluster %s labelled %s=%s, fleetWorkspaceName %s",
		localClusterKey, rancher.ManagementClusterNameLabel, rancher.LocalCluster, rancher.FleetLocal), nil
}

// upgradeClusterRepo sets the harvester-cluster-repo Deployment to the release's image and
// waits for its rollout (fact 41.11).
func (r *runner) upgradeClusterRepo(ctx context.Context) (StepState, string, error) {
	image := r.in.ClusterRepoImage
	dep := &appsv1.Deployment{}
	if err := r.c.Get(ctx, clusterRepoKey, dep); err != nil {
		return "", "", fmt.Errorf("read Deployment %s: %w", clusterRepoKey, err)
	}
	ctr, err := container(dep, rancher.ClusterRepoDeployment)
	if err != nil {
		return "", "", err
	}
	if ctr.Image == image {
		done, _, err := rolledOut(dep)
		if err != nil {
			return "", "", err
		}
		if done {
			return r.already(StepUpgradeClusterRepo, fmt.Sprintf("Deployment %s already runs %s", clusterRepoKey, image), r.ours(dep))
		}
	} else if err := r.setImage(ctx, dep, rancher.ClusterRepoDeployment, image); err != nil {
		return "", "", err
	}
	if err := r.waitRollout(ctx, clusterRepoKey, rancher.ClusterRepoDeployment, image); err != nil {
		return "", "", err
	}
	return StateDone, fmt.Sprintf("Deployment %s runs %s", clusterRepoKey, image), nil
}

// refreshHarvesterCharts makes Rancher download the harvester-charts index again, so the
// new chart versions the upgraded repository serves are known (fact 41.11): it sets
// spec.forceUpdate to now and waits for status.downloadTime to reach it. Nothing to do
// when the repository was not changed by this upgrade (UpgradeClusterRepo Skipped) and its
// last forced update was downloaded; done once recorded Done.
func (r *runner) refreshHarvesterCharts(ctx context.Context) (StepState, string, error) {
	if r.prior[StepRefreshHarvesterCharts].State == StateDone {
		return StateDone, "ClusterRepo harvester-charts was refreshed (done by an earlier run)", nil
	}
	repo := &catalogv1.ClusterRepo{}
	if err := r.c.Get(ctx, chartsRepoKey, repo); err != nil {
		return "", "", fmt.Errorf("read ClusterRepo %s: %w", rancher.HarvesterChartsRepo, err)
	}
	downloaded := func(repo *catalogv1.ClusterRepo) bool {
		return repo.Spec.ForceUpdate != nil && !repo.Status.DownloadTime.Before(repo.Spec.ForceUpdate)
	}
	repoStep := r.current[StepUpgradeClusterRepo]
	if repoStep.State == StateSkipped && (repo.Spec.ForceUpdate == nil || downloaded(repo)) {
		return StateSkipped, fmt.Sprintf("Deployment %s was already at %s and ClusterRepo %s has no refresh pending", clusterRepoKey, r.in.ClusterRepoImage, rancher.HarvesterChartsRepo), nil
	}
	// A refresh asked for after the repository's rollout (by an earlier run that
	// stopped while waiting) is awaited, not asked for again.
	since := r.prior[StepUpgradeClusterRepo].Time
	if repoStep.State == StateDone && r.prior[StepUpgradeClusterRepo].State != StateDone {
		since = repoStep.Time
	}
	since = metav1.NewTime(since.Truncate(time.Second)) // what the ConfigMap and the ClusterRepo keep
	if repo.Spec.ForceUpdate == nil || repo.Spec.ForceUpdate.Before(&since) || since.IsZero() {
		before := repo.DeepCopy()
		// Both times are kept to the second: a refresh asked for in the second of the
		// last download would look downloaded already, so it is asked for after it.
		force := r.in.Clock.Now().Truncate(time.Second)
		if last := repo.Status.DownloadTime.Time; !force.After(last) {
			force = last.Truncate(time.Second).Add(time.Second)
		}
		repo.Spec.ForceUpdate = &metav1.Time{Time: force}
		if err := r.c.Patch(ctx, repo, client.MergeFrom(before)); err != nil {
			return "", "", fmt.Errorf("set spec.forceUpdate of ClusterRepo %s: %w", rancher.HarvesterChartsRepo, err)
		}
	}
	forced := repo.Spec.ForceUpdate.DeepCopy()
	err := r.waitIndexDownloaded(ctx, rancher.HarvesterChartsRepo, forced, "Rancher downloads it from the harvester-cluster-repo Service; look at the ClusterRepo's conditions and at Rancher's logs")
	if err != nil {
		return "", "", err
	}
	return StateDone, fmt.Sprintf("ClusterRepo %s downloaded its index after the refresh of %s", rancher.HarvesterChartsRepo, forced.UTC().Format(time.RFC3339)), nil
}

// waitIndexDownloaded waits until the ClusterRepo name has downloaded its index at or
// after the forced update forced (status.downloadTime, fact 20).
func (r *runner) waitIndexDownloaded(ctx context.Context, name string, forced *metav1.Time, remedy string) error {
	return r.poll(ctx, fmt.Sprintf("ClusterRepo %s to download its index (status.downloadTime at or after spec.forceUpdate %s)", name, forced.UTC().Format(time.RFC3339)), remedy,
		func(ctx context.Context) (bool, string, error) {
			cur := &catalogv1.ClusterRepo{}
			if err := r.c.Get(ctx, client.ObjectKey{Name: name}, cur); err != nil {
				return false, "", fmt.Errorf("read ClusterRepo %s: %w", name, err)
			}
			status := "downloadTime " + cur.Status.DownloadTime.UTC().Format(time.RFC3339)
			if c := condition(cur.Status.Conditions, "Downloaded"); c != nil && c.Status == corev1.ConditionFalse {
				status += "; Downloaded False: " + c.Message
			}
			return !cur.Status.DownloadTime.Before(forced), status, nil
		})
}

// ours says whether this upgrade (its plan) last changed obj.
func (r *runner) ours(obj client.Object) bool {
	return obj.GetAnnotations()[lastUpgradeNameAnnotation] == r.in.Plan
}

// condition is the condition of type t, or nil.
func condition(conds []genericcondition.GenericCondition, t string) *genericcondition.GenericCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
