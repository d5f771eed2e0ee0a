// Package v1alpha1 holds the API of capi-inplace: UpgradeTask, one in-place upgrade of
// the machines of a control plane or MachineDeployment, and NodeUpdate, the upgrade of
// one node. It also names, in one place, every annotation, label, condition type and
// reason the project reads or writes.
//
// +kubebuilder:object:generate=true
// +groupName=inplace.cluster.x-k8s.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the capi-inplace API.
	GroupVersion = schema.GroupVersion{Group: "inplace.cluster.x-k8s.io", Version: "v1alpha1"}

	// SchemeBuilder registers the capi-inplace types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the capi-inplace types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
