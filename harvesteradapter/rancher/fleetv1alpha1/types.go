// Package fleetv1alpha1 holds the kinds of Fleet's fleet.cattle.io/v1alpha1 that the
// Harvester cluster upgrade reads: Bundle, what Fleet deploys to its clusters (on
// Harvester, among others, the bundles of Rancher's ManagedCharts in fleet-local), and
// Cluster, Fleet's view of a cluster and of the fleet-agent it runs there. The release's
// script waits a bounded time for every Bundle to be Ready at its end
// (shared/facts/harvester-release-steps.md fact 31, lib.sh wait_for_fleet_bundles), and
// after Rancher's upgrade redeploys the local cluster's agent and waits for it (fact
// 16.15 and 16.16). Fleet's Go module is not needed for a few fields, so these are our
// own types with the JSON names of rancher/fleet pkg/apis/fleet.cattle.io/v1alpha1
// (bundle_types.go: Bundle, BundleStatus.Conditions; cluster_types.go: Cluster,
// ClusterSpec.RedeployAgentGeneration, ClusterStatus.AgentDeployedGeneration, APIServerURL,
// APIServerCAHash, AgentConfigChanged, Conditions; wrangler's GenericCondition), holding only what the upgrade reads and
// writes; the CRDs keep every other field.
//
// +kubebuilder:object:generate=true
// +groupName=fleet.cattle.io
// +versionName=v1alpha1
package fleetv1alpha1

import (
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Fleet's API group and version.
var GroupVersion = schema.GroupVersion{Group: "fleet.cattle.io", Version: "v1alpha1"}

// AddToScheme registers Bundle, Cluster and their lists.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Bundle{}, &BundleList{}, &Cluster{}, &ClusterList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// BundleSpec is what Fleet deploys; the upgrade reads none of it.
// +kubebuilder:pruning:PreserveUnknownFields
type BundleSpec struct{}

// BundleStatus is the part of Fleet's BundleStatus the upgrade reads.
// +kubebuilder:pruning:PreserveUnknownFields
type BundleStatus struct {
	// conditions of the bundle; Ready says whether it is deployed and ready everywhere.
	// +optional
	Conditions []genericcondition.GenericCondition `json:"conditions,omitempty"`
}

// Bundle is Fleet's Bundle.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status
type Bundle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec BundleSpec `json:"spec,omitempty"`
	// +optional
	Status BundleStatus `json:"status,omitempty"`
}

// BundleList is a list of Bundles.
//
// +kubebuilder:object:root=true
type BundleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Bundle `json:"items"`
}

// ClusterSpec is the part of Fleet's ClusterSpec the upgrade reads and writes.
// +kubebuilder:pruning:PreserveUnknownFields
type ClusterSpec struct {
	// redeployAgentGeneration, when it differs from status.agentDeployedGeneration, makes
	// fleet-controller deploy the cluster's agent again (fleet
	// internal/cmd/controller/agentmanagement/controllers/cluster/import.go agentDeployed).
	// +optional
	RedeployAgentGeneration int64 `json:"redeployAgentGeneration,omitempty"`
}

// ClusterStatus is the part of Fleet's ClusterStatus the upgrade reads.
// +kubebuilder:pruning:PreserveUnknownFields
type ClusterStatus struct {
	// agentDeployedGeneration is the spec.redeployAgentGeneration the deployed agent was
	// deployed for; fleet-controller sets it once the agent's objects are applied.
	// +optional
	// +nullable
	AgentDeployedGeneration *int64 `json:"agentDeployedGeneration,omitempty"`
	// apiServerURL is the API server address the deployed agent was given.
	// +optional
	APIServerURL string `json:"apiServerURL,omitempty"`
	// apiServerCAHash is a hash of the API server CA the deployed agent was given.
	// +optional
	APIServerCAHash string `json:"apiServerCAHash,omitempty"`
	// agentConfigChanged is set by fleet-controller when its configuration's API server
	// no longer matches the deployed agent's, and cleared when it deploys the agent again.
	// +optional
	AgentConfigChanged bool `json:"agentConfigChanged,omitempty"`
	// conditions of the cluster: Imported (the agent deployed by the import handler),
	// Ready.
	// +optional
	Conditions []genericcondition.GenericCondition `json:"conditions,omitempty"`
}

// Cluster is Fleet's Cluster (on Harvester, fleet-local/local is the cluster itself).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,path=clusters
// +kubebuilder:subresource:status
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec ClusterSpec `json:"spec,omitempty"`
	// +optional
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterList is a list of Clusters.
//
// +kubebuilder:object:root=true
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Cluster `json:"items"`
}
