package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// pollEvery is how often the demo looks at the objects it waits for.
const pollEvery = 200 * time.Millisecond

// noReactionAfter is how long the annotation path waits for any sign of the manager
// (an UpgradeTask, the status annotation) before it says the manager ignores it.
const noReactionAfter = 30 * time.Second

// upgradeByAnnotation asks for the upgrade as a user does with kubectl annotate: the
// in-place-upgrade-to annotation on the Cluster. The manager cascades it to the control
// plane, then to the MachineDeployments, and reports on the Cluster's status annotation.
func upgradeByAnnotation(ctx context.Context, s *scenario.Scenario, v *view) error {
	mc := s.Management.Client
	cluster := &clusterv1.Cluster{}
	key := client.ObjectKeyFromObject(s.Cluster)
	if err := mc.Get(ctx, key, cluster); err != nil {
		return err
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	if cluster.Annotations == nil {
		cluster.Annotations = map[string]string{}
	}
	cluster.Annotations[inplacev1.UpgradeToAnnotation] = s.Options.Hop.ToKubernetes
	if err := mc.Patch(ctx, cluster, patch); err != nil {
		return fmt.Errorf("annotate Cluster %s: %w", key, err)
	}
	v.step(fmt.Sprintf("kubectl annotate cluster -n %s %s %s=%s", key.Namespace, key.Name, inplacev1.UpgradeToAnnotation, s.Options.Hop.ToKubernetes))

	began := time.Now()
	lastStatus := ""
	for {
		if err := sleep(ctx, pollEvery); err != nil {
			return err
		}
		if err := mc.Get(ctx, key, cluster); err != nil {
			continue
		}
		status := cluster.Annotations[inplacev1.UpgradeStatusAnnotation]
		if status != lastStatus {
			lastStatus = status
			v.step(fmt.Sprintf("Cluster %s: %s=%s", key.Name, inplacev1.UpgradeStatusAnnotation, status))
		}
		switch status {
		case inplacev1.UpgradeStatusDone:
			return nil
		case inplacev1.UpgradeStatusFailed:
			return fmt.Errorf("the Cluster's upgrade failed: %s", cluster.Annotations[inplacev1.UpgradeMessageAnnotation])
		case "":
			if time.Since(began) > noReactionAfter {
				tasks := &inplacev1.UpgradeTaskList{}
				if err := mc.List(ctx, tasks, client.InNamespace(key.Namespace)); err == nil && len(tasks.Items) == 0 {
					return fmt.Errorf("the manager did not react to the %s annotation within %s: this build may not have the annotation cascade yet (issue #6); try --via=hook",
						inplacev1.UpgradeToAnnotation, noReactionAfter)
				}
			}
		}
	}
}

// upgradeByHook sends an ExternalUpgradeRequest over HTTPS for the control plane, waits
// for its UpgradeTask to complete, then does the same for the MachineDeployment with
// the MachineDeployment's maxUnavailable.
func upgradeByHook(ctx context.Context, s *scenario.Scenario, v *view) error {
	tlsConfig, err := manager.ClientTLSConfig(s.Certs.Dir)
	if err != nil {
		return err
	}
	hooks := externalHookClient(s, tlsConfig)
	if _, err := hooks.Discover(ctx); err != nil {
		return fmt.Errorf("discover the manager's hooks: %w", err)
	}

	cp := &hooksv1.ExternalUpgradeRequestRequest{
		ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: s.ControlPlane.Name},
		NewMachineSpec:  hooksv1.NewMachineSpec{Version: s.Options.Hop.ToKubernetes},
	}
	if err := requestAndWait(ctx, s, v, hooks, cp, "KubeadmControlPlane "+s.ControlPlane.Name); err != nil {
		return err
	}

	md := &clusterv1.MachineDeployment{}
	if err := s.Management.Client.Get(ctx, client.ObjectKeyFromObject(s.MachineDeployment), md); err != nil {
		return err
	}
	workers := &hooksv1.ExternalUpgradeRequestRequest{
		MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: md.Name},
		NewMachineSpec:       hooksv1.NewMachineSpec{Version: s.Options.Hop.ToKubernetes},
		Options:              hooksv1.UpgradeOptions{MaxUnavailable: md.Spec.Rollout.Strategy.RollingUpdate.MaxUnavailable},
	}
	return requestAndWait(ctx, s, v, hooks, workers, "MachineDeployment "+md.Name)
}

func externalHookClient(s *scenario.Scenario, tlsConfig *tls.Config) *hookclient.Client {
	catalog := runtimecatalog.New()
	_ = runtimehooksv1.AddToCatalog(catalog)
	_ = hooksv1.AddToCatalog(catalog)
	return hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", s.Manager.ExternalHookPort), tlsConfig, catalog)
}

func requestAndWait(ctx context.Context, s *scenario.Scenario, v *view, hooks *hookclient.Client, req *hooksv1.ExternalUpgradeRequestRequest, target string) error {
	req.Cluster.Namespace, req.Cluster.Name = s.Cluster.Namespace, s.Cluster.Name
	resp := &hooksv1.ExternalUpgradeRequestResponse{}
	if err := hooks.Call(ctx, hooksv1.ExternalUpgradeRequest, extension.ExternalUpgradeRequestHandlerName, req, resp); err != nil {
		return fmt.Errorf("ExternalUpgradeRequest for %s: %w", target, err)
	}
	if resp.Status != runtimehooksv1.ResponseStatusSuccess || resp.Decision != hooksv1.DecisionAccept {
		return fmt.Errorf("ExternalUpgradeRequest for %s: %s %s: %s", target, resp.Status, resp.Decision, resp.Message)
	}
	maxUnavailable := "1"
	if req.Options.MaxUnavailable != nil {
		maxUnavailable = req.Options.MaxUnavailable.String()
	}
	v.step(fmt.Sprintf("ExternalUpgradeRequest for %s to %s (maxUnavailable %s): %s, UpgradeTask %s", target, s.Options.Hop.ToKubernetes, maxUnavailable, resp.Decision, resp.UpgradeTaskName))
	task, err := waitForTask(ctx, s, resp.UpgradeTaskName)
	if err != nil {
		return err
	}
	if task.Status.Phase != inplacev1.TaskPhaseCompleted {
		return fmt.Errorf("UpgradeTask %s of %s ended %s: %s", task.Name, target, task.Status.Phase, taskMessage(task))
	}
	v.step(fmt.Sprintf("UpgradeTask %s: %s, %s machines upgraded", task.Name, task.Status.Phase, task.Status.Progress))
	return nil
}

// waitForTask waits until the UpgradeTask has ended.
func waitForTask(ctx context.Context, s *scenario.Scenario, name string) (*inplacev1.UpgradeTask, error) {
	task := &inplacev1.UpgradeTask{}
	key := client.ObjectKey{Namespace: s.Cluster.Namespace, Name: name}
	for {
		if err := s.Management.Client.Get(ctx, key, task); err == nil && task.Status.Phase.IsFinal() {
			return task, nil
		}
		if err := sleep(ctx, pollEvery); err != nil {
			return nil, err
		}
	}
}

// taskMessage is the task's own word on how it ended: its Degraded or Ready condition.
func taskMessage(task *inplacev1.UpgradeTask) string {
	for _, typ := range []string{inplacev1.DegradedCondition, inplacev1.ReadyCondition} {
		if c := meta.FindStatusCondition(task.Status.Conditions, typ); c != nil && c.Message != "" {
			return c.Message
		}
	}
	return "no message"
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// maxUnavailableOf resolves the MachineDeployment's maxUnavailable against its size, as
// Cluster API does (a percentage rounds down, at least one).
func maxUnavailableOf(md *clusterv1.MachineDeployment, replicas int) int {
	mu := md.Spec.Rollout.Strategy.RollingUpdate.MaxUnavailable
	if mu == nil {
		return 1
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(mu, replicas, false)
	if err != nil || n < 1 {
		return 1
	}
	return n
}
