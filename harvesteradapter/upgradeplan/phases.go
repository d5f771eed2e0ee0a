package upgradeplan

import (
	"context"
	"fmt"
	"slices"
	"strings"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/config"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Node states the plan shows before a node's NodeUpdate starts and after it ends.
const (
	NodeStateWaiting         = "Waiting"
	NodeStateImagePreloading = "ImagePreloading"
	NodeStateImagePreloaded  = "ImagePreloaded"
	NodeStateAtRelease       = "AtRelease"
)

// initialize records the running version, refuses a hop capi-inplace does not support
// (releases.CheckHop), records the cluster's shape and runs the preflight checks (fact 46). A failing check holds the plan here, before anything is created on
// the cluster, and is run again at every look until it passes or is skipped.
func (r *PlanReconciler) initialize(ctx context.Context, pr *PlanRun) (bool, string, error) {
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return false, "", err
	}
	if len(nodes) == 0 {
		return false, "", heldf("the workload cluster %s has no nodes yet", pr.Cluster.Name)
	}
	previous, nonWitness := "", 0
	for _, n := range nodes {
		if n.role != harvesterv1.NodeRoleWitness {
			nonWitness++
		}
		v, err := releases.HarvesterVersionFromOSImage(n.node.Status.NodeInfo.OSImage)
		if err != nil {
			return false, "", heldf("node %s: %v", n.node.Name, err)
		}
		if previous == "" || releases.Less(v, previous) {
			previous = v
		}
	}
	pr.Plan.Status.PreviousVersion = previous
	// A hop outside the table of supported hops is refused here, before anything is
	// created on the cluster; spec.force does not skip it (force only lowers the release's
	// minUpgradableVersion floor): the hop's release-specific migrations would not run
	// (releases.Hops, fact 57).
	if err := releases.CheckHop(previous, pr.Plan.Spec.Version); err != nil {
		return false, "", nodeupdater.Permanentf("UnsupportedHop", "%v", err)
	}
	// A hop whose node migrations run with the OS install (the v1.6 to v1.7 hop's move
	// to NetworkManager) needs the OS upgraded: a node left on its OS would get the new
	// OS at a later hop, whose release no longer runs them (fact 53).
	if m := releases.NodeMigrations(previous, pr.Plan.Spec.Version); len(m) > 0 && !releases.UpgradesOS(pr.Config) {
		return false, "", nodeupdater.Permanentf("UnsupportedHop", "Harvester %s -> %s runs node migrations with the OS upgrade (%s), and the HarvesterUpgrader %s has upgradeOS: false: set upgradeOS to true (a node left on its OS would get the new OS at a later hop without them)",
			previous, pr.Plan.Spec.Version, strings.Join(m, ", "), pr.Config.Name)
	}
	pr.Plan.Status.SingleNode = nonWitness == 1
	pr.Plan.Status.Nodes = r.nodeStatuses(nodes, nil, NodeStateWaiting, pr)
	pr.Plan.Status.Preflight = nil
	if r.Checks != nil {
		pr.Plan.Status.Preflight = r.Checks(ctx, pr)
	}
	pr.Plan.Status.Preflight = append(pr.Plan.Status.Preflight, otherUpgradeCheck(ctx, pr))
	var failed []string
	for _, c := range pr.Plan.Status.Preflight {
		if c.Result == harvesterv1.CheckFailed {
			failed = append(failed, fmt.Sprintf("%s: %s", c.Name, c.Message))
		}
	}
	if len(failed) > 0 {
		return false, "", heldf("preflight checks failed (fix them, or skip one with the annotation skip-check.harvester.inplace.cluster.x-k8s.io/<name>: \"true\"): %s", strings.Join(failed, "; "))
	}
	return true, fmt.Sprintf("%d nodes at Harvester %s; %d preflight checks passed or skipped", len(nodes), previous, len(pr.Plan.Status.Preflight)), nil
}

// createRepository deploys the release's repository and waits until it serves; with
// release.repositoryURL there is none to deploy.
func (r *PlanReconciler) createRepository(ctx context.Context, pr *PlanRun) (bool, string, error) {
	if pr.Config.Spec.Release.RepositoryURL != "" {
		return true, "the release is served by the existing repository " + pr.Config.Spec.Release.RepositoryURL, nil
	}
	return repository.Ensure(ctx, pr.Workload, pr.Config)
}

// populateMetadata reads harvester-release.yaml into the status and checks the release
// installs over the running one (unless spec.force), as the toolkit's version guard.
func (r *PlanReconciler) populateMetadata(ctx context.Context, pr *PlanRun) (bool, string, error) {
	readURL := pr.repo
	if pr.Config.Spec.Release.RepositoryURL == "" && r.Env.RepositoryURL != nil {
		readURL = r.Env.RepositoryURL(pr.repo)
	}
	data, err := r.Env.Releases.ReadRelease(ctx, pr.Cluster, readURL)
	if err != nil {
		return false, "", fmt.Errorf("read the release metadata of Harvester %s: %w", pr.Plan.Spec.Version, err)
	}
	rel, err := releases.ParseMetadata(data)
	if err != nil {
		return false, "", nodeupdater.Permanent("InvalidReleaseMetadata", err)
	}
	pr.Plan.Status.ReleaseMetadata = &harvesterv1.ReleaseInfo{
		Harvester: rel.Harvester, HarvesterChart: rel.HarvesterChart, OS: rel.OS, Kubernetes: rel.Kubernetes,
		Rancher: rel.Rancher, KubeVirt: rel.KubeVirt, MinUpgradableVersion: rel.MinUpgradableVersion,
		MonitoringChart: rel.MonitoringChart, LoggingChart: rel.LoggingChart, LoggingChartHarvesterEventRouter: rel.LoggingChartHarvesterEventRouter,
		RancherDependencies: rel.RancherDependencies.Info(),
	}
	if !releases.SameVersion(rel.Harvester, pr.Plan.Spec.Version) {
		return false, "", nodeupdater.Permanentf("WrongRelease", "the repository serves Harvester %s, but the plan is for %s: point the HarvesterUpgrader's release at the %s release", rel.Harvester, pr.Plan.Spec.Version, pr.Plan.Spec.Version)
	}
	if err := rel.CheckEligible(pr.Plan.Spec.Version, rel.Kubernetes, releases.ForcedFloor(pr.Plan, pr.Plan.Status.PreviousVersion, rel)); err != nil {
		return false, "", heldf("%v (spec.force installs over a version older than minUpgradableVersion; never a downgrade)", err)
	}
	return true, fmt.Sprintf("Harvester %s: Kubernetes %s, Rancher %s, chart %s", rel.Harvester, rel.Kubernetes, rel.Rancher, rel.HarvesterChart), nil
}

// preloadImages pulls the release's images onto every node with one SUC Plan,
// concurrency nodes at a time (fact 50), before any node is disrupted. A negative
// concurrency skips it: each node then preloads in its own turn.
func (r *PlanReconciler) preloadImages(ctx context.Context, pr *PlanRun) (bool, string, error) {
	if p := pr.Config.Spec.PreloadImages; p != nil && !*p {
		return true, "skipped: preloadImages is false in the HarvesterUpgrader", nil
	}
	concurrency := pr.Plan.Spec.ImagePreload.Concurrency
	if concurrency != nil && *concurrency < 0 {
		return true, "skipped (imagePreload.concurrency is negative): each node preloads before it is drained", nil
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return false, "", err
	}
	n := int64(len(nodes))
	if concurrency != nil && *concurrency > 0 && int64(*concurrency) < n {
		n = int64(*concurrency)
	}
	want := clusterPreloadPlan(pr, n)
	done, message, states, err := applyClusterPlan(ctx, pr, want, nodes)
	pr.Plan.Status.Nodes = r.nodeStatuses(nodes, states, NodeStateImagePreloading, pr)
	return done, message, err
}

// clusterPreloadPlan is the SUC Plan that preloads the release's images on every node,
// concurrency at a time: the node program's preload, as each node's own preload Plan
// runs it (planForNode), selecting every node.
func clusterPreloadPlan(pr *PlanRun, concurrency int64) *sucv1.Plan {
	spec := pr.Config.Spec
	release := spec.Release.Version
	return &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{
			Name:      ObjectName("preload", pr.Plan),
			Namespace: spec.SystemUpgradeController.Namespace,
			Labels:    map[string]string{LabelUpgradePlan: pr.Plan.Name, suc.LabelPlanKind: string(suc.PlanPreload)},
		},
		Spec: sucv1.PlanSpec{
			Concurrency:           concurrency,
			Version:               release,
			ServiceAccountName:    spec.SystemUpgradeController.ServiceAccountName,
			JobActiveDeadlineSecs: ptr.To(suc.DeadlineSeconds(suc.PlanTimeout(suc.PlanPreload, spec.Timeouts))),
			NodeSelector:          planNodes(pr.Plan),
			Tolerations:           []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Upgrade:               suc.NodeProgram(spec.Images.Node, PreloadArgs(pr.Plan), pr.repo, release, suc.PrivilegedRoot()),
		},
	}
}

// PreloadArgs is the node program's preload with the plan's minimum validity of RKE2's
// certificates, which it checks first on each node (clusterchecks.CheckRKE2Certificates).
func PreloadArgs(plan *harvesterv1.UpgradePlan) []string {
	var annotations map[string]string
	if plan != nil {
		annotations = plan.Annotations
	}
	return []string{"preload", fmt.Sprintf("--min-cert-days=%d", clusterchecks.RKE2CertificateDays(annotations))}
}

// planNodes selects the nodes the plan covers: its spec.nodeSelector, and every node
// (each carries kubernetes.io/hostname; SUC selects no node with a nil selector).
func planNodes(plan *harvesterv1.UpgradePlan) *metav1.LabelSelector {
	sel := &metav1.LabelSelector{}
	if plan.Spec.NodeSelector != nil {
		sel = plan.Spec.NodeSelector.DeepCopy()
	}
	sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpExists})
	return sel
}

// applyClusterPlan creates or updates a Plan of the plan's own (one for every node) and
// reports, as SUC signals it (a node done once it carries the Plan's latest hash), each
// node's state and whether every node is done. A failed Job fails the plan.
func applyClusterPlan(ctx context.Context, pr *PlanRun, want *sucv1.Plan, nodes []clusterNode) (bool, string, map[string]string, error) {
	current, message, err := suc.Sync(ctx, pr.Workload, want, fmt.Sprintf("%d nodes", len(nodes)))
	if current == nil || err != nil {
		return false, message, nil, err
	}
	if err := suc.FailedJob(ctx, pr.Workload, current, "", pr.logs); err != nil {
		return false, "", nil, err
	}
	states := map[string]string{}
	done := 0
	for _, n := range nodes {
		if suc.DoneOn(current, n.node) {
			states[n.node.Name] = "done"
			done++
		}
	}
	if done == len(nodes) {
		return true, fmt.Sprintf("SUC plan %s completed on all %d nodes", current.Name, len(nodes)), states, nil
	}
	return false, fmt.Sprintf("System Upgrade Controller is applying plan %s: %d of %d nodes done, %d at a time", current.Name, done, len(nodes), current.Spec.Concurrency), states, nil
}

// upgradeNodes lets the nodes go (their NodeUpdates wait for this phase) and follows
// them until every node of the cluster runs the release and no NodeUpdate of the
// cluster still runs. A failed node makes the plan Degraded; it does not fail it: the
// node can be upgraded again (a task retries it, or a new NodeUpdate).
func (r *PlanReconciler) upgradeNodes(ctx context.Context, pr *PlanRun) (bool, string, error) {
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return false, "", err
	}
	nus, err := r.nodeUpdatesOf(ctx, pr)
	if err != nil {
		return false, "", err
	}
	handOver, err := r.rollThroughRancher(ctx, pr, nodes)
	if err != nil {
		return false, "", err
	}
	steer, err := r.steerRancher(ctx, pr, nodes, nus)
	if err != nil {
		return false, "", err
	}
	handOver += steer
	pr.Plan.Status.Nodes = r.nodeStatuses(nodes, nil, NodeStateImagePreloaded, pr, nus)
	at, running := 0, 0
	for _, n := range pr.Plan.Status.Nodes {
		switch n.State {
		case NodeStateAtRelease:
			at++
		case string(inplacev1.NodeUpdatePhasePending), "":
		default:
			if strings.HasPrefix(n.State, string(inplacev1.NodeUpdatePhaseInProgress)) {
				running++
			}
		}
	}
	if at == len(nodes) && running == 0 {
		return true, fmt.Sprintf("all %d nodes run Harvester %s", len(nodes), pr.Plan.Spec.Version), nil
	}
	if held := r.heldByFailedNodes(ctx, pr, nus); held != "" {
		return false, "", heldf("%s%s", held, handOver)
	}
	return false, fmt.Sprintf("%d of %d nodes run Harvester %s; %d upgrading%s", at, len(nodes), pr.Plan.Spec.Version, running, handOver), nil
}

// nodeUpdatesOf maps each node of the plan's cluster to its newest NodeUpdate by the
// Harvester updater.
func (r *PlanReconciler) nodeUpdatesOf(ctx context.Context, pr *PlanRun) (map[string]*inplacev1.NodeUpdate, error) {
	list := &inplacev1.NodeUpdateList{}
	if err := r.Env.Client.List(ctx, list, client.InNamespace(pr.Plan.Namespace)); err != nil {
		return nil, fmt.Errorf("list NodeUpdates: %w", err)
	}
	out := map[string]*inplacev1.NodeUpdate{}
	for i := range list.Items {
		nu := &list.Items[i]
		if nu.Spec.ClusterName != pr.Plan.Spec.ClusterName || nu.Spec.UpdaterRef.Kind != config.GroupKind.Kind {
			continue
		}
		if prev, ok := out[nu.Spec.NodeName]; !ok || prev.CreationTimestamp.Before(&nu.CreationTimestamp) {
			out[nu.Spec.NodeName] = nu
		}
	}
	return out, nil
}

// nodeStatuses describes the cluster's nodes in their order. planStates are the states
// of a cluster Plan's nodes ("done"); before says what a node not done and without a
// NodeUpdate is; a running NodeUpdate shows as InProgress/<step>, an ended one by its
// phase unless the node runs the release.
func (r *PlanReconciler) nodeStatuses(nodes []clusterNode, planStates map[string]string, before string, pr *PlanRun, nus ...map[string]*inplacev1.NodeUpdate) []harvesterv1.NodeUpgradeStatus {
	out := make([]harvesterv1.NodeUpgradeStatus, 0, len(nodes))
	release := pr.Plan.Status.ReleaseMetadata
	at, total := 0, len(nodes)
	for _, n := range nodes {
		s := harvesterv1.NodeUpgradeStatus{Name: n.node.Name, Role: n.role, State: before}
		if planStates[n.node.Name] == "done" {
			s.State = NodeStateImagePreloaded
		}
		atRelease := release != nil && func() bool {
			ok, _ := releases.NodeAtTarget(n.node.Status.NodeInfo, release.Kubernetes, pr.Plan.Spec.Version, releases.UpgradesOS(pr.Config))
			return ok
		}()
		var nu *inplacev1.NodeUpdate
		if len(nus) > 0 {
			nu = nus[0][n.node.Name]
		}
		switch {
		case nu != nil && (nu.Status.Phase == inplacev1.NodeUpdatePhaseInProgress || nu.Status.Phase == inplacev1.NodeUpdatePhasePending) && nu.DeletionTimestamp.IsZero():
			s.NodeUpdate = nu.Name
			s.State = string(inplacev1.NodeUpdatePhaseInProgress)
			if nu.Status.CurrentStep != "" {
				s.State += "/" + nu.Status.CurrentStep
			}
			if st := nodeupdater.Step(nu, nu.Status.CurrentStep); st != nil {
				s.Message = st.Message
			}
		case atRelease:
			s.State = NodeStateAtRelease
			if nu != nil {
				s.NodeUpdate = nu.Name
			}
			at++
		case nu != nil && nu.Status.Phase == inplacev1.NodeUpdatePhaseFailed:
			s.NodeUpdate, s.State, s.Message = nu.Name, string(nu.Status.Phase), nu.Status.FailureMessage
		}
		out = append(out, s)
	}
	pr.Plan.Status.Upgraded = fmt.Sprintf("%d/%d", at, total)
	return out
}

// cleanImages removes the previous release's images from every node, one node at a
// time (fact 55), while the repository still serves the image lists.
func (r *PlanReconciler) cleanImages(ctx context.Context, pr *PlanRun) (bool, string, error) {
	previous := pr.Plan.Status.PreviousVersion
	if previous == "" || releases.SameVersion(previous, pr.Plan.Spec.Version) {
		return true, "skipped: no previous release on the nodes", nil
	}
	nodes, err := clusterNodes(ctx, pr)
	if err != nil {
		return false, "", err
	}
	want := suc.ImageCleanupPlan(pr.Config, ObjectName("image-cleanup", pr.Plan), pr.repo, previous)
	want.Labels[LabelUpgradePlan] = pr.Plan.Name
	want.Spec.NodeSelector = planNodes(pr.Plan)
	done, message, _, err := applyClusterPlan(ctx, pr, want, nodes)
	return done, message, err
}

// cleanUp removes what the plan created on the workload cluster, and waits until
// rke2-multus.yaml.skip is off every node (fact 34).
func (r *PlanReconciler) cleanUp(ctx context.Context, pr *PlanRun) (bool, string, error) {
	waiting, err := r.removeClusterObjects(ctx, pr)
	if err != nil || waiting != "" {
		return false, waiting, err
	}
	return true, "removed the repository, the Plans and the Job of the plan", nil
}

// removeClusterObjects deletes the repository (unless it was an existing one), the SUC
// Plans and the Jobs and ConfigMaps the plan created on the workload cluster, but the
// Plan removing rke2-multus.yaml.skip (unskipMultusManifest), created here when the
// plan placed the file, and kept until it has completed on every node: it then says what
// it waits for. It may be called again at any time.
func (r *PlanReconciler) removeClusterObjects(ctx context.Context, pr *PlanRun) (string, error) {
	// The cluster upgrade stopped before anything is given back (stopClusterUpgrade). It
	// deletes only a Job that has not ended: a failed one's words are kept below, before
	// removeLabelled deletes it.
	if stopping, err := stopClusterUpgrade(ctx, pr.Workload, pr.Plan.Name, r.now()); err != nil || stopping != "" {
		return stopping, err
	}
	if pr.Config.Spec.Release.RepositoryURL == "" {
		dep, svc, err := repository.Objects(pr.Config)
		if err != nil {
			return "", err
		}
		objs := []client.Object{dep, svc}
		if pvc := repository.LegacyClaim(pr.Config); pvc != nil { // left by an earlier version
			objs = append(objs, pvc)
		}
		for _, obj := range objs {
			if err := pr.Workload.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
				return "", fmt.Errorf("delete the upgrade repository's %T %s: %w", obj, obj.GetName(), err)
			}
		}
	}
	if err := clearTurns(ctx, pr); err != nil {
		return "", err
	}
	if _, err := startStoppedVMs(ctx, pr); err != nil {
		return "", err
	}
	if served, err := longhorn.LiveUpgradeServed(pr.Workload); err != nil {
		return "", err
	} else if served {
		if err := longhorn.ReleaseV2AutomaticUpgrade(ctx, pr.Workload, pr.Plan.UID); err != nil {
			return "", err
		}
	}
	nus, err := r.nodeUpdatesOf(ctx, pr)
	if err != nil {
		return "", err
	}
	handing, behind, err := handBackRancher(ctx, pr, nus, r.plannerSettle(), r.now())
	if err != nil || handing != "" {
		return handing, err
	}
	if releasing, err := releaseGuards(ctx, pr, nus); err != nil || releasing != "" {
		return releasing, err
	}
	keep, waiting, unskipErr := unskipMultusManifest(ctx, pr)
	if unskipErr != nil && keep == "" {
		return "", unskipErr // not known whether a removal Plan must stay: delete nothing yet
	}
	var keeping []string
	if keep != "" {
		keeping = append(keeping, keep)
	}
	if _, err := r.keepFailedJobLogs(ctx, pr); err != nil {
		return "", err
	}
	if err := removeLabelled(ctx, pr.Workload, pr.Plan.Name, keeping...); err != nil {
		return "", err
	}
	if resuming, err := r.resumeRancher(ctx, pr, behind); err != nil || resuming != "" {
		return resuming, err
	}
	return waiting, unskipErr
}

// resumeRancher lets Rancher's planner go once the roll is handed back
// (handBackRancher) and the strategy restored, and names the nodes left behind the
// declared version, once: an event on the plan and the plan's RancherHandedBack
// condition. Until Rancher has copied the restored strategy into the RKEControlPlane its
// planner reads, the pause stays and it says so: let go before, the planner would take
// the next node with our hooks, which no one answers any more.
func (r *PlanReconciler) resumeRancher(ctx context.Context, pr *PlanRun, behind []string) (string, error) {
	// A pause of someone else's is left as it is (ResumePlanner returns it unlifted).
	after, err := rancher.ResumePlanner(ctx, pr.Workload, pr.Plan.Name)
	if err != nil {
		return "", err
	}
	if after.Paused && after.By == pr.Plan.Name {
		if after.Unsynced != "" {
			return "Rancher's planner stays paused until it reads the restored upgradeStrategy: " + after.Unsynced, nil
		}
		return "Rancher's planner stays paused: its RKEControlPlane was written while the pause was being lifted; the next pass lifts it", nil
	}
	message := "Rancher's roll of fleet-local/local handed back settled: every node runs the RKE2 it declares"
	if len(behind) > 0 {
		cl, err := rancher.ProvisioningCluster(ctx, pr.Workload)
		if err != nil {
			return "", err
		}
		declared := ""
		if cl != nil {
			declared = cl.Spec.KubernetesVersion
		}
		message = fmt.Sprintf("fleet-local/local declares RKE2 %s and node(s) %s do not run it yet: each carries the restart guard, so Rancher installs %s there without restarting it (rancher-system-agent then counts the plan applied and Rancher waits for their kubelets); to finish, run an UpgradeTask to %s again: each of those nodes' NodeUpdates restarts RKE2 on the drained node (a reboot of the node starts it too)",
			declared, strings.Join(behind, ", "), declared, pr.Plan.Spec.Version)
	}
	if c := meta.FindStatusCondition(pr.Plan.Status.Conditions, ConditionRancherHandedBack); c == nil || c.Message != message {
		if len(behind) > 0 {
			r.event(pr.Plan, corev1.EventTypeWarning, "RKE2NotRestarted", "HandBack", "%s", message)
		}
		meta.SetStatusCondition(&pr.Plan.Status.Conditions, metav1.Condition{Type: ConditionRancherHandedBack, Status: metav1.ConditionTrue,
			Reason: "HandedBack", Message: message, ObservedGeneration: pr.Plan.Generation})
	}
	return "", nil
}

// ConditionRancherHandedBack, on an UpgradePlan whose nodes' RKE2 Rancher provisions,
// says that its end handed fleet-local/local back settled, and names the nodes that do
// not run the version it declares.
const ConditionRancherHandedBack = "RancherHandedBack"

// removeLabelled deletes the Plans, Jobs and ConfigMaps labelled with the plan's name,
// in every namespace, and last the admission policy that kept other upgraders off the
// cluster (ensureGuard). The Plans and Jobs go first, so that a cluster upgrade still running
// when its plan is deleted is being stopped; then what the cluster upgrade and the plan
// changed for the roll, recorded in the cluster upgrade's progress ConfigMap (charts
// paused, KubeVirt's workload update methods, Longhorn's replica replenishment wait), is
// given back (clusterupgrade.Restore). Every end of a plan, success, failure or deletion,
// comes through here, as Harvester's cleanup restores them on every end
// (harvester-release-steps.md fact 37). The progress ConfigMap itself carries no plan
// label and stays: a plan created again resumes from it. The SUC Plans named in keep,
// and their Jobs, stay.
func removeLabelled(ctx context.Context, wc client.Client, plan string, keep ...string) error {
	sel := client.MatchingLabels{LabelUpgradePlan: plan}
	lists := []client.ObjectList{&sucv1.PlanList{}, &batchv1.JobList{}, &corev1.ConfigMapList{},
		&admissionv1.ValidatingAdmissionPolicyBindingList{}, &admissionv1.ValidatingAdmissionPolicyList{}}
	for _, list := range lists {
		if _, configMaps := list.(*corev1.ConfigMapList); configMaps {
			if err := clusterupgrade.Restore(ctx, wc, clusterupgrade.ProgressKey(repository.Namespace, plan)); err != nil {
				return fmt.Errorf("give back what the cluster upgrade of plan %s changed for the roll: %w", plan, err)
			}
		}
		if err := wc.List(ctx, list, sel); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				continue // SUC not installed: no Plan of ours
			}
			return fmt.Errorf("list %T of plan %s: %w", list, plan, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return err
		}
		for _, item := range items {
			obj, ok := item.(client.Object)
			if !ok {
				continue
			}
			if _, isPlan := obj.(*sucv1.Plan); isPlan && slices.Contains(keep, obj.GetName()) {
				continue
			}
			if _, isJob := obj.(*batchv1.Job); isJob && slices.Contains(keep, obj.GetLabels()[labelSUCPlan]) {
				continue
			}
			if err := wc.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
			}
		}
	}
	return nil
}

// ensurePlanFor returns the UpgradePlan of the node's cluster and release, creating it
// from the HarvesterUpgrader when there is none (the first node of a cluster and release
// creates it).
func EnsureFor(ctx context.Context, c client.Client, nu *inplacev1.NodeUpdate, cfg *harvesterv1.HarvesterUpgrader) (*harvesterv1.UpgradePlan, bool, error) {
	key := types.NamespacedName{Namespace: nu.Namespace, Name: Name(nu.Spec.ClusterName, cfg.Spec.Release.Version)}
	plan := &harvesterv1.UpgradePlan{}
	err := c.Get(ctx, key, plan)
	if err == nil {
		return plan, false, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, fmt.Errorf("get UpgradePlan %s: %w", key, err)
	}
	plan = &harvesterv1.UpgradePlan{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec: harvesterv1.UpgradePlanSpec{
			ClusterName: nu.Spec.ClusterName, UpgraderName: nu.Spec.UpdaterRef.Name, Version: cfg.Spec.Release.Version,
			ImagePreload: cfg.Spec.ImagePreload,
		},
	}
	if err := c.Create(ctx, plan); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, false, fmt.Errorf("UpgradePlan %s was just created by another node; looking again", key)
		}
		return nil, false, fmt.Errorf("create UpgradePlan %s: %w", key, err)
	}
	return plan, true, nil
}
