package sim

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// Fleet's local agent, as fleet-controller manages it, and what Fleet's and Harvester's
// upgrades do to fleet-controller's configuration (harvester-release-steps.md fact 16.5
// and 16.14 to 16.16). Each behaviour follows the source named:
//
//   - fleet-controller deploys the local fleet-agent again when spec.redeployAgentGeneration
//     of cluster.fleet local differs from status.agentDeployedGeneration, or when the
//     apiServerURL or apiServerCA of its configuration differ from what the deployed agent
//     was given (status.apiServerURL, status.apiServerCAHash; onConfig then sets
//     status.agentConfigChanged, which stays until the agent is deployed again, even if
//     the configuration goes back): rancher/fleet
//     internal/cmd/controller/agentmanagement/controllers/cluster/import.go at 881da83,
//     onConfig, agentDeployed, importCluster. It does so at once
//     (the simulator in the same pass): the agent's objects are applied again (here the
//     Deployment's template changes, so it rolls out), and the status records the
//     generation, the URL and the CA's hash, with Imported and Ready True. Without an
//     apiServerURL it deploys nothing and reports "missing apiServerURL in fleet config for
//     cluster auto registration" (the same function; harvester issue #4565).
//   - When Rancher upgrades the fleet chart, fleet-controller's configuration comes out
//     with apiServerURL and apiServerCA empty (harvester PR #6962: "When upgrading fleet,
//     we observed apiServerURL become empty"; rancher/fleet#3061: "in upgrade process, this
//     value becomes empty first, then revert").
//   - Harvester's own controller writes them back (harvester
//     pkg/controller/master/mcmsettings/fleetcontroller.go); harvester PR #7022: "old
//     harvester POD should update the configmap just after Rancher is upgraded by Helm.
//     But in rare cases, it does not and until the new harvester POD is up". The
//     simulator plays the rare case, the one the release guards against: it writes them
//     back when the harvester ManagedChart starts deploying a new generation (the new
//     harvester pod starting), so a fleet-agent redeploy lands while that chart is being
//     upgraded, which is what the release's save and restore prevent (fact 16, "if the
//     waits are skipped").
//
// FleetAgentRedeploys records each redeploy with the ManagedCharts being deployed at
// that moment.

// The API server address and CA the simulated cluster's fleet-controller configuration
// holds (the values of rancher/fleet#3061's example cluster: the Kubernetes Service).
const (
	FleetAPIServerURL = "https://10.53.0.1:443"
)

// FleetAPIServerCA is the CA in the simulated configuration, base64 as Fleet keeps it.
var FleetAPIServerCA = base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\nsimulated cluster CA\n-----END CERTIFICATE-----\n"))

// FleetAgentRedeploy is one deploy of the local fleet-agent by the simulated
// fleet-controller.
type FleetAgentRedeploy struct {
	At time.Time
	// Generation is the redeployAgentGeneration it was deployed for.
	Generation int64
	// Reason says what asked for it: the redeploy generation, the configuration.
	Reason string
	// ChartsInFlight are the ManagedCharts (fleet-local) being deployed then: not paused,
	// a generation Fleet has not reconciled.
	ChartsInFlight []string
}

// FleetAgentRedeploys are the local fleet-agent's deploys so far, in order.
func (r *Rancher) FleetAgentRedeploys() []FleetAgentRedeploy {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]FleetAgentRedeploy(nil), r.agentRedeploys...)
}

func fleetConfigYAML(url, ca string) string {
	return fmt.Sprintf("agentCheckinInterval: 15m\nagentTLSMode: system-store\napiServerCA: %q\napiServerURL: %q\nbootstrap:\n  agentNamespace: %s\n  namespace: %s\n",
		ca, url, rancher.FleetLocalAgentNamespace, rancher.FleetLocal)
}

// seedFleet creates fleet-controller's configuration with the cluster's API server,
// cluster.fleet local with its agent deployed for it (generation 0, Imported and Ready),
// and the fleet-agent Deployment rolled out.
func seedFleet(ctx context.Context, c client.Client) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rancher.FleetLocalAgentNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", rancher.FleetLocalAgentNamespace, err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerConfigMap},
		Data:       map[string]string{rancher.FleetControllerConfigKey: fleetConfigYAML(FleetAPIServerURL, FleetAPIServerCA)},
	}
	cl := &fleetv1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: rancher.FleetLocalCluster}}
	agent := seedDeployment(rancher.FleetAgentDeploy, rancher.FleetAgentDeploy, "rancher/fleet-agent:v0.13.0", 1)
	agent.Namespace = rancher.FleetLocalAgentNamespace
	for _, o := range []client.Object{cm, cl, agent} {
		if err := recreate(ctx, c, o); err != nil {
			return err
		}
	}
	cl.Status = fleetv1alpha1.ClusterStatus{AgentDeployedGeneration: ptr.To(int64(0))}
	markAgentDeployed(cl, FleetAPIServerURL, FleetAPIServerCA)
	if err := c.Status().Update(ctx, cl); err != nil {
		return fmt.Errorf("seed the status of Fleet's Cluster: %w", err)
	}
	return rollOut(ctx, c, client.ObjectKeyFromObject(agent))
}

// hashCA is import.go's hashStatusField of the CA as the configuration gives it.
func hashCA(ca string) string {
	raw, _ := base64.StdEncoding.DecodeString(ca)
	b, _ := json.Marshal(raw)
	return fmt.Sprintf("%x", sha256.Sum224(b))
}

func markAgentDeployed(cl *fleetv1alpha1.Cluster, url, ca string) {
	now := time.Now().UTC().Format(time.RFC3339)
	cl.Status.AgentDeployedGeneration = ptr.To(cl.Spec.RedeployAgentGeneration)
	cl.Status.APIServerURL, cl.Status.APIServerCAHash = url, hashCA(ca)
	cl.Status.AgentConfigChanged = false
	cl.Status.Conditions = []genericcondition.GenericCondition{
		{Type: "Imported", Status: corev1.ConditionTrue, LastUpdateTime: now},
		{Type: "Ready", Status: corev1.ConditionTrue, LastUpdateTime: now},
	}
}

// fleetConfig reads fleet-controller's configuration; nil when it is missing.
func (r *Rancher) fleetConfig(ctx context.Context) (*corev1.ConfigMap, rancher.FleetConfig, error) {
	cm := &corev1.ConfigMap{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerConfigMap}, cm); err != nil {
		return nil, nil, client.IgnoreNotFound(err)
	}
	cfg, err := rancher.ParseFleetConfig(cm.Data[rancher.FleetControllerConfigKey])
	return cm, cfg, err
}

// setFleetAPIServer writes url and ca into fleet-controller's configuration, as the
// fleet chart's render (both empty) or Harvester's controller (the cluster's) does.
func (r *Rancher) setFleetAPIServer(ctx context.Context, url, ca string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, cfg, err := r.fleetConfig(ctx)
		if err != nil || cm == nil {
			return err
		}
		if cur := cfg.APIServer(); cur.URL == url && cur.CA == ca {
			return nil
		}
		cm.Data[rancher.FleetControllerConfigKey] = fleetConfigYAML(url, ca)
		return r.Client.Update(ctx, cm)
	})
}

// harvesterRestoresFleetConfig is Harvester's controller writing the cluster's API server
// back into fleet-controller's configuration, which the simulator plays when the new
// harvester pod starts (see above).
func (r *Rancher) harvesterRestoresFleetConfig(ctx context.Context) error {
	return r.setFleetAPIServer(ctx, FleetAPIServerURL, FleetAPIServerCA)
}

// chartsInFlight are the ManagedCharts Fleet is deploying: not paused, at a generation
// not yet reconciled.
func chartsInFlight(charts []managementv3.ManagedChart) []string {
	var out []string
	for _, mc := range charts {
		if !mc.Spec.Paused && mc.Status.ObservedGeneration != mc.Generation {
			out = append(out, mc.Name)
		}
	}
	return out
}

// fleetAgent is fleet-controller's import handler for cluster.fleet local (see above).
func (r *Rancher) fleetAgent(ctx context.Context) error {
	_, cfg, err := r.fleetConfig(ctx)
	if err != nil || cfg == nil {
		return err
	}
	cl := &fleetv1alpha1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.FleetLocalCluster}, cl); err != nil {
		return client.IgnoreNotFound(err)
	}
	api := cfg.APIServer()
	if !cl.Status.AgentConfigChanged && (api.URL != cl.Status.APIServerURL || hashCA(api.CA) != cl.Status.APIServerCAHash) {
		// onConfig: the agent must be deployed again, whatever the import makes of it.
		cl.Status.AgentConfigChanged = true
		if err := r.Client.Status().Update(ctx, cl); err != nil {
			return err
		}
	}
	var reason string
	switch {
	case cl.Status.AgentDeployedGeneration == nil || *cl.Status.AgentDeployedGeneration != cl.Spec.RedeployAgentGeneration:
		reason = "spec.redeployAgentGeneration " + strconv.FormatInt(cl.Spec.RedeployAgentGeneration, 10)
	case cl.Status.AgentConfigChanged:
		reason = fmt.Sprintf("fleet-controller's configuration changed (apiServerURL %q)", api.URL)
	default:
		return nil
	}
	if api.URL == "" {
		imported := condition(cl.Status.Conditions, "Imported")
		msg := "missing apiServerURL in fleet config for cluster auto registration"
		if imported != nil && imported.Status == corev1.ConditionFalse && imported.Message == msg {
			return nil
		}
		cl.Status.Conditions = []genericcondition.GenericCondition{
			{Type: "Imported", Status: corev1.ConditionFalse, Message: msg, LastUpdateTime: time.Now().UTC().Format(time.RFC3339)},
			{Type: "Ready", Status: corev1.ConditionFalse, Message: msg},
		}
		return r.Client.Status().Update(ctx, cl)
	}
	charts := &managementv3.ManagedChartList{}
	if err := r.Client.List(ctx, charts, client.InNamespace(rancher.FleetLocal)); err != nil {
		return err
	}
	agent := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocalAgentNamespace, Name: rancher.FleetAgentDeploy}, agent); err != nil {
		return client.IgnoreNotFound(err)
	}
	if agent.Spec.Template.Annotations == nil {
		agent.Spec.Template.Annotations = map[string]string{}
	}
	// The agent's objects applied again: a new bootstrap, a new pod.
	agent.Spec.Template.Annotations["sim.fleet.cattle.io/deployed-at"] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := r.Client.Update(ctx, agent); err != nil {
		return err
	}
	markAgentDeployed(cl, api.URL, api.CA)
	if err := r.Client.Status().Update(ctx, cl); err != nil {
		return err
	}
	r.mu.Lock()
	r.agentRedeploys = append(r.agentRedeploys, FleetAgentRedeploy{At: time.Now(), Generation: cl.Spec.RedeployAgentGeneration, Reason: reason, ChartsInFlight: chartsInFlight(charts.Items)})
	r.mu.Unlock()
	return nil
}
