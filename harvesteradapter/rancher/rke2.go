package rancher

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
)

// This file is RKE2 through its owner (shared/facts/harvester-release-steps.md section
// E): on a Harvester cluster Rancher's provisioning Cluster fleet-local/local provisions
// RKE2 on every node, so the Kubernetes upgrade goes through it, as Harvester's own
// upgrade controller and upgrade-toolkit do (node sheet fact 11.4; release sheet facts
// 58-60 and 76): the version declared there, an upgrade strategy whose drain hooks are
// ours, and each node's turn answered at Rancher's pre-drain and post-drain requests on
// the node's machine-plan Secret (node sheet facts 38-39).

// Names Rancher v2prov uses on machine-plan Secrets and Nodes (node sheet fact 38;
// rancher@v2.14.4 pkg/capr/common.go).
const (
	// MachinePlanSecretType is the type of a machine-plan Secret, in FleetLocal.
	MachinePlanSecretType corev1.SecretType = "rke.cattle.io/machine-plan"
	// MachineNameLabel names, on a machine-plan Secret, its CAPI Machine.
	MachineNameLabel = "rke.cattle.io/machine-name"
	// NodeMachineAnnotation names, on a Node, its CAPI Machine.
	NodeMachineAnnotation = "cluster.x-k8s.io/machine"
	// EtcdRoleLabel, ControlPlaneRoleLabel and InitNodeLabel are a machine's roles on its
	// plan Secret; a machine with neither role is a worker.
	EtcdRoleLabel         = "rke.cattle.io/etcd-role"
	ControlPlaneRoleLabel = "rke.cattle.io/control-plane-role"
	InitNodeLabel         = "rke.cattle.io/init-node"
	// PreDrainRequest and PostDrainRequest are Rancher's hook requests on a plan Secret:
	// set to the drain options' JSON when the planner waits for the hooks (fact 39).
	PreDrainRequest  = "rke.cattle.io/pre-drain"
	PostDrainRequest = "rke.cattle.io/post-drain"
	// FailureCountKey is the plan Secret's data key where rancher-system-agent counts the
	// failed applications of the current plan (rancher@v2.14.4 pkg/capr/planner/store.go).
	FailureCountKey = "failure-count"
)

// Our drain hooks: the annotations Rancher waits for on a node's plan Secret, each
// answered by setting it to the request's value (fact 39). Harvester's own are
// harvesterhci.io/pre-hook and post-hook; ours are distinct so that a Harvester Upgrade
// and capi-inplace never answer each other's requests.
const (
	PreDrainHook  = "harvester.inplace.cluster.x-k8s.io/pre-drain"
	PostDrainHook = "harvester.inplace.cluster.x-k8s.io/post-drain"
)

// FieldUpgradeStrategy is the field of fleet-local/local the upgrade sets for the roll
// (in Change records): spec.rkeConfig.upgradeStrategy.
const FieldUpgradeStrategy = "spec.rkeConfig.upgradeStrategy"

// LocalClusterKey is fleet-local/local.
var LocalClusterKey = client.ObjectKey{Namespace: FleetLocal, Name: LocalCluster}

// localClusterGVK is the provisioning Cluster's kind, for unstructured reads and writes
// that keep every field Rancher has there (our provisioningv1 types hold only a part).
var localClusterGVK = schema.GroupVersionKind{Group: "provisioning.cattle.io", Version: "v1", Kind: "Cluster"}

// Owner is what Rancher keeps of one node of the cluster it provisions: the provisioning
// Cluster and the node's machine-plan Secret.
type Owner struct {
	Cluster *provisioningv1.Cluster
	Secret  *corev1.Secret
}

// ProvisionedNode says whether Rancher provisions the node's RKE2: fleet-local/local
// exists with an rkeConfig and a declared kubernetesVersion, and the node has a
// machine-plan Secret there (its cluster.x-k8s.io/machine annotation names a machine
// with one). Nil when something else owns RKE2 on the node (a SUC Plan upgrades it then).
func ProvisionedNode(ctx context.Context, c client.Client, node *corev1.Node) (*Owner, error) {
	cl, err := ProvisioningCluster(ctx, c)
	if err != nil || cl == nil {
		return nil, err
	}
	secret, err := MachinePlan(ctx, c, node)
	if err != nil || secret == nil {
		return nil, err
	}
	return &Owner{Cluster: cl, Secret: secret}, nil
}

// ProvisioningCluster is fleet-local/local when Rancher provisions RKE2 with it (an
// rkeConfig and a kubernetesVersion, fact 59), else nil: not served, missing, or
// imported.
func ProvisioningCluster(ctx context.Context, c client.Client) (*provisioningv1.Cluster, error) {
	cl := &provisioningv1.Cluster{}
	if err := c.Get(ctx, LocalClusterKey, cl); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read provisioning Cluster %s: %w", LocalClusterKey, err)
	}
	if cl.Spec.RKEConfig == nil || cl.Spec.KubernetesVersion == "" {
		return nil, nil
	}
	return cl, nil
}

// MachinePlan is the node's machine-plan Secret in FleetLocal, nil when it has none.
func MachinePlan(ctx context.Context, c client.Client, node *corev1.Node) (*corev1.Secret, error) {
	machine := node.Annotations[NodeMachineAnnotation]
	if machine == "" {
		return nil, nil
	}
	list := &corev1.SecretList{}
	if err := c.List(ctx, list, client.InNamespace(FleetLocal), client.MatchingLabels{MachineNameLabel: machine}); err != nil {
		return nil, fmt.Errorf("list the machine-plan Secrets of machine %s: %w", machine, err)
	}
	for i := range list.Items {
		if list.Items[i].Type == MachinePlanSecretType {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

// Asked is the value of Rancher's hook request (PreDrainRequest or PostDrainRequest) on
// a plan Secret, "" when it asks nothing.
func Asked(secret *corev1.Secret, request string) string { return secret.Annotations[request] }

// Answered says whether our hook answered Rancher's current request.
func Answered(secret *corev1.Secret, request, hook string) bool {
	v := secret.Annotations[request]
	return v != "" && secret.Annotations[hook] == v
}

// Answer answers Rancher's request on the node's plan Secret with our hook (fact 39):
// the hook's annotation set to the request's value. Nothing when Rancher asks nothing.
func Answer(ctx context.Context, c client.Client, secret *corev1.Secret, request, hook string) error {
	value := secret.Annotations[request]
	if value == "" || secret.Annotations[hook] == value {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations":     map[string]string{hook: value},
		"resourceVersion": secret.ResourceVersion,
	}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, secret, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		return fmt.Errorf("answer Rancher's %s request on machine-plan Secret %s/%s: %w", request, secret.Namespace, secret.Name, err)
	}
	return nil
}

// Strategy is the upgrade strategy the upgrade gives fleet-local/local for the roll:
// concurrency as given for control plane and workers, Rancher's drain off (the node's
// own steps evacuate and drain it, with the HarvesterUpgrader's drain options, before
// the pre-drain hook is answered), and our pre- and post-drain hooks on both, which make
// Rancher wait for each node's NodeUpdate (fact 60: with hooks set, the hooks run even
// without a drain).
func Strategy(concurrency int) map[string]any {
	drain := map[string]any{
		"enabled":        false,
		"preDrainHooks":  []any{map[string]any{"annotation": PreDrainHook}},
		"postDrainHooks": []any{map[string]any{"annotation": PostDrainHook}},
	}
	c := strconv.Itoa(max(concurrency, 1))
	return map[string]any{
		"controlPlaneConcurrency":  c,
		"controlPlaneDrainOptions": drain,
		"workerConcurrency":        c,
		"workerDrainOptions":       drain,
	}
}

// HasOurHooks says whether fleet-local/local's strategy waits for our hooks.
func HasOurHooks(cl *provisioningv1.Cluster) bool {
	if cl == nil || cl.Spec.RKEConfig == nil {
		return false
	}
	us := cl.Spec.RKEConfig.UpgradeStrategy
	for _, hooks := range [][]provisioningv1.DrainHook{us.ControlPlaneDrainOptions.PreDrainHooks, us.WorkerDrainOptions.PreDrainHooks} {
		if !hasHook(hooks, PreDrainHook) {
			return false
		}
	}
	return true
}

func hasHook(hooks []provisioningv1.DrainHook, annotation string) bool {
	for _, h := range hooks {
		if h.Annotation == annotation {
			return true
		}
	}
	return false
}

// ReadStrategy is fleet-local/local's spec.rkeConfig.upgradeStrategy as JSON, "null"
// when unset: what Restore gives back.
func ReadStrategy(ctx context.Context, c client.Client) (json.RawMessage, error) {
	u, err := getLocal(ctx, c)
	if err != nil {
		return nil, err
	}
	v, found, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "rkeConfig", "upgradeStrategy")
	if err != nil || !found {
		return json.RawMessage("null"), err
	}
	return json.Marshal(v)
}

// SetRoll declares kubernetesVersion on fleet-local/local and sets its upgrade strategy
// to strategy (null removes it), every other field kept: an update of the whole object
// at the version read, so that a strategy replaces the one before rather than merging
// into it.
func SetRoll(ctx context.Context, c client.Client, kubernetesVersion string, strategy json.RawMessage) error {
	u, err := getLocal(ctx, c)
	if err != nil {
		return err
	}
	if kubernetesVersion != "" {
		if err := unstructured.SetNestedField(u.Object, kubernetesVersion, "spec", "kubernetesVersion"); err != nil {
			return err
		}
	}
	var v any
	if err := json.Unmarshal(strategy, &v); err != nil {
		return fmt.Errorf("upgrade strategy %s: %w", strategy, err)
	}
	if v == nil {
		unstructured.RemoveNestedField(u.Object, "spec", "rkeConfig", "upgradeStrategy")
	} else if err := unstructured.SetNestedField(u.Object, v, "spec", "rkeConfig", "upgradeStrategy"); err != nil {
		return err
	}
	if err := c.Update(ctx, u); err != nil {
		return fmt.Errorf("set the kubernetesVersion and upgrade strategy of provisioning Cluster %s: %w", LocalClusterKey, err)
	}
	return nil
}

func getLocal(ctx context.Context, c client.Client) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(localClusterGVK)
	if err := c.Get(ctx, LocalClusterKey, u); err != nil {
		return nil, fmt.Errorf("read provisioning Cluster %s: %w", LocalClusterKey, err)
	}
	return u, nil
}

// machine is one machine of the provisioned cluster, for RolloutOrder.
type machine struct {
	node   string
	name   string
	tier   int
	init   bool
	behind bool
}

// RolloutOrder is the order Rancher's planner takes the nodes whose kubelet does not run
// kubernetesVersion in (fact 60; rancher@v2.14.4 pkg/capr/planner/planner.go
// fullReconcile): the init node, then the other etcd nodes, then control-plane-only
// nodes, then workers, each tier by machine name. nodes maps node names to Nodes.
func RolloutOrder(ctx context.Context, c client.Client, nodes []corev1.Node, kubernetesVersion string) ([]string, error) {
	byMachine, err := planSecrets(ctx, c)
	if err != nil {
		return nil, err
	}
	var ms []machine
	for i := range nodes {
		n := &nodes[i]
		s := byMachine[n.Annotations[NodeMachineAnnotation]]
		if s == nil {
			continue
		}
		m := machine{node: n.Name, name: s.Labels[MachineNameLabel], tier: 2, init: s.Labels[InitNodeLabel] == "true",
			behind: !SameRelease(kubernetesVersion, n.Status.NodeInfo.KubeletVersion)}
		switch {
		case s.Labels[EtcdRoleLabel] == "true":
			m.tier = 0
		case s.Labels[ControlPlaneRoleLabel] == "true":
			m.tier = 1
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool {
		a, b := ms[i], ms[j]
		if a.tier != b.tier {
			return a.tier < b.tier
		}
		if a.init != b.init {
			return a.init
		}
		return a.name < b.name
	})
	var out []string
	for _, m := range ms {
		if m.behind {
			out = append(out, m.node)
		}
	}
	return out, nil
}

// SameRelease is Rancher's kubeletVersionUpToDate (fact 61): major, minor and patch
// equal; a version that does not parse is not.
func SameRelease(declared, kubelet string) bool {
	d, err1 := version.ParseGeneric(declared)
	k, err2 := version.ParseGeneric(kubelet)
	if err1 != nil || err2 != nil {
		return false
	}
	return d.Major() == k.Major() && d.Minor() == k.Minor() && d.Patch() == k.Patch()
}

// Waiting names the nodes whose plan Secret carries a pre-drain request our hook has not
// answered, or a pre-drain answered and no post-drain answered yet: the nodes Rancher
// rolls now.
func Waiting(ctx context.Context, c client.Client, nodes []corev1.Node) ([]string, error) {
	byMachine, err := planSecrets(ctx, c)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := range nodes {
		s := byMachine[nodes[i].Annotations[NodeMachineAnnotation]]
		if s != nil && Asked(s, PreDrainRequest) != "" && !Answered(s, PostDrainRequest, PostDrainHook) {
			out = append(out, nodes[i].Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// PlanSecrets maps machine names (a Node's NodeMachineAnnotation) to their machine-plan
// Secrets in FleetLocal.
func PlanSecrets(ctx context.Context, c client.Client) (map[string]*corev1.Secret, error) {
	return planSecrets(ctx, c)
}

// planSecrets maps machine names to their machine-plan Secrets in FleetLocal.
func planSecrets(ctx context.Context, c client.Client) (map[string]*corev1.Secret, error) {
	list := &corev1.SecretList{}
	if err := c.List(ctx, list, client.InNamespace(FleetLocal)); err != nil {
		return nil, fmt.Errorf("list the machine-plan Secrets in %s: %w", FleetLocal, err)
	}
	byMachine := map[string]*corev1.Secret{}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Type == MachinePlanSecretType && s.Labels[MachineNameLabel] != "" {
			byMachine[s.Labels[MachineNameLabel]] = s
		}
	}
	return byMachine, nil
}

// AnyProvisioned says whether Rancher provisions any of nodes: one of them has a
// machine-plan Secret.
func AnyProvisioned(ctx context.Context, c client.Client, nodes []corev1.Node) (bool, error) {
	byMachine, err := planSecrets(ctx, c)
	if err != nil {
		return false, err
	}
	for i := range nodes {
		if byMachine[nodes[i].Annotations[NodeMachineAnnotation]] != nil {
			return true, nil
		}
	}
	return false, nil
}

// The plan Secret's data keys where Rancher delivers a node's plan and
// rancher-system-agent writes the plan it last applied successfully: the plan is in
// sync when the two are equal (rancher@v2.14.4 pkg/capr/planner/store.go UpdatePlan,
// SecretToNode).
const (
	PlanDataKey        = "plan"
	AppliedPlanDataKey = "appliedPlan"
)

// installerRepository is the repository of Rancher's RKE2 installer image; its tag is the
// RKE2 version with "+" made "-" (fact 58; planner.go getInstallerImage).
const installerRepository = "system-agent-installer-rke2"

// DeliveredPlan is what a node's plan Secret says of the RKE2 that Rancher's current
// plan installs there.
type DeliveredPlan struct {
	// Version is the RKE2 version the plan's install instruction installs, "" when the
	// Secret holds no plan or none that installs RKE2.
	Version string
	// Applied says whether rancher-system-agent applied that plan: RKE2 Version is on the
	// node's disk. It runs only if the install restarted RKE2, or RKE2 started since (the
	// restart guard stops the install before the restart, fact 12).
	Applied bool
}

// ReadDeliveredPlan reads the node's plan Secret.
func ReadDeliveredPlan(secret *corev1.Secret) DeliveredPlan {
	data := secret.Data[PlanDataKey]
	if len(data) == 0 {
		return DeliveredPlan{}
	}
	var plan struct {
		Instructions []struct {
			Image string `json:"image"`
		} `json:"instructions"`
	}
	if err := json.Unmarshal(data, &plan); err != nil {
		return DeliveredPlan{}
	}
	out := DeliveredPlan{Applied: bytes.Equal(data, secret.Data[AppliedPlanDataKey])}
	for _, in := range plan.Instructions {
		repo, tag, ok := strings.Cut(in.Image[strings.LastIndex(in.Image, "/")+1:], ":")
		if ok && repo == installerRepository {
			out.Version = installerTagVersion(tag)
		}
	}
	return out
}

// installerTagVersion is the RKE2 version of an installer image tag: v1.35.6-rke2r1 is
// v1.35.6+rke2r1.
func installerTagVersion(tag string) string {
	if i := strings.LastIndex(tag, "-rke2"); i > 0 {
		return tag[:i] + "+" + tag[i+1:]
	}
	return tag
}
