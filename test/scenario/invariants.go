package scenario

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// Check is one safety invariant checked from the simulators' records.
type Check struct {
	// Name says what was checked, as a sentence a person reads.
	Name string
	// OK is true when the invariant held.
	OK bool
	// Detail says what broke it.
	Detail string
}

// PlanKinds are the Harvester updater's SUC Plans that run on each node while it is
// upgraded, in the order they run: the UpgradePlan's preload of every node
// (capi-inplace-preload-<release>-<hash>), then the node's own drain, RKE2 and OS Plans
// (capi-inplace-<kind>-<node>-<hash>). The UpgradePlan's image cleanup
// (capi-inplace-image-cleanup-<release>-<hash>) runs after the last node.
var PlanKinds = []string{"preload", "drain", "rke2", "os"}

// planKind is the kind of one of the updater's Plans (capi-inplace-<kind>-...), or "".
func planKind(plan string) string {
	rest, ok := strings.CutPrefix(plan, "capi-inplace-")
	if !ok {
		return ""
	}
	if strings.HasPrefix(rest, "image-cleanup-") {
		return "image-cleanup"
	}
	kind, _, _ := strings.Cut(rest, "-")
	return kind
}

// RunsPerNode counts, for each node, how many times each kind of Plan ran on it.
func RunsPerNode(runs []sim.PlanRun) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, r := range runs {
		kind := planKind(r.Plan)
		if kind == "" {
			continue
		}
		if out[r.Node] == nil {
			out[r.Node] = map[string]int{}
		}
		out[r.Node][kind]++
	}
	return out
}

// MaxDownAtOnce is the largest number of the given nodes that were NotReady at the same
// time, from the kubelet simulator's transitions.
func MaxDownAtOnce(log []sim.DownEvent, nodes []string) int {
	of := map[string]bool{}
	for _, n := range nodes {
		of[n] = true
	}
	down := map[string]bool{}
	most := 0
	for _, e := range log {
		if !of[e.Node] {
			continue
		}
		down[e.Node] = e.Down
		n := 0
		for _, d := range down {
			if d {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// Invariants checks the safety of what happened so far: each node ran each Plan at most
// once (exactly once for the nodes in upgraded), never more control plane nodes down
// than one nor more workers down than the MachineDeployment's maxUnavailable, no worker
// started before the control plane finished, no Plan left behind for an upgraded node,
// and, with Longhorn v2, no node taken down while Longhorn's live upgrade ran.
func (s *Scenario) Invariants(ctx context.Context, upgraded []string) []Check {
	done := map[string]bool{}
	for _, n := range upgraded {
		done[n] = true
	}
	var cp, workers []string
	for _, n := range s.Nodes {
		if n.ControlPlane {
			cp = append(cp, n.Name)
		} else {
			workers = append(workers, n.Name)
		}
	}
	runs := s.Record.Runs()
	checks := []Check{
		onceEach(runs, s.NodeNames(), done, s.Planner == nil),
		atMostDown(s.Record.DownLog(), "control plane", cp, 1),
		atMostDown(s.Record.DownLog(), "worker", workers, s.Options.WorkerMaxUnavailable),
		controlPlaneFirst(runs, cp, workers),
		s.noPlanLeft(ctx, done),
		s.noVMWhileDrained(),
		s.vmsRestored(ctx, done),
	}
	if s.SUC != nil {
		checks = append(checks, s.rebootsEnded())
	}
	if s.Options.LonghornV2 && s.Longhorn != nil {
		checks = append(checks, longhornLiveUpgradeLeftAlone(s.Longhorn))
	}
	if s.Planner != nil {
		checks = append(checks, rancherRestarts(s.Planner, s.NodeNames(), done, s.Options.Hop.ToKubernetes), s.rancherSettled(ctx))
	}
	if s.Multus != nil {
		checks = append(checks, s.multusLeftAlone(ctx))
	}
	if s.Settings != nil {
		checks = append(checks, s.settingsHeldForNodes(), s.settingsRestored(ctx))
	}
	return checks
}

// rebootsEnded checks the reboots the OS upgrades armed on the nodes' hosts (the SUC
// simulator's record; harvester-node-upgrade.md fact 28): none is still to come or under
// way once the upgrade has ended, so none happens after its NodeUpdate was final, and no
// node rebooted twice.
func (s *Scenario) rebootsEnded() Check {
	reboots := s.Record.Reboots("")
	c := Check{Name: fmt.Sprintf("no reboot armed by an OS upgrade outlived its NodeUpdate, no node rebooted twice (%d reboots)", len(reboots)), OK: true}
	var problems []string
	count := map[string]int{}
	for _, rb := range reboots {
		count[rb.Node]++
	}
	for _, n := range s.NodeNames() {
		if s.SUC.RebootArmed(n) {
			problems = append(problems, n+" still has a reboot armed or under way")
		}
		if count[n] > 1 {
			problems = append(problems, fmt.Sprintf("%s rebooted %d times", n, count[n]))
		}
	}
	if len(problems) > 0 {
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// multusLeftAlone checks what the nodes' RKE2 did to the rke2-multus chart (the Multus
// simulator's record; harvester-release-steps.md facts 9 and 34): no RKE2 restart ran a
// helm operation on it (each was skipped, or found the chart unchanged), no
// NetworkAttachmentDefinition was lost, and once the UpgradePlan has succeeded no node
// is left with rke2-multus.yaml.skip.
func (s *Scenario) multusLeftAlone(ctx context.Context) Check {
	installs := s.Multus.Installs()
	c := Check{Name: fmt.Sprintf("no RKE2 restart ran a helm operation on rke2-multus, no VM network lost, no node left with rke2-multus.yaml.skip after the plan (%d applications)", len(installs)), OK: true}
	var problems []string
	for _, in := range installs[min(1, len(installs)):] { // the first is the chart's install at the start
		if in.Cause == sim.MultusOnRestart && in.Outcome != "skipped" && in.Outcome != "unchanged" {
			problems = append(problems, fmt.Sprintf("%s's RKE2 restart at %s %s rke2-multus", in.Node, in.Version, in.Outcome))
		}
	}
	if lost := s.Multus.NetworksLost(); len(lost) > 0 {
		problems = append(problems, "VM networks lost: "+strings.Join(lost, ", "))
	}
	if s.Management != nil {
		plan := &harvesterv1.UpgradePlan{}
		key := client.ObjectKey{Namespace: s.Options.Namespace, Name: upgradeplan.Name(s.Options.ClusterName, s.Options.Hop.ToRelease)}
		if err := s.Management.Client.Get(ctx, key, plan); err == nil && plan.Status.Phase == harvesterv1.UpgradePlanSucceeded {
			for _, n := range s.NodeNames() {
				if s.SUC.ManifestSkipped(n) {
					problems = append(problems, n+" left with rke2-multus.yaml.skip")
				}
			}
		}
	}
	if len(problems) > 0 {
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// rancherRestarts checks what Rancher's provisioning did to the nodes' RKE2 (the
// RancherPlanner simulator's record): each upgraded node restarted exactly once at the
// release, every node at most once, each such restart inside the node's answered drain
// hooks (its NodeUpdate let Rancher go), no restart of any node outside its drain or
// hooks (fact 12: what the restart guard prevents during the Rancher upgrade), and no
// downgrade (fact 62b).
func rancherRestarts(p *sim.RancherPlanner, nodes []string, done map[string]bool, toVersion string) Check {
	restarts := p.Restarts()
	c := Check{Name: fmt.Sprintf("Rancher restarted RKE2 once per upgraded node, at %s, behind its drain hooks, never outside them, no downgrade (%d restarts)", toVersion, len(restarts)), OK: true}
	var problems []string
	at := map[string]int{}
	for _, a := range restarts {
		if a.To == toVersion {
			at[a.Node]++
			if !a.InHooks {
				problems = append(problems, fmt.Sprintf("%s restarted at %s outside its answered drain hooks", a.Node, a.To))
			}
		}
	}
	for _, n := range nodes {
		if got := at[n]; got > 1 || (done[n] && got != 1) {
			problems = append(problems, fmt.Sprintf("%s restarted at %s %d times", n, toVersion, got))
		}
	}
	for _, a := range p.UnguardedRestartsOutsideDrain() {
		problems = append(problems, fmt.Sprintf("%s restarted RKE2 (%s to %s) neither drained nor behind its hooks nor guarded", a.Node, a.From, a.To))
	}
	for _, a := range p.Downgrades() {
		problems = append(problems, fmt.Sprintf("%s downgraded from %s to %s", a.Node, a.From, a.To))
	}
	if len(problems) > 0 {
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// rancherSettled checks that Rancher's roll of the nodes is settled at the end, however
// the run ended: no node cordoned, no plan Secret in a drain (drain options, a hook
// request or an uncordon asked) that Rancher's machine-drain controller would wait at for
// good (rancher v2.14.4 machinedrain.go OnChange). Rancher's last uncordon may trail the
// end of the run by a moment: it is looked at for up to 10 s.
func (s *Scenario) rancherSettled(ctx context.Context) Check {
	c := Check{Name: "Rancher's roll settled: no node left cordoned, no drain of Rancher's waiting at a hook nobody answers", OK: true}
	var problems []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		problems = problems[:0]
		secrets, err := rancher.PlanSecrets(ctx, s.Workload.Client)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, name := range s.NodeNames() {
			node := &corev1.Node{}
			if err := s.Workload.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
				problems = append(problems, fmt.Sprintf("read node %s: %v", name, err))
				continue
			}
			if node.Spec.Unschedulable {
				problems = append(problems, name+" is cordoned")
			}
			secret := secrets[node.Annotations[rancher.NodeMachineAnnotation]]
			if secret == nil {
				continue
			}
			for _, key := range []string{rancher.DrainOptionsAnnotation, rancher.PreDrainRequest, rancher.PostDrainRequest, rancher.UnCordonAnnotation} {
				if v := secret.Annotations[key]; v != "" {
					problems = append(problems, fmt.Sprintf("%s's plan Secret still has %s", name, key))
				}
			}
		}
		if len(problems) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(problems) > 0 {
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// longhornLiveUpgradeLeftAlone checks that no node was cordoned or NotReady while
// Longhorn's live upgrade of a v2 instance manager was active
// (shared/facts/longhorn-v2-live-upgrade.md, fact 37), as the Longhorn simulator saw it.
func longhornLiveUpgradeLeftAlone(lh *sim.Longhorn) Check {
	c := Check{Name: fmt.Sprintf("no node taken down while Longhorn's live upgrade of a v2 instance manager ran (%d node upgrades by Longhorn)", len(lh.Upgrades())), OK: true}
	if v := lh.Violations(); len(v) > 0 {
		c.OK, c.Detail = false, strings.Join(v, "; ")
	}
	return c
}

// noVMWhileDrained: every VMI left its node (live-migrated or stopped) before the node's
// drain started, and none was live-migrated off the same node twice.
func (s *Scenario) noVMWhileDrained() Check {
	c := Check{Name: "no virtual machine ran on a node when its drain started, none was live-migrated off a node twice", OK: true}
	if s.KubeVirt == nil {
		return c
	}
	problems := s.KubeVirt.RunningWhileDrained(s.Record)
	left := map[string]int{}
	var prev = map[string]string{}
	for _, p := range s.KubeVirt.History() {
		if p.How == "migrated" {
			left[p.VMI+" off "+prev[p.VMI]]++
		}
		prev[p.VMI] = p.Node
	}
	for k, n := range left {
		if n > 1 {
			problems = append(problems, fmt.Sprintf("%s migrated %d times", k, n))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// vmsRestored: no virtual machine stopped for an upgraded node is still stopped.
func (s *Scenario) vmsRestored(ctx context.Context, done map[string]bool) Check {
	c := Check{Name: "every virtual machine stopped for an upgraded node was started again", OK: true}
	if s.Workload == nil || s.KubeVirt == nil {
		return c
	}
	vms := &kubevirtv1.VirtualMachineList{}
	if err := s.Workload.Client.List(ctx, vms, client.InNamespace(VMNamespace), client.HasLabels{kubevirt.LabelStoppedBy}); err != nil {
		c.OK, c.Detail = false, fmt.Sprintf("list VirtualMachines: %v", err)
		return c
	}
	var left []string
	for _, vm := range vms.Items {
		if node := vm.Annotations[kubevirt.AnnotationStoppedOnNode]; done[node] {
			left = append(left, vm.Name+" (stopped on "+node+")")
		}
	}
	sort.Strings(left)
	if len(left) > 0 {
		c.OK, c.Detail = false, "still stopped: "+strings.Join(left, ", ")
	}
	return c
}

// onceEach checks the Plans per node; without sucRKE2 (Rancher provisions RKE2) no node
// may run an rke2 Plan at all.
func onceEach(runs []sim.PlanRun, nodes []string, done map[string]bool, sucRKE2 bool) Check {
	c := Check{Name: "every upgraded node ran each upgrade Plan exactly once, no node ran one twice", OK: true}
	if !sucRKE2 {
		c.Name += "; no SUC rke2 Plan where Rancher provisions RKE2"
	}
	perNode := RunsPerNode(runs)
	var problems []string
	for _, n := range nodes {
		for _, kind := range PlanKinds {
			got := perNode[n][kind]
			if !sucRKE2 && kind == "rke2" {
				if got > 0 {
					problems = append(problems, fmt.Sprintf("%s ran an rke2 Plan %d times behind Rancher's back", n, got))
				}
				continue
			}
			if got > 1 || (done[n] && got != 1) {
				problems = append(problems, fmt.Sprintf("%s ran its %s Plan %d times", n, kind, got))
			}
		}
	}
	if len(problems) > 0 {
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

func atMostDown(log []sim.DownEvent, role string, nodes []string, limit int) Check {
	most := MaxDownAtOnce(log, nodes)
	c := Check{Name: fmt.Sprintf("never more than %d %s node(s) down at once (saw %d)", limit, role, most), OK: most <= limit}
	if !c.OK {
		c.Detail = fmt.Sprintf("%d %s nodes were NotReady at the same time; the limit is %d", most, role, limit)
	}
	return c
}

// DisruptiveKind reports whether a Plan kind is part of a node's own, disruptive upgrade
// (drain, RKE2, OS), as opposed to the UpgradePlan's work on every node in service
// (preload before the nodes, image cleanup after).
func DisruptiveKind(kind string) bool { return kind == "drain" || kind == "rke2" || kind == "os" }

// NodesUpgraded names the nodes on which a disruptive Plan (DisruptiveKind) ran.
func NodesUpgraded(runs []sim.PlanRun) map[string]bool {
	out := map[string]bool{}
	for _, r := range runs {
		if DisruptiveKind(planKind(r.Plan)) {
			out[r.Node] = true
		}
	}
	return out
}

func controlPlaneFirst(runs []sim.PlanRun, cp, workers []string) Check {
	c := Check{Name: "the control plane finished before the first worker started", OK: true}
	isCP, isWorker := map[string]bool{}, map[string]bool{}
	for _, n := range cp {
		isCP[n] = true
	}
	for _, n := range workers {
		isWorker[n] = true
	}
	var lastCP, firstWorker time.Time
	var lastCPNode, firstWorkerNode string
	for _, r := range runs {
		// A node's upgrade is its disruptive Plans: the UpgradePlan preloads every node
		// (and cleans their images) before and after, in service, by design.
		if !DisruptiveKind(planKind(r.Plan)) {
			continue
		}
		switch {
		case isCP[r.Node] && (r.End.IsZero() || r.End.After(lastCP)):
			lastCP, lastCPNode = r.End, r.Node
			if r.End.IsZero() {
				lastCP = time.Now()
			}
		case isWorker[r.Node] && (firstWorker.IsZero() || r.Start.Before(firstWorker)):
			firstWorker, firstWorkerNode = r.Start, r.Node
		}
	}
	if !lastCP.IsZero() && !firstWorker.IsZero() && firstWorker.Before(lastCP) {
		c.OK = false
		c.Detail = fmt.Sprintf("worker %s started at %s, before control plane node %s finished at %s",
			firstWorkerNode, firstWorker.Format("15:04:05.000"), lastCPNode, lastCP.Format("15:04:05.000"))
	}
	return c
}

func (s *Scenario) noPlanLeft(ctx context.Context, done map[string]bool) Check {
	c := Check{Name: "no SUC Plan left behind on an upgraded node", OK: true}
	if s.Workload == nil {
		c.OK, c.Detail = false, "the workload cluster is stopped"
		return c
	}
	plans := &sucv1.PlanList{}
	if err := s.Workload.Client.List(ctx, plans, client.InNamespace(SUCNamespace), client.HasLabels{suc.LabelNodeUpdate}); err != nil {
		c.OK, c.Detail = false, fmt.Sprintf("list Plans: %v", err)
		return c
	}
	var left []string
	for _, p := range plans.Items {
		if done[p.Annotations[suc.AnnotationNode]] {
			left = append(left, p.Name)
		}
	}
	sort.Strings(left)
	if len(left) > 0 {
		c.OK, c.Detail = false, "still there: "+strings.Join(left, ", ")
	}
	return c
}
