// Package dataengine is a small typed client for Longhorn's live v2 data engine upgrade
// API as its enhancement proposal defines it: DataEngineUpgradeManager and
// NodeDataEngineUpgrade in longhorn.io/v1beta2. No released longhorn-manager module
// carries these kinds, so the Harvester updater keeps its own types with the proposal's
// fields, and uses them only when the workload cluster serves the kinds.
//
// +kubebuilder:object:generate=true
// +groupName=longhorn.io
// +versionName=v1beta2
package dataengine

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Longhorn's API group and version.
var GroupVersion = schema.GroupVersion{Group: "longhorn.io", Version: "v1beta2"}

// AddToScheme registers the two kinds under longhorn.io/v1beta2, beside longhorn-manager's
// released kinds.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &DataEngineUpgradeManager{}, &DataEngineUpgradeManagerList{},
		&NodeDataEngineUpgrade{}, &NodeDataEngineUpgradeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// UpgradeState is where an upgrade stands, as Longhorn reports it.
type UpgradeState string

// The states of the proposal.
const (
	UpgradeStateUndefined    UpgradeState = ""
	UpgradeStatePending      UpgradeState = "pending"
	UpgradeStateInitializing UpgradeState = "initializing"
	UpgradeStateUpgrading    UpgradeState = "upgrading"
	UpgradeStateCompleted    UpgradeState = "completed"
	UpgradeStateError        UpgradeState = "error"
)

// DataEngineUpgradeManagerSpec asks Longhorn to upgrade the data engine of some nodes.
type DataEngineUpgradeManagerSpec struct {
	// DataEngine is the data engine to upgrade; only v2 is supported.
	DataEngine string `json:"dataEngine"`
	// Nodes are the nodes to upgrade; empty means all.
	// +optional
	Nodes []string `json:"nodes,omitempty"`
}

// UpgradeNodeStatus is the upgrade state of one node.
type UpgradeNodeStatus struct {
	State   UpgradeState `json:"state,omitempty"`
	Message string       `json:"message,omitempty"`
}

// DataEngineUpgradeManagerStatus is how the upgrade stands.
type DataEngineUpgradeManagerStatus struct {
	// +optional
	OwnerID string `json:"ownerID,omitempty"`
	// +optional
	InstanceManagerImage string `json:"instanceManagerImage,omitempty"`
	// +optional
	State UpgradeState `json:"state,omitempty"`
	// +optional
	CurrentNode string `json:"currentNode,omitempty"`
	// +optional
	UpgradingNodes map[string]*UpgradeNodeStatus `json:"upgradingNodes,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// DataEngineUpgradeManager is Longhorn's request to upgrade the data engine of nodes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lhdum
type DataEngineUpgradeManager struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              DataEngineUpgradeManagerSpec   `json:"spec,omitempty"`
	Status            DataEngineUpgradeManagerStatus `json:"status,omitempty"`
}

// DataEngineUpgradeManagerList is a list of DataEngineUpgradeManagers.
// +kubebuilder:object:root=true
type DataEngineUpgradeManagerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DataEngineUpgradeManager `json:"items"`
}

// VolumeUpgradeStatus is the upgrade state of one volume on a node.
type VolumeUpgradeStatus struct {
	State   UpgradeState `json:"state,omitempty"`
	Message string       `json:"message,omitempty"`
}

// NodeDataEngineUpgradeSpec is the upgrade of one node's data engine, created by Longhorn
// for each node of a DataEngineUpgradeManager.
type NodeDataEngineUpgradeSpec struct {
	NodeID                   string `json:"nodeID"`
	DataEngine               string `json:"dataEngine"`
	InstanceManagerImage     string `json:"instanceManagerImage"`
	DataEngineUpgradeManager string `json:"dataEngineUpgradeManager"`
}

// NodeDataEngineUpgradeStatus is how one node's upgrade stands.
type NodeDataEngineUpgradeStatus struct {
	// +optional
	OwnerID string `json:"ownerID,omitempty"`
	// +optional
	Volumes map[string]*VolumeUpgradeStatus `json:"volumes,omitempty"`
	// +optional
	State UpgradeState `json:"state,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// NodeDataEngineUpgrade is Longhorn's upgrade of one node's data engine.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lhndeu
type NodeDataEngineUpgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              NodeDataEngineUpgradeSpec   `json:"spec,omitempty"`
	Status            NodeDataEngineUpgradeStatus `json:"status,omitempty"`
}

// NodeDataEngineUpgradeList is a list of NodeDataEngineUpgrades.
// +kubebuilder:object:root=true
type NodeDataEngineUpgradeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeDataEngineUpgrade `json:"items"`
}
