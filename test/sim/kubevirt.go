package sim

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeVirt plays KubeVirt's virt-controller on a workload cluster, as far as the Harvester
// updater relies on it (kubevirt.io/api v1.6.0 core/v1 types; KubeVirt's
// pkg/virt-controller/watch/vm and .../migration controllers):
//   - a VirtualMachine whose run strategy is Always or RerunOnFailure (or running: true)
//     gets a VirtualMachineInstance of the same name, owned by it, built from its
//     template, Running on a node: the one PlaceOn named if it can take it, else the
//     node kube-scheduler would bind its virt-launcher pod to, with the default
//     profile's filters and weighted scores (pick, kubevirt_scheduler.go); with no
//     node that passes the filters it stays Scheduling and is placed once one does.
//     KubeVirt labels the VMI kubevirt.io/nodeName and sets status.nodeName
//     (types.go NodeNameLabel); a VMI with host devices or GPUs is LiveMigratable False
//     with reason HostDeviceNotLiveMigratable, any other True;
//   - a VirtualMachine that is Halted (or running: false) loses its VMI: the VM
//     controller deletes it to stop the guest;
//   - a VirtualMachineInstanceMigration is labelled kubevirt.io/vmi-name (KubeVirt's
//     mutating webhook, MigrationSelectorLabel), goes Pending, then Running (KubeVirt's
//     migration controller goes through Scheduling, Scheduled, PreparingTarget and
//     TargetReady to Running; VirtualMachineInstanceMigration.IsRunning counts all of them
//     but Pending), and after MigrationDelay from its creation moves its VMI to the node
//     kube-scheduler would bind the migration's target pod to (pick: never the source
//     node, and within the migration's spec.addedNodeSelector): the VMI's node, label,
//     migrationState and launcher image (the target pod's, see WorkloadUpdater) change,
//     and the migration goes Succeeded with the same
//     migrationState. The migration controller's own limits (parallelMigrationsPerCluster,
//     parallelOutboundMigrationsPerNode) are not played: every migration runs at once. It fails (phase
//     Failed, migrationState.failed, failureReason) when FailMigrations names the VMI,
//     when no node can take the VMI (KubeVirt's target pod stays unschedulable until its
//     timeout), or when the VMI does not exist. A migration of a VMI that is not
//     LiveMigratable fails at once: KubeVirt's admission webhook refuses to create it, a
//     webhook this API server does not run;
//   - the Longhorn volumes a VMI uses move with its live migration and detach when it
//     stops (longhornusers.go).
//
// With KubeVirtCR set it also plays virt-operator's deployed version and virt-controller's
// workload updater (see kubevirt_updater.go).
//
// The simulator records which VMI ran on which node when, and how the scheduler scored
// the nodes when it chose that one (History), so a test can check over the whole run that
// no VMI ran on a node while it was drained, and that none was migrated or started more
// often than it should, and a failure says why a VMI went where it went.
type KubeVirt struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace, when set, is the only namespace whose VirtualMachines and migrations the
	// simulator plays (tests share one API server); empty means all.
	Namespace string
	// NodeSelector, when set, limits the nodes VMIs are placed on and migrated to (tests
	// share one API server's Nodes); empty means every node.
	NodeSelector map[string]string
	// MigrationDelay is how long a live migration takes. Default 200ms.
	MigrationDelay time.Duration
	// Interval is how often the cluster is looked at. Default 50ms.
	Interval time.Duration
	// Cache, when set, is an informer cache of the workload cluster that the VM and
	// migration controllers read from, as virt-controller reads from its informers; each
	// pass then sees the simulator's own writes (awaitCached), and costs the API server no
	// list. The workload updater still reads the API server: it creates migrations by
	// generateName, which a stale list would repeat (virt-controller guards them with its
	// expectations, which the simulator does not play). Unset, every read goes to the API
	// server.
	Cache ctrlcache.Cache
	// KubeVirtCR, when set, names the KubeVirt install CR (Harvester's is
	// harvester-system/kubevirt) whose deployed version and workload update strategy the
	// simulator plays (kubevirt_updater.go). Unset, VMIs carry no launcher image and no
	// workload update runs, as before.
	KubeVirtCR client.ObjectKey

	mu       sync.Mutex
	places   map[string]string
	failures map[string]string
	history  []VMIPlacement
	updater  workloadUpdater
}

// VMIPlacement is one stay of a VMI on a node: from its start or its arrival by
// migration (How) until it stopped or left (End zero while it is still there).
type VMIPlacement struct {
	// VMI is namespace/name.
	VMI  string
	Node string
	// How is "started" or "migrated".
	How        string
	Start, End time.Time
	// Scores are the scheduler's scores of the feasible nodes when it chose Node, best
	// first; none when a test's PlaceOn chose it or it was the only feasible node.
	Scores []NodeScore
}

func (p VMIPlacement) String() string {
	out := fmt.Sprintf("%s %s on %s at %s", p.VMI, p.How, p.Node, p.Start.Format("15:04:05.000"))
	if !p.End.IsZero() {
		out += " until " + p.End.Format("15:04:05.000")
	}
	if len(p.Scores) > 0 {
		out += ", scored " + describeScores(p.Scores)
	}
	return out
}

// PlaceOn says on which node the VMI of a VirtualMachine starts when that node can take
// it; namespace/name of the VM.
func (k *KubeVirt) PlaceOn(namespace, vm, node string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.places == nil {
		k.places = map[string]string{}
	}
	k.places[namespace+"/"+vm] = node
}

// FailMigrations makes every migration of a VMI fail with reason, until called again
// with an empty reason.
func (k *KubeVirt) FailMigrations(namespace, vmi, reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failures == nil {
		k.failures = map[string]string{}
	}
	if reason == "" {
		delete(k.failures, namespace+"/"+vmi)
		return
	}
	k.failures[namespace+"/"+vmi] = reason
}

// History returns every stay of a VMI on a node, in order.
func (k *KubeVirt) History() []VMIPlacement {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]VMIPlacement(nil), k.history...)
}

// Starts is how many times the VMI of namespace/name was started.
func (k *KubeVirt) Starts(vmi string) int { return k.count(vmi, "started") }

// Migrations is how many times the VMI of namespace/name was live-migrated.
func (k *KubeVirt) Migrations(vmi string) int { return k.count(vmi, "migrated") }

func (k *KubeVirt) count(vmi, how string) int {
	n := 0
	for _, p := range k.History() {
		if p.VMI == vmi && p.How == how {
			n++
		}
	}
	return n
}

// NodeOf is the node the VMI of namespace/name runs on now, "" when it runs nowhere.
func (k *KubeVirt) NodeOf(vmi string) string {
	for _, p := range k.History() {
		if p.VMI == vmi && p.End.IsZero() {
			return p.Node
		}
	}
	return ""
}

// RunningWhileDrained returns, for every drain of a node by a Plan's Job that rec
// recorded, the VMIs that were running on that node at the moment the drain started.
// Harvester's pre-drain waits for every VMI to leave the node before it is drained
// (harvester-node-upgrade.md, facts 24 and 33): a VMI still there is killed by the drain.
func (k *KubeVirt) RunningWhileDrained(rec *Record) []string {
	history := k.History()
	nodes := map[string]bool{}
	for _, p := range history {
		nodes[p.Node] = true
	}
	var out []string
	for node := range nodes {
		for _, d := range rec.Drains(node) {
			for _, p := range history {
				if p.Node == node && !p.Start.After(d.At) && (p.End.IsZero() || p.End.After(d.At)) {
					out = append(out, fmt.Sprintf("%s on %s at the drain of %s", p.VMI, node, d.At.Format(time.RFC3339Nano)))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func (k *KubeVirt) arrive(vmi string, p Placement, how string, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.history = append(k.history, VMIPlacement{VMI: vmi, Node: p.Node, How: how, Start: at, Scores: p.Scores})
}

func (k *KubeVirt) leave(vmi string, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := range k.history {
		if k.history[i].VMI == vmi && k.history[i].End.IsZero() {
			k.history[i].End = at
		}
	}
}

// reader is where the VM and migration controllers read: Cache when set, else the API
// server.
func (k *KubeVirt) reader() client.Reader {
	if k.Cache != nil {
		return k.Cache
	}
	return k.Client
}

func (k *KubeVirt) inNamespace() []client.ListOption {
	if k.Namespace == "" {
		return nil
	}
	return []client.ListOption{client.InNamespace(k.Namespace)}
}

func (k *KubeVirt) migrationDelay() time.Duration {
	if k.MigrationDelay > 0 {
		return k.MigrationDelay
	}
	return 200 * time.Millisecond
}

// Run plays KubeVirt until ctx ends.
func (k *KubeVirt) Run(ctx context.Context) {
	interval := k.Interval
	if interval == 0 {
		interval = 50 * time.Millisecond
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// The updater first: it reads the deployed KubeVirt version, whose launcher
			// image the VMIs started in this pass run.
			_ = k.syncWorkloadUpdates(ctx)
			_ = k.syncVMs(ctx)
			_ = k.syncMigrations(ctx)
		}
	}
}

// wantsRunning is KubeVirt's reading of a VM's run strategy for a VM without a VMI:
// Always and RerunOnFailure start one; Halted, Manual and Once leave it stopped (Manual
// and Once are started through the start subresource, which this simulator does not
// serve).
func wantsRunning(vm *kubevirtv1.VirtualMachine) bool {
	s, err := vm.RunStrategy()
	return err == nil && (s == kubevirtv1.RunStrategyAlways || s == kubevirtv1.RunStrategyRerunOnFailure)
}

func halted(vm *kubevirtv1.VirtualMachine) bool {
	s, err := vm.RunStrategy()
	return err == nil && s == kubevirtv1.RunStrategyHalted
}

func (k *KubeVirt) syncVMs(ctx context.Context) error {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := k.reader().List(ctx, vms, k.inNamespace()...); err != nil {
		return err
	}
	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := k.reader().List(ctx, vmis, k.inNamespace()...); err != nil {
		return err
	}
	nodes := &corev1.NodeList{}
	if err := k.reader().List(ctx, nodes, client.MatchingLabels(k.NodeSelector)); err != nil {
		return err
	}
	byKey := map[string]*kubevirtv1.VirtualMachineInstance{}
	for i := range vmis.Items {
		byKey[vmis.Items[i].Namespace+"/"+vmis.Items[i].Name] = &vmis.Items[i]
	}
	for i := range vms.Items {
		vm := &vms.Items[i]
		key := vm.Namespace + "/" + vm.Name
		vmi := byKey[key]
		if vmi == nil || !vmi.DeletionTimestamp.IsZero() {
			// A VMI deleted by someone else (virtctl restart, a user's delete) ends its
			// guest: virt-launcher's pod goes with it (KubeVirt's VMI controller deletes
			// the pods of a deleted VMI).
			k.leave(key, time.Now())
		}
		switch {
		case vmi == nil && wantsRunning(vm):
			if err := k.startVMI(ctx, vm, nodes.Items, byKey); err != nil {
				return err
			}
		case vmi != nil && halted(vm) && vmi.DeletionTimestamp.IsZero():
			if err := k.Client.Delete(ctx, vmi); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			awaitGone(ctx, k.Cache, vmi)
			k.leave(key, time.Now())
			// The stopped guest's disks detach (longhornusers.go).
			if err := ReleaseVolumes(ctx, k.Client, func(namespace, _, name, kind string) bool {
				return kind == "VirtualMachineInstance" && namespace == vmi.Namespace && name == vmi.Name
			}); err != nil {
				return err
			}
		case vmi != nil && vmi.Status.Phase == kubevirtv1.Scheduling:
			if p := k.pick(vm, vmi, nil, nodes.Items, byKey, ""); p.Node != "" {
				if err := k.run(ctx, vmi, p); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// startVMI creates the VM's VMI, Running on a node that can take it, or Scheduling.
func (k *KubeVirt) startVMI(ctx context.Context, vm *kubevirtv1.VirtualMachine, nodes []corev1.Node, others map[string]*kubevirtv1.VirtualMachineInstance) error {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{
		Name: vm.Name, Namespace: vm.Namespace, Labels: map[string]string{},
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
		}},
	}}
	if t := vm.Spec.Template; t != nil {
		vmi.Spec = *t.Spec.DeepCopy()
		for key, v := range t.ObjectMeta.Labels {
			vmi.Labels[key] = v
		}
	}
	migratable := corev1.ConditionTrue
	reason := ""
	if d := vmi.Spec.Domain.Devices; len(d.HostDevices) > 0 || len(d.GPUs) > 0 {
		migratable, reason = corev1.ConditionFalse, kubevirtv1.VirtualMachineInstanceReasonHostDeviceNotMigratable
	}
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{
		Phase: kubevirtv1.Scheduling,
		Conditions: []kubevirtv1.VirtualMachineInstanceCondition{
			{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: migratable, Reason: reason},
		},
	}
	p := k.pick(vm, vmi, nil, nodes, others, "")
	if p.Node != "" {
		vmi.Labels[kubevirtv1.NodeNameLabel] = p.Node
		vmi.Status.Phase, vmi.Status.NodeName = kubevirtv1.Running, p.Node
		vmi.Status.LauncherContainerImageVersion = k.launcherImage()
	}
	// VirtualMachineInstance has no status subresource in KubeVirt's CRD: the status is
	// written with the object.
	if err := k.Client.Create(ctx, vmi); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("start VMI %s/%s: %w", vm.Namespace, vm.Name, err)
	}
	awaitCached(ctx, k.Cache, vmi)
	if p.Node != "" {
		k.arrive(vm.Namespace+"/"+vm.Name, p, "started", time.Now())
	}
	return nil
}

// run puts a Scheduling VMI on the node p chose.
func (k *KubeVirt) run(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, p Placement) error {
	if vmi.Labels == nil {
		vmi.Labels = map[string]string{}
	}
	vmi.Labels[kubevirtv1.NodeNameLabel] = p.Node
	vmi.Status.Phase, vmi.Status.NodeName = kubevirtv1.Running, p.Node
	vmi.Status.LauncherContainerImageVersion = k.launcherImage()
	if err := k.Client.Update(ctx, vmi); err != nil {
		return err
	}
	awaitCached(ctx, k.Cache, vmi)
	k.arrive(vmi.Namespace+"/"+vmi.Name, p, "started", time.Now())
	return nil
}

// pick chooses the node for a VMI's virt-launcher pod (for a migration, its target pod,
// rendered from the same VMI with the migration's addedNodeSelector): the VM's PlaceOn
// node if that node passes the scheduler's filters (a test's placement), else the node
// kube-scheduler would bind the pod to (schedule, kubevirt_scheduler.go), never exclude.
func (k *KubeVirt) pick(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, added map[string]string, nodes []corev1.Node, vmis map[string]*kubevirtv1.VirtualMachineInstance, exclude string) Placement {
	pod := launcherOf(vmi, added)
	bound := boundLaunchers(vmis)
	if vm != nil {
		k.mu.Lock()
		want := k.places[vm.Namespace+"/"+vm.Name]
		k.mu.Unlock()
		byName := map[string]*corev1.Node{}
		for i := range nodes {
			byName[nodes[i].Name] = &nodes[i]
		}
		if n := byName[want]; n != nil && want != exclude && passesFilters(n, pod, bound, byName) {
			return Placement{Node: want}
		}
	}
	return schedule(pod, nodes, bound, exclude)
}

// vmiRequests is what a VMI's virt-launcher pod requests, as KubeVirt renders it
// (pkg/virt-controller/services renderresources.go): spec.domain.resources.requests,
// memory else spec.domain.memory.guest, CPU else vCPUs × 1000m over the default
// cpuAllocationRatio of 10. KubeVirt's memory overhead (GetMemoryOverhead) is left out,
// as the Harvester updater's capacity count leaves it out when no launcher pod is listed
// (harvesteradapter/preview_capacity.go vmiRequests): the simulator runs no launcher
// pods, and the two must agree on what fits.
func vmiRequests(spec *kubevirtv1.VirtualMachineInstanceSpec) (cpuMilli, mem int64) {
	d := spec.Domain
	if q, ok := d.Resources.Requests[corev1.ResourceMemory]; ok {
		mem = q.Value()
	} else if d.Memory != nil && d.Memory.Guest != nil {
		mem = d.Memory.Guest.Value()
	}
	if q, ok := d.Resources.Requests[corev1.ResourceCPU]; ok {
		return q.MilliValue(), mem
	}
	vcpus := int64(1)
	if c := d.CPU; c != nil {
		for _, v := range []uint32{c.Sockets, c.Cores, c.Threads} {
			if v > 0 {
				vcpus *= int64(v)
			}
		}
	}
	return vcpus * 1000 / 10, mem
}

func (k *KubeVirt) syncMigrations(ctx context.Context) error {
	migrations := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := k.reader().List(ctx, migrations, k.inNamespace()...); err != nil {
		return err
	}
	for i := range migrations.Items {
		m := &migrations.Items[i]
		if m.Status.Phase == kubevirtv1.MigrationSucceeded || m.Status.Phase == kubevirtv1.MigrationFailed || !m.DeletionTimestamp.IsZero() {
			continue
		}
		if err := k.migrate(ctx, m); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

func (k *KubeVirt) migrate(ctx context.Context, m *kubevirtv1.VirtualMachineInstanceMigration) error {
	if m.Labels[kubevirtv1.MigrationSelectorLabel] != m.Spec.VMIName {
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels[kubevirtv1.MigrationSelectorLabel] = m.Spec.VMIName
		return k.write(ctx, m, k.Client.Update(ctx, m)) // seen again on the next pass
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := k.reader().Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.VMIName}, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return k.endMigration(ctx, m, nil, fmt.Sprintf("VMI %s/%s does not exist", m.Namespace, m.Spec.VMIName))
		}
		return err
	}
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstanceIsMigratable && c.Status == corev1.ConditionFalse {
			return k.endMigration(ctx, m, nil, fmt.Sprintf("Cannot migrate VMI, Reason: %s", c.Reason))
		}
	}
	if m.Status.Phase == kubevirtv1.MigrationPhaseUnset {
		m.Status.Phase = kubevirtv1.MigrationPending
		m.Status.PhaseTransitionTimestamps = append(m.Status.PhaseTransitionTimestamps,
			kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{Phase: kubevirtv1.MigrationPending, PhaseTransitionTimestamp: metav1.Now()})
		return k.write(ctx, m, k.Client.Status().Update(ctx, m))
	}
	if m.Status.Phase == kubevirtv1.MigrationPending {
		m.Status.Phase = kubevirtv1.MigrationRunning
		m.Status.PhaseTransitionTimestamps = append(m.Status.PhaseTransitionTimestamps,
			kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{Phase: kubevirtv1.MigrationRunning, PhaseTransitionTimestamp: metav1.Now()})
		return k.write(ctx, m, k.Client.Status().Update(ctx, m))
	}
	if time.Since(m.CreationTimestamp.Time) < k.migrationDelay() {
		return nil
	}
	source := vmi.Status.NodeName
	state := &kubevirtv1.VirtualMachineInstanceMigrationState{
		SourceNode: source, MigrationUID: m.UID, StartTimestamp: &m.CreationTimestamp,
	}
	k.mu.Lock()
	reason := k.failures[m.Namespace+"/"+m.Spec.VMIName]
	k.mu.Unlock()
	if reason != "" {
		return k.endMigration(ctx, m, state, reason)
	}
	nodes := &corev1.NodeList{}
	if err := k.reader().List(ctx, nodes, client.MatchingLabels(k.NodeSelector)); err != nil {
		return err
	}
	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := k.reader().List(ctx, vmis, k.inNamespace()...); err != nil {
		return err
	}
	others := map[string]*kubevirtv1.VirtualMachineInstance{}
	for i := range vmis.Items {
		others[vmis.Items[i].Namespace+"/"+vmis.Items[i].Name] = &vmis.Items[i]
	}
	placed := k.pick(nil, vmi, m.Spec.AddedNodeSelector, nodes.Items, others, source)
	target := placed.Node
	if target == "" {
		return k.endMigration(ctx, m, state, "the migration target pod could not be scheduled: no other node can run the VMI")
	}
	now := metav1.Now()
	state.TargetNode, state.EndTimestamp, state.Completed = target, &now, true
	vmi.Labels[kubevirtv1.NodeNameLabel] = target
	vmi.Status.NodeName = target
	vmi.Status.MigrationState = state.DeepCopy()
	if image := k.launcherImage(); image != "" {
		// The VMI now runs in the target pod, started from the launcher image of the
		// KubeVirt deployed when the migration began: virt-controller records it
		// (VirtualMachineInstanceStatus.LauncherContainerImageVersion).
		vmi.Status.LauncherContainerImageVersion = image
	}
	if err := k.Client.Update(ctx, vmi); err != nil {
		return err
	}
	awaitCached(ctx, k.Cache, vmi)
	// Its disks' attachment moves with it (longhornusers.go, LH fact 38).
	if err := MoveVolumeAttachments(ctx, k.Client, vmi.Namespace, vmi.Name, target); err != nil {
		return err
	}
	key := vmi.Namespace + "/" + vmi.Name
	k.leave(key, now.Time)
	k.arrive(key, placed, "migrated", now.Time)
	m.Status.Phase, m.Status.MigrationState = kubevirtv1.MigrationSucceeded, state
	m.Status.PhaseTransitionTimestamps = append(m.Status.PhaseTransitionTimestamps,
		kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{Phase: kubevirtv1.MigrationSucceeded, PhaseTransitionTimestamp: now})
	return k.write(ctx, m, k.Client.Status().Update(ctx, m))
}

// endMigration fails a migration with reason, as KubeVirt reports it: phase Failed and
// a migration state that is failed with the reason.
func (k *KubeVirt) endMigration(ctx context.Context, m *kubevirtv1.VirtualMachineInstanceMigration, state *kubevirtv1.VirtualMachineInstanceMigrationState, reason string) error {
	if state == nil {
		state = &kubevirtv1.VirtualMachineInstanceMigrationState{MigrationUID: m.UID}
	}
	now := metav1.Now()
	state.EndTimestamp, state.Failed, state.FailureReason = &now, true, reason
	m.Status.Phase, m.Status.MigrationState = kubevirtv1.MigrationFailed, state
	m.Status.PhaseTransitionTimestamps = append(m.Status.PhaseTransitionTimestamps,
		kubevirtv1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{Phase: kubevirtv1.MigrationFailed, PhaseTransitionTimestamp: now})
	return k.write(ctx, m, k.Client.Status().Update(ctx, m))
}

// write ends a write of obj that returned err: once it succeeded, the cache shows it
// before the next pass reads.
func (k *KubeVirt) write(ctx context.Context, obj client.Object, err error) error {
	if err == nil {
		awaitCached(ctx, k.Cache, obj)
	}
	return err
}
