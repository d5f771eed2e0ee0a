// Package catalogv1 holds the one kind of Rancher's catalog.cattle.io/v1 that the
// Harvester cluster upgrade touches: ClusterRepo, a Helm repository Rancher indexes; on
// Harvester, harvester-charts is served by the harvester-cluster-repo Deployment and is
// where the harvester and harvester-crd ManagedCharts come from (shared/facts/
// harvester-node-upgrade.md, fact 41.11). Rancher's Go module is not available through
// the Go module proxy, so these are our own types with the JSON names of
// rancher/rancher@59bd052e44553e77e5c570b84ed4a24dfa7b44ab
// pkg/apis/catalog.cattle.io/v1/types.go (ClusterRepo, RepoSpec, RepoStatus). Rancher
// installs it cluster-scoped with the status subresource (pkg/crds/dashboard/crds.go).
// The types hold only what the upgrade reads or writes; the CRD keeps every other field.
//
// +kubebuilder:object:generate=true
// +groupName=catalog.cattle.io
// +versionName=v1
package catalogv1

import (
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Rancher's catalog API group and version.
var GroupVersion = schema.GroupVersion{Group: "catalog.cattle.io", Version: "v1"}

// AddToScheme registers ClusterRepo and ClusterRepoList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ClusterRepo{}, &ClusterRepoList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// RepoSpec is the part of Rancher's RepoSpec the upgrade uses.
// +kubebuilder:pruning:PreserveUnknownFields
type RepoSpec struct {
	// url is the HTTP or OCI URL of the Helm repository.
	// +optional
	URL string `json:"url,omitempty"`
	// gitRepo is a git repository holding the Helm repository.
	// +optional
	GitRepo string `json:"gitRepo,omitempty"`
	// gitBranch is the branch of gitRepo.
	// +optional
	GitBranch string `json:"gitBranch,omitempty"`
	// forceUpdate makes Rancher download the repository's index again when set to a
	// time after the last download.
	// +optional
	ForceUpdate *metav1.Time `json:"forceUpdate,omitempty"`
}

// RepoStatus is the part of Rancher's RepoStatus the upgrade reads.
// +kubebuilder:pruning:PreserveUnknownFields
type RepoStatus struct {
	// observedGeneration is the generation Rancher last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration"`
	// downloadTime is when the index was last downloaded.
	// +optional
	DownloadTime metav1.Time `json:"downloadTime,omitempty"`
	// url is the URL the index was fetched from.
	// +optional
	URL string `json:"url,omitempty"`
	// commit is, for a git repository, the commit the index was built from.
	// +optional
	Commit string `json:"commit,omitempty"`
	// conditions are Rancher's conditions of the repository, such as Downloaded.
	// +optional
	Conditions []genericcondition.GenericCondition `json:"conditions,omitempty"`
}

// ClusterRepo is a Helm repository that Rancher indexes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=clusterrepos,scope=Cluster,categories=catalog
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=".spec.url"
type ClusterRepo struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Spec RepoSpec `json:"spec"`
	// +optional
	Status RepoStatus `json:"status,omitempty"`
}

// ClusterRepoList is a list of ClusterRepos.
// +kubebuilder:object:root=true
type ClusterRepoList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterRepo `json:"items"`
}
