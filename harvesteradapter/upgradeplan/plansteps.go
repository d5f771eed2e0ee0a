package upgradeplan

import (
	"errors"
	"slices"
	"strings"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// The sub-steps of the ClusterUpgrading phase that the UpgradePlan runs itself, on the
// management side, around the cluster upgrade Job's own (clusterupgrade.StepNames). They
// are listed in status.clusterUpgrade with the Job's, in the order they run, so that one
// list says everything the phase changed. What each changes on the cluster is recorded in
// the cluster upgrade's progress ConfigMap (clusterupgrade.Record) or by the objects it
// creates, and given back when the plan ends, whatever the outcome (removeClusterObjects).
const (
	// PlanStepFreeV2Volumes holds the Job while Longhorn v2 volumes are attached, or
	// stops their VMs when the HarvesterUpgrader says so (harvester-release-steps.md
	// facts 69 to 71; clearV2Volumes).
	PlanStepFreeV2Volumes = "FreeV2Volumes"
	// PlanStepPlaceRestartGuard places the drop-in that keeps Rancher's re-rendered plans
	// from restarting RKE2 on every node at once (fact 12; guardRestarts).
	PlanStepPlaceRestartGuard = "PlaceRestartGuard"
	// PlanStepStartStoppedVMs starts again the VMs PlanStepFreeV2Volumes stopped
	// (startStoppedVMs).
	PlanStepStartStoppedVMs = "StartStoppedVMs"
	// PlanStepRaiseReplicaReplenishment raises Longhorn's replica-replenishment-wait-interval
	// to 1800 s for the nodes (fact 35; raiseReplicaReplenishment).
	PlanStepRaiseReplicaReplenishment = "RaiseReplicaReplenishment"
	// PlanStepDisableDescheduler turns the descheduler add-on off for the nodes (fact 36;
	// disableDescheduler).
	PlanStepDisableDescheduler = "DisableDescheduler"
	// PlanStepSkipMultusManifest places rke2-multus.yaml.skip on the RKE2 servers for the
	// nodes (fact 34; skipMultusManifest).
	PlanStepSkipMultusManifest = "SkipMultusManifest"
)

// planStepsBeforeJob and planStepsAfterJob are the plan's own sub-steps, in the order
// they run, before the cluster upgrade Job is created and once it has succeeded.
var (
	planStepsBeforeJob = []string{PlanStepFreeV2Volumes, PlanStepPlaceRestartGuard}
	planStepsAfterJob  = []string{PlanStepStartStoppedVMs, PlanStepRaiseReplicaReplenishment, PlanStepDisableDescheduler, PlanStepSkipMultusManifest}
)

// isPlanStep says whether name is one of the plan's own sub-steps.
func isPlanStep(name string) bool {
	return slices.Contains(planStepsBeforeJob, name) || slices.Contains(planStepsAfterJob, name)
}

// setClusterUpgrade writes status.clusterUpgrade: the plan's sub-steps before the Job,
// the Job's (job; nil keeps those listed already), then the plan's after it. A plan
// sub-step not given in set keeps what is listed, Pending when nothing is.
func setClusterUpgrade(plan *harvesterv1.UpgradePlan, job []clusterupgrade.StepProgress, set ...harvesterv1.ClusterUpgradeStep) {
	listed := map[string]harvesterv1.ClusterUpgradeStep{}
	var jobSteps []harvesterv1.ClusterUpgradeStep
	for _, s := range plan.Status.ClusterUpgrade {
		listed[s.Name] = s
		if !isPlanStep(s.Name) {
			jobSteps = append(jobSteps, s)
		}
	}
	for _, s := range set {
		listed[s.Name] = s
	}
	if job != nil {
		jobSteps = jobSteps[:0]
		for _, s := range job {
			jobSteps = append(jobSteps, harvesterv1.ClusterUpgradeStep{Name: s.Name, State: string(s.State), Message: s.Message})
		}
	}
	own := func(name string) harvesterv1.ClusterUpgradeStep {
		if s, ok := listed[name]; ok {
			return s
		}
		return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StatePending)}
	}
	out := make([]harvesterv1.ClusterUpgradeStep, 0, len(planStepsBeforeJob)+len(jobSteps)+len(planStepsAfterJob))
	for _, name := range planStepsBeforeJob {
		out = append(out, own(name))
	}
	out = append(out, jobSteps...)
	for _, name := range planStepsAfterJob {
		out = append(out, own(name))
	}
	plan.Status.ClusterUpgrade = out
}

// planStepState is what a plan sub-step's run says of it, for status.clusterUpgrade: err
// is what it returned (a hold keeps it Running with the hold's message, another error
// fails it), finished whether it is done, changed what it changed on the cluster (the
// phase message's words, without their leading separator), idle what to say when it
// had nothing to do (Skipped). A sub-step that was Done stays Done with its message when
// a later look finds nothing left to do, so that what it changed stays listed.
func planStepState(plan *harvesterv1.UpgradePlan, name string, finished bool, changed, idle string, err error) harvesterv1.ClusterUpgradeStep {
	changed = strings.TrimPrefix(strings.TrimSpace(changed), "; ")
	var held *errHeld
	switch {
	case errors.As(err, &held):
		return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StateRunning), Message: held.msg}
	case err != nil:
		if _, permanent := nodeupdater.AsPermanent(err); permanent {
			return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StateFailed), Message: err.Error()}
		}
		// A transient error is retried: the sub-step keeps what it showed.
		for _, s := range plan.Status.ClusterUpgrade {
			if s.Name == name {
				return s
			}
		}
		return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StatePending)}
	case !finished:
		return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StateRunning), Message: changed}
	case changed != "":
		return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StateDone), Message: changed}
	}
	for _, s := range plan.Status.ClusterUpgrade {
		if s.Name == name && s.State == string(clusterupgrade.StateDone) {
			return s
		}
	}
	return harvesterv1.ClusterUpgradeStep{Name: name, State: string(clusterupgrade.StateSkipped), Message: idle}
}
