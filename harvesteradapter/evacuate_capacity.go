package harvesteradapter

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
)

// EventVMsLackRoom is the event reason of an evacuation held because the nodes that stay
// up cannot hold the VMs still to be live-migrated off the node.
const EventVMsLackRoom = "VMsLackRoom"

// roomShortfall checks, before the evacuation of node creates a migration, that the nodes
// that stay up (targets: kubevirt.EvacuationTargets) have room for every VMI it has still
// to live-migrate (pending), with the count the disruption preview uses (roomLedger,
// vmiRequests: allocatable less the requests bound there; each VMI, largest memory first,
// on the node with the most memory free). It returns "" when every one has room, else
// what holds the node: the VMs with no room, what they ask in all, and what each node
// that stays up has free. Nothing is migrated while it holds: a migration whose target
// pod finds no room fails, and moving some VMs only to stop on the others would disturb
// them for nothing.
func roomShortfall(ctx context.Context, wc client.Client, node string, targets []*corev1.Node, pending []*kubevirtv1.VirtualMachineInstance) (string, error) {
	if len(pending) == 0 {
		return "", nil
	}
	l, err := newRoomLedger(ctx, wc, targets)
	if err != nil {
		return "", err
	}
	needs := map[*kubevirtv1.VirtualMachineInstance]requests{}
	for _, vmi := range pending {
		r, exact := vmiRequests(vmi, l.launcher, l.ratio)
		needs[vmi], l.inexact = r, l.inexact || !exact
	}
	sorted := append([]*kubevirtv1.VirtualMachineInstance(nil), pending...)
	sort.SliceStable(sorted, func(i, j int) bool { return needs[sorted[i]].mem > needs[sorted[j]].mem })
	before := l.describe()
	var short []string
	var missing requests
	for _, vmi := range sorted {
		if l.place(vmi, needs[vmi], targets) == "" {
			short = append(short, fmt.Sprintf("%s (%s)", kubevirt.VMKey(vmi), needs[vmi]))
			missing = missing.plus(needs[vmi])
		}
	}
	if len(short) == 0 {
		return "", nil
	}
	sort.Strings(short)
	note := ""
	if l.inexact {
		note = "; requests read from the VMI spec where no virt-launcher pod is listed, without KubeVirt's memory overhead"
	}
	if len(targets) == 0 {
		before = "none"
	}
	return fmt.Sprintf("the nodes that stay up have no room for the VMs to live-migrate off node %s: %s; %s in all is missing (free on the nodes that stay up: %s)%s; no VM is migrated until there is room: free CPU or memory on the other nodes, or stop or move these VMs yourself",
		node, strings.Join(short, ", "), missing, before, note), nil
}
