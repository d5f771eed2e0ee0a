package harvesteradapter

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	podresource "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
)

// requests are CPU (millicores) and memory (bytes) as the scheduler counts them.
type requests struct{ cpu, mem int64 }

func (r requests) fits(in requests) bool { return r.cpu <= in.cpu && r.mem <= in.mem }
func (r requests) minus(o requests) requests {
	return requests{cpu: r.cpu - o.cpu, mem: r.mem - o.mem}
}
func (r requests) plus(o requests) requests { return requests{cpu: r.cpu + o.cpu, mem: r.mem + o.mem} }

func (r requests) String() string {
	return fmt.Sprintf("CPU %s, memory %s", resource.NewMilliQuantity(r.cpu, resource.DecimalSI), resource.NewQuantity(r.mem, resource.BinarySI))
}

func requestsOf(list corev1.ResourceList) requests {
	return requests{cpu: list.Cpu().MilliValue(), mem: list.Memory().Value()}
}

// kubevirtCPUAllocationRatio is KubeVirt's default cpuAllocationRatio: a VMI that
// requests no CPU gets, on its virt-launcher pod, vCPUs × 1000m / ratio (kubevirt.io/api
// v1.6.0 core/v1 types.go DeveloperConfiguration.CPUAllocationRatio, "Defaults to 10";
// KubeVirt's pkg/virt-controller/services renderresources.go).
const kubevirtCPUAllocationRatio = 10

// cpuAllocationRatio is the ratio the cluster's KubeVirt install CR configures
// (spec.configuration.developerConfiguration.cpuAllocationRatio; Harvester's is
// harvester-system/kubevirt), else KubeVirt's default.
func cpuAllocationRatio(ctx context.Context, wc client.Client) int64 {
	list := &kubevirtv1.KubeVirtList{}
	if err := wc.List(ctx, list); err != nil {
		return kubevirtCPUAllocationRatio // not served, or not readable: the default
	}
	for i := range list.Items {
		if d := list.Items[i].Spec.Configuration.DeveloperConfiguration; d != nil && d.CPUAllocationRatio > 0 {
			return int64(d.CPUAllocationRatio)
		}
	}
	return kubevirtCPUAllocationRatio
}

// vmiRequests is what a VMI asks of a node, as KubeVirt requests it: the requests of its
// virt-launcher pod (labelled kubevirt.io/created-by with the VMI's UID,
// kubevirtv1.CreatedByLabel) when it is listed; the target pod of a live migration is
// rendered from the same VMI and asks the same. Without the pod, the VMI's own
// spec.domain.resources.requests: memory, else spec.domain.memory.guest; CPU, else its
// vCPUs × 1000m over the cluster's cpuAllocationRatio. That fallback leaves out the memory overhead
// KubeVirt adds to the launcher (GetMemoryOverhead, some hundreds of MiB), which this
// does not replicate: exact is false, and the capacity says so.
func vmiRequests(vmi *kubevirtv1.VirtualMachineInstance, launchers map[types.UID]*corev1.Pod, ratio int64) (r requests, exact bool) {
	if pod := launchers[vmi.UID]; pod != nil {
		return requestsOf(podresource.PodRequests(pod, podresource.PodResourcesOptions{})), true
	}
	spec := vmi.Spec.Domain
	r = requestsOf(spec.Resources.Requests)
	if _, ok := spec.Resources.Requests[corev1.ResourceMemory]; !ok && spec.Memory != nil && spec.Memory.Guest != nil {
		r.mem = spec.Memory.Guest.Value()
	}
	if _, ok := spec.Resources.Requests[corev1.ResourceCPU]; !ok {
		r.cpu = vcpus(spec.CPU) * 1000 / ratio
	}
	return r, false
}

// vcpus is sockets × cores × threads, each 1 when unset, as KubeVirt counts a VMI's vCPUs.
func vcpus(cpu *kubevirtv1.CPU) int64 {
	if cpu == nil {
		return 1
	}
	n := int64(1)
	for _, v := range []uint32{cpu.Sockets, cpu.Cores, cpu.Threads} {
		if v > 0 {
			n *= int64(v)
		}
	}
	return n
}

// roomLedger is what the nodes that stay up have free: allocatable minus the requests of
// the pods bound there (not finished) and of the VMIs running there whose launcher pod is
// not listed.
type roomLedger struct {
	free     map[string]requests
	order    []string
	inexact  bool
	launcher map[types.UID]*corev1.Pod
	ratio    int64
}

func newRoomLedger(ctx context.Context, wc client.Client, targets []*corev1.Node) (*roomLedger, error) {
	l := &roomLedger{free: map[string]requests{}, launcher: map[types.UID]*corev1.Pod{}, ratio: cpuAllocationRatio(ctx, wc)}
	pods := &corev1.PodList{}
	if err := wc.List(ctx, pods, client.HasLabels{kubevirtv1.CreatedByLabel}); err != nil {
		return nil, fmt.Errorf("list the virt-launcher pods: %w", err)
	}
	for i := range pods.Items {
		l.launcher[types.UID(pods.Items[i].Labels[kubevirtv1.CreatedByLabel])] = &pods.Items[i]
	}
	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := wc.List(ctx, vmis); err != nil && !kubevirt.Absent(err) {
		return nil, fmt.Errorf("list the virtual machine instances: %w", err)
	}
	for _, n := range targets {
		free := requestsOf(n.Status.Allocatable)
		bound := &corev1.PodList{}
		if err := wc.List(ctx, bound, client.MatchingFields{"spec.nodeName": n.Name}); err != nil {
			return nil, fmt.Errorf("list the pods of node %s: %w", n.Name, err)
		}
		for i := range bound.Items {
			if p := &bound.Items[i]; p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				free = free.minus(requestsOf(podresource.PodRequests(p, podresource.PodResourcesOptions{})))
			}
		}
		for i := range vmis.Items {
			if v := &vmis.Items[i]; v.Status.NodeName == n.Name && !kubevirt.VMIFinished(v) && l.launcher[v.UID] == nil {
				r, _ := vmiRequests(v, nil, l.ratio)
				free = free.minus(r)
			}
		}
		l.free[n.Name] = free
		l.order = append(l.order, n.Name)
	}
	return l, nil
}

// place takes a VMI's requests from the node that stays up, satisfies its required node
// affinity and has the most memory free after it; "" when none has room.
func (l *roomLedger) place(vmi *kubevirtv1.VirtualMachineInstance, need requests, targets []*corev1.Node) string {
	best := ""
	for _, n := range targets {
		if !need.fits(l.free[n.Name]) || !affinityAllows(vmi, n) {
			continue
		}
		if best == "" || l.free[n.Name].mem > l.free[best].mem {
			best = n.Name
		}
	}
	if best != "" {
		l.free[best] = l.free[best].minus(need)
	}
	return best
}

func affinityAllows(vmi *kubevirtv1.VirtualMachineInstance, n *corev1.Node) bool {
	a := vmi.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	ok, err := corev1helpers.MatchNodeSelectorTerms(n, a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
	return err == nil && ok
}

func (l *roomLedger) describe() string {
	parts := make([]string, 0, len(l.order))
	for _, n := range l.order {
		parts = append(parts, fmt.Sprintf("%s: %s free", n, l.free[n]))
	}
	return strings.Join(parts, "; ")
}

// previewCapacity judges whether the nodes that stay up (targets: EvacuationTargets less
// the nodes down together) have room for the VMIs the evacuation would live-migrate,
// largest memory first, each on the node with the most memory free, as a rough stand-in
// for the scheduler placing KubeVirt's migration target pods. It fills d.MigratingVMs
// with where each has room, and returns the capacity verdict: "room: ..." or "short: ...",
// naming the VMs with no room and what each asks. A VM with no room is still listed as
// migrating: the run would try, its target pod would not be scheduled, the migration
// would fail and hold the node (runEvacuate does not stop a VM that could migrate).
func previewCapacity(ctx context.Context, wc client.Client, targets []*corev1.Node, migrating []*kubevirtv1.VirtualMachineInstance, d *inplacev1.NodeDisruption) (string, error) {
	if len(migrating) == 0 {
		return "no VM would be live-migrated", nil
	}
	l, err := newRoomLedger(ctx, wc, targets)
	if err != nil {
		return "", err
	}
	needs := map[*kubevirtv1.VirtualMachineInstance]requests{}
	for _, vmi := range migrating {
		r, exact := vmiRequests(vmi, l.launcher, l.ratio)
		needs[vmi], l.inexact = r, l.inexact || !exact
	}
	sorted := append([]*kubevirtv1.VirtualMachineInstance(nil), migrating...)
	sort.SliceStable(sorted, func(i, j int) bool { return needs[sorted[i]].mem > needs[sorted[j]].mem })
	before := l.describe()
	var short []string
	var total requests
	placed := map[*kubevirtv1.VirtualMachineInstance]string{}
	for _, vmi := range sorted {
		total = total.plus(needs[vmi])
		if placed[vmi] = l.place(vmi, needs[vmi], targets); placed[vmi] == "" {
			short = append(short, fmt.Sprintf("%s (%s)", kubevirt.VMKey(vmi), needs[vmi]))
		}
	}
	for _, vmi := range migrating { // in the node's order, as the run goes
		d.MigratingVMs = append(d.MigratingVMs, migratingVM(vmi, placed[vmi], needs[vmi]))
	}
	return capacityVerdict(before, short, len(migrating), total, len(targets), l.inexact), nil
}

func migratingVM(vmi *kubevirtv1.VirtualMachineInstance, node string, need requests) inplacev1.PreviewVM {
	out := inplacev1.PreviewVM{Namespace: vmi.Namespace, Name: vmi.Name}
	if owner := kubevirt.VMIOwnerVM(vmi); owner != "" {
		out.Name = owner
	}
	if node == "" {
		out.Reason = fmt.Sprintf("would hold the node: no node that stays up has room for it (%s); its live migration would fail", need)
	} else {
		out.Reason = fmt.Sprintf("live-migrated: room on %s (%s requested); KubeVirt's scheduler picks the node", node, need)
	}
	return out
}

func capacityVerdict(before string, short []string, n int, total requests, targets int, inexact bool) string {
	note := ""
	if inexact {
		note = "; requests read from the VMI spec where no virt-launcher pod is listed, without KubeVirt's memory overhead"
	}
	switch {
	case targets == 0:
		return fmt.Sprintf("short: no node stays up to take the %d live-migrating VM(s) (%s in all); their migrations would fail and hold the node", n, total)
	case len(short) > 0:
		return fmt.Sprintf("short: the nodes that stay up (%s) have no room for %s; their migrations would fail and hold the node%s", before, strings.Join(short, ", "), note)
	}
	return fmt.Sprintf("room: the nodes that stay up (%s) take the %d live-migrating VM(s) (%s in all)%s", before, n, total, note)
}
