package harvesteradapter

import (
	"context"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
)

// The steps of one node's upgrade, in the order they run; each shows in
// NodeUpdate.status.steps.
const (
	StepClusterUpgrade     = "ClusterUpgrade"
	StepRepository         = "Repository"
	StepImagePreload       = "ImagePreload"
	StepCordon             = "Cordon"
	StepEvacuateVMs        = "EvacuateVMs"
	StepDrain              = "Drain"
	StepKubernetesUpgrade  = "KubernetesUpgrade"
	StepOSUpgrade          = "OSUpgrade"
	StepLonghornDataEngine = "LonghornDataEngine"
	StepLonghornPause      = "LonghornPause"
	StepRancherPreDrain    = upgradeplan.StepRancherPreDrain
	StepRancherPostDrain   = "RancherPostDrain"
	StepRemoveRestartGuard = upgradeplan.StepRemoveRestartGuard
	StepRestoreVMs         = "RestoreVMs"
	StepFinish             = "Finish"
)

// step is one named step of a node's upgrade, in a file of its own (step_*.go). skip
// says, when it is not needed for this node, why; run advances it and says whether it is
// done and what it is doing; timeout bounds it from its start.
type step struct {
	name    string
	timeout func(harvesterv1.Timeouts) time.Duration
	skip    func(u *Updater, ctx context.Context, r *nodeRun) (string, error)
	run     func(u *Updater, ctx context.Context, r *nodeRun) (bool, string, error)
}

// pipeline is the order of a node's steps, as upgrade-toolkit orders its phases: adding
// a step is adding its file and one line here.
var pipeline = []step{
	clusterUpgradeStep,
	repositoryStep,
	preloadStep,
	longhornPauseStep,
	rancherPreDrainStep,
	cordonStep,
	evacuateStep,
	drainStep,
	dataEngineStep,
	removeGuardStep,
	kubernetesStep,
	osStep,
	rancherPostDrainStep,
	restoreStep,
	finishStep,
}

func stepNames() []string {
	names := make([]string, 0, len(pipeline))
	for _, s := range pipeline {
		names = append(names, s.name)
	}
	return names
}
