package upgradeplan

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
)

// AnnotationAllowDeletion on an UpgradePlan lets it be deleted while it is in
// ClusterUpgrading or NodeUpgrading, where the admission policy
// capi-inplace-upgradeplan-deletion (config/policy/upgradeplan-deletion.yaml) refuses it
// otherwise: upgrade-toolkit's allow-deletion (fact 47).
const AnnotationAllowDeletion = "harvester.inplace.cluster.x-k8s.io/allow-deletion"

// failedNode is a node of the plan whose NodeUpdate failed: its words, and how to
// upgrade it again.
type failedNode struct {
	name string
	// words are its NodeUpdate's failure message, the node's own words first
	// (suc.FailedJob).
	words string
	// retry is what asks for it again, as a person types it.
	retry string
}

// heldByFailedNodes says what holds a plan in NodeUpgrading whose nodes failed, for the
// plan's message and its Degraded condition; empty when no node failed. The plan waits
// for every node to run the release, and a failed node's task has stopped, so nothing
// moves until a person decides: the message names each failed node in its own words,
// the settings the cluster keeps for the roll until the plan ends (why they are not
// back), and the two ways on. nus are the newest NodeUpdates of the plan's nodes
// (nodeUpdatesOf); each failed one's UpgradeTask says how it is asked for again.
func (r *PlanReconciler) heldByFailedNodes(ctx context.Context, pr *PlanRun, nus map[string]*inplacev1.NodeUpdate) string {
	var failed []failedNode
	for _, n := range pr.Plan.Status.Nodes {
		if n.State != string(inplacev1.NodeUpdatePhaseFailed) {
			continue
		}
		failed = append(failed, failedNode{name: n.Name, words: n.Message, retry: r.retryOf(ctx, nus[n.Name])})
	}
	return heldMessage(pr.Plan, failed)
}

// retryOf is how the failed NodeUpdate nu is asked for again, by the path its UpgradeTask
// came from: under Cluster API's hooks (pacing External) Cluster API asks again once the
// NodeUpdate is gone (extension.UpdateMachine's answer says the same), and a deleted
// NodeUpdate no longer counts against the Cluster's failure budget; a task of the
// annotation cascade or of an ExternalUpgradeRequest has ended Failed for good, and the
// same request again makes a new task (<task>-2) that upgrades the node again and the
// machines its task did not start, once the failure budget is lifted: with the default
// budget of 1 the new task waits Paused (FailureBudgetExhausted) until then
// (docs/upgradetask.md, failure budget).
func (r *PlanReconciler) retryOf(ctx context.Context, nu *inplacev1.NodeUpdate) string {
	if nu == nil {
		return "ask for its upgrade again, as it was asked for"
	}
	task := &inplacev1.UpgradeTask{}
	owner := metav1.GetControllerOf(nu)
	if owner == nil || owner.Kind != "UpgradeTask" || r.Env.Client.Get(ctx, client.ObjectKey{Namespace: nu.Namespace, Name: owner.Name}, task) != nil {
		return fmt.Sprintf("%s, then ask again for the upgrade of machine %s to %s as it was asked for (the in-place-upgrade-to annotation, an ExternalUpgradeRequest, or, under Cluster API's hooks, kubectl delete nodeupdate -n %s %s)",
			liftFailureBudget(nu.Namespace, nu.Spec.ClusterName), nu.Spec.MachineName, nu.Spec.Version, nu.Namespace, nu.Name)
	}
	return retryCommand(task, nu)
}

// retryCommand is how a person asks again for the failed NodeUpdate nu of task.
func retryCommand(task *inplacev1.UpgradeTask, nu *inplacev1.NodeUpdate) string {
	if task.Spec.Pacing == inplacev1.PacingExternal {
		return fmt.Sprintf("kubectl delete nodeupdate -n %s %s: Cluster API asks again with UpdateMachine and a new NodeUpdate upgrades it", nu.Namespace, nu.Name)
	}
	kind, name := "machinedeployment", ""
	switch {
	case task.Spec.ControlPlaneRef != nil:
		kind, name = strings.ToLower(task.Spec.ControlPlaneRef.Kind), task.Spec.ControlPlaneRef.Name
	case task.Spec.MachineDeploymentRef != nil:
		name = task.Spec.MachineDeploymentRef.Name
	default:
		kind, name = "machine", nu.Spec.MachineName
	}
	return fmt.Sprintf("%s, then kubectl annotate %s -n %s %s %s=%s --overwrite, or the same ExternalUpgradeRequest again: a new UpgradeTask upgrades it and the machines UpgradeTask %s did not start",
		liftFailureBudget(task.Namespace, task.Spec.ClusterName), kind, task.Namespace, name, inplacev1.UpgradeToAnnotation, task.Spec.Version, task.Name)
}

// liftFailureBudget is the command that stops the failures so far from counting against
// the Cluster's failure budget (controllers/upgradetask, failurebudget.go says the same).
func liftFailureBudget(namespace, cluster string) string {
	return fmt.Sprintf("kubectl annotate cluster -n %s %s %s=$(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ) --overwrite (the failure no longer counts against the Cluster's failure budget)",
		namespace, cluster, inplacev1.FailureBudgetResetAnnotation)
}

// heldMessage is the text of heldByFailedNodes: "node X failed at <step>: <its words>;
// the cluster keeps the roll's settings (...) until the plan ends; to go on: retry the
// node (...) or end the plan (...), which gives every setting back". Empty when none
// failed.
func heldMessage(plan *harvesterv1.UpgradePlan, failed []failedNode) string {
	if len(failed) == 0 {
		return ""
	}
	var b strings.Builder
	for _, f := range failed {
		fmt.Fprintf(&b, "node %s failed%s; ", f.name, atStep(f.words))
	}
	settings := rollSettings(plan)
	if len(settings) > 0 {
		fmt.Fprintf(&b, "the cluster keeps the roll's settings (%s) until the plan ends; ", strings.Join(settings, ", "))
	}
	nodes, retries := "node", map[string][]string{}
	var order []string
	for _, f := range failed {
		if _, seen := retries[f.retry]; !seen {
			order = append(order, f.retry)
		}
		retries[f.retry] = append(retries[f.retry], f.name)
	}
	if len(failed) > 1 {
		nodes = "nodes"
	}
	var ways []string
	for _, retry := range order {
		if len(order) == 1 {
			ways = append(ways, retry)
			continue
		}
		ways = append(ways, strings.Join(retries[retry], ", ")+": "+retry)
	}
	end := fmt.Sprintf("kubectl annotate upgradeplan -n %s %s %s=true, then kubectl delete upgradeplan -n %s %s",
		plan.Namespace, plan.Name, AnnotationAllowDeletion, plan.Namespace, plan.Name)
	fmt.Fprintf(&b, "to go on: retry the %s (%s) or end the plan (%s), which gives every setting back", nodes, strings.Join(ways, "; "), end)
	return b.String()
}

// atStep turns a NodeUpdate's failure message "step S: words" (nodeupdater's) into
// " at S: words", so that the node's own words follow its name.
func atStep(words string) string {
	if step, rest, ok := strings.Cut(words, ": "); ok && strings.HasPrefix(step, "step ") && !strings.Contains(step[len("step "):], " ") {
		return " at " + step[len("step "):] + ": " + rest
	}
	if words == "" {
		return ""
	}
	return ": " + words
}

// rollSettings are the settings the plan changed for the node phase and gives back when
// it ends (removeClusterObjects), as its status.clusterUpgrade says they were changed,
// each with its value for the roll.
func rollSettings(plan *harvesterv1.UpgradePlan) []string {
	said := map[string]string{
		clusterupgrade.StepDisableKubeVirtWorkloadUpdates: "KubeVirt's workloadUpdateMethods [] in the harvester chart",
		PlanStepRaiseReplicaReplenishment:                 fmt.Sprintf("Longhorn's %s %d", settingReplicaReplenishmentWaitInterval, replenishmentDuringRoll),
		PlanStepDisableDescheduler:                        "the descheduler add-on off",
		PlanStepSkipMultusManifest:                        "rke2-multus.yaml.skip on the RKE2 servers",
	}
	var out []string
	for _, s := range plan.Status.ClusterUpgrade {
		if text, ok := said[s.Name]; ok && s.State == string(clusterupgrade.StateDone) {
			out = append(out, text)
		}
	}
	return out
}
