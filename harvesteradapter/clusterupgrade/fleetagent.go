package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
)

// Fleet around Rancher's upgrade (harvester-release-steps.md fact 16.5 and 16.14 to
// 16.16; umanif.sh@v1.8.2 save_fleet_controller_configmap, patch_fleet_cluster,
// wait_for_fleet_agent, wait_cluster_local_and_fleet; harvester issue #6851, PRs #6962,
// #7004 and #7022; rancher/fleet#3061).
//
// When Rancher upgrades Fleet, the fleet chart renders fleet-controller's ConfigMap again
// and its apiServerURL (and apiServerCA) can come out empty; Harvester's own controller
// puts them back later, at a moment nobody chooses, often only when the new harvester
// pod starts during the harvester chart's upgrade. fleet-controller deploys the local
// fleet-agent again whenever those two change (import.go onConfig, agentDeployed), and a
// fleet-agent replaced while the harvester ManagedChart is being upgraded disrupts that
// upgrade or rolls it back. So the release saves the two values before Rancher's upgrade,
// and after it, before any ManagedChart is touched, puts them back, has Fleet deploy the
// agent once more on purpose (spec.redeployAgentGeneration of cluster.fleet local one
// past status.agentDeployedGeneration) and waits for that agent.

// FieldFleetAPIServer is the record of fleet-controller's apiServerURL and apiServerCA
// from before Rancher's upgrade (a rancher.FleetAPIServer as JSON).
const FieldFleetAPIServer = "config.apiServerURL+apiServerCA"

// FleetAgentRedeployedAnnotation marks cluster.fleet local with the plan that asked Fleet
// to redeploy its agent, so that a resumed run waits for that agent instead of asking
// again.
const FleetAgentRedeployedAnnotation = "inplace.cluster.x-k8s.io/fleet-agent-redeployed-for"

// fleetLocalReadyWait bounds the wait for cluster.fleet local to be Ready once the agent
// is redeployed: the script looks 30 times, 2 s apart, and goes on without failing.
const fleetLocalReadyWait = 60 * time.Second

var (
	fleetControllerConfigKey = client.ObjectKey{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerConfigMap}
	fleetLocalClusterKey     = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.FleetLocalCluster}
	fleetAgentKey            = client.ObjectKey{Namespace: rancher.FleetLocalAgentNamespace, Name: rancher.FleetAgentDeploy}
)

// readFleetConfig is fleet-controller's configuration, or nil when its ConfigMap or its
// config value is missing.
func readFleetConfig(ctx context.Context, c client.Client) (*corev1.ConfigMap, rancher.FleetConfig, error) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, fleetControllerConfigKey, cm); apierrors.IsNotFound(err) {
		return nil, nil, nil
	} else if err != nil {
		return nil, nil, fmt.Errorf("read fleet-controller's ConfigMap %s: %w", fleetControllerConfigKey, err)
	}
	raw, ok := cm.Data[rancher.FleetControllerConfigKey]
	if !ok {
		return cm, nil, nil
	}
	cfg, err := rancher.ParseFleetConfig(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("ConfigMap %s: %w", fleetControllerConfigKey, err)
	}
	return cm, cfg, nil
}

// saveFleetAPIServer records fleet-controller's apiServerURL and apiServerCA before
// Rancher's upgrade (save_fleet_controller_configmap, fact 16.5). Nothing is recorded
// when the ConfigMap or its config is missing, as the script skips saving then.
func (r *runner) saveFleetAPIServer(ctx context.Context) error {
	_, cfg, err := readFleetConfig(ctx, r.c)
	if err != nil || cfg == nil {
		return err
	}
	raw, err := cfg.APIServer().JSON()
	if err != nil {
		return err
	}
	return r.remember(ctx, fleetControllerConfigKey, FieldFleetAPIServer, raw)
}

// restoreFleetAPIServer writes the recorded apiServerURL and apiServerCA back into
// fleet-controller's configuration where they differ, each only when it was recorded
// non-empty (restore_fleet_controller_configmap). It says what it changed, "" when
// nothing.
func restoreFleetAPIServer(ctx context.Context, c client.Client, before json.RawMessage) (string, error) {
	var saved rancher.FleetAPIServer
	if err := json.Unmarshal(before, &saved); err != nil {
		return "", fmt.Errorf("the recorded value %s is not fleet-controller's apiServerURL and apiServerCA: %w", before, err)
	}
	cm, cfg, err := readFleetConfig(ctx, c)
	if err != nil || cfg == nil {
		return "", err
	}
	now := cfg.APIServer()
	put := rancher.FleetAPIServer{}
	what := ""
	if saved.URL != "" && now.URL != saved.URL {
		put.URL = saved.URL
		what = fmt.Sprintf("apiServerURL from %q to %q", now.URL, saved.URL)
	}
	if saved.CA != "" && now.CA != saved.CA {
		put.CA = saved.CA
		if what != "" {
			what += ", "
		}
		what += "apiServerCA to the saved one"
	}
	if what == "" {
		return "", nil
	}
	rendered, err := cfg.WithAPIServer(put)
	if err != nil {
		return "", err
	}
	patched := cm.DeepCopy()
	patched.Data[rancher.FleetControllerConfigKey] = rendered
	if err := c.Patch(ctx, patched, client.MergeFromWithOptions(cm, client.MergeFromWithOptimisticLock{})); err != nil {
		return "", fmt.Errorf("put fleet-controller's %s in ConfigMap %s: %w", what, fleetControllerConfigKey, err)
	}
	return what, nil
}

// settleFleetAgent is the end of upgrade_rancher (fact 16.14 to 16.16): once Rancher's
// charts are deployed, wait for the local fleet-agent's rollout and for the Cluster API
// Cluster fleet-local/local as the target release's wait_capi_cluster does (16.14, fact
// 40, capicluster.go), then for the new fleet-controller's configuration (the field
// agentTLSMode, which the script waits for), put back apiServerURL and apiServerCA, have
// Fleet deploy the local agent once more, wait until it has (status.agentDeployedGeneration
// at spec.redeployAgentGeneration, the Deployment rolled out), and give cluster.fleet
// local a bounded time to be Ready. Skipped, as the script, when Rancher was already at
// the release's version.
func (r *runner) settleFleetAgent(ctx context.Context) (StepState, string, error) {
	if r.prior[StepSettleFleetAgent].State == StateDone {
		return StateDone, r.prior[StepSettleFleetAgent].Message + " (done by an earlier run)", nil
	}
	if r.current[StepUpgradeRancher].State == StateSkipped {
		return StateSkipped, fmt.Sprintf("Rancher was already at %s: the release redeploys Fleet's local agent only after it upgraded Rancher", r.in.RancherVersion), nil
	}
	// 16.14: the fleet-agent the new Fleet deployed rolls out, and the Cluster API
	// Cluster settles again (wait_rollout_with_loop, wait_capi_cluster).
	if err := r.waitRolledOut(ctx, fleetAgentKey); err != nil {
		return "", "", err
	}
	capi, err := r.waitCAPIClusterAfterFleetAgent(ctx)
	if err != nil {
		return "", "", err
	}
	remedy := fmt.Sprintf("Rancher deploys Fleet once it runs at %s; look at `kubectl -n %s get configmap %s -o yaml` and fleet-controller's logs", r.in.RancherVersion, rancher.FleetNamespace, rancher.FleetControllerConfigMap)
	err = r.poll(ctx, fmt.Sprintf("fleet-controller's ConfigMap %s to have agentTLSMode (the new Fleet's configuration)", fleetControllerConfigKey), remedy,
		func(ctx context.Context) (bool, string, error) {
			_, cfg, err := readFleetConfig(ctx, r.c)
			if err != nil || cfg == nil {
				return false, "no configuration", err
			}
			return cfg.Has("agentTLSMode"), "agentTLSMode absent", nil
		})
	if err != nil {
		return "", "", err
	}
	restored := "apiServerURL and apiServerCA as saved"
	changes, err := ReadChanges(ctx, r.c, r.p.ConfigMap)
	if err != nil {
		return "", "", err
	}
	var saved json.RawMessage
	for _, ch := range changes {
		if ch.Object == fleetControllerConfigKey.String() && ch.Field == FieldFleetAPIServer {
			saved = ch.Before
		}
	}
	if saved == nil {
		restored = "nothing saved to put back (fleet-controller had no configuration before Rancher's upgrade)"
	} else {
		what, err := restoreFleetAPIServer(ctx, r.c, saved)
		if err != nil {
			return "", "", err
		}
		if what != "" {
			restored = "put back " + what
		}
	}
	generation, err := r.redeployFleetAgent(ctx)
	if err != nil {
		return "", "", err
	}
	err = r.poll(ctx, fmt.Sprintf("Fleet to deploy the local agent for redeployAgentGeneration %d", generation),
		fmt.Sprintf("fleet-controller deploys it; look at `kubectl -n %s get clusters.fleet.cattle.io %s -o yaml` and fleet-controller's logs", rancher.FleetLocal, rancher.FleetLocalCluster),
		func(ctx context.Context) (bool, string, error) {
			if saved != nil {
				// fleet-controller deploys no agent without an apiServerURL: should
				// anything render the configuration again meanwhile, put it back again.
				what, err := restoreFleetAPIServer(ctx, r.c, saved)
				if apierrors.IsConflict(err) {
					return false, "fleet-controller's ConfigMap changed while being put back: looking again", nil
				}
				if err != nil {
					return false, "", err
				}
				if what != "" {
					r.logf("fleet-controller's configuration changed again: put back %s", what)
				}
			}
			cl := &fleetv1alpha1.Cluster{}
			if err := r.c.Get(ctx, fleetLocalClusterKey, cl); err != nil {
				return false, "", fmt.Errorf("read Fleet's Cluster %s: %w", fleetLocalClusterKey, err)
			}
			deployed := cl.Status.AgentDeployedGeneration
			if deployed == nil || *deployed != generation {
				got := "none"
				if deployed != nil {
					got = strconv.FormatInt(*deployed, 10)
				}
				return false, "status.agentDeployedGeneration " + got, nil
			}
			return true, "", nil
		})
	if err != nil {
		return "", "", err
	}
	if err := r.waitRolledOut(ctx, fleetAgentKey); err != nil {
		return "", "", err
	}
	ready, err := r.fleetLocalReady(ctx)
	if err != nil {
		return "", "", err
	}
	return StateDone, fmt.Sprintf("%s; fleet-controller's configuration: %s; Fleet redeployed the local agent (redeployAgentGeneration %d) and Deployment %s rolled out; %s", capi, restored, generation, fleetAgentKey, ready), nil
}

// redeployFleetAgent sets spec.redeployAgentGeneration of cluster.fleet local one past
// status.agentDeployedGeneration (patch_fleet_cluster), unless this plan did already,
// and returns the generation to wait for.
func (r *runner) redeployFleetAgent(ctx context.Context) (int64, error) {
	var generation int64
	// The patch carries the resourceVersion the generation was computed from, so a
	// status write by fleet-controller in between (it writes status all the time) is a
	// conflict: read again and compute again.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := &fleetv1alpha1.Cluster{}
		if err := r.c.Get(ctx, fleetLocalClusterKey, cl); err != nil {
			return fmt.Errorf("read Fleet's Cluster %s: %w", fleetLocalClusterKey, err)
		}
		if cl.Annotations[FleetAgentRedeployedAnnotation] == r.in.Plan {
			generation = cl.Spec.RedeployAgentGeneration
			return nil
		}
		generation = ptr.Deref(cl.Status.AgentDeployedGeneration, 0) + 1
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"annotations": map[string]string{FleetAgentRedeployedAnnotation: r.in.Plan}, "resourceVersion": cl.ResourceVersion},
			"spec":     map[string]any{"redeployAgentGeneration": generation},
		})
		if err != nil {
			return err
		}
		return r.c.Patch(ctx, cl, client.RawPatch(types.MergePatchType, patch))
	})
	if err != nil {
		return 0, fmt.Errorf("set spec.redeployAgentGeneration of Fleet's Cluster %s to %d: %w", fleetLocalClusterKey, generation, err)
	}
	return generation, nil
}

// fleetLocalReady waits at most fleetLocalReadyWait for cluster.fleet local's Ready
// condition (wait_cluster_local_is_ready) and says what it saw; it never fails on it.
func (r *runner) fleetLocalReady(ctx context.Context) (string, error) {
	ready, last, err := r.pollBounded(ctx, fleetLocalReadyWait, func(ctx context.Context) (bool, string, error) {
		cl := &fleetv1alpha1.Cluster{}
		if err := r.c.Get(ctx, fleetLocalClusterKey, cl); err != nil {
			return false, "", fmt.Errorf("read Fleet's Cluster %s: %w", fleetLocalClusterKey, err)
		}
		c := condition(cl.Status.Conditions, "Ready")
		if c == nil {
			return false, "no Ready condition", nil
		}
		return c.Status == corev1.ConditionTrue, fmt.Sprintf("Ready %s: %s", c.Status, c.Message), nil
	})
	switch {
	case err != nil:
		return "", err
	case ready:
		return "cluster.fleet local is Ready", nil
	}
	return fmt.Sprintf("cluster.fleet local not Ready after %s (%s), gone on without it as the release's script does", fleetLocalReadyWait, last), nil
}

// pollBounded calls check every poll interval until it says done or limit has passed, and
// returns whether it was done and the last status it gave. Only check's error, or the
// context's, is an error: the release's bounded waits go on when they give up.
func (r *runner) pollBounded(ctx context.Context, limit time.Duration, check func(context.Context) (bool, string, error)) (bool, string, error) {
	deadline := r.in.Clock.Now().Add(limit)
	for {
		done, status, err := check(ctx)
		if err != nil || done {
			return done, status, err
		}
		if !r.in.Clock.Now().Before(deadline) {
			return false, status, nil
		}
		select {
		case <-ctx.Done():
			return false, status, ctx.Err()
		case <-r.in.Clock.After(r.in.PollInterval):
		}
	}
}
