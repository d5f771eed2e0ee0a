package suc

import (
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// PlanRestartGuard places the restart guard on the nodes a RestartGuardPlan selects:
// the label value of such a Plan's LabelPlanKind.
const PlanRestartGuard PlanKind = "restart-guard"

// restartGuardConcurrency is how many nodes place the guard at once: Harvester's 10
// (shared/facts/harvester-release-steps.md fact 12). Placing it restarts only the
// system agent, not RKE2, so the nodes need not take turns.
const restartGuardConcurrency = 10

// restartGuardTimeout bounds one node's Job of the guard, placed (RestartGuardPlan) or
// removed (PlanUnguard). A fixed 10 minutes rather than a step's configurable timeout
// (the preload's 30 minutes, say): the work is one small file and a restart of the
// system agent, which takes seconds, and none of the HarvesterUpgrader's timeouts is
// about it. It is SUC's code default (shared/facts/suc.md, facts 4 and 36), said in the
// Plan so that it does not depend on how SUC was configured.
const restartGuardTimeout = 10 * time.Minute

// RestartGuardPlan is the SUC Plan of Harvester's skip_restart_rancher_system_agent
// (shared/facts/harvester-release-steps.md fact 12), named name: each node it selects
// runs the node program's rke2-restart-guard, which writes a runtime drop-in giving
// rancher-system-agent INSTALL_RKE2_SKIP_ENABLE=true and restarts the agent, so that the
// machine plans Rancher re-renders (on a Rancher upgrade, for every node) are installed
// without restarting RKE2. The caller sets the NodeSelector and adds its own labels; the
// Plan has no NodeSelector, which selects no node (SUC reads a nil selector as nothing).
// Ten nodes at a time as Harvester, every taint tolerated, privileged and root (the
// host's systemctl), the version the release, so that SUC runs it once per node and
// release; written for SUC as NodePlan is (no volume, a tagged image, a deadline, no
// cordon or drain: restarting the agent does not disturb the node's workloads).
//
// The guard stays until PlanUnguard removes it on a node (fact 44) or the node reboots:
// the drop-in is under /run (fact 12).
func RestartGuardPlan(cfg *harvesterv1.HarvesterUpgrader, name, repositoryURL string) *sucv1.Plan {
	spec := cfg.Spec
	release := spec.Release.Version
	return &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: spec.SystemUpgradeController.Namespace,
			Labels:    map[string]string{LabelPlanKind: string(PlanRestartGuard)},
		},
		Spec: sucv1.PlanSpec{
			Concurrency:           restartGuardConcurrency,
			Version:               release,
			ServiceAccountName:    spec.SystemUpgradeController.ServiceAccountName,
			JobActiveDeadlineSecs: ptr.To(DeadlineSeconds(restartGuardTimeout)),
			// As NodePlan: Harvester nodes carry control plane and etcd taints.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Upgrade:     NodeProgram(spec.Images.Node, []string{"rke2-restart-guard"}, repositoryURL, release, PrivilegedRoot()),
		},
	}
}

// UnguardPlan is RestartGuardPlan's counterpart: each node it selects runs the node
// program's rke2-restart-guard --remove (PlanUnguard's program, without the release's
// pre-drain settings, which belong to a node's own turn), taking the guard off. Named
// name, labelled PlanUnguard; the caller sets the NodeSelector and adds its own labels.
func UnguardPlan(cfg *harvesterv1.HarvesterUpgrader, name, repositoryURL string) *sucv1.Plan {
	plan := RestartGuardPlan(cfg, name, repositoryURL)
	plan.Labels[LabelPlanKind] = string(PlanUnguard)
	plan.Spec.Upgrade = NodeProgram(cfg.Spec.Images.Node, []string{"rke2-restart-guard", "--remove"}, repositoryURL, cfg.Spec.Release.Version, PrivilegedRoot())
	return plan
}
