package preview

import (
	"context"
	"fmt"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/nodeorder"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// compute computes the preview's status. The steps run in order, each on what the ones
// before it decided; none writes anything.
func (r *Reconciler) compute(ctx context.Context, p *inplacev1.UpgradePreview) (inplacev1.UpgradePreviewStatus, error) {
	// One read of the workload cluster for the whole computation: the updater judges
	// every machine on the same state of it, and reads it once, not once per machine.
	ctx = nodeupdater.WithReadSnapshot(ctx)
	s, err := r.readScope(ctx, p)
	if err != nil {
		return inplacev1.UpgradePreviewStatus{}, err
	}
	if s.problem != "" {
		return inplacev1.UpgradePreviewStatus{Phase: inplacev1.PreviewPhaseFailed, Message: truncate(s.problem, 4096),
			Summary: "cannot preview: the run would refuse this upgrade; see status.message"}, nil
	}
	for _, step := range []func(context.Context, *previewScope) error{
		r.judgeOutcomes,
		r.unasked,
		r.order,
		r.runPreflight,
		r.previewDisruption,
		r.estimate,
	} {
		if err := step(ctx, s); err != nil {
			return inplacev1.UpgradePreviewStatus{}, err
		}
	}
	return statusOf(s), nil
}

// judgeOutcomes decides per machine: at the target already, else what Cluster API would
// do with the hooks' answers.
func (r *Reconciler) judgeOutcomes(ctx context.Context, s *previewScope) error {
	for _, t := range s.targets {
		if !t.ref.IsControlPlane() && controlPlaneReaches(s) {
			// The run upgrades the control plane first: the workers' hooks judge the
			// kubelet skew against the version it will run by then.
			ctx = upgraderequest.WithControlPlaneAt(ctx, s.preview.Spec.Version)
		}
		var bySet map[string]verdict
		if !t.ref.IsControlPlane() {
			var err error
			if bySet, err = r.judgeMachineSets(ctx, s, t); err != nil {
				return err
			}
		}
		for i := range t.machines {
			m := &t.machines[i]
			e := &entry{machine: m, node: s.nodes[m.Status.NodeRef.Name], paused: pausedNode(s.preview, m)}
			e.status = inplacev1.PreviewMachine{Name: m.Name, NodeName: m.Status.NodeRef.Name, Target: t.display()}
			// A machine at the version is still judged by the hooks when its templates
			// are about to change: that change alone can make Cluster API replace it.
			at := false
			if templateChangeOf(s, t) == nil {
				var err error
				if at, err = r.atTarget(ctx, s, t, m); err != nil {
					return err
				}
			}
			var v verdict
			switch {
			case at:
				v = verdict{inplacev1.MachineOutcomeAtTarget, "already runs " + s.preview.Spec.Version}
			case t.ref.IsControlPlane():
				v = r.judgeControlPlaneMachine(ctx, s, t, m)
			default:
				var ok bool
				if v, ok = bySet[machineSetOf(m)]; !ok {
					v = verdict{inplacev1.MachineOutcomeRefused, "the machine's MachineSet was not found: Cluster API would not roll it out"}
				}
			}
			e.status.Outcome, e.status.Reason = v.outcome, v.reason
			t.entries = append(t.entries, e)
		}
	}
	return nil
}

// controlPlaneReaches reports whether the preview's control plane reaches the version
// before the workers go: it has one, judged already, and no machine of it is refused
// (a machine replaced comes back at the version).
func controlPlaneReaches(s *previewScope) bool {
	if len(s.targets) == 0 || !s.targets[0].ref.IsControlPlane() || len(s.targets[0].entries) == 0 {
		return false
	}
	for _, e := range s.targets[0].entries {
		if e.status.Outcome == inplacev1.MachineOutcomeRefused {
			return false
		}
	}
	return true
}

func machineSetOf(m *clusterv1.Machine) string {
	for _, ref := range m.OwnerReferences {
		if ref.Kind == "MachineSet" {
			return ref.Name
		}
	}
	return ""
}

// order places the machines upgraded in place as the run would take them: the control
// plane first, then the MachineDeployments in the cascade's order; within each, the
// UpgradeTask's own order (nodeorder.Sort). Paused machines keep their place, as in the
// task, and say so.
func (r *Reconciler) order(_ context.Context, s *previewScope) error {
	position := int32(0)
	for _, t := range s.targets {
		var inPlace []*entry
		for _, e := range t.entries {
			if e.status.Outcome == inplacev1.MachineOutcomeInPlace {
				inPlace = append(inPlace, e)
			}
		}
		nodeorder.Sort(inPlace, (*entry).candidate, s.preview.Spec.NodeOrder, t.ref.IsControlPlane())
		where := "control plane first"
		if !t.ref.IsControlPlane() {
			where = "workers of " + t.display()
			if s.targets[0].ref.IsControlPlane() {
				where += " after the control plane"
			}
		}
		for _, e := range inPlace {
			position++
			e.status.Order = position
			e.status.OrderReason = where + "; " + nodeorder.Reason(e.candidate(), s.preview.Spec.NodeOrder, t.ref.IsControlPlane())
			if e.paused {
				e.status.OrderReason += "; paused by spec.pauseNodes: would not start while listed, and is not counted in the estimate"
			}
		}
		t.entries = append(inPlace, notInPlace(t.entries)...)
	}
	return nil
}

func notInPlace(entries []*entry) []*entry {
	var out []*entry
	for _, e := range entries {
		if e.status.Outcome != inplacev1.MachineOutcomeInPlace {
			out = append(out, e)
		}
	}
	return out
}

func (e *entry) candidate() nodeorder.Candidate {
	return nodeorder.Candidate{Machine: e.machine.Name, Node: e.machine.Status.NodeRef.Name, Witness: nodeorder.IsWitness(e.node), Created: e.machine.CreationTimestamp.Time}
}

// runPreflight runs every check for every machine that would start, as the task's dry run
// does: with the Input the task builds for its target.
func (r *Reconciler) runPreflight(ctx context.Context, s *previewScope) error {
	for _, t := range s.targets {
		in := upgradetask.PreflightInput(upgradetask.Round{
			Cluster: s.cluster, Version: s.preview.Spec.Version, UpdaterRef: s.updaterRef,
			ControlPlane: t.ref.IsControlPlane(), MaxUnavailable: t.maxUnavailable,
			TargetMachines: t.machines, Nodes: s.nodes, Budget: s.budget,
		})
		for _, e := range t.entries {
			if e.status.Outcome != inplacev1.MachineOutcomeInPlace || e.paused {
				continue
			}
			results := preflight.Run(ctx, r.Checks, in, preflight.MachineNode{Machine: e.machine, Node: e.node})
			for _, res := range results {
				e.status.Preflight = append(e.status.Preflight, inplacev1.PreflightCheckStatus{Name: res.Name, Passed: res.Passed, Message: truncate(res.Message, 4096)})
			}
			if f := preflight.FirstFailure(results); f != nil {
				e.status.WouldHold = true
				e.status.Reason = joinReason(e.status.Reason, "would be held today by "+preflight.Describe(*f))
			}
		}
	}
	return nil
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// previewDisruption asks the updater, when it can tell, what upgrading each node would
// disrupt. The nodes down at the same time are, kept simple, the maxUnavailable-1 nodes
// just before it in its batch of the same target.
func (r *Reconciler) previewDisruption(ctx context.Context, s *previewScope) error {
	if r.Registry == nil || s.updaterRef.Kind == "" {
		return nil
	}
	reg, found, err := r.Registry.Lookup(s.updaterRef)
	if err != nil || !found {
		return nil
	}
	previewer, ok := reg.Updater.(nodeupdater.DisruptionPreviewer)
	if !ok {
		return nil
	}
	for _, t := range s.targets {
		batch := startingEntries(t)
		for i, e := range batch {
			var with []string
			for j := i - i%t.maxUnavailable; j < i; j++ {
				with = append(with, batch[j].status.NodeName)
			}
			d, err := previewer.PreviewDisruption(ctx, nodeupdater.PreflightTarget{
				Namespace: s.cluster.Namespace, ClusterName: s.cluster.Name, MachineName: e.machine.Name, NodeName: e.status.NodeName,
				Version: s.preview.Spec.Version, UpdaterRef: s.updaterRef, ControlPlane: t.ref.IsControlPlane(), Disrupted: with,
			})
			if err != nil {
				e.status.Reason = joinReason(e.status.Reason, fmt.Sprintf("updater %s could not preview the disruption: %v", s.updaterRef, err))
				continue
			}
			e.status.Disruption = &d
		}
	}
	return nil
}

// startingEntries are the target's machines that would be upgraded in place and are not
// paused, in order.
func startingEntries(t *target) []*entry {
	var out []*entry
	for _, e := range t.entries {
		if e.status.Outcome == inplacev1.MachineOutcomeInPlace && !e.paused {
			out = append(out, e)
		}
	}
	return out
}

// statusOf renders the scope as the preview's status.
func statusOf(s *previewScope) inplacev1.UpgradePreviewStatus {
	st := inplacev1.UpgradePreviewStatus{
		Phase:      inplacev1.PreviewPhaseReady,
		FailClosed: s.cluster.Annotations[inplacev1.FailClosedAnnotation] == "true",
		Message:    truncate(strings.Join(s.notes, "; "), 4096),
	}
	for _, t := range s.targets {
		for _, e := range t.entries {
			switch e.status.Outcome {
			case inplacev1.MachineOutcomeInPlace:
				st.InPlace++
			case inplacev1.MachineOutcomeReplaced:
				st.Replaced++
			case inplacev1.MachineOutcomeRefused:
				st.Refused++
			case inplacev1.MachineOutcomeAtTarget:
				st.AtTarget++
			}
			if e.status.WouldHold {
				st.Held++
			}
			// Within the API's bounds: a status the API server refuses shows nothing.
			e.status.Reason = truncate(e.status.Reason, 4096)
			e.status.OrderReason = truncate(e.status.OrderReason, 1024)
			st.Machines = append(st.Machines, e.status)
		}
	}
	// Machines that would not be upgraded in place come last, after every target's order.
	inPlace := st.Machines[:0:0]
	var rest []inplacev1.PreviewMachine
	for _, m := range st.Machines {
		if m.Order > 0 {
			inPlace = append(inPlace, m)
		} else {
			rest = append(rest, m)
		}
	}
	st.Machines = append(inPlace, rest...)
	st.EstimatedDuration, st.EstimateSource = s.total, s.estimateSource
	st.Summary = fmt.Sprintf("%d machines: %d in place, %d replaced, %d refused, %d held today", len(st.Machines), st.InPlace, st.Replaced, st.Refused, st.Held)
	if st.AtTarget > 0 {
		st.Summary += fmt.Sprintf(", %d at the version", st.AtTarget)
	}
	if s.total != nil {
		st.Summary += fmt.Sprintf("; about %s (%s)", human(s.total.Duration), s.estimateSource)
	}
	st.Summary = truncate(st.Summary, 1024)
	return st
}
