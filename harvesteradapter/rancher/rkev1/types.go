// Package rkev1 holds what the Harvester upgrade touches of Rancher's rke.cattle.io/v1:
// the RKEControlPlane fleet-local/local, which Rancher generates from the provisioning
// Cluster of the same name (rancher@v2.14.4
// pkg/controllers/provisioningv2/provisioningcluster/template.go rkeControlPlane) and
// whose planner rolls every node's machine plan. The upgrade only reads and writes its
// metadata: the Cluster API pause annotation, which stops the planner's machine
// reconciliation (rancher@v2.14.4 pkg/capr/planner/planner.go Process: "pausing the
// control plane only affects machine reconciliation"). Rancher's Go module is not
// served by the Go module proxy: these are our own types, for the CRD the test API
// servers install; the CRD keeps every field (x-kubernetes-preserve-unknown-fields).
//
// +kubebuilder:object:generate=true
// +groupName=rke.cattle.io
// +versionName=v1
package rkev1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Rancher's rke.cattle.io API group and version.
var GroupVersion = schema.GroupVersion{Group: "rke.cattle.io", Version: "v1"}

// RKEControlPlaneKind is the kind of the control plane Rancher's planner reconciles.
const RKEControlPlaneKind = "RKEControlPlane"

// RKEControlPlaneSpec is kept whole; the upgrade reads none of it.
// +kubebuilder:pruning:PreserveUnknownFields
type RKEControlPlaneSpec struct {
	// kubernetesVersion is the RKE2 version Rancher's planner renders into every plan,
	// copied from the provisioning Cluster.
	// +optional
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
}

// RKEControlPlaneStatus is kept whole.
// +kubebuilder:pruning:PreserveUnknownFields
type RKEControlPlaneStatus struct {
	// observedGeneration is the generation the planner last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// RKEControlPlane is Rancher's RKE2 control plane of a provisioned cluster.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
type RKEControlPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is Rancher's.
	// +optional
	Spec RKEControlPlaneSpec `json:"spec,omitempty"`
	// status is Rancher's.
	// +optional
	Status RKEControlPlaneStatus `json:"status,omitempty"`
}

// RKEControlPlaneList is a list of RKEControlPlanes.
// +kubebuilder:object:root=true
type RKEControlPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RKEControlPlane `json:"items"`
}
