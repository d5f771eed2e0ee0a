package harvesteradapter

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
)

// evacuateStep empties the cordoned node of running virtual machines through KubeVirt's
// API, before it is drained: live migration where it can, a recorded shutdown where it
// cannot.
var evacuateStep = step{
	name: StepEvacuateVMs,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.Drain, harvesterv1.DefaultDrainTimeout)
	},
	run: (*Updater).runEvacuate,
}

// Event reasons of the evacuation and restore, recorded on the NodeUpdate.
const (
	EventVMMigrationStarted = "VMMigrationStarted"
	EventVMMigrationFailed  = "VMMigrationFailed"
	EventVMStopped          = "VMStopped"
	EventVMStarted          = "VMStarted"
	EventVMLeftStopped      = "VMLeftStopped"
	EventVMHoldsNode        = "VMHoldsNode"
)

// runEvacuate looks at every VMI on the node (KubeVirt's kubevirt.io/nodeName label) and
// moves it on by one stage per reconcile, so that a restart anywhere resumes where it
// was:
//   - a VMI that can be live-migrated (whyNotMigratable) gets one
//     VirtualMachineInstanceMigration of a deterministic name, and the step waits until
//     it runs on another node; its addedNodeSelector confines it to the nodes no running
//     roll has still to upgrade, labelled for this NodeUpdate while the step runs
//     (landingFor: where none qualifies, they lack room, or KubeVirt is older than
//     v1.6.0, the upgrade-pending taint's preference alone steers it, and the step says
//     why);
//   - one that cannot is stopped through its VirtualMachine and recorded on it
//     (stopVM), and the step waits until its VMI is gone. A paused one is stopped and
//     not recorded: Harvester leaves paused VMs out of what it restores (fact 32);
//   - a failed migration holds the node with the VM's name and KubeVirt's reason. The
//     updater does not stop a VM that could migrate (Harvester's script does, fact 33):
//     the operator decides, by fixing the cause and deleting the failed migration (the
//     updater then creates it again), by migrating the VM, or by stopping it;
//   - a VMI a failed migration of Harvester's left pinned to another node
//     (kubevirt.LeftoverMigrationPin) holds the node, named with what to do: that
//     nodeSelector is no choice of its user's, and Harvester's upgrade shutting such
//     VMs down is a reported failure (harvester/harvester#8147, #8212);
//   - a VMI that ended (Succeeded, Failed) holds nothing; one that is still being
//     scheduled or migrated by someone else is waited for;
//   - before any of that, the nodes that stay up must have room for every VMI still to
//     be live-migrated (roomShortfall, the disruption preview's count): while they have
//     not, the node is held with the shortfall named, and nothing is migrated or stopped.
//
// The step is done when no VMI runs on the node.
func (u *Updater) runEvacuate(ctx context.Context, r *nodeRun) (bool, string, error) {
	node := r.nu.Spec.NodeName
	vmis, served, err := vmisOnNode(ctx, r.wc, node)
	if err != nil {
		return false, "", err
	}
	if !served {
		return true, fmt.Sprintf("the cluster does not serve KubeVirt's API: no virtual machine runs on node %s", node), nil
	}
	nodes := &corev1.NodeList{}
	if err := r.wc.List(ctx, nodes); err != nil {
		return false, "", fmt.Errorf("list nodes: %w", err)
	}
	targets, nonWitness := kubevirt.EvacuationTargets(nodes.Items, node)
	ours, err := u.migrations(ctx, r)
	if err != nil {
		return false, "", err
	}

	// First, whether the nodes that stay up can hold the VMs still to migrate: the node
	// is held, untouched further, while they cannot.
	actions := make([]vmiAction, len(vmis))
	whys := make([]string, len(vmis))
	var pending []*kubevirtv1.VirtualMachineInstance
	for i := range vmis {
		vmi := &vmis[i]
		actions[i], whys[i] = judgeVMI(vmi, node, targets, nonWitness)
		if actions[i] == vmiMigrate && ours[kubevirt.MigrationName(r.nu, vmi)] == nil && !migrationRuns(vmi) {
			pending = append(pending, vmi)
		}
	}
	short, err := roomShortfall(ctx, r.wc, node, targets, pending)
	if err != nil {
		return false, "", err
	}
	if short != "" {
		hold := u.holdOnce(r, EventVMsLackRoom, short)
		return u.evacuationHeld(r, []string{hold}, nil)
	}
	land, err := u.landingFor(ctx, r, nodes.Items, targets, pending, ours)
	if err != nil {
		return false, "", err
	}

	var waiting, holds []string
	var failed []failedMigration
	var stoppedByUs map[string]bool
	for i := range vmis {
		vmi := &vmis[i]
		action, why := actions[i], whys[i]
		var hold string
		switch action {
		case vmiLeave:
			continue
		case vmiWait:
			waiting = append(waiting, why)
			continue
		case vmiHold:
			hold = u.holdOnce(r, EventVMHoldsNode, why)
		case vmiStop:
			if hold, err = u.stopOnNode(ctx, r, vmi, why); err == nil && hold == "" {
				waiting = append(waiting, kubevirt.VMKey(vmi)+" is stopping")
			}
		case vmiMigrate:
			m := ours[kubevirt.MigrationName(r.nu, vmi)]
			if hold, err = u.migrateOff(ctx, r, vmi, m, land, nonWitness); err == nil && hold == "" {
				waiting = append(waiting, kubevirt.VMKey(vmi)+" is migrating")
			}
			if hold == "" || kubevirt.VMIOwnerVM(vmi) == "" {
				break
			}
			// A failed migration's VM that drainPolicy Evict stopped holds nothing: its
			// VMI is shutting down.
			if stoppedByUs == nil {
				stoppedByUs = map[string]bool{}
				vms, serr := kubevirt.StoppedVMs(ctx, r.wc, r.nu.UID, "node "+node)
				if serr != nil {
					return false, "", serr
				}
				for i := range vms {
					stoppedByUs[kubevirt.VMKey(&vms[i])] = true
				}
			}
			if stoppedByUs[vmi.Namespace+"/"+kubevirt.VMIOwnerVM(vmi)] {
				hold = ""
				waiting = append(waiting, kubevirt.VMKey(vmi)+" is stopping")
				break
			}
			failed = append(failed, failedMigration{vmi: vmi, m: m})
		}
		if err != nil {
			return false, "", err
		}
		if hold != "" {
			holds = append(holds, hold)
		}
	}

	if len(holds) > 0 {
		return u.evacuationHeld(r, holds, func(blockedFor, grace time.Duration) (string, error) {
			return u.stopFailedMigrations(ctx, r, failed, blockedFor, grace)
		})
	}
	if _, err := u.applyBlockPolicy(r, nil); err != nil {
		return false, "", err
	}
	if len(waiting) > 0 {
		msg := fmt.Sprintf("evacuating node %s: %s", node, strings.Join(waiting, ", "))
		if note := land.note(); note != "" {
			msg += "; " + note
		}
		return false, msg, nil
	}
	// No VMI is left to land anywhere: the landing label goes.
	if err := kubevirt.RemoveLanding(ctx, r.wc, kubevirt.LandingLabel(r.nu.UID)); err != nil {
		return false, "", err
	}
	return true, u.evacuationSummary(ctx, r, ours), nil
}

// failedMigration is a VMI a VirtualMachine owns whose live migration off the node, this
// NodeUpdate's, failed.
type failedMigration struct {
	vmi *kubevirtv1.VirtualMachineInstance
	m   *kubevirtv1.VirtualMachineInstanceMigration
}

// evacuationHeld is the evacuation's answer while holds keep VMs on the node: the drain
// policy judges them as a blocked drain (applyBlockPolicy). Skip puts the node back once
// they have held it for the grace period. Evict, then, stops the VMs whose live
// migration failed, as Harvester's own upgrade does (harvester-node-upgrade.md fact 33,
// wait_vms_out_or_shutdown); it cannot act on the other holds (no room on the nodes that
// stay up, a VMI no VirtualMachine owns, a VM that cannot be stopped), under which the
// node holds as under Hold. evict is nil when no hold is one it can act on.
func (u *Updater) evacuationHeld(r *nodeRun, holds []string, evict func(blockedFor, grace time.Duration) (string, error)) (bool, string, error) {
	b := &nodedrain.Blockage{Of: "the evacuation", What: strings.Join(holds, "; "),
		Evicts:      "the VMs whose live migration failed are stopped (and started again once the node is upgraded), as Harvester's upgrade does,",
		Evicted:     inplacev1.BlockingVMsStoppedReason,
		CannotEvict: "only a VM whose live migration failed is stopped by it; move, stop or make room for the others"}
	acted := false
	b.Evict = func(blockedFor, grace time.Duration) (string, error) {
		if evict == nil {
			return "", nil
		}
		did, err := evict(blockedFor, grace)
		acted = did != ""
		return did, err
	}
	policy, err := u.applyBlockPolicy(r, b)
	if err != nil {
		return false, "", err
	}
	if acted {
		return false, policy, nil
	}
	return false, "holding: " + b.What + "; " + policy, nil
}

// stopFailedMigrations stops, under drainPolicy Evict once the grace period has passed,
// the VMs whose live migration off the node failed: recorded on the VirtualMachine as
// every VM the evacuation stops, so that they are started again once the node is
// upgraded. It says "" when there is none to stop.
func (u *Updater) stopFailedMigrations(ctx context.Context, r *nodeRun, failed []failedMigration, blockedFor, grace time.Duration) (string, error) {
	var stopped []string
	for _, f := range failed {
		why := fmt.Sprintf("its live migration %s failed (%s) and the evacuation was blocked for %s, more than the grace period %s of drainPolicy Evict",
			f.m.Name, kubevirt.MigrationFailure(f.m), blockedFor.Round(time.Second), grace)
		hold, err := u.stopOnNode(ctx, r, f.vmi, why)
		if err != nil {
			return "", err
		}
		if hold == "" {
			stopped = append(stopped, kubevirt.VMKey(f.vmi))
		}
	}
	if len(stopped) == 0 {
		return "", nil
	}
	return fmt.Sprintf("drainPolicy Evict stopped VM %s, whose live migration off node %s failed, as Harvester's upgrade does; started again once the node is upgraded",
		strings.Join(stopped, ", "), r.nu.Spec.NodeName), nil
}

// completedOnVMI is the migration state of m's VMI when it records m as completed, nil
// otherwise (or when the VMI cannot be read).
func completedOnVMI(ctx context.Context, c client.Reader, m *kubevirtv1.VirtualMachineInstanceMigration) *kubevirtv1.VirtualMachineInstanceMigrationState {
	if m.Status.Phase == kubevirtv1.MigrationFailed {
		return nil
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.VMIName}, vmi); err != nil {
		return nil
	}
	if s := vmi.Status.MigrationState; s != nil && s.MigrationUID == m.UID && s.Completed && !s.Failed {
		return s
	}
	return nil
}

// vmisOnNode lists the VMIs KubeVirt labels as running on node (kubevirt.io/nodeName),
// sorted; served is false on a cluster that does not serve KubeVirt's API.
func vmisOnNode(ctx context.Context, c client.Reader, node string) (vmis []kubevirtv1.VirtualMachineInstance, served bool, err error) {
	list := &kubevirtv1.VirtualMachineInstanceList{}
	if err := c.List(ctx, list, client.MatchingLabels{kubevirtv1.NodeNameLabel: node}); err != nil {
		if kubevirt.Absent(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("list the virtual machine instances on node %s: %w", node, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return kubevirt.VMKey(&list.Items[i]) < kubevirt.VMKey(&list.Items[j]) })
	return list.Items, true, nil
}

// vmiAction is what the evacuation does with one VMI listed on its node.
type vmiAction int

const (
	// vmiLeave: the VMI ended or runs on another node; it holds nothing.
	vmiLeave vmiAction = iota
	// vmiWait: the VMI is shutting down, or is not Running yet; the step waits for it.
	vmiWait
	// vmiStop: the VMI cannot be live-migrated; its VirtualMachine is stopped.
	vmiStop
	// vmiMigrate: the VMI is live-migrated off the node.
	vmiMigrate
	// vmiHold: the VMI holds the node, named, until its operator acts: it is neither
	// migrated nor stopped.
	vmiHold
)

// judgeVMI decides what the evacuation of node does with a VMI listed there; why is what
// is waited for (vmiWait), why it cannot be live-migrated (vmiStop) or what holds the
// node (vmiHold). targets and
// nonWitness are kubevirt.EvacuationTargets'. The run (runEvacuate) and the disruption
// preview (PreviewDisruption) both decide with it, so that the preview cannot drift from
// the run.
func judgeVMI(vmi *kubevirtv1.VirtualMachineInstance, node string, targets []*corev1.Node, nonWitness int) (vmiAction, string) {
	key := kubevirt.VMKey(vmi)
	switch {
	case kubevirt.VMIFinished(vmi) || (vmi.Status.NodeName != "" && vmi.Status.NodeName != node):
		return vmiLeave, ""
	case !vmi.DeletionTimestamp.IsZero():
		return vmiWait, key + " is shutting down"
	case vmi.Status.Phase != kubevirtv1.Running:
		return vmiWait, fmt.Sprintf("%s is %s", key, phaseOr(vmi.Status.Phase))
	}
	if pin := kubevirt.LeftoverMigrationPin(vmi); pin != "" {
		return vmiHold, leftoverPinHold(vmi, pin)
	}
	if why := kubevirt.WhyNotMigratable(vmi, targets, nonWitness); why != "" {
		return vmiStop, why
	}
	return vmiMigrate, ""
}

// leftoverPinHold is what holds the node for a VMI that a failed migration of Harvester's
// left pinned to another node (kubevirt.LeftoverMigrationPin). Its nodeSelector is not the
// user's choice but the leftover of a move that failed, so the VM is not stopped for it,
// as Harvester's own upgrade does (harvester/harvester#8147, #8212): the operator
// decides. A restart drops the pin (the new VMI is built from the VirtualMachine's
// template, which never carried it: harvester/harvester#3397).
func leftoverPinHold(vmi *kubevirtv1.VirtualMachineInstance, pin string) string {
	return fmt.Sprintf("VMI %s is pinned to node %s by the spec.nodeSelector %s=%s and the annotation %s that Harvester's migrate action left when its migration there failed (harvester/harvester#8147): "+
		"it is neither live-migrated nor stopped for that. Restart the VM (virtctl restart %s -n %s: its new VMI has no such selector), migrate it to node %s, or stop it; the node then goes on",
		kubevirt.VMKey(vmi), pin, corev1.LabelHostname, pin, kubevirt.MigrationTargetAnnotation, vmi.Name, vmi.Namespace, pin)
}

// unownedHold is what holds the node for a VMI that cannot be live-migrated and that no
// VirtualMachine owns: the updater could stop it but never start it again.
func unownedHold(vmi *kubevirtv1.VirtualMachineInstance, why string) string {
	return fmt.Sprintf("VMI %s cannot be live-migrated (%s) and no VirtualMachine owns it, so the updater cannot stop it and start it again: stop or move it yourself", kubevirt.VMKey(vmi), why)
}

// stopOnNode stops the VM of a VMI that cannot be live-migrated, once. It returns what
// holds the node when the VM cannot be stopped and started again by the updater.
func (u *Updater) stopOnNode(ctx context.Context, r *nodeRun, vmi *kubevirtv1.VirtualMachineInstance, why string) (string, error) {
	owner := kubevirt.VMIOwnerVM(vmi)
	if owner == "" {
		return u.holdOnce(r, EventVMHoldsNode, unownedHold(vmi, why)), nil
	}
	paused := kubevirt.VMIPaused(vmi)
	stopped, held, err := kubevirt.StopVM(ctx, r.wc, r.nu.UID, r.nu.Spec.NodeName, vmi.Namespace, owner, !paused)
	if err != nil || !stopped {
		return u.holdOnce(r, EventVMHoldsNode, held), err
	}
	if paused {
		u.event(r, corev1.EventTypeNormal, EventVMLeftStopped, "Evacuate", fmt.Sprintf("stopping paused VM %s/%s on node %s: it cannot be live-migrated (%s); as Harvester does, a paused VM is not started again after the upgrade", vmi.Namespace, owner, r.nu.Spec.NodeName, why))
		return "", nil
	}
	u.event(r, corev1.EventTypeNormal, EventVMStopped, "Evacuate", fmt.Sprintf("stopping VM %s/%s on node %s: it cannot be live-migrated (%s); it is started again once the node is upgraded", vmi.Namespace, owner, r.nu.Spec.NodeName, why))
	return "", nil
}

// holdOnce returns what holds the node, and records it as a Warning event the first
// time the step says it: a hold lasts many reconciles, the event is told once.
func (u *Updater) holdOnce(r *nodeRun, reason, hold string) string {
	if hold == "" {
		return ""
	}
	if prev := nodeupdater.Step(r.nu, StepEvacuateVMs); prev == nil || !strings.Contains(prev.Message, hold) {
		u.event(r, corev1.EventTypeWarning, reason, "Evacuate", hold)
	}
	return hold
}

// migrateOff creates the VMI's migration if it has none yet, and reports what holds the
// node when the migration failed. The migration is confined to the landing nodes
// (landing.selector) where it can be; where it cannot, or where KubeVirt older than
// v1.6.0 drops the addedNodeSelector (the migration read back from the API server has
// none), a VMMayMoveTwice event says why.
func (u *Updater) migrateOff(ctx context.Context, r *nodeRun, vmi *kubevirtv1.VirtualMachineInstance, m *kubevirtv1.VirtualMachineInstanceMigration, land landing, nonWitness int) (string, error) {
	if m != nil {
		if m.Status.Phase == kubevirtv1.MigrationFailed {
			hold := fmt.Sprintf("the live migration %s of VM %s off node %s failed: %s; fix the cause and delete the migration to try again, or migrate or stop the VM yourself",
				m.Name, kubevirt.VMKey(vmi), r.nu.Spec.NodeName, kubevirt.MigrationFailure(m))
			return u.holdOnce(r, EventVMMigrationFailed, hold), nil
		}
		return "", nil
	}
	if migrationRuns(vmi) {
		return "", nil // someone else's migration runs: wait for it
	}
	added, why := land.selector(vmi, nonWitness)
	m = &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			Name: kubevirt.MigrationName(r.nu, vmi), Namespace: vmi.Namespace,
			Labels:      map[string]string{suc.LabelNodeUpdate: string(r.nu.UID)},
			Annotations: map[string]string{suc.AnnotationNode: r.nu.Spec.NodeName},
		},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name, AddedNodeSelector: added},
	}
	if added != nil {
		m.Annotations[kubevirt.AnnotationLandingLabel] = land.label
	} else {
		m.Annotations[kubevirt.AnnotationUnconfined] = why
	}
	if err := r.wc.Create(ctx, m); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return "", nil
		}
		return "", fmt.Errorf("create the migration of VMI %s off node %s: %w", kubevirt.VMKey(vmi), r.nu.Spec.NodeName, err)
	}
	// m is now what the API server stored.
	where := "to a node no running roll has still to upgrade"
	if kubevirt.AddedSelectorPruned(m) {
		why = "KubeVirt dropped the migration's addedNodeSelector, so it is older than v1.6.0"
	}
	if why != "" {
		where = "to any node, by the upgrade-pending taint's preference"
		u.event(r, corev1.EventTypeNormal, EventVMMayMoveTwice, "Evacuate", fmt.Sprintf("the live migration %s of VM %s off node %s is not confined to the nodes no running roll has still to upgrade (%s): the VM may land on a node still to go and move again at its turn",
			m.Name, kubevirt.VMKey(vmi), r.nu.Spec.NodeName, why))
	}
	u.event(r, corev1.EventTypeNormal, EventVMMigrationStarted, "Evacuate", fmt.Sprintf("live-migrating VM %s off node %s (migration %s), %s", kubevirt.VMKey(vmi), r.nu.Spec.NodeName, m.Name, where))
	return "", nil
}

// migrationRuns says whether a migration of the VMI, this NodeUpdate's or someone
// else's, has started and not ended.
func migrationRuns(vmi *kubevirtv1.VirtualMachineInstance) bool {
	s := vmi.Status.MigrationState
	return s != nil && s.StartTimestamp != nil && !s.Completed && !s.Failed
}

// migrations are this NodeUpdate's migrations, by name.
func (u *Updater) migrations(ctx context.Context, r *nodeRun) (map[string]*kubevirtv1.VirtualMachineInstanceMigration, error) {
	list := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := r.wc.List(ctx, list, client.MatchingLabels{suc.LabelNodeUpdate: string(r.nu.UID)}); err != nil {
		if kubevirt.Absent(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list the migrations of node %s: %w", r.nu.Spec.NodeName, err)
	}
	out := map[string]*kubevirtv1.VirtualMachineInstanceMigration{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// evacuationSummary says what left the node: the VMs migrated and the VMs stopped.
func (u *Updater) evacuationSummary(ctx context.Context, r *nodeRun, ours map[string]*kubevirtv1.VirtualMachineInstanceMigration) string {
	var migrated []string
	for _, m := range ours {
		state := m.Status.MigrationState
		if m.Status.Phase != kubevirtv1.MigrationSucceeded {
			// The VMI records its migration's end before the migration does: KubeVirt's
			// migration controller marks the migration Succeeded once it sees the VMI's
			// migrationState completed, so a migration whose VMI has already left the node
			// may still read Running here. Harvester's own migration handler takes the
			// VMI's record as the end too (pkg/controller/master/migration, OnVmiChanged:
			// migrationState.migrationUID and completed).
			state = completedOnVMI(ctx, r.wc, m)
			if state == nil {
				continue
			}
		}
		target := ""
		if state != nil && state.TargetNode != "" {
			target = " to " + state.TargetNode
		}
		migrated = append(migrated, m.Namespace+"/"+m.Spec.VMIName+target)
	}
	sort.Strings(migrated)
	var stopped []string
	if vms, err := kubevirt.StoppedVMs(ctx, r.wc, r.nu.UID, "node "+r.nu.Spec.NodeName); err == nil {
		for i := range vms {
			stopped = append(stopped, kubevirt.VMKey(&vms[i]))
		}
	}
	if len(migrated) == 0 && len(stopped) == 0 {
		return fmt.Sprintf("no virtual machine runs on node %s", r.nu.Spec.NodeName)
	}
	msg := fmt.Sprintf("no virtual machine runs on node %s", r.nu.Spec.NodeName)
	if len(migrated) > 0 {
		msg += fmt.Sprintf("; live-migrated %s", strings.Join(migrated, ", "))
		if note := unconfinedNote(ours); note != "" {
			msg += "; " + note
		}
	}
	if len(stopped) > 0 {
		msg += fmt.Sprintf("; stopped %s", strings.Join(stopped, ", "))
	}
	return msg
}

func phaseOr(p kubevirtv1.VirtualMachineInstancePhase) string {
	if p == "" {
		return "not scheduled yet"
	}
	return string(p)
}

// event records an event on the NodeUpdate, when the updater has a recorder.
func (u *Updater) event(r *nodeRun, eventType, reason, action, note string) {
	if u.Recorder == nil {
		return
	}
	if len(note) > 1024 {
		note = note[:1021] + "..."
	}
	u.Recorder.Eventf(r.nu, nil, eventType, reason, action, "%s", note)
}
