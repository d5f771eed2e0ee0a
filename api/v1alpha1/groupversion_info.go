// Package v1alpha1 holds the API of capi-inplace: UpgradeTask, one in-place upgrade of
// the machines of a control plane or MachineDeployment, and NodeUpdate, the upgrade of
// one node. It also names, in one place, every annotation, label, condition type and
// reason the project reads or writes.
//
// +kubebuilder:object:generate=true
// +groupName=inplace.cluster.x-k8s.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the capi-inplace API.
	GroupVersion = schema.GroupVersion{Group: "inplace.cluster.x-k8s.io", Version: "v1alpha1"}

	// schemeBuilder registers the capi-inplace types with a scheme.
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the capi-inplace types to a scheme.
	AddToScheme = schemeBuilder.AddToScheme

	// objectTypes are the kinds of this group version; each kind's file adds its own.
	objectTypes []runtime.Object
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, objectTypes...)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
