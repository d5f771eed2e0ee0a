package upgradeplan

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// StepRemoveRestartGuard is the NodeUpdate step that takes the restart guard off a node
// before Rancher restarts its RKE2 (harvesteradapter.StepRemoveRestartGuard).
const StepRemoveRestartGuard = "RemoveRestartGuard"

// StepRancherPreDrain is the NodeUpdate step at which a node waits for Rancher to take it
// (harvesteradapter.StepRancherPreDrain): the plan lets Rancher's planner go when the
// node Rancher takes next waits there.
const StepRancherPreDrain = "RancherPreDrain"

// Rancher never gets ahead of the NodeUpdates. Left alone, Rancher's planner takes the
// next node of the roll as soon as the one before is done: it cordons it and asks for
// its pre-drain hook (harvester-release-steps.md fact 60) whether or not an UpgradeTask
// wants that node now: with the window closed, a gate red, the node in pauseNodes, the
// task aborted or ended. steerRancher keeps the planner paused (rancher.PausePlanner)
// except while it has work a running NodeUpdate asked for:
//
//   - the node Rancher takes next (rancher.RolloutOrder) has a running NodeUpdate
//     waiting at RancherPreDrain: the planner writes its drain options, and its
//     machine-drain controller cordons it and asks for the pre-drain hook;
//   - a node's pre-drain hook is answered and Rancher has not asked for its post-drain
//     hook yet: the planner delivers the plan and, once it is applied, asks for the
//     uncordon.
//
// Paused, the planner starts nothing; the machine-drain controller, which is not the
// planner, still finishes the cordon, drain-done and uncordon that a Secret asks for. And
// with concurrency 1 (rancher.Strategy), at most one node is ever in Rancher's hands: no
// two cordoned nodes can hold each other in their Longhorn or budget checks.
//
// It also settles the turns of nodes whose NodeUpdate no longer runs, so that no tier
// waits at a hook nobody answers: a drain Rancher started on such a node before the pause
// took is withdrawn (rancher.Withdraw, the node uncordoned), and a post-drain request
// that comes after the node's update ended (its plan failed to apply while it ran, its
// abort put the restart guard back, and a retry of rancher-system-agent since installed
// the plan without a restart) is answered, so that Rancher uncordons it. It says what
// holds Rancher, for the phase's message.
func (r *PlanReconciler) steerRancher(ctx context.Context, pr *PlanRun, nodes []clusterNode, nus map[string]*inplacev1.NodeUpdate) (string, error) {
	cl, err := rancher.ProvisioningCluster(ctx, pr.Workload)
	if err != nil || cl == nil || !rancher.HasOurHooks(cl) {
		return "", err
	}
	// The pause as it is before the Secrets are read: only that pause is lifted below, so
	// that a pause a NodeUpdate set since, before answering a post-drain hook, stays.
	seen, err := rancher.ReadPlannerPause(ctx, pr.Workload)
	if err != nil {
		return "", err
	}
	secrets, err := rancher.PlanSecrets(ctx, pr.Workload)
	if err != nil {
		return "", err
	}
	declared := cl.Spec.KubernetesVersion
	want := ""
	var withdraw, silent, postDrain, failing, settling []string
	for _, n := range nodes {
		s := secrets[n.node.Annotations[rancher.NodeMachineAnnotation]]
		if s == nil {
			continue
		}
		running := nodeUpdateRunning(nus[n.node.Name])
		answered := rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook)
		if !running && !answered && !rancher.InOurDrain(s) && agentNotApplying(s, declared) && !rancher.SameRelease(declared, n.node.Status.NodeInfo.KubeletVersion) {
			silent = append(silent, n.node.Name)
		}
		if !running && !answered && planFailing(s) {
			failing = append(failing, n.node.Name)
		}
		switch {
		case answered && rancher.Asked(s, rancher.PostDrainRequest) == "":
			want = fmt.Sprintf("Rancher restarts RKE2 on node %s", n.node.Name)
		case answered && !running && !rancher.Answered(s, rancher.PostDrainRequest, rancher.PostDrainHook):
			postDrain = append(postDrain, n.node.Name)
		case !answered && !running && (rancher.InOurDrain(s) || rancher.Asked(s, rancher.PreDrainRequest) != ""):
			withdraw = append(withdraw, n.node.Name)
		case !running && s.Annotations[rancher.WithdrawnAtAnnotation] != "":
			settling = append(settling, n.node.Name)
		}
	}
	for _, name := range settling {
		node := nodeNamed(nodes, name)
		if _, err := rancher.SettleWithdrawn(ctx, pr.Workload, secrets[node.Annotations[rancher.NodeMachineAnnotation]], name, r.plannerSettle(), r.now()); err != nil {
			return "", err
		}
	}
	held := ""
	if len(failing) > 0 {
		// Rancher's planner drains a node whose plan failed to apply at once, whatever its
		// concurrency and whatever other node it has in hand (rancher@v2.14.4
		// pkg/capr/planner/planner.go reconcile: r.entry.Plan.Failed lets the drain and
		// the new plan through): let go, it would cordon such a node that no NodeUpdate
		// asked for, next to the one it takes in turn. Held until the agent there applies
		// its plan; a drain it started is withdrawn below.
		held = fmt.Sprintf("; Rancher's planner stays paused while rancher-system-agent fails to apply Rancher's plan on node(s) %s, whose NodeUpdate does not run: Rancher drains a node whose plan failed at once, whatever its concurrency, and would cordon it beside the node it takes in turn. "+
			"Check the agent there (journalctl -u rancher-system-agent; Rancher's Updated condition on fleet-local/local): the roll goes on once its plan applies", strings.Join(failing, ", "))
		want = ""
	}
	if len(postDrain) > 0 {
		// Answered below, once the planner is paused: a node's answered post-drain hook
		// ends its turn, and a running planner would take the next node at once.
		want = ""
	} else if want == "" && held == "" {
		next, err := rancherNext(ctx, pr, nodes, secrets, declared)
		if err != nil {
			return "", err
		}
		if nu := nus[next]; next != "" && nodeUpdateRunning(nu) && nodeupdater.StepState(nu, StepRancherPreDrain) == inplacev1.StepStateRunning {
			// Rancher cordons the node it takes before our own one-node-at-a-time check
			// (Cordon) runs: it takes none while another node's update is past its turn
			// (restarting RKE2 without Rancher, in its OS step, or ending).
			if pastTurn(nus, next) == "" {
				want = fmt.Sprintf("Rancher takes node %s, whose NodeUpdate %s waits for it", next, nu.Name)
			}
		}
	}
	if want != "" {
		if _, err := rancher.ResumeSeenPlanner(ctx, pr.Workload, pr.Plan.Name, seen); err != nil {
			return "", err
		}
		if seen.Paused && seen.By == pr.Plan.Name && seen.Unsynced != "" {
			// Let go now, the planner would roll with what its RKEControlPlane still says.
			return "; Rancher's planner stays paused until it reads what the roll declares: " + seen.Unsynced + silentAgents(silent, declared), nil
		}
		return "; " + want + silentAgents(silent, declared), nil
	}
	pause, err := rancher.PausePlanner(ctx, pr.Workload, pr.Plan.Name)
	if err != nil || !pause.Served {
		return "", err
	}
	for _, name := range postDrain {
		node := nodeNamed(nodes, name)
		s := secrets[node.Annotations[rancher.NodeMachineAnnotation]]
		if err := rancher.Answer(ctx, pr.Workload, s, rancher.PostDrainRequest, rancher.PostDrainHook); err != nil && !apierrors.IsConflict(err) {
			return "", err // a conflict: Rancher wrote the Secret meanwhile, the next pass answers
		}
	}
	for _, name := range withdraw {
		node := nodeNamed(nodes, name)
		s := secrets[node.Annotations[rancher.NodeMachineAnnotation]]
		changed, err := rancher.Withdraw(ctx, pr.Workload, s, name)
		if err != nil {
			if apierrors.IsConflict(err) {
				continue // Rancher wrote the Secret meanwhile: the next pass looks again
			}
			return "", err
		}
		if !changed {
			continue
		}
		r.event(pr.Plan, corev1.EventTypeNormal, "RancherDrainWithdrawn", "Withdraw",
			"Rancher had taken node %s, which no running NodeUpdate waits for: its drain withdrawn and the node uncordoned; Rancher takes it again when its NodeUpdate runs", name)
	}
	if held != "" {
		return held + silentAgents(silent, declared), nil
	}
	return "; Rancher's planner is paused until the node it takes next is asked for (RKEControlPlane fleet-local/local, cluster.x-k8s.io/paused)" + silentAgents(silent, declared), nil
}

// agentNotApplying says whether Rancher delivered the node the plan of the declared
// RKE2 and rancher-system-agent neither applied it nor failed to: under our hooks Rancher
// delivers a plan only after our pre-drain answer, so with no drain left and no
// NodeUpdate running this is an update that ended waiting for a silent agent
// (harvesteradapter rancherAbortReady withdrew the drain).
func agentNotApplying(s *corev1.Secret, declared string) bool {
	d := rancher.ReadDeliveredPlan(s)
	return d.Version != "" && releases.SameVersion(d.Version, declared) && !d.Applied && !planFailing(s)
}

// silentAgents says, for the plan's message, which nodes wait for rancher-system-agent
// to apply Rancher's plan after their update ended, and what to do.
func silentAgents(nodes []string, declared string) string {
	if len(nodes) == 0 {
		return ""
	}
	return fmt.Sprintf("; rancher-system-agent has not applied Rancher's plan (RKE2 %s) on node(s) %s, whose NodeUpdate ended waiting for it: their restart guard is back, so the agent installs RKE2 without restarting it once it runs. "+
		"Check the agent there (systemctl status rancher-system-agent; journalctl -u rancher-system-agent); then a new NodeUpdate of each node restarts RKE2 inside it",
		declared, strings.Join(nodes, ", "))
}

// rancherNext is the node Rancher's planner takes next (rancher.RolloutOrder), "" when
// it has none to take: the first node whose kubelet is not at the declared version,
// unless Rancher's plan is applied there already (installed under the restart guard:
// the node's own NodeUpdate restarts it, Rancher takes nothing).
func rancherNext(ctx context.Context, pr *PlanRun, nodes []clusterNode, secrets map[string]*corev1.Secret, declared string) (string, error) {
	order, err := rancher.RolloutOrder(ctx, pr.Workload, asNodes(nodes), declared)
	if err != nil || len(order) == 0 {
		return "", err
	}
	node := nodeNamed(nodes, order[0])
	if s := secrets[node.Annotations[rancher.NodeMachineAnnotation]]; s != nil {
		if d := rancher.ReadDeliveredPlan(s); d.Applied && releases.SameVersion(d.Version, declared) {
			return "", nil
		}
	}
	return order[0], nil
}

// nodeUpdateRunning says whether a NodeUpdate is running: created or in progress, not
// aborting, not being deleted.
// pastTurn names a node other than next whose NodeUpdate has not ended and is past its
// turn at Rancher's hooks (RancherPreDrain done or skipped): that node is being
// disrupted, or its ending waits for it to be back.
func pastTurn(nus map[string]*inplacev1.NodeUpdate, next string) string {
	for node, nu := range nus {
		if node == next || nu == nil || nu.Status.Phase.IsFinal() || stepsEnded(nu) {
			continue
		}
		switch nodeupdater.StepState(nu, StepRancherPreDrain) {
		case inplacev1.StepStateSucceeded, inplacev1.StepStateSkipped:
			return node
		}
	}
	return ""
}

// stepsEnded says whether every step of nu has ended: its updater is done with the node,
// whatever its phase says yet.
func stepsEnded(nu *inplacev1.NodeUpdate) bool {
	for _, st := range nu.Status.Steps {
		if st.State == inplacev1.StepStatePending || st.State == inplacev1.StepStateRunning {
			return false
		}
	}
	return len(nu.Status.Steps) > 0
}

func nodeUpdateRunning(nu *inplacev1.NodeUpdate) bool {
	return nu != nil && nu.DeletionTimestamp.IsZero() && nu.Status.AbortStartTime == nil &&
		(nu.Status.Phase == inplacev1.NodeUpdatePhaseInProgress || nu.Status.Phase == inplacev1.NodeUpdatePhasePending || nu.Status.Phase == "")
}

func nodeNamed(nodes []clusterNode, name string) *corev1.Node {
	for _, n := range nodes {
		if n.node.Name == name {
			return n.node
		}
	}
	return &corev1.Node{}
}

// handBackRancher, at every end of the plan (success, failure, deletion), gives
// fleet-local/local back settled before the strategy it had is restored
// (removeLabelled): no tier waiting at a hook nobody answers, no node cordoned for the
// roll, no RKE2 restarting outside a NodeUpdate. The release's version stays declared,
// as Harvester's cleanup leaves it (fact 59): once a node runs it, declaring the old one
// again would make Rancher downgrade that node (fact 62). So:
//
//  1. while Rancher has in hand a node whose NodeUpdate has not ended (its drain names
//     our hooks, or it asks for a hook of ours nobody answered yet), the end waits for
//     that update to finish the node's turn: its own steps answer the pre-drain hook,
//     and the post-drain hook once the node runs the release, or its ending settles the
//     node (harvesteradapter rancherAbortReady). Meanwhile the planner is paused, except
//     while Rancher restarts RKE2 there (our pre-drain hook answered, the plan applying
//     and not failing: it waits for the planner to deliver the plan and ask for the
//     uncordon). Handed back earlier, Rancher would answer nothing in that update's
//     place and roll on by itself: our hooks answered ahead (3. below) let its
//     machine-drain controller uncordon the node before the update's OS upgrade and
//     reboot, and a planner still running with our hooks takes the next node as soon as
//     that one is uncordoned, cordoning a node no NodeUpdate asked for (soak seeds 155
//     and 177). With no such update, while Rancher restarts RKE2 on a node the end
//     waits the same way until Rancher asks for the post-drain hook;
//  2. every node whose kubelet is not at the declared version gets the restart guard
//     (a SUC Plan of the plan's own on those nodes): once the strategy loses our hooks,
//     Rancher gives them the release's plan without asking, and only the guard keeps
//     rancher-system-agent from restarting RKE2 there (fact 12); it installs the new RKE2
//     on their disks, to be started by a later NodeUpdate (suc.PlanRKE2Restart) or a
//     reboot;
//  3. our hooks are answered ahead on every drain that names them (rancher.PreAnswer),
//     so that Rancher's machine-drain controller finishes each by itself, and a node whose
//     plan fails to apply, cordoned by Rancher until it is applied, is uncordoned.
//
// The planner is let go after the strategy is restored (resumeRancher). It says what it
// waits for, and names the nodes left behind the declared version (behind).
func handBackRancher(ctx context.Context, pr *PlanRun, nus map[string]*inplacev1.NodeUpdate, settle time.Duration, now time.Time) (waiting string, behind []string, err error) {
	cl, err := rancher.ProvisioningCluster(ctx, pr.Workload)
	if err != nil || cl == nil {
		return "", nil, err
	}
	pause, err := rancher.ReadPlannerPause(ctx, pr.Workload)
	if err != nil {
		return "", nil, err
	}
	secrets, err := rancher.PlanSecrets(ctx, pr.Workload)
	if err != nil {
		return "", nil, err
	}
	inDrain := false
	for _, s := range secrets {
		inDrain = inDrain || rancher.InOurDrain(s)
	}
	if !rancher.HasOurHooks(cl) && pause.By != pr.Plan.Name && !inDrain {
		return "", nil, nil // never handed to Rancher, or handed back
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return "", nil, err
	}
	declared := cl.Spec.KubernetesVersion
	if !rancher.HasOurHooks(cl) && !inDrain {
		// Settled and its strategy given back by an earlier pass: only our pause is left,
		// which resumeRancher lifts once Rancher's planner reads the restored strategy.
		for _, n := range nodes {
			if secrets[n.node.Annotations[rancher.NodeMachineAnnotation]] != nil && !rancher.SameRelease(declared, n.node.Status.NodeInfo.KubeletVersion) {
				behind = append(behind, n.node.Name)
			}
		}
		return "", behind, nil
	}
	for _, n := range nodes {
		s := secrets[n.node.Annotations[rancher.NodeMachineAnnotation]]
		nu := nus[n.node.Name]
		if s == nil || nu == nil || nu.Status.Phase.IsFinal() || !inRancherTurn(s) {
			continue
		}
		if rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) && rancher.Asked(s, rancher.PostDrainRequest) == "" && !planFailing(s) {
			if _, err := rancher.ResumeSeenPlanner(ctx, pr.Workload, pr.Plan.Name, pause); err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("waiting for Rancher to finish restarting RKE2 %s on node %s, whose NodeUpdate %s answered its pre-drain hook, before the roll is handed back", declared, n.node.Name, nu.Name), nil, nil
		}
		if _, err := rancher.PausePlanner(ctx, pr.Workload, pr.Plan.Name); err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("waiting for NodeUpdate %s to finish node %s's turn with Rancher (%s) before the roll is handed back; Rancher's planner stays paused meanwhile, so that it takes no other node", nu.Name, n.node.Name, turnPoint(s)), nil, nil
	}
	for _, n := range nodes {
		s := secrets[n.node.Annotations[rancher.NodeMachineAnnotation]]
		if s == nil || inRancherTurn(s) {
			continue
		}
		settled, err := rancher.SettleWithdrawn(ctx, pr.Workload, s, n.node.Name, settle, now)
		if err != nil {
			return "", nil, err
		}
		if !settled {
			return fmt.Sprintf("watching node %s for %s after Rancher's drain of it was withdrawn, before the roll is handed back: Rancher's machine-drain controller may still cordon it from the plan Secret as it was before", n.node.Name, settle), nil, nil
		}
	}
	var behindNodes []clusterNode
	for _, n := range nodes {
		s := secrets[n.node.Annotations[rancher.NodeMachineAnnotation]]
		if s == nil || rancher.SameRelease(declared, n.node.Status.NodeInfo.KubeletVersion) {
			continue
		}
		// A node whose hooks an earlier pass answered ahead (its plan failing then: counted
		// behind, guarded) is not waited for when its plan applies later: let go with the
		// strategy still carrying our hooks, the planner would pass its post-drain hook at
		// once and take the next node with the roll's cordon and drain, which no NodeUpdate
		// asked for (soak seed 1015). It stays behind, installed under the guard.
		if rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) && rancher.Asked(s, rancher.PostDrainRequest) == "" && !planFailing(s) &&
			!rancher.PostDrainAnsweredAhead(s) {
			if _, err := rancher.ResumeSeenPlanner(ctx, pr.Workload, pr.Plan.Name, pause); err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("waiting for Rancher to finish restarting RKE2 %s on node %s (its pre-drain hook was answered) before the roll is handed back", declared, n.node.Name), nil, nil
		}
		behindNodes = append(behindNodes, n)
		behind = append(behind, n.node.Name)
	}
	// No restart in flight: the planner is held from here until the strategy has lost our
	// hooks (resumeRancher, after removeLabelled restored it). Let go, it would take the
	// next node with our hooks as soon as the last one's post-drain hook is answered
	// (below, or by that node's ending), cordoning a node no NodeUpdate asked for while
	// the guard is placed; held, the node waiting at its post-drain hook is uncordoned
	// once the planner runs again, the hook answered ahead.
	if _, err := rancher.PausePlanner(ctx, pr.Workload, pr.Plan.Name); err != nil {
		return "", nil, err
	}
	if len(behindNodes) > 0 {
		want := suc.RestartGuardPlan(pr.Config, ObjectName("reguard", pr.Plan), pr.repo)
		want.Labels[LabelUpgradePlan] = pr.Plan.Name
		want.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpIn, Values: slices.Sorted(slices.Values(behind))}}}
		done, message, _, err := applyClusterPlan(ctx, pr, want, behindNodes)
		if err != nil || !done {
			return fmt.Sprintf("placing the restart guard on node(s) %s before Rancher gets the roll back: %s", strings.Join(behind, ", "), message), nil, err
		}
	}
	for _, n := range nodes {
		s := secrets[n.node.Annotations[rancher.NodeMachineAnnotation]]
		if s == nil {
			continue
		}
		if _, err := rancher.PreAnswer(ctx, pr.Workload, s); err != nil {
			if apierrors.IsConflict(err) {
				return fmt.Sprintf("answering our hooks ahead on node %s's plan Secret, which Rancher wrote meanwhile", n.node.Name), nil, nil
			}
			return "", nil, err
		}
		if s.Annotations[rancher.DrainDoneAnnotation] != "" && planFailing(s) {
			if _, err := rancher.Uncordon(ctx, pr.Workload, n.node.Name); err != nil {
				return "", nil, err
			}
		}
	}
	return "", behind, nil
}

// inRancherTurn says whether Rancher has the node of the plan Secret s in hand for our
// roll: a drain naming our hooks, or a hook of ours asked for and not answered.
func inRancherTurn(s *corev1.Secret) bool {
	return rancher.InOurDrain(s) ||
		(rancher.Asked(s, rancher.PreDrainRequest) != "" && !rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook)) ||
		(rancher.Asked(s, rancher.PostDrainRequest) != "" && !rancher.Answered(s, rancher.PostDrainRequest, rancher.PostDrainHook))
}

// turnPoint says where a node Rancher has in hand is in its turn, for a message.
func turnPoint(s *corev1.Secret) string {
	switch {
	case rancher.Answered(s, rancher.PostDrainRequest, rancher.PostDrainHook):
		return "post-drain hook answered, Rancher uncordons it"
	case rancher.Asked(s, rancher.PostDrainRequest) != "":
		return "Rancher restarted RKE2 there and waits at its post-drain hook"
	case rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook) && planFailing(s):
		return "rancher-system-agent fails to apply Rancher's plan there"
	case rancher.Answered(s, rancher.PreDrainRequest, rancher.PreDrainHook):
		return "pre-drain hook answered"
	case rancher.Asked(s, rancher.PreDrainRequest) != "":
		return "Rancher cordoned it and waits at its pre-drain hook"
	default:
		return "Rancher is taking it"
	}
}

// releaseGuards, at the end of a plan that reached its node phase, takes the restart
// guard off the nodes that run the declared RKE2 and that no NodeUpdate took through its
// steps since the plan placed the guard (the plan's cluster step guards every node,
// fact 12; a node's own update takes it off, fact 44): a node upgraded before this plan
// (by a plan deleted before it, say), never given a NodeUpdate of it, or whose update
// ended without succeeding after Rancher restarted its RKE2 (an abort puts the guard
// back where the node might still restart). Left on, the
// guard would keep rancher-system-agent from restarting RKE2 for every later plan
// change of Rancher's there (a registry, a new RKE2) until the node reboots. A node whose
// delivered plan is not applied yet keeps it: taken off then, the agent's install would
// restart RKE2 outside any NodeUpdate. A plan that failed in its cluster step leaves the
// guard where it is (Rancher's re-render may still come). It says what it waits for.
func releaseGuards(ctx context.Context, pr *PlanRun, nus map[string]*inplacev1.NodeUpdate) (string, error) {
	switch pr.Plan.Status.Phase {
	case harvesterv1.UpgradePlanNodeUpgrading, harvesterv1.UpgradePlanImageCleaning, harvesterv1.UpgradePlanCleaningUp, harvesterv1.UpgradePlanSucceeded:
	default:
		return "", nil
	}
	cl, err := rancher.ProvisioningCluster(ctx, pr.Workload)
	if err != nil || cl == nil {
		return "", err
	}
	secrets, err := rancher.PlanSecrets(ctx, pr.Workload)
	if err != nil {
		return "", err
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return "", err
	}
	declared := cl.Spec.KubernetesVersion
	var release []clusterNode
	var names []string
	for _, n := range nodes {
		s := secrets[n.node.Annotations[rancher.NodeMachineAnnotation]]
		if s == nil || !rancher.SameRelease(declared, n.node.Status.NodeInfo.KubeletVersion) || !rancher.ReadDeliveredPlan(s).Applied {
			continue
		}
		if nu := nus[n.node.Name]; nu != nil && !nu.CreationTimestamp.Before(&pr.Plan.CreationTimestamp) &&
			(!nu.Status.Phase.IsFinal() || (nu.Status.Phase == inplacev1.NodeUpdatePhaseSucceeded &&
				nodeupdater.StepState(nu, StepRemoveRestartGuard) == inplacev1.StepStateSucceeded)) {
			// Its own update took the guard off (RemoveRestartGuard), or still runs. An
			// update that ended otherwise may have put it back (its abort); one that
			// succeeded without taking it off (Rancher restarted nothing there, the node
			// was not rebooted: upgradeOS false, or its OS at the release already) left
			// the plan's guard on, which the release's pre-drain removes on every node
			// (fact 44): the Plan below takes it off (a no-op where rke2-restart did).
			continue
		}
		release = append(release, n)
		names = append(names, n.node.Name)
	}
	if len(release) == 0 {
		return "", nil
	}
	want := suc.UnguardPlan(pr.Config, ObjectName("unguard", pr.Plan), pr.repo)
	want.Labels[LabelUpgradePlan] = pr.Plan.Name
	want.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpIn, Values: slices.Sorted(slices.Values(names))}}}
	done, message, _, err := applyClusterPlan(ctx, pr, want, release)
	if err != nil || done {
		return "", err
	}
	return fmt.Sprintf("taking the restart guard off node(s) %s, which run the declared RKE2 %s and had no update of their own since the guard was placed: %s", strings.Join(names, ", "), declared, message), nil
}

// planFailing says whether rancher-system-agent failed to apply the node's current plan.
func planFailing(s *corev1.Secret) bool {
	v := string(s.Data[rancher.FailureCountKey])
	return v != "" && v != "0" && !rancher.ReadDeliveredPlan(s).Applied
}
