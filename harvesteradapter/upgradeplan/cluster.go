package upgradeplan

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// clusterUpgradeJob is the Job that upgrades the cluster to the plan's release
// (harvester-node-upgrade.md, facts 40-42 and 51): the node image's
// `capi-inplace node cluster-upgrade`, every input a flag, in harvester-system, labelled
// with the plan so that cleanup finds it and its progress ConfigMap.
func (r *PlanReconciler) clusterUpgradeJob(pr *PlanRun) *batchv1.Job {
	rel := pr.Plan.Status.ReleaseMetadata
	labels := map[string]string{LabelUpgradePlan: pr.Plan.Name}
	return clusterupgrade.Job(clusterupgrade.JobInput{
		Plan:           pr.Plan.Name,
		Image:          pr.Config.Spec.Images.Node,
		Namespace:      repository.Namespace,
		ServiceAccount: pr.Config.Spec.ClusterUpgrade.ServiceAccountName,
		Labels:         labels,
		Input: clusterupgrade.Input{
			Plan:                  pr.Plan.Name,
			HarvesterVersion:      rel.Harvester,
			HarvesterChartVersion: rel.HarvesterChart,
			RancherVersion:        rel.Rancher,
			PollInterval:          r.ClusterUpgradePollInterval,
		},
	})
}

// upgradeCluster runs the cluster upgrade Job and copies its sub-steps' progress into the
// plan's status. A failed Job fails the plan (fact 51); the sub-steps are resumable, so a
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
		if err := pr.Workload.Create(ctx, want); err != nil {
			return false, "", fmt.Errorf("create the cluster upgrade Job %s/%s: %w", want.Namespace, want.Name, err)
		}
		return false, fmt.Sprintf("created the cluster upgrade Job %s/%s", want.Namespace, want.Name), nil
	case err != nil:
		return false, "", fmt.Errorf("get the cluster upgrade Job %s: %w", want.Name, err)
	}
	steps, err := clusterupgrade.ReadProgress(ctx, pr.Workload, clusterupgrade.ProgressKey(want.Namespace, pr.Plan.Name))
	if err != nil {
		return false, "", err
	}
	pr.Plan.Status.ClusterUpgrade = pr.Plan.Status.ClusterUpgrade[:0]
	var current []string
	for _, s := range steps {
		pr.Plan.Status.ClusterUpgrade = append(pr.Plan.Status.ClusterUpgrade, harvesterv1.ClusterUpgradeStep{Name: s.Name, State: string(s.State), Message: s.Message})
		if s.State == clusterupgrade.StateRunning || s.State == clusterupgrade.StateFailed {
			current = append(current, fmt.Sprintf("%s: %s", s.Name, s.Message))
		}
	}
	done, failed, message := clusterupgrade.JobState(job)
	switch {
	case failed:
		return false, "", nodeupdater.Permanentf("ClusterUpgradeFailed", "the cluster upgrade Job %s/%s failed: %s", job.Namespace, job.Name, message)
	case done:
		return true, fmt.Sprintf("the cluster upgrade Job %s upgraded Rancher %s and Harvester's charts %s", job.Name, rel.Rancher, rel.HarvesterChart), nil
	}
	if len(current) == 0 {
		return false, fmt.Sprintf("the cluster upgrade Job %s/%s runs", job.Namespace, job.Name), nil
	}
	return false, "cluster upgrade: " + strings.Join(current, "; "), nil
}
