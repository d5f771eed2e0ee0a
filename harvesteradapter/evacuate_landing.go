package harvesteradapter

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
)

// EventVMMayMoveTwice is the event reason of a live migration the evacuation could not
// confine to the nodes no running roll has still to upgrade: its VM may land on such a
// node and move again at that node's turn.
const EventVMMayMoveTwice = "VMMayMoveTwice"

// landing is where the migrations the evacuation creates in one pass may send their VMs.
type landing struct {
	// label is the node label their addedNodeSelector asks for (kubevirt.LandingLabel),
	// "" when they are not confined.
	label string
	// nodes are the nodes that carry it.
	nodes []*corev1.Node
	// why says, when label is "", why the migrations are left to the upgrade-pending
	// taint's preference; both are "" when no VM is to migrate.
	why string
}

// selector is the addedNodeSelector of the migration of vmi, nil when it is not
// confined; why says then why not. A VMI whose required node affinity fits none of the
// landing nodes is not confined: the rule would leave it nowhere to go.
func (l landing) selector(vmi *kubevirtv1.VirtualMachineInstance, nonWitness int) (map[string]string, string) {
	if l.label == "" {
		return nil, l.why
	}
	if why := kubevirt.WhyNotMigratable(vmi, l.nodes, nonWitness); why != "" {
		return nil, "on the nodes no running roll has still to upgrade, " + why
	}
	return map[string]string{l.label: "true"}, ""
}

// note is what the step's message says of where the VMs go.
func (l landing) note() string {
	if l.label == "" && l.why == "" {
		return ""
	}
	if l.label == "" {
		return "VMs are steered off the nodes still to be upgraded by the upgrade-pending taint's preference only: " + l.why
	}
	return fmt.Sprintf("VMs land only on the nodes no running roll has still to upgrade (%s, label %s)", nodeNames(l.nodes), l.label)
}

// landingFor decides where this pass's migrations off node may send their VMs and labels
// those nodes: the targets (kubevirt.EvacuationTargets) that carry no upgrade-pending
// taint of any task (kubevirt.Landing). Not confined, and the label taken off every node,
// when
//   - a migration of this NodeUpdate shows that the API server dropped its
//     addedNodeSelector: KubeVirt is older than v1.6.0 (Harvester v1.6.x ships v1.5.2,
//     v1.7.0 v1.6.3: deploy/charts/harvester/values.yaml), and cannot confine any;
//   - no target qualifies (the first node of a roll over the whole cluster, or every
//     other node is in a roll): confining would leave the VMs nowhere to go;
//   - those nodes have no room for the VMs still to migrate (pending; the count of
//     roomShortfall), while the targets as a whole have: KubeVirt would fail the
//     migrations whose target pod stays unschedulable, and the node would hold on them.
//
// While a migration of this NodeUpdate that asked for the label has not ended, the label
// is not taken off its last nodes: its target pod may not be scheduled yet.
func (u *Updater) landingFor(ctx context.Context, r *nodeRun, nodes []corev1.Node, targets []*corev1.Node, pending []*kubevirtv1.VirtualMachineInstance, ours map[string]*kubevirtv1.VirtualMachineInstanceMigration) (landing, error) {
	label := kubevirt.LandingLabel(r.nu.UID)
	confinedRunning := false
	for _, m := range ours {
		if kubevirt.AddedSelectorPruned(m) {
			return landing{why: "KubeVirt dropped the addedNodeSelector of migration " + m.Name + ", so it is older than v1.6.0 and cannot confine a migration's target"},
				kubevirt.LabelLanding(ctx, r.wc, nodes, label, nil)
		}
		if m.Spec.AddedNodeSelector[label] != "" && !kubevirt.MigrationFinished(m) {
			confinedRunning = true
		}
	}
	if len(pending) == 0 && !confinedRunning {
		// Nothing is to land: no label is needed.
		return landing{}, kubevirt.LabelLanding(ctx, r.wc, nodes, label, nil)
	}
	l := landing{label: label, nodes: kubevirt.Landing(targets)}
	switch {
	case len(l.nodes) == 0:
		l = landing{why: "every other node that can take VMs is still to be upgraded by a running roll"}
	case len(pending) > 0:
		short, err := roomShortfall(ctx, r.wc, r.nu.Spec.NodeName, l.nodes, pending)
		if err != nil {
			return landing{}, err
		}
		if short != "" {
			l = landing{why: fmt.Sprintf("the nodes no running roll has still to upgrade (%s) have no room for every VM to migrate", nodeNames(l.nodes))}
		}
	}
	if l.label == "" && confinedRunning {
		return l, nil // the label stays where it is until those migrations end
	}
	want := map[string]bool{}
	for _, n := range l.nodes {
		want[n.Name] = true
	}
	return l, kubevirt.LabelLanding(ctx, r.wc, nodes, label, want)
}

// unconfinedNote says which of this NodeUpdate's migrations were not confined to the
// nodes no running roll has still to upgrade, and why, for the step's summary; "" when
// every one was.
func unconfinedNote(ours map[string]*kubevirtv1.VirtualMachineInstanceMigration) string {
	var parts []string
	for _, m := range ours {
		why := m.Annotations[kubevirt.AnnotationUnconfined]
		if kubevirt.AddedSelectorPruned(m) {
			why = "KubeVirt older than v1.6.0 dropped its addedNodeSelector"
		}
		if why != "" {
			parts = append(parts, fmt.Sprintf("%s/%s (%s)", m.Namespace, m.Spec.VMIName, why))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	sort.Strings(parts)
	return "placed by the upgrade-pending taint's preference only, not confined to the nodes no running roll has still to upgrade: " + strings.Join(parts, ", ")
}

func nodeNames(nodes []*corev1.Node) string {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	return strings.Join(names, ", ")
}
