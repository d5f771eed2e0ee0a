package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kubelet plays the kubelets of a workload cluster's nodes: it creates Nodes, reports
// them Ready or NotReady and at which version, and records every transition. With
// ServeAddress set it also serves each node's kubelet /stats/summary and /configz over
// HTTPS, reachable through the API server's node proxy (see SetDiskStats; Close stops
// the servers).
type Kubelet struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Record receives the Ready / NotReady transitions.
	Record *Record
	// OSImage is the OS image new nodes report. Default "Harvester v1.7.1".
	OSImage string
	// Labels are put on every node it creates, besides those CreateNode is given.
	Labels map[string]string
	// ServeAddress, when set, is the IP address (see NonLoopbackIPv4) on which CreateNode
	// starts the new node's kubelet server, on a port of its own, and which the node's
	// status names (InternalIP, daemonEndpoints.kubeletEndpoint.Port). Empty serves
	// nothing and leaves nodes without addresses.
	ServeAddress string
	// Logs, when set, is what the kubelet servers answer for a container's log
	// (/containerLogs, behind the API server's pods/log): the log, and whether the
	// container is known. SUC.PodLog fits.
	Logs func(namespace, pod, container string) (string, bool)

	servers kubeletServers

	// mu guards installed.
	mu sync.Mutex
	// installed is the RKE2 version on each node's disk where it differs from the one
	// running: rancher-system-agent installed it under the restart guard, which stops
	// system-agent-installer-rke2's run.sh after it wrote the binaries and the restart
	// stamp and before it restarts the service (harvester-release-steps.md fact 12;
	// rancher/system-agent-installer-rke2 package/run.sh). The next start of RKE2, a
	// reboot or a restart of the service, runs it (InstallRKE2, Rebooted, RestartRKE2).
	installed map[string]string
}

// DefaultNodeResources are a simulated node's capacity and allocatable: a small
// Harvester node (Harvester's documented minimum for production, its hardware
// requirements page, is 16 cores and 64 GiB) with the kubelet's default of 110 pods.
func DefaultNodeResources() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
}

// CreateNode registers a Ready node at the given kubelet version (e.g. v1.34.3+rke2r3).
func (k *Kubelet) CreateNode(ctx context.Context, name, version string, labels map[string]string) (*corev1.Node, error) {
	all := map[string]string{corev1.LabelHostname: name}
	for key, v := range k.Labels {
		all[key] = v
	}
	for key, v := range labels {
		all[key] = v
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all}}
	if err := k.Client.Create(ctx, node); err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	osImage := k.OSImage
	if osImage == "" {
		osImage = "Harvester v1.7.1"
	}
	// Every node reports a capacity and allocatable, as a real kubelet always does
	// (kubelet nodestatus setters MachineInfo: the machine's CPU, memory and pod count,
	// less the reservations).
	resources := DefaultNodeResources()
	node.Status = corev1.NodeStatus{
		NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: version, OSImage: osImage, BootID: string(uuid.NewUUID())},
		Conditions:  []corev1.NodeCondition{readyCondition(true, "KubeletReady", "kubelet is posting ready status")},
		Capacity:    resources.DeepCopy(),
		Allocatable: resources.DeepCopy(),
	}
	if k.ServeAddress != "" {
		host, port, err := k.serve(name)
		if err != nil {
			return nil, err
		}
		servedStatus(&node.Status, host, port)
	}
	if err := k.Client.Status().Update(ctx, node); err != nil {
		return nil, fmt.Errorf("report node %s ready: %w", name, err)
	}
	return node, nil
}

// SetReady reports the node Ready or NotReady.
func (k *Kubelet) SetReady(ctx context.Context, name string, ready bool, reason string) error {
	message := "kubelet is posting ready status"
	if !ready {
		message = "kubelet stopped posting node status: " + reason
	}
	if err := k.updateStatus(ctx, name, func(st *corev1.NodeStatus) {
		setNodeCondition(st, readyCondition(ready, reason, message))
	}); err != nil {
		return err
	}
	k.Record.nodeDown(name, !ready, time.Now())
	return nil
}

// SetVersion reports a new kubelet version (after an upgrade) and a new operating system
// image; an empty value leaves that one as it is. A new kubelet version is RKE2 started
// at that version: it is then the one installed too.
func (k *Kubelet) SetVersion(ctx context.Context, name, version, osImage string) error {
	if version != "" {
		k.mu.Lock()
		delete(k.installed, name)
		k.mu.Unlock()
	}
	return k.updateStatus(ctx, name, func(st *corev1.NodeStatus) {
		if version != "" {
			st.NodeInfo.KubeletVersion = version
		}
		if osImage != "" {
			st.NodeInfo.OSImage = osImage
		}
	})
}

// Rebooted reports the node back from a reboot of its host: a new boot ID (the kernel's
// random boot_id, which the kubelet reports as status.nodeInfo.bootID), the OS image it
// booted (empty keeps the one it had) and Ready, at the RKE2 version installed on its
// disk: RKE2's unit is enabled, so the boot starts whatever binaries were installed last
// (InstallRKE2).
func (k *Kubelet) Rebooted(ctx context.Context, name, osImage string) error {
	k.mu.Lock()
	version := k.installed[name]
	delete(k.installed, name)
	k.mu.Unlock()
	if err := k.updateStatus(ctx, name, func(st *corev1.NodeStatus) {
		st.NodeInfo.BootID = string(uuid.NewUUID())
		if osImage != "" {
			st.NodeInfo.OSImage = osImage
		}
		if version != "" {
			st.NodeInfo.KubeletVersion = version
		}
	}); err != nil {
		return err
	}
	return k.SetReady(ctx, name, true, "KubeletReady")
}

// InstallRKE2 puts RKE2 version on node's disk without starting it: what
// system-agent-installer-rke2's run.sh leaves when INSTALL_RKE2_SKIP_ENABLE=true (the
// restart guard, harvester-release-steps.md fact 12): the install and the restart stamp
// are written before run.sh exits on that variable (package/run.sh). The node runs its
// old version until RKE2 starts again (Rebooted, RestartRKE2).
func (k *Kubelet) InstallRKE2(name, version string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.installed == nil {
		k.installed = map[string]string{}
	}
	k.installed[name] = version
}

// InstalledRKE2 is the RKE2 version on node's disk that does not run yet, "" when the
// running one is the installed one.
func (k *Kubelet) InstalledRKE2(name string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.installed[name]
}

// RestartRKE2 restarts rke2-server or rke2-agent on node: NotReady for down, then Ready at
// the installed version (the running one when nothing else is installed). It says the
// version it started.
func (k *Kubelet) RestartRKE2(ctx context.Context, name string, down time.Duration) (string, error) {
	if err := k.SetReady(ctx, name, false, "RKE2Restarting"); err != nil {
		return "", err
	}
	t := time.NewTimer(down)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-t.C:
	}
	k.mu.Lock()
	version := k.installed[name]
	delete(k.installed, name)
	k.mu.Unlock()
	if version != "" {
		if err := k.updateStatus(ctx, name, func(st *corev1.NodeStatus) { st.NodeInfo.KubeletVersion = version }); err != nil {
			return "", err
		}
	}
	if err := k.SetReady(ctx, name, true, "KubeletReady"); err != nil {
		return "", err
	}
	return version, nil
}

// SetUnschedulable cordons or uncordons the node.
func (k *Kubelet) SetUnschedulable(ctx context.Context, name string, unschedulable bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := k.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		if node.Spec.Unschedulable == unschedulable {
			return nil
		}
		node.Spec.Unschedulable = unschedulable
		return k.Client.Update(ctx, node)
	})
}

func (k *Kubelet) updateStatus(ctx context.Context, name string, mutate func(*corev1.NodeStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := k.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return fmt.Errorf("get node %s: %w", name, err)
		}
		mutate(&node.Status)
		return k.Client.Status().Update(ctx, node)
	})
}

func readyCondition(ready bool, reason, message string) corev1.NodeCondition {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	return corev1.NodeCondition{
		Type: corev1.NodeReady, Status: status, Reason: reason, Message: message,
		LastHeartbeatTime: now, LastTransitionTime: now,
	}
}

func setNodeCondition(st *corev1.NodeStatus, c corev1.NodeCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			if st.Conditions[i].Status == c.Status {
				c.LastTransitionTime = st.Conditions[i].LastTransitionTime
			}
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

// NodeReady reports whether a node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
