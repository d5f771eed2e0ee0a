package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// kubernetesStep upgrades RKE2 on the node through its owner and waits for its kubelet
// to come back Ready at the target: Rancher's provisioning where it provisions the node
// (step_rancher.go), else a SUC rke2-upgrade Plan. A SUC upgrade behind Rancher's back
// would leave the old version declared, which Rancher re-installs on every node at its
// next plan change (harvester-release-steps.md facts 61-62).
var kubernetesStep = step{
	name:    StepKubernetesUpgrade,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanKubernetes, t) },
	run:     (*Updater).runKubernetes,
}

func (u *Updater) runKubernetes(ctx context.Context, r *nodeRun) (bool, string, error) {
	owner, err := u.rancherOwner(ctx, r)
	if err != nil {
		return false, "", err
	}
	if owner != nil {
		node, err := u.node(ctx, r)
		if err != nil {
			return false, "", err
		}
		return u.rancherKubernetes(ctx, r, owner, node)
	}
	done, message, err := u.applyPlan(ctx, r, suc.PlanKubernetes)
	if err != nil || !done {
		return done, message, err
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	if !kube.NodeReady(node) || !releases.SameVersion(node.Status.NodeInfo.KubeletVersion, r.nu.Spec.Version) {
		return false, fmt.Sprintf("waiting for node %s to come back Ready at %s (kubelet reports %s)", node.Name, r.nu.Spec.Version, node.Status.NodeInfo.KubeletVersion), nil
	}
	return true, fmt.Sprintf("node %s runs Kubernetes %s", node.Name, r.nu.Spec.Version), nil
}
