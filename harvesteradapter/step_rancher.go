package harvesteradapter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// The node's turn with Rancher, where Rancher's provisioning owns RKE2 on the node
// (rancher.ProvisionedNode; harvester-release-steps.md section E). Rancher chooses the
// order (its tiers, fact 60) and cordons the node it takes, then asks for its pre-drain
// hook; the node's NodeUpdate, which selection started because Rancher waits for this
// node (the RancherTurn preflight check), makes the node safe with its own steps
// (Longhorn, VM evacuation, drain, the restart guard taken off), then answers the hook
// (KubernetesUpgrade); Rancher restarts RKE2 at the declared version and asks for the
// post-drain hook, which the node answers after its OS upgrade (RancherPostDrain), as
// Harvester's node Jobs do (node sheet fact 39). Then Rancher uncordons the node.

// rancherPreDrainStep waits until Rancher takes the node: its pre-drain request.
var rancherPreDrainStep = step{
	name:    StepRancherPreDrain,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanKubernetes, t) },
	skip:    (*Updater).skipRancherTurn,
	run:     (*Updater).runRancherPreDrain,
}

// rancherPostDrainStep answers Rancher's post-drain request once the node runs the
// release.
var rancherPostDrainStep = step{
	name:    StepRancherPostDrain,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanKubernetes, t) },
	skip:    (*Updater).skipRancherPostDrain,
	run:     (*Updater).runRancherPostDrain,
}

// rancherOwner is the node's owner when Rancher provisions its RKE2, else nil; read
// once per reconcile.
func (u *Updater) rancherOwner(ctx context.Context, r *nodeRun) (*rancher.Owner, error) {
	if r.ownerRead {
		return r.owner, nil
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return nil, err
	}
	owner, err := rancher.ProvisionedNode(ctx, r.wc, node)
	if err != nil {
		return nil, err
	}
	r.owner, r.ownerRead = owner, true
	return owner, nil
}

func (u *Updater) skipRancherTurn(ctx context.Context, r *nodeRun) (string, error) {
	owner, err := u.rancherOwner(ctx, r)
	if err != nil {
		return "", err
	}
	if owner == nil {
		return fmt.Sprintf("Rancher does not provision RKE2 on node %s (no machine-plan Secret, or fleet-local/local has no rkeConfig): a SUC Plan upgrades it", r.nu.Spec.NodeName), nil
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return "", err
	}
	if rancher.Asked(owner.Secret, rancher.PreDrainRequest) == "" && releases.SameVersion(node.Status.NodeInfo.KubeletVersion, r.nu.Spec.Version) {
		return fmt.Sprintf("node %s runs Kubernetes %s already: Rancher has nothing to restart there", node.Name, r.nu.Spec.Version), nil
	}
	if installedNotRunning(owner, r.nu.Spec.Version) {
		return fmt.Sprintf("Rancher's plan for node %s is applied at RKE2 %s already, under the restart guard, and Rancher will not restart it: KubernetesUpgrade restarts RKE2 on the drained node", node.Name, r.nu.Spec.Version), nil
	}
	return "", nil
}

// installedNotRunning says whether Rancher's plan for the node is applied at version
// while Rancher asks for no drain hook: rancher-system-agent installed that RKE2 under
// the restart guard (a roll handed back settled, or a plan ended early), and counts the
// plan as applied, so Rancher never restarts it and waits for the node's kubelet for
// good (harvester-release-steps.md facts 12 and 61). The node's own update restarts it
// (suc.PlanRKE2Restart).
func installedNotRunning(owner *rancher.Owner, version string) bool {
	if rancher.Asked(owner.Secret, rancher.PreDrainRequest) != "" {
		return false
	}
	d := rancher.ReadDeliveredPlan(owner.Secret)
	return d.Applied && releases.SameVersion(d.Version, version)
}

// runRancherPreDrain waits for Rancher's pre-drain request on the node's plan Secret.
func (u *Updater) runRancherPreDrain(ctx context.Context, r *nodeRun) (bool, string, error) {
	owner, err := u.rancherOwner(ctx, r)
	if err != nil {
		return false, "", err
	}
	if owner == nil {
		return false, fmt.Sprintf("waiting: Rancher no longer provisions RKE2 on node %s (its machine-plan Secret or fleet-local/local's rkeConfig is gone); find out who removed it", r.nu.Spec.NodeName), nil
	}
	if rancher.Asked(owner.Secret, rancher.PreDrainRequest) != "" {
		return true, fmt.Sprintf("Rancher takes node %s (machine-plan Secret %s asks for its pre-drain hook)", r.nu.Spec.NodeName, owner.Secret.Name), nil
	}
	return false, fmt.Sprintf("waiting for Rancher to take node %s: RKE2 %s is declared on fleet-local/local; Rancher takes the nodes tier by tier (etcd, control plane, workers) and asks each for its pre-drain hook",
		r.nu.Spec.NodeName, owner.Cluster.Spec.KubernetesVersion), nil
}

// rancherKubernetes is the KubernetesUpgrade step where Rancher owns RKE2: the
// pre-drain hook is answered (the node is safe now: evacuated, drained, its restart
// guard off), Rancher applies the new plan and restarts RKE2 at the declared version,
// and the step is done once the node is Ready at the target and Rancher asks for the
// post-drain hook (it does once the plan is applied and the node healthy).
func (u *Updater) rancherKubernetes(ctx context.Context, r *nodeRun, owner *rancher.Owner, node *corev1.Node) (bool, string, error) {
	at := kube.NodeReady(node) && releases.SameVersion(node.Status.NodeInfo.KubeletVersion, r.nu.Spec.Version)
	if rancher.Asked(owner.Secret, rancher.PreDrainRequest) == "" {
		if at {
			return true, fmt.Sprintf("node %s runs Kubernetes %s", node.Name, r.nu.Spec.Version), nil
		}
		if installedNotRunning(owner, r.nu.Spec.Version) || nodeupdater.StepState(r.nu, StepRancherPreDrain) == inplacev1.StepStateSkipped {
			done, message, err := u.applyPlan(ctx, r, suc.PlanRKE2Restart)
			if err != nil || !done {
				return false, "RKE2 " + r.nu.Spec.Version + " is installed on node " + node.Name + " but not running (Rancher's plan was applied under the restart guard): restarting it; " + message, err
			}
			return false, fmt.Sprintf("RKE2 restarted on node %s; waiting for its kubelet to report %s and Ready (it reports %s)", node.Name, r.nu.Spec.Version, node.Status.NodeInfo.KubeletVersion), nil
		}
		return false, fmt.Sprintf("waiting for Rancher to ask for node %s's pre-drain hook again", node.Name), nil
	}
	if !rancher.Answered(owner.Secret, rancher.PreDrainRequest, rancher.PreDrainHook) {
		// The answer lets Rancher restart RKE2 on the node: the budget is asked again.
		if held, err := u.freshBudget(ctx, r, node, "restart RKE2"); err != nil || held != "" {
			return false, held, err
		}
	}
	if err := rancher.Answer(ctx, r.wc, owner.Secret, rancher.PreDrainRequest, rancher.PreDrainHook); err != nil {
		return false, "", err
	}
	if !at {
		return false, fmt.Sprintf("pre-drain hook answered; waiting for Rancher to restart RKE2 at %s on node %s (kubelet reports %s)%s%s",
			r.nu.Spec.Version, node.Name, node.Status.NodeInfo.KubeletVersion, planFailures(owner.Secret), u.agentQuiet(r, owner.Secret, time.Now())), nil
	}
	if rancher.Asked(owner.Secret, rancher.PostDrainRequest) == "" {
		return false, fmt.Sprintf("node %s runs Kubernetes %s; waiting for Rancher to finish its plan and ask for the post-drain hook", node.Name, r.nu.Spec.Version), nil
	}
	return true, fmt.Sprintf("Rancher restarted RKE2 at %s on node %s", r.nu.Spec.Version, node.Name), nil
}

// agentQuiet names a rancher-system-agent that has neither applied nor failed the plan
// Rancher delivered to the node for AgentSilentAfter since the pre-drain answer (the
// KubernetesUpgrade step's start): nothing of Rancher's says it, the machine shows
// "waiting for plan to be applied" for as long as it lasts (rancher@v2.14.4
// pkg/capr/planner/store.go getPlanStatusReasonMessage), and an agent that crash-loops
// on the node is what real upgrades met (rancher/rancher#54901, harvester/harvester#10521).
// "" while the agent may just be at work.
func (u *Updater) agentQuiet(r *nodeRun, s *corev1.Secret, now time.Time) string {
	after := u.AgentSilentAfter
	if after == 0 {
		after = 2 * time.Minute
	}
	st := nodeupdater.Step(r.nu, StepKubernetesUpgrade)
	d := rancher.ReadDeliveredPlan(s)
	if st == nil || st.StartTime == nil || d.Applied || d.Version == "" || planFailures(s) != "" {
		return ""
	}
	quiet := now.Sub(st.StartTime.Time).Truncate(time.Second)
	if quiet < after {
		return ""
	}
	return fmt.Sprintf("; rancher-system-agent on node %s has not applied Rancher's plan (RKE2 %s) for %s, nor failed it (timeouts.kubernetesUpgrade allows %s): check the agent on the node (systemctl status rancher-system-agent; journalctl -u rancher-system-agent)",
		r.nu.Spec.NodeName, d.Version, quiet, suc.PlanTimeout(suc.PlanKubernetes, r.cfg.Spec.Timeouts))
}

// planFailures says how often rancher-system-agent failed to apply the node's plan
// (the Secret's failure-count, rancher@v2.14.4 pkg/capr/planner/store.go).
func planFailures(secret *corev1.Secret) string {
	n, _ := strconv.Atoi(string(secret.Data[rancher.FailureCountKey]))
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; rancher-system-agent failed to apply the plan %d time(s): see Rancher's Updated condition on fleet-local/local and rancher-system-agent's log on the node", n)
}

func (u *Updater) skipRancherPostDrain(ctx context.Context, r *nodeRun) (string, error) {
	owner, err := u.rancherOwner(ctx, r)
	if err != nil || owner != nil {
		return "", err
	}
	return fmt.Sprintf("Rancher does not provision RKE2 on node %s: no drain hook to answer", r.nu.Spec.NodeName), nil
}

// runRancherPostDrain answers Rancher's post-drain request, after the OS upgrade; Rancher
// then uncordons the node and ends its turn. Without a request (the node ran the target
// Kubernetes already and Rancher never took it) there is nothing to answer.
func (u *Updater) runRancherPostDrain(ctx context.Context, r *nodeRun) (bool, string, error) {
	owner, err := u.rancherOwner(ctx, r)
	if err != nil {
		return false, "", err
	}
	if owner == nil || rancher.Asked(owner.Secret, rancher.PreDrainRequest) == "" {
		return true, fmt.Sprintf("Rancher waits for no drain hook of node %s", r.nu.Spec.NodeName), nil
	}
	if rancher.Asked(owner.Secret, rancher.PostDrainRequest) == "" {
		return false, fmt.Sprintf("waiting for Rancher to ask for node %s's post-drain hook", r.nu.Spec.NodeName), nil
	}
	if err := u.answerPostDrain(ctx, r, owner.Secret); err != nil {
		return false, "", err
	}
	return true, fmt.Sprintf("post-drain hook answered; Rancher uncordons node %s and takes the next node once its NodeUpdate waits for it", r.nu.Spec.NodeName), nil
}

// answerPostDrain answers the node's post-drain hook, Rancher's planner held first
// (rancher.HoldPlanner: paused, and the pause written again so that the UpgradePlan
// cannot lift it on what it read before).
// The answer ends the node's turn: Rancher's machine-drain controller, which is not the
// planner, uncordons it and clears its drain (the planner asked for the uncordon before
// the post-drain hook was asked, rancher@v2.14.4 pkg/controllers/capr/machinedrain
// unDrain), and a running planner would then take the next node of the roll at once,
// cordoning it whether or not a NodeUpdate waits for it (fact 60). Paused, it takes
// none until the UpgradePlan lets it go for a NodeUpdate waiting at RancherPreDrain
// (upgradeplan steerRancher).
//
// Only while the roll is the UpgradePlan's: the plan there, the strategy still carrying
// our hooks. A plan being deleted counts: its hand-back waits while this node's post-drain
// hook is asked and not answered (upgradeplan handBackRancher), so it lifts the hold after
// this answer; let go meanwhile to finish this node's restart, the planner would take the
// next node with our hooks the moment this one is uncordoned (soak seed 155). Once the
// plan handed the roll back, the strategy has lost our hooks and the planner is Rancher's
// again (resumeRancher let it go): a hold then would have no plan to lift it.
func (u *Updater) answerPostDrain(ctx context.Context, r *nodeRun, s *corev1.Secret) error {
	cl, err := rancher.ProvisioningCluster(ctx, r.wc)
	if err != nil {
		return err
	}
	if r.plan != nil && cl != nil && rancher.HasOurHooks(cl) {
		reason := fmt.Sprintf("post-drain hook of node %s answered by NodeUpdate %s", r.nu.Spec.NodeName, r.nu.Name)
		if _, err := rancher.HoldPlanner(ctx, r.wc, r.plan.Name, reason); err != nil {
			return err
		}
	}
	return rancher.Answer(ctx, r.wc, s, rancher.PostDrainRequest, rancher.PostDrainHook)
}

// rancherAbortReady says whether an abort may end the node's update with respect to
// Rancher, and settles Rancher's turn of the node on the way (every ending of a
// NodeUpdate comes through Abort: failure, timeout, skip, abort, deletion):
//
//   - Before Rancher took the node (our hooks set, no drain of it yet) the plan may
//     have let the planner go for this very node, and a pass that read it so takes the
//     node after a pause (harvester-release-steps.md fact 60). The planner is paused and
//     the ending holds PlannerSettle from its start, looking again: a take that lands
//     meanwhile is withdrawn as below, inside the update.
//   - Before our pre-drain answer nothing of the new plan reached the node. The restart
//     guard, if RemoveRestartGuard took it off, is put back first (PlanReguard): a plan
//     given to the node later, once the plan's hooks are gone, would otherwise restart
//     RKE2 outside any NodeUpdate (fact 12). Then Rancher's drain of the node is
//     withdrawn: its planner paused (rancher.PausePlanner), so that it takes no node
//     nobody asked for, its drain annotations removed and the node it cordoned
//     uncordoned (rancher.Withdraw). The abort ends once a look finds nothing to
//     withdraw.
//   - Our pre-drain answered, Rancher restarts RKE2 at the declared version: the abort
//     holds until the plan is applied and Rancher asks for the post-drain hook, which
//     it answers; Rancher then uncordons the node.
//   - Unless rancher-system-agent fails to apply the plan: it retries without limit
//     (rancher@v2.14.4 pkg/capr/planner/store.go, maxFailures -1), and a retry that
//     succeeds later would restart RKE2 on a node whose update ended. The guard is put
//     back, so that such a retry installs without a restart, and the node, cordoned by
//     Rancher until its plan is applied, is uncordoned (the machine-drain controller
//     does not cordon it again: its drain is done). The UpgradePlan answers the
//     post-drain request that comes once the install succeeds (upgradeplan steerRancher).
//   - Unless rancher-system-agent stays silent: no applied plan, no failure counted, no
//     restart (the agent not running on the node: nothing of Rancher's ends that wait,
//     rancher@v2.14.4 pkg/capr/planner/store.go "waiting for plan to be applied"). The
//     hold is bounded by the time the KubernetesUpgrade step itself waits for Rancher's
//     restart (timeouts.kubernetesUpgrade from the step's start, when the hook was
//     answered; agentSilent): past it, the ending is reversed. The guard is put back, so
//     that the agent, once it runs, installs without a restart; Rancher's drain is
//     withdrawn (rancher.WithdrawUnapplied: the planner delivered the plan already and
//     drains no node for a plan it delivered) and the node uncordoned; an event names
//     the node and what to do, and the UpgradePlan's message says it while the plan is
//     not applied (upgradeplan steerRancher).
func (u *Updater) rancherAbortReady(ctx context.Context, r *nodeRun) (bool, error) {
	owner, err := u.rancherOwner(ctx, r)
	if err != nil || owner == nil {
		return true, err
	}
	s := owner.Secret
	node := r.nu.Spec.NodeName
	if !rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) {
		if st := nodeupdater.StepState(r.nu, StepRemoveRestartGuard); st != inplacev1.StepStatePending && st != inplacev1.StepStateSkipped {
			if done, _, err := u.applyPlan(ctx, r, suc.PlanReguard); err != nil || !done {
				return false, err
			}
		}
		taken := rancher.InOurDrain(s) || rancher.Asked(s, rancher.PreDrainRequest) != ""
		if !taken {
			// A drain withdrawn by an earlier look (or by the plan) is watched for
			// PlannerSettle: the machine-drain controller may still cordon the node from
			// the Secret as it was before (rancher.SettleWithdrawn).
			if settled, err := rancher.SettleWithdrawn(ctx, r.wc, s, node, u.plannerSettle(), time.Now()); err != nil || !settled {
				return false, err
			}
		}
		if !taken && (!rancher.HasOurHooks(owner.Cluster) || nodeupdater.StepState(r.nu, StepRancherPreDrain) == inplacev1.StepStatePending) {
			return true, nil // the plan never let the planner go for this node
		}
		pause, err := rancher.PausePlanner(ctx, r.wc, upgradeplan.Name(r.nu.Spec.ClusterName, r.cfg.Spec.Release.Version))
		if err != nil || !pause.Served {
			// No RKEControlPlane to pause: Rancher keeps waiting at the hook.
			return err == nil, err
		}
		if !taken {
			// The plan may have let the planner go for this very node, and a pass that
			// read it so takes the node after the pause has landed: the ending holds,
			// looking again, until such a pass has had time to land, and withdraws what
			// it took (the branch below) while the update still runs.
			return u.plannerSettled(r), nil
		}
		changed, err := rancher.Withdraw(ctx, r.wc, s, node)
		if apierrors.IsConflict(err) {
			return false, nil // Rancher wrote the Secret meanwhile: look again
		}
		return err == nil && !changed, err
	}
	if rancher.Asked(s, rancher.PostDrainRequest) != "" {
		if err := u.answerPostDrain(ctx, r, s); err != nil {
			if apierrors.IsConflict(err) {
				return false, nil
			}
			return false, err
		}
		return true, nil
	}
	failing := planFailures(s) != ""
	silent := !failing && agentSilent(r, time.Now())
	if !failing && !silent {
		return false, nil // RKE2 restarts now: the abort waits for the plan to be applied
	}
	if done, _, err := u.applyPlan(ctx, r, suc.PlanReguard); err != nil || !done {
		return false, err
	}
	if silent {
		changed, err := rancher.WithdrawUnapplied(ctx, r.wc, s, node)
		if apierrors.IsConflict(err) {
			return false, nil // Rancher wrote the Secret meanwhile: look again
		}
		if err != nil || !changed {
			return err == nil, err
		}
		u.event(r, corev1.EventTypeWarning, "RancherAgentSilent", "Withdraw", fmt.Sprintf(
			"rancher-system-agent on node %s has not applied Rancher's plan (RKE2 %s) within %s of the pre-drain answer (timeouts.kubernetesUpgrade): the restart guard is back, Rancher's drain withdrawn and the node uncordoned. "+
				"Check the agent on the node (systemctl status rancher-system-agent; journalctl -u rancher-system-agent): once it runs it installs RKE2 without restarting it, and a new NodeUpdate of the node restarts RKE2 inside it",
			node, rancher.ReadDeliveredPlan(s).Version, suc.PlanTimeout(suc.PlanKubernetes, r.cfg.Spec.Timeouts)))
		return false, nil // a next look finds nothing left to withdraw
	}
	_, err = rancher.Uncordon(ctx, r.wc, node)
	return err == nil, err
}

// plannerSettled says whether an ending of a node Rancher has not taken has held long
// enough, with the planner paused, for a pass that read it unpaused to have landed:
// PlannerSettle from the ending's start, which comes just before its first look paused
// the planner. Rancher's planner reads the pause once, at the start of a pass
// (rancher@v2.14.4 pkg/capr/planner/planner.go Process), and says nothing of a pass under
// way: its status changes only when what it says changes (wrangler condition setValue),
// so a bounded wait is the one signal.
func (u *Updater) plannerSettled(r *nodeRun) bool {
	start := r.nu.Status.AbortStartTime
	return start == nil || time.Since(start.Time) >= u.plannerSettle()
}

// plannerSettle is PlannerSettle or its default.
func (u *Updater) plannerSettle() time.Duration {
	if u.PlannerSettle > 0 {
		return u.PlannerSettle
	}
	return rancher.DefaultPlannerSettle
}

// agentSilent says whether an ending has waited long enough for rancher-system-agent to
// apply the plan our answered pre-drain hook let Rancher deliver: as long as the
// KubernetesUpgrade step itself waits for Rancher's restart (timeouts.kubernetesUpgrade,
// from the step's start, when it answered the hook). An ending that comes from that
// step's own timeout finds it passed at once; an earlier abort holds until then, while
// a restart may still come.
func agentSilent(r *nodeRun, now time.Time) bool {
	var since time.Time
	switch st := nodeupdater.Step(r.nu, StepKubernetesUpgrade); {
	case st != nil && st.StartTime != nil:
		since = st.StartTime.Time
	case r.nu.Status.AbortStartTime != nil:
		since = r.nu.Status.AbortStartTime.Time
	default:
		return false
	}
	return now.Sub(since) >= suc.PlanTimeout(suc.PlanKubernetes, r.cfg.Spec.Timeouts)
}

// removeGuardStep takes the restart guard off the node before Rancher is let restart its
// RKE2: Harvester's recover_rancher_system_agent at the start of pre-drain
// (harvester-release-steps.md fact 44). The UpgradePlan placed the guard on every node
// before the Rancher upgrade (guardRestarts, fact 12), so that Rancher's re-rendered
// plans did not restart RKE2 everywhere; with it still there, the plan that installs the
// release would not restart RKE2 on this node either.
var removeGuardStep = step{
	name:    StepRemoveRestartGuard,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanUnguard, t) },
	skip: func(u *Updater, ctx context.Context, r *nodeRun) (string, error) {
		owner, err := u.rancherOwner(ctx, r)
		if err != nil {
			return "", err
		}
		if owner == nil || rancher.Asked(owner.Secret, rancher.PreDrainRequest) == "" {
			return fmt.Sprintf("Rancher will not restart RKE2 on node %s for this upgrade: no restart guard to take off", r.nu.Spec.NodeName), nil
		}
		return "", nil
	},
	run: func(u *Updater, ctx context.Context, r *nodeRun) (bool, string, error) {
		return u.applyPlan(ctx, r, suc.PlanUnguard)
	},
}
