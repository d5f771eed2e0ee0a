// Package toolkit holds upgrade-toolkit's UpgradePlan (management.harvesterhci.io/v1beta1,
// "Harvester Upgrade V2"), which no Go module reachable through the module proxy
// provides: capi-inplace reads it only to hold its own nodes while one is in progress
// and keeps new ones out while its own UpgradePlan runs. The fields are the few a test
// needs, with the JSON names, scope, short names and status subresource of the
// toolkit's type (harvester/upgrade-toolkit api/v1beta1/upgradeplan_types.go at
// 0ce8800; shared/facts/harvester-node-upgrade.md fact 44).
//
// +kubebuilder:object:generate=true
// +groupName=management.harvesterhci.io
// +versionName=v1beta1
package toolkit

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is upgrade-toolkit's API group and version.
var GroupVersion = schema.GroupVersion{Group: "management.harvesterhci.io", Version: "v1beta1"}

// AddToScheme registers UpgradePlan under management.harvesterhci.io/v1beta1.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &UpgradePlan{}, &UpgradePlanList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// The final phases of an UpgradePlan; any other phase, the empty one included, is in
// progress (Harvester v1.9's node-down controller, isOnUpgradeV2;
// shared/facts/harvester-release-steps.md fact 38).
const (
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
)

// UpgradePlan is upgrade-toolkit's upgrade of the cluster to a Harvester release.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=up;ups
// +kubebuilder:printcolumn:name="VERSION",type="string",JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="CURRENTPHASE",type="string",JSONPath=`.status.currentPhase`
type UpgradePlan struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec UpgradePlanSpec `json:"spec"`
	// +optional
	Status UpgradePlanStatus `json:"status,omitempty"`
}

// UpgradePlanSpec names the release.
type UpgradePlanSpec struct {
	// +optional
	Version *string `json:"version,omitempty"`
}

// UpgradePlanStatus is where the plan is.
type UpgradePlanStatus struct {
	// +optional
	CurrentPhase string `json:"currentPhase,omitempty"`
}

// UpgradePlanList is a list of UpgradePlans.
//
// +kubebuilder:object:root=true
type UpgradePlanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpgradePlan `json:"items"`
}

// InProgress reports whether the toolkit's plan is neither Succeeded nor Failed.
func (p *UpgradePlan) InProgress() bool {
	return p.Status.CurrentPhase != PhaseSucceeded && p.Status.CurrentPhase != PhaseFailed
}
