package harvesteradapter

import (
	"context"
	"time"


	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// DefaultClusterChecks runs the cluster preflight (clusterchecks.go) of a plan with the
// plan's annotations, through the workload cluster's API server.
func DefaultClusterChecks(configs RESTConfigs) ClusterChecks {
	return func(ctx context.Context, pr *PlanRun) []harvesterv1.PreflightCheck {
		in := ClusterCheckInput{Workload: pr.Workload, Annotations: pr.Plan.Annotations, Now: time.Now()}
		cfg, err := configs.RESTConfig(ctx, pr.Cluster)
		if err == nil {
			in.APIServer = cfg
			if k, kerr := NewProxyKubeletReader(cfg); kerr == nil {
				in.Kubelets = k
			}
		}
		return preflightStatus(RunClusterChecks(ctx, in))
	}
}

// preflightStatus is the checks' results as the plan's status shows them.
func preflightStatus(results []ClusterCheckResult) []harvesterv1.PreflightCheck {
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
