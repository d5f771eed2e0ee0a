package inplacectl

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// sampleNow is the fixed "now" of the samples, so their printed durations never change.
var sampleNow = time.Date(2026, 11, 27, 19, 0, 0, 0, time.UTC)

func ago(d time.Duration) *metav1.Time { t := metav1.NewTime(sampleNow.Add(-d)); return &t }

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// samplePreview is a preview with every kind of machine: in place (one held by a failing
// check, with VMs migrating and stopped, a PDB-blocked pod and a degraded volume),
// replaced, refused and at target.
func samplePreview() *inplacev1.UpgradePreview {
	mu := intstr.FromInt32(1)
	return &inplacev1.UpgradePreview{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "harvester-v1.35.6-rke2r1"},
		Spec:       inplacev1.UpgradePreviewSpec{ClusterName: "harvester", Version: "v1.35.6+rke2r1", MaxUnavailable: &mu},
		Status: inplacev1.UpgradePreviewStatus{
			Phase: inplacev1.PreviewPhaseReady, ObservedRefresh: "t1", ComputedTime: ago(time.Minute),
			Summary: "3 in place, 1 replaced, 1 refused, 1 at target; 1 held; about 1h12m",
			InPlace: 3, Replaced: 1, Refused: 1, AtTarget: 1, Held: 1,
			EstimatedDuration: dur(72 * time.Minute), EstimateSource: "the median of 9 past NodeUpdates of this cluster",
			Machines: []inplacev1.PreviewMachine{
				{
					Name: "harvester-cp-1", NodeName: "demo-cp-1", Target: "KubeadmControlPlane/harvester-cp", Outcome: inplacev1.MachineOutcomeInPlace,
					Order: 1, OrderReason: "control plane first, oldest first", EstimatedDuration: dur(24 * time.Minute),
					Preflight: []inplacev1.PreflightCheckStatus{{Name: "NodeReady", Passed: true}},
					Disruption: &inplacev1.NodeDisruption{
						MigratingVMs: []inplacev1.PreviewVM{{Namespace: "vms", Name: "web-1", Reason: "to demo-cp-2 or demo-cp-3"}},
						StoppedVMs:   []inplacev1.PreviewVM{{Namespace: "vms", Name: "gpu-1", Reason: "a PCI device passed through cannot live-migrate"}},
						Capacity:     "the 2 nodes that stay up have room for the 1 migrating VM",
					},
				},
				{
					Name: "harvester-workers-1", NodeName: "demo-workers-1", Target: "MachineDeployment/harvester-workers", Outcome: inplacev1.MachineOutcomeInPlace,
					Order: 2, OrderReason: "spec.nodeOrder", WouldHold: true, EstimatedDuration: dur(24 * time.Minute),
					Preflight: []inplacev1.PreflightCheckStatus{
						{Name: "NodeReady", Passed: true},
						{Name: "UpdaterChecks/LonghornVolumesHealthy", Passed: false, Message: "volume pvc-db has 1 healthy replica of 3"},
					},
					Disruption: &inplacev1.NodeDisruption{
						BlockingPods:    []inplacev1.PreviewPod{{Namespace: "apps", Name: "db-0", PodDisruptionBudget: "db", Reason: "the budget allows 0 disruptions now"}},
						DegradedVolumes: []inplacev1.PreviewVolume{{Name: "pvc-db", Reason: "its only healthy replica is on demo-workers-1"}},
					},
				},
				{
					Name: "harvester-workers-2", NodeName: "demo-workers-2", Target: "MachineDeployment/harvester-workers", Outcome: inplacev1.MachineOutcomeInPlace,
					Order: 3, OrderReason: "by name", EstimatedDuration: dur(24 * time.Minute),
				},
				{
					Name: "harvester-workers-3", NodeName: "demo-workers-3", Target: "MachineDeployment/harvester-workers", Outcome: inplacev1.MachineOutcomeReplaced,
					Reason: "spec.infrastructureRef: the HarvesterMachineTemplate changes, which no updater covers",
				},
				{
					Name: "harvester-gpu-1", NodeName: "demo-gpu-1", Target: "MachineDeployment/harvester-gpu", Outcome: inplacev1.MachineOutcomeRefused,
					Reason: "the Cluster is fail-closed and spec.bootstrap changes, which no updater covers",
				},
				{
					Name: "harvester-witness-1", NodeName: "demo-witness-1", Target: "MachineDeployment/harvester-witness", Outcome: inplacev1.MachineOutcomeAtTarget,
					Reason: "already runs v1.35.6+rke2r1",
				},
			},
		},
	}
}

// sampleStatus is an upgrade under way: the control plane done, the workers' task
// running with one node in progress, one held by a preflight check and one failed.
func sampleStatus() *UpgradeStatus {
	cp := inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "harvester-cp-v1.35.6", CreationTimestamp: metav1.NewTime(sampleNow.Add(-40 * time.Minute))},
		Spec: inplacev1.UpgradeTaskSpec{ClusterName: "harvester", Version: "v1.35.6+rke2r1",
			ControlPlaneRef: &inplacev1.ControlPlaneReference{Kind: "KubeadmControlPlane", Name: "harvester-cp"}},
		Status: inplacev1.UpgradeTaskStatus{
			Phase: inplacev1.TaskPhaseCompleted, Total: 1, Upgraded: 1, Progress: "1/1",
			StartTime: ago(40 * time.Minute), CompletionTime: ago(20 * time.Minute),
			Machines: []inplacev1.MachineUpgradeStatus{
				{Name: "harvester-cp-1", NodeName: "demo-cp-1", State: inplacev1.MachineStateUpgraded, Order: 1, NodeUpdate: "nu-cp-1"},
			},
		},
	}
	workers := inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "harvester-workers-v1.35.6", CreationTimestamp: metav1.NewTime(sampleNow.Add(-20 * time.Minute))},
		Spec: inplacev1.UpgradeTaskSpec{ClusterName: "harvester", Version: "v1.35.6+rke2r1",
			MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "harvester-workers"}},
		Status: inplacev1.UpgradeTaskStatus{
			Phase: inplacev1.TaskPhaseInProgress, Total: 3, InProgress: 1, Waiting: 1, Failed: 1, Progress: "0/3",
			CurrentNodes: "demo-workers-1", StartTime: ago(19 * time.Minute),
			Machines: []inplacev1.MachineUpgradeStatus{
				{Name: "harvester-workers-1", NodeName: "demo-workers-1", State: inplacev1.MachineStateInProgress, Order: 1, NodeUpdate: "nu-workers-1"},
				{Name: "harvester-workers-2", NodeName: "demo-workers-2", State: inplacev1.MachineStateFailed, Order: 2, NodeUpdate: "nu-workers-2",
					Message: "OSUpgrade failed"},
				{Name: "harvester-workers-3", NodeName: "demo-workers-3", State: inplacev1.MachineStateWaiting, Order: 3,
					Message: "Availability: 1 node(s) of the target already unavailable (demo-workers-1); maxUnavailable is 1"},
			},
			Conditions: []metav1.Condition{
				{Type: inplacev1.DegradedCondition, Status: metav1.ConditionTrue, Reason: inplacev1.NodeFailedReason, Message: "node demo-workers-2 failed: elemental upgrade failed"},
				{Type: inplacev1.PausedCondition, Status: metav1.ConditionFalse, Reason: "NotPaused"},
			},
		},
	}
	steps := func(current string, states ...inplacev1.StepState) []inplacev1.NodeUpdateStep {
		names := []string{"Repository", "Drain", "KubernetesUpgrade", "OSUpgrade", "Finish"}
		var out []inplacev1.NodeUpdateStep
		for i, s := range states {
			st := inplacev1.NodeUpdateStep{Name: names[i], State: s, StartTime: ago(time.Duration(10-i) * time.Minute)}
			if names[i] == current {
				st.Message = "waiting for SUC Plan os-upgrade-demo-workers-1 to finish on the node"
			}
			out = append(out, st)
		}
		return out
	}
	nodeUpdates := map[string]inplacev1.NodeUpdate{
		"nu-cp-1": {ObjectMeta: metav1.ObjectMeta{Name: "nu-cp-1"}, Status: inplacev1.NodeUpdateStatus{
			Phase: inplacev1.NodeUpdatePhaseSucceeded, StartTime: ago(40 * time.Minute), CompletionTime: ago(21 * time.Minute)}},
		"nu-workers-1": {ObjectMeta: metav1.ObjectMeta{Name: "nu-workers-1"}, Status: inplacev1.NodeUpdateStatus{
			Phase: inplacev1.NodeUpdatePhaseInProgress, StartTime: ago(10 * time.Minute), CurrentStep: "OSUpgrade",
			Steps: steps("OSUpgrade", inplacev1.StepStateSucceeded, inplacev1.StepStateSucceeded, inplacev1.StepStateSkipped, inplacev1.StepStateRunning, inplacev1.StepStatePending)}},
		"nu-workers-2": {ObjectMeta: metav1.ObjectMeta{Name: "nu-workers-2"}, Status: inplacev1.NodeUpdateStatus{
			Phase: inplacev1.NodeUpdatePhaseFailed, StartTime: ago(18 * time.Minute), CompletionTime: ago(12 * time.Minute), CurrentStep: "OSUpgrade",
			FailureReason: inplacev1.StepFailedReason, FailureMessage: "elemental upgrade failed with return code: 33"}},
	}
	return &UpgradeStatus{
		Namespace: "demo", Cluster: "harvester", Now: sampleNow,
		Annotations: map[string]string{
			inplacev1.UpgradeToAnnotation:       "v1.35.6+rke2r1",
			inplacev1.UpgradeStatusAnnotation:   inplacev1.UpgradeStatusFailed,
			inplacev1.UpgradeProgressAnnotation: "1/4",
			inplacev1.UpgradeMessageAnnotation:  "MachineDeployment harvester-workers: machine harvester-workers-2 failed: elemental upgrade failed with return code: 33",
		},
		Tasks:       []inplacev1.UpgradeTask{cp, workers},
		NodeUpdates: nodeUpdates,
	}
}
