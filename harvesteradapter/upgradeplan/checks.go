package upgradeplan

import (
	"context"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
)

// DefaultClusterChecks runs the cluster preflight (package clusterchecks) of a plan with the
// plan's annotations, through the workload cluster's API server.
func DefaultClusterChecks(configs repository.RESTConfigs) ClusterChecks {
	return func(ctx context.Context, pr *PlanRun) []harvesterv1.PreflightCheck {
		in := clusterchecks.Input{Workload: pr.Workload, Annotations: pr.Plan.Annotations, Now: time.Now()}
		cfg, err := configs.RESTConfig(ctx, pr.Cluster)
		if err == nil {
			in.APIServer = cfg
			if k, kerr := clusterchecks.NewProxyKubeletReader(cfg); kerr == nil {
				in.Kubelets = k
			}
		}
		results := clusterchecks.Run(ctx, in)
		return append(preflightStatus(results), managedChartsCheck(ctx, pr))
	}
}

// CheckManagedChartsReady: every ManagedChart of fleet-local is ready (facts 4a, 47), so
// the cluster upgrade starts from settled charts.
const CheckManagedChartsReady = "ManagedChartsReady"

// managedChartsCheck is the ManagedChartsReady check, skipped by its annotation.
func managedChartsCheck(ctx context.Context, pr *PlanRun) harvesterv1.PreflightCheck {
	c := harvesterv1.PreflightCheck{Name: CheckManagedChartsReady}
	if pr.Plan.Annotations[clusterchecks.SkipCheckAnnotationPrefix+CheckManagedChartsReady] == "true" {
		c.Result, c.Message = harvesterv1.CheckSkipped, "skipped by the annotation "+clusterchecks.SkipCheckAnnotationPrefix+CheckManagedChartsReady
		return c
	}
	ok, message, err := clusterupgrade.ManagedChartsReady(ctx, pr.Workload)
	switch {
	case err != nil:
		c.Result, c.Message = harvesterv1.CheckFailed, err.Error()
	case ok:
		c.Result, c.Message = harvesterv1.CheckPassed, message
	default:
		c.Result, c.Message = harvesterv1.CheckFailed, message
	}
	return c
}

// otherUpgradeCheck is the NoOtherUpgrade check (clusterchecks.OtherUpgrades), skipped
// by its annotation. Unlike the checks of ClusterChecks, which the manager wires in, it
// always runs: one upgrader at a time is not a matter of the cluster's shape.
func otherUpgradeCheck(ctx context.Context, pr *PlanRun) harvesterv1.PreflightCheck {
	c := harvesterv1.PreflightCheck{Name: clusterchecks.CheckNoOtherUpgrade}
	if pr.Plan.Annotations[clusterchecks.SkipCheckAnnotationPrefix+clusterchecks.CheckNoOtherUpgrade] == "true" {
		c.Result, c.Message = harvesterv1.CheckSkipped, "skipped by the annotation "+clusterchecks.SkipCheckAnnotationPrefix+clusterchecks.CheckNoOtherUpgrade
		return c
	}
	others, err := clusterchecks.OtherUpgrades(ctx, pr.Workload)
	switch {
	case err != nil:
		c.Result, c.Message = harvesterv1.CheckFailed, err.Error()
	case len(others) > 0:
		c.Result, c.Message = harvesterv1.CheckFailed, clusterchecks.OtherUpgradeHold(others)
	default:
		c.Result, c.Message = harvesterv1.CheckPassed, "no other upgrade of the cluster is in progress"
	}
	return c
}

// preflightStatus is the checks' results as the plan's status shows them.
func preflightStatus(results []clusterchecks.Result) []harvesterv1.PreflightCheck {
	out := make([]harvesterv1.PreflightCheck, 0, len(results))
	for _, r := range results {
		c := harvesterv1.PreflightCheck{Name: r.Name, Result: harvesterv1.CheckFailed, Message: r.Message}
		switch {
		case r.Skipped:
			c.Result = harvesterv1.CheckSkipped
		case r.Passed:
			c.Result = harvesterv1.CheckPassed
		}
		out = append(out, c)
	}
	return out
}
