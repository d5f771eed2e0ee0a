package upgradeplan

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
)

// heldPlan is a plan held in NodeUpgrading, as the demo's --fail demo-workers-2 leaves it:
// the roll's four settings changed, demo-workers-2 failed, demo-workers-3 not started.
func heldPlan() *harvesterv1.UpgradePlan {
	done, skipped := string(clusterupgrade.StateDone), string(clusterupgrade.StateSkipped)
	return &harvesterv1.UpgradePlan{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "harvester-v1-8-1"},
		Spec:       harvesterv1.UpgradePlanSpec{ClusterName: "harvester", Version: "v1.8.1"},
		Status: harvesterv1.UpgradePlanStatus{
			Phase: harvesterv1.UpgradePlanNodeUpgrading,
			ClusterUpgrade: []harvesterv1.ClusterUpgradeStep{
				{Name: PlanStepFreeV2Volumes, State: skipped},
				{Name: clusterupgrade.StepPauseCharts, State: done},
				{Name: clusterupgrade.StepDisableKubeVirtWorkloadUpdates, State: done},
				{Name: PlanStepStartStoppedVMs, State: skipped},
				{Name: PlanStepRaiseReplicaReplenishment, State: done},
				{Name: PlanStepDisableDescheduler, State: done},
				{Name: PlanStepSkipMultusManifest, State: done},
			},
			Nodes: []harvesterv1.NodeUpgradeStatus{
				{Name: "demo-workers-1", State: NodeStateAtRelease},
				{Name: "demo-workers-2", State: string(inplacev1.NodeUpdatePhaseFailed), NodeUpdate: "workers-v1-workers-2",
					Message: "step OSUpgrade: elemental upgrade failed with return code: 33 (container upgrade of pod p exited with code 1); SUC job j of plan p failed on node demo-workers-2: BackoffLimitExceeded: Job has reached the specified backoff limit"},
				{Name: "demo-workers-3", State: NodeStateImagePreloaded},
			},
		},
	}
}

// What holds the plan, in one message: the failed node in its own words first, the
// settings the cluster keeps for the roll and why (the plan has not ended), and the two
// ways on with the commands that take them.
func TestHeldMessage(t *testing.T) {
	retry := "kubectl annotate machinedeployment -n demo workers inplace.cluster.x-k8s.io/in-place-upgrade-to=v1.35.6+rke2r1 --overwrite"
	end := "kubectl annotate upgradeplan -n demo harvester-v1-8-1 harvester.inplace.cluster.x-k8s.io/allow-deletion=true, then kubectl delete upgradeplan -n demo harvester-v1-8-1"
	words := "elemental upgrade failed with return code: 33 (container upgrade of pod p exited with code 1); SUC job j of plan p failed on node demo-workers-2: BackoffLimitExceeded: Job has reached the specified backoff limit"
	settings := "the cluster keeps the roll's settings (KubeVirt's workloadUpdateMethods [] in the harvester chart, Longhorn's replica-replenishment-wait-interval 1800, the descheduler add-on off, rke2-multus.yaml.skip on the RKE2 servers) until the plan ends; "
	noSettings := heldPlan()
	noSettings.Status.ClusterUpgrade = nil
	for _, tc := range []struct {
		name   string
		plan   *harvesterv1.UpgradePlan
		failed []failedNode
		want   string
	}{
		{"no node failed", heldPlan(), nil, ""},
		{"one node", heldPlan(), []failedNode{{"demo-workers-2", heldPlan().Status.Nodes[1].Message, retry}},
			"node demo-workers-2 failed at OSUpgrade: " + words + "; " + settings +
				"to go on: retry the node (" + retry + ") or end the plan (" + end + "), which gives every setting back"},
		{"two nodes of one MachineDeployment", heldPlan(), []failedNode{{"a", "step Drain: x", retry}, {"b", "step OSUpgrade: y", retry}},
			"node a failed at Drain: x; node b failed at OSUpgrade: y; " + settings +
				"to go on: retry the nodes (" + retry + ") or end the plan (" + end + "), which gives every setting back"},
		{"two nodes asked for apart", heldPlan(), []failedNode{{"cp-1", "step Cordon: x", "R1"}, {"w-1", "no step named", "R2"}},
			"node cp-1 failed at Cordon: x; node w-1 failed: no step named; " + settings +
				"to go on: retry the nodes (cp-1: R1; w-1: R2) or end the plan (" + end + "), which gives every setting back"},
		{"nothing changed for the roll", noSettings, []failedNode{{"n", "", "R"}},
			"node n failed; to go on: retry the node (R) or end the plan (" + end + "), which gives every setting back"},
	} {
		if got := heldMessage(tc.plan, tc.failed); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// The retry is the path the node's task came from: for a task of the annotation cascade
// or of an ExternalUpgradeRequest, the Cluster's failure budget lifted (a new task waits
// Paused until then) and the same request again (its target, its version); for Cluster
// API's hooks, the NodeUpdate deleted. Read through the NodeUpdate's owner.
func TestHeldByFailedNodesNamesTheRetryOfEachPath(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := inplacev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	task := func(name string, pacing inplacev1.Pacing, cp bool) *inplacev1.UpgradeTask {
		task := &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name, UID: types.UID("uid-" + name)},
			Spec: inplacev1.UpgradeTaskSpec{ClusterName: "harvester", Version: "v1.35.6+rke2r1", Pacing: pacing}}
		if cp {
			task.Spec.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
		} else {
			task.Spec.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "workers"}
		}
		return task
	}
	nodeUpdate := func(name, machine string, owner *inplacev1.UpgradeTask) *inplacev1.NodeUpdate {
		nu := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name},
			Spec: inplacev1.NodeUpdateSpec{ClusterName: "harvester", MachineName: machine, Version: "v1.35.6+rke2r1"}}
		if owner != nil {
			nu.OwnerReferences = []metav1.OwnerReference{{APIVersion: inplacev1.GroupVersion.String(), Kind: "UpgradeTask", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
		}
		return nu
	}
	workers := task("workers-v1", inplacev1.PacingExtension, false)
	cp := task("cp-v1", "", true)
	capi := task("workers-capi", inplacev1.PacingExternal, false)
	r := &PlanReconciler{Env: Env{Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(workers, cp, capi).Build()}}
	for _, tc := range []struct {
		name string
		nu   *inplacev1.NodeUpdate
		want string
	}{
		{"a MachineDeployment's task", nodeUpdate("workers-v1-workers-2", "workers-2", workers),
			"kubectl annotate cluster -n demo harvester inplace.cluster.x-k8s.io/failure-budget-reset=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite (the failure no longer counts against the Cluster's failure budget), then kubectl annotate machinedeployment -n demo workers inplace.cluster.x-k8s.io/in-place-upgrade-to=v1.35.6+rke2r1 --overwrite, or the same ExternalUpgradeRequest again: a new UpgradeTask upgrades it and the machines UpgradeTask workers-v1 did not start"},
		{"a control plane's task", nodeUpdate("cp-v1-cp-2", "cp-2", cp),
			"kubectl annotate cluster -n demo harvester inplace.cluster.x-k8s.io/failure-budget-reset=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite (the failure no longer counts against the Cluster's failure budget), then kubectl annotate kubeadmcontrolplane -n demo cp inplace.cluster.x-k8s.io/in-place-upgrade-to=v1.35.6+rke2r1 --overwrite, or the same ExternalUpgradeRequest again: a new UpgradeTask upgrades it and the machines UpgradeTask cp-v1 did not start"},
		{"Cluster API's hooks", nodeUpdate("workers-capi-workers-1", "workers-1", capi),
			"kubectl delete nodeupdate -n demo workers-capi-workers-1: Cluster API asks again with UpdateMachine and a new NodeUpdate upgrades it"},
		{"a task that is gone", nodeUpdate("gone-workers-1", "workers-1", task("gone", "", false)),
			"kubectl annotate cluster -n demo harvester inplace.cluster.x-k8s.io/failure-budget-reset=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite (the failure no longer counts against the Cluster's failure budget), then ask again for the upgrade of machine workers-1 to v1.35.6+rke2r1 as it was asked for (the in-place-upgrade-to annotation, an ExternalUpgradeRequest, or, under Cluster API's hooks, kubectl delete nodeupdate -n demo gone-workers-1)"},
	} {
		plan := heldPlan()
		pr := &PlanRun{Plan: plan}
		got := r.heldByFailedNodes(context.Background(), pr, map[string]*inplacev1.NodeUpdate{"demo-workers-2": tc.nu})
		want := heldMessage(plan, []failedNode{{"demo-workers-2", plan.Status.Nodes[1].Message, tc.want}})
		if got != want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, want)
		}
	}
	plan := heldPlan()
	plan.Status.Nodes[1].State = string(inplacev1.NodeUpdatePhaseInProgress) + "/OSUpgrade"
	if got := r.heldByFailedNodes(context.Background(), &PlanRun{Plan: plan}, nil); got != "" {
		t.Errorf("no node failed, yet %q", got)
	}
}
