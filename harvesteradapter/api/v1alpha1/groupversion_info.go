// Package v1alpha1 is the configuration API of capi-inplace's Harvester updater:
// HarvesterUpgrader, in group harvester.inplace.cluster.x-k8s.io. An UpgradeTask or
// NodeUpdate names one through its updaterRef (HarvesterUpgrader/<name>, in the Cluster's
// namespace).
//
// +kubebuilder:object:generate=true
// +groupName=harvester.inplace.cluster.x-k8s.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the Harvester updater's API.
	GroupVersion = schema.GroupVersion{Group: "harvester.inplace.cluster.x-k8s.io", Version: "v1alpha1"}

	// SchemeBuilder registers the Harvester updater's types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the Harvester updater's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
