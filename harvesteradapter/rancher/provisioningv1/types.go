// Package provisioningv1 holds the one kind of Rancher's provisioning.cattle.io/v1 that
// the Harvester cluster upgrade touches: the provisioning Cluster fleet-local/local that
// stands for the Harvester cluster itself (shared/facts/harvester-node-upgrade.md,
// facts 41.8, 41.9 and 52). Rancher's Go module (github.com/rancher/rancher/pkg/apis) is
// not available through the Go module proxy, so these are our own types with the JSON
// names of rancher/rancher@59bd052e44553e77e5c570b84ed4a24dfa7b44ab
// pkg/apis/provisioning.cattle.io/v1/cluster_types.go (and, for rkeConfig,
// pkg/apis/rke.cattle.io/v1/cluster_configuration_types.go). They hold only what the
// upgrade reads or writes; the CRD keeps every other field (x-kubernetes-preserve-
// unknown-fields), and the upgrade only ever sends merge patches of the fields it
// changes, so nothing Rancher keeps there is lost.
//
// +kubebuilder:object:generate=true
// +groupName=provisioning.cattle.io
// +versionName=v1
package provisioningv1

import (
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Rancher's provisioning API group and version.
var GroupVersion = schema.GroupVersion{Group: "provisioning.cattle.io", Version: "v1"}

// AddToScheme registers Cluster and ClusterList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Cluster{}, &ClusterList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// ClusterSpec is the part of Rancher's ClusterSpec the upgrade uses.
// +kubebuilder:pruning:PreserveUnknownFields
type ClusterSpec struct {
	// kubernetesVersion is the RKE2 version Rancher provisions the cluster's nodes with.
	// +optional
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
	// rkeConfig is the RKE2 configuration of the cluster.
	// +optional
	RKEConfig *RKEConfig `json:"rkeConfig,omitempty"`
}

// RKEConfig is the part of Rancher's RKEConfig (rke.cattle.io/v1 ClusterConfiguration,
// inlined) the Harvester upgrade drives (fact 52): the provision generation and the
// upgrade strategy with its drain hooks.
// +kubebuilder:pruning:PreserveUnknownFields
type RKEConfig struct {
	// provisionGeneration makes Rancher's planner reconcile the nodes again when raised.
	// +optional
	ProvisionGeneration int `json:"provisionGeneration,omitempty"`
	// registries is the containerd registry configuration Rancher renders into every
	// node's plan (rke.cattle.io/v1 Registry: mirrors, configs). Harvester writes it from
	// its containerd-registry setting (shared/facts/harvester-release-steps.md, fact 24);
	// a change is a plan change on every node (fact 58). Kept as raw JSON: nothing here
	// reads its fields.
	// +optional
	Registries *apiextensionsv1.JSON `json:"registries,omitempty"`
	// upgradeStrategy is how many nodes Rancher upgrades at once and how it drains them.
	// +optional
	UpgradeStrategy ClusterUpgradeStrategy `json:"upgradeStrategy,omitempty"`
}

// ClusterUpgradeStrategy is Rancher's rke.cattle.io/v1 ClusterUpgradeStrategy.
type ClusterUpgradeStrategy struct {
	// controlPlaneConcurrency is how many control plane nodes are upgraded at once.
	// +optional
	ControlPlaneConcurrency string `json:"controlPlaneConcurrency,omitempty"`
	// controlPlaneDrainOptions is how control plane nodes are drained.
	// +optional
	ControlPlaneDrainOptions DrainOptions `json:"controlPlaneDrainOptions,omitempty"`
	// workerConcurrency is how many worker nodes are upgraded at once.
	// +optional
	WorkerConcurrency string `json:"workerConcurrency,omitempty"`
	// workerDrainOptions is how worker nodes are drained.
	// +optional
	WorkerDrainOptions DrainOptions `json:"workerDrainOptions,omitempty"`
}

// DrainOptions is the part of Rancher's rke.cattle.io/v1 DrainOptions that Harvester sets:
// whether to drain and the hooks Rancher waits on around the drain (fact 52).
// +kubebuilder:pruning:PreserveUnknownFields
type DrainOptions struct {
	// enabled drains the node before upgrading it.
	// +optional
	Enabled bool `json:"enabled"`
	// preDrainHooks are annotations Rancher waits for before draining.
	// +optional
	PreDrainHooks []DrainHook `json:"preDrainHooks,omitempty"`
	// postDrainHooks are annotations Rancher waits for after draining and upgrading.
	// +optional
	PostDrainHooks []DrainHook `json:"postDrainHooks,omitempty"`
}

// DrainHook is an annotation a drain waits on.
type DrainHook struct {
	// annotation is the annotation's key.
	// +optional
	Annotation string `json:"annotation,omitempty"`
}

// ClusterStatus is the part of Rancher's ClusterStatus the upgrade reads or writes.
// +kubebuilder:pruning:PreserveUnknownFields
type ClusterStatus struct {
	// ready says Rancher considers the cluster provisioned and ready.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// clusterName is the management cluster (clusters.management.cattle.io) of this one.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`
	// fleetWorkspaceName is the Fleet workspace of the cluster (fact 41.9).
	// +optional
	FleetWorkspaceName string `json:"fleetWorkspaceName,omitempty"`
	// observedGeneration is the generation Rancher last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration"`
	// conditions are Rancher's conditions of the cluster, such as Provisioned and Ready.
	// +optional
	Conditions []genericcondition.GenericCondition `json:"conditions,omitempty"`
}

// Cluster is Rancher's provisioning Cluster; on Harvester, fleet-local/local is the
// Harvester cluster itself.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=clusters,scope=Namespaced,categories=provisioning
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=".spec.kubernetesVersion"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=".status.ready"
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Spec ClusterSpec `json:"spec,omitempty"`
	// +optional
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterList is a list of Clusters.
// +kubebuilder:object:root=true
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Cluster `json:"items"`
}
