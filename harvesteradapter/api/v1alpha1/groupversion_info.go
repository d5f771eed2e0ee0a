// Package v1alpha1 is the configuration API of capi-inplace's Harvester updater:
// HarvesterUpgrader, in group harvester.inplace.cluster.x-k8s.io. An UpgradeTask or
// NodeUpdate names one through its updaterRef (HarvesterUpgrader/<name>, in the Cluster's
// namespace).
//
// +kubebuilder:object:generate=true
// +groupName=harvester.inplace.cluster.x-k8s.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the Harvester updater's API.
	GroupVersion = schema.GroupVersion{Group: "harvester.inplace.cluster.x-k8s.io", Version: "v1alpha1"}

	// schemeBuilder registers the Harvester updater's types with a scheme.
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the Harvester updater's types to a scheme.
	AddToScheme = schemeBuilder.AddToScheme

	// objectTypes are the kinds of this group version; each kind's file adds its own.
	objectTypes []runtime.Object
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, objectTypes...)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
