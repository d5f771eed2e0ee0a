package capienv

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

//go:embed testdata/clusterclass.yaml
var clusterClassYAML []byte

// The ClusterClasses CreateClasses creates: InPlaceClass updates every machine in place
// (KCP maxSurge 0, which KCP allows from 3 replicas on); SmallControlPlaneClass is for
// control planes of fewer than 3 machines (KCP maxSurge 1: KCP replaces them).
const (
	InPlaceClass           = "in-memory"
	SmallControlPlaneClass = "in-memory-small-cp"
)

// CreateClasses creates the in-memory ClusterClasses and their templates in namespace
// (testdata/clusterclass.yaml; workers maxSurge 0 and maxUnavailable 1 in both).
func CreateClasses(ctx context.Context, c client.Client, namespace string) error {
	for _, class := range []struct {
		Name                 string
		ControlPlaneMaxSurge int
	}{{InPlaceClass, 0}, {SmallControlPlaneClass, 1}} {
		var buf bytes.Buffer
		if err := clusterClassTemplate.Execute(&buf, class); err != nil {
			return fmt.Errorf("render ClusterClass %s: %w", class.Name, err)
		}
		if err := createAll(ctx, c, namespace, buf.Bytes()); err != nil {
			return err
		}
	}
	return nil
}

var clusterClassTemplate = template.Must(template.New("clusterclass").Parse(string(clusterClassYAML)))

func createAll(ctx context.Context, c client.Client, namespace string, manifest []byte) error {
	reader := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the ClusterClass manifest: %w", err)
		}
		obj := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal(doc, &obj.Object); err != nil {
			return fmt.Errorf("parse the ClusterClass manifest: %w", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		obj.SetNamespace(namespace)
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// ClusterShape is the topology of a Cluster of the in-memory class.
type ClusterShape struct {
	Version      string
	ControlPlane int32
	// Workers is the replicas of the one MachineDeployment, md-0 (none when 0).
	Workers int32
}

// class is the ClusterClass of the shape: KCP allows in-place (maxSurge 0) only from 3
// control plane machines on.
func (s ClusterShape) class() string {
	if s.ControlPlane < 3 {
		return SmallControlPlaneClass
	}
	return InPlaceClass
}

// CreateCluster creates a Cluster of the in-memory class.
func CreateCluster(ctx context.Context, c client.Client, namespace, name string, shape ClusterShape, annotations map[string]string) (*clusterv1.Cluster, error) {
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: annotations},
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{
				Services:      clusterv1.NetworkRanges{CIDRBlocks: []string{"10.128.0.0/12"}},
				Pods:          clusterv1.NetworkRanges{CIDRBlocks: []string{"192.168.0.0/16"}},
				ServiceDomain: "cluster.local",
			},
			Topology: clusterv1.Topology{
				ClassRef:     clusterv1.ClusterClassRef{Name: shape.class()},
				Version:      shape.Version,
				ControlPlane: clusterv1.ControlPlaneTopology{Replicas: &shape.ControlPlane},
			},
		},
	}
	if shape.Workers > 0 {
		cluster.Spec.Topology.Workers.MachineDeployments = []clusterv1.MachineDeploymentTopology{{
			Class: "default-worker", Name: "md-0", Replicas: &shape.Workers,
		}}
	}
	if err := c.Create(ctx, cluster); err != nil {
		return nil, fmt.Errorf("create Cluster %s/%s: %w", namespace, name, err)
	}
	return cluster, nil
}

// Machines lists the Machines of a Cluster, sorted by name.
func Machines(ctx context.Context, c client.Client, namespace, cluster string) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster}); err != nil {
		return nil, fmt.Errorf("list the Machines of %s/%s: %w", namespace, cluster, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// IsControlPlane tells a control plane Machine.
func IsControlPlane(m *clusterv1.Machine) bool {
	_, ok := m.Labels[clusterv1.MachineControlPlaneLabel]
	return ok
}

// WaitProvisioned waits until the Cluster has want Machines, each with a Node whose
// kubelet reports version, and none deleting; it returns them.
func WaitProvisioned(ctx context.Context, c client.Client, namespace, cluster string, want int, version string, timeout time.Duration) ([]clusterv1.Machine, error) {
	deadline := time.Now().Add(timeout)
	for {
		machines, err := Machines(ctx, c, namespace, cluster)
		missing := ""
		switch {
		case err != nil:
			missing = err.Error()
		case len(machines) != want:
			missing = fmt.Sprintf("%d machines, want %d", len(machines), want)
		default:
			for i := range machines {
				m := &machines[i]
				if !m.DeletionTimestamp.IsZero() || !m.Status.NodeRef.IsDefined() || m.Status.NodeInfo == nil || m.Status.NodeInfo.KubeletVersion != version || m.Spec.Version != version {
					missing = fmt.Sprintf("machine %s not provisioned at %s yet (phase %q)", m.Name, version, m.Status.Phase)
					break
				}
			}
		}
		if missing == "" {
			return machines, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("cluster %s/%s not provisioned within %s: %s", namespace, cluster, timeout, missing)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// controlPlaneComponentConditions are the conditions KubeadmControlPlane sets on each of
// its Machines from the workload cluster's static pods and etcd members (Cluster API
// v1.14 util/conditions/sort.go).
var controlPlaneComponentConditions = []string{"APIServerPodHealthy", "ControllerManagerPodHealthy", "SchedulerPodHealthy", "EtcdPodHealthy", "EtcdMemberHealthy"}

// UnhealthyControlPlaneComponent names the first of a control plane Machine's component
// conditions that is not True; empty for a worker or a healthy control plane Machine. A
// cluster is provisioned once KubeadmControlPlane sees its new members healthy: a version
// bump before that makes it scale down the member that looks unhealthy (a replacement),
// not update it in place (a CI run saw the newest of three deleted 8 s after it was created).
func UnhealthyControlPlaneComponent(m *clusterv1.Machine) string {
	if !IsControlPlane(m) {
		return ""
	}
	for _, t := range controlPlaneComponentConditions {
		if !meta.IsStatusConditionTrue(m.Status.Conditions, t) {
			return t
		}
	}
	return ""
}

// RegisterExtension registers a capi-inplace manager's hook server (url, serving
// certificate signed by caPEM) with Cluster API through an ExtensionConfig, with
// settings, and waits until Cluster API's discovery has listed its handlers.
func RegisterExtension(ctx context.Context, c client.Client, name, url string, caPEM []byte, settings map[string]string) error {
	ext := &runtimev1.ExtensionConfig{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: runtimev1.ExtensionConfigSpec{
			ClientConfig:      runtimev1.ClientConfig{URL: url, CABundle: caPEM},
			NamespaceSelector: &metav1.LabelSelector{},
			Settings:          settings,
		},
	}
	if err := c.Create(ctx, ext); err != nil {
		return fmt.Errorf("create ExtensionConfig %s: %w", name, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got := &runtimev1.ExtensionConfig{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, got); err == nil && len(got.Status.Handlers) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ExtensionConfig %s: Cluster API did not discover the extension's handlers within a minute (status %+v)", name, got.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Workload returns a client of a Cluster's workload API server (CAPD's in-memory one),
// from the <cluster>-kubeconfig Secret Cluster API wrote.
func Workload(ctx context.Context, c client.Client, scheme *runtime.Scheme, namespace, cluster string) (client.Client, error) {
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster + "-kubeconfig"}, secret); err != nil {
		return nil, fmt.Errorf("read the kubeconfig of %s/%s: %w", namespace, cluster, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig of %s/%s: %w", namespace, cluster, err)
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// WorkloadNodes play the kubelets of in-memory workload Nodes for the external updater
// simulator (sim.ExternalUpdater.UseNodes): readiness while a node is upgraded, and the
// kubelet version it reports after, which Cluster API v1.14 compares with the Machine's
// spec.version (exactly) before it calls the machine up to date and moves the topology on
// (shared/facts/capi-inplace-updates.md facts 34 and 35).
// CAPD's in-memory API server has no status subresource, so the Node is written whole.
type WorkloadNodes struct {
	mgmt   client.Client
	scheme *runtime.Scheme

	mu      sync.Mutex
	clients map[string]client.Client
	// notReady is, per Cluster (namespace/name), the Nodes set NotReady now; maxDown the
	// most of each set of Nodes NotReady at once, over every change (see MaxNotReady).
	notReady map[string]map[string]bool
	history  map[string][]map[string]bool
}

// NewWorkloadNodes returns WorkloadNodes reaching each Cluster's workload API server
// through its kubeconfig Secret on the management cluster.
func NewWorkloadNodes(mgmt client.Client, scheme *runtime.Scheme) *WorkloadNodes {
	return &WorkloadNodes{mgmt: mgmt, scheme: scheme, clients: map[string]client.Client{},
		notReady: map[string]map[string]bool{}, history: map[string][]map[string]bool{}}
}

func (w *WorkloadNodes) client(ctx context.Context, nu *inplacev1.NodeUpdate) (client.Client, error) {
	key := nu.Namespace + "/" + nu.Spec.ClusterName
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.clients[key]; ok {
		return c, nil
	}
	c, err := Workload(ctx, w.mgmt, w.scheme, nu.Namespace, nu.Spec.ClusterName)
	if err != nil {
		return nil, err
	}
	w.clients[key] = c
	return c, nil
}

func (w *WorkloadNodes) update(ctx context.Context, nu *inplacev1.NodeUpdate, change func(*corev1.Node)) error {
	c, err := w.client(ctx, nu)
	if err != nil {
		return err
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, node); err != nil {
		return fmt.Errorf("read workload Node %s: %w", nu.Spec.NodeName, err)
	}
	change(node)
	if err := c.Update(ctx, node); err != nil {
		return fmt.Errorf("write workload Node %s: %w", nu.Spec.NodeName, err)
	}
	return nil
}

// SetReady sets the Node's Ready condition, and records it.
func (w *WorkloadNodes) SetReady(ctx context.Context, nu *inplacev1.NodeUpdate, ready bool) error {
	if !ready {
		// Recorded before the write: a Node is counted down from the moment its updater
		// takes it down, whether or not the write went through.
		w.record(nu, false)
	}
	defer func() {
		if ready {
			w.record(nu, true)
		}
	}()
	return w.update(ctx, nu, func(node *corev1.Node) {
		status, reason := corev1.ConditionTrue, "KubeletReady"
		if !ready {
			status, reason = corev1.ConditionFalse, "KubeletNotReady"
		}
		for i := range node.Status.Conditions {
			if node.Status.Conditions[i].Type == corev1.NodeReady {
				node.Status.Conditions[i].Status, node.Status.Conditions[i].Reason = status, reason
				node.Status.Conditions[i].LastTransitionTime = metav1.Now()
				return
			}
		}
		node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, LastTransitionTime: metav1.Now()})
	})
}

func (w *WorkloadNodes) record(nu *inplacev1.NodeUpdate, ready bool) {
	key := nu.Namespace + "/" + nu.Spec.ClusterName
	w.mu.Lock()
	defer w.mu.Unlock()
	set := map[string]bool{}
	for n := range w.notReady[key] {
		set[n] = true
	}
	if ready {
		delete(set, nu.Spec.NodeName)
	} else {
		set[nu.Spec.NodeName] = true
	}
	w.notReady[key] = set
	w.history[key] = append(w.history[key], set)
}

// MaxNotReady returns the most of the given Nodes of a Cluster that the updater had
// NotReady at once, over the whole run.
func (w *WorkloadNodes) MaxNotReady(namespace, cluster string, nodes ...string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	most := 0
	for _, set := range w.history[namespace+"/"+cluster] {
		n := 0
		for _, node := range nodes {
			if set[node] {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// Upgraded makes the Node's kubelet report the NodeUpdate's version.
func (w *WorkloadNodes) Upgraded(ctx context.Context, nu *inplacev1.NodeUpdate) error {
	return w.update(ctx, nu, func(node *corev1.Node) { node.Status.NodeInfo.KubeletVersion = nu.Spec.Version })
}

// KubeletVersions returns the kubelet version of every Node of a Cluster's workload API
// server, by Node name.
func KubeletVersions(ctx context.Context, c client.Client, scheme *runtime.Scheme, namespace, cluster string) (map[string]string, error) {
	wc, err := Workload(ctx, c, scheme, namespace, cluster)
	if err != nil {
		return nil, err
	}
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes); err != nil {
		return nil, fmt.Errorf("list the workload Nodes of %s/%s: %w", namespace, cluster, err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		out[n.Name] = n.Status.NodeInfo.KubeletVersion
	}
	return out, nil
}
