// Package fleetv1alpha1 holds the one kind of Fleet's fleet.cattle.io/v1alpha1 that the
// Harvester cluster upgrade reads: Bundle, what Fleet deploys to its clusters (on
// Harvester, among others, the bundles of Rancher's ManagedCharts in fleet-local). The
// release's script waits a bounded time for every Bundle to be Ready at its end
// (shared/facts/harvester-release-steps.md fact 31, lib.sh wait_for_fleet_bundles).
// Fleet's Go module is not needed for one status field, so this is our own type with the
// JSON names of rancher/fleet pkg/apis/fleet.cattle.io/v1alpha1 bundle_types.go (Bundle,
// BundleStatus.Conditions, wrangler's GenericCondition), holding only what the upgrade
// reads; the CRD keeps every other field.
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

// AddToScheme registers Bundle and BundleList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Bundle{}, &BundleList{})
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
