// Package longhornlive is a small typed client for the kinds of Longhorn's live upgrade
// of v2 instance managers: InstanceManagerUpgrade (IMU) and InstanceManagerUpgradeControl
// (IMUC) in longhorn.io/v1beta2 (shared/facts/longhorn-v2-live-upgrade.md, facts 2 and
// 7–10). Longhorn serves them only from the release that carries longhorn-manager PR
// #4676 (v1.13.x, possibly v1.12.2+); the project pins longhorn-manager v1.10.0, which
// has neither kind, so the Harvester updater keeps its own types here. They hold only
// the fields the updater reads, with the JSON names, kinds, short names, scope and
// printer columns of longhorn-manager's
// k8s/pkg/apis/longhorn/v1beta2/instancemanagerupgrade.go and
// instancemanagerupgradecontrol.go (PR #4676 head 26bf063). The updater never creates
// either kind (fact 36); the test simulator does, as Longhorn would.
//
// +kubebuilder:object:generate=true
// +groupName=longhorn.io
// +versionName=v1beta2
package longhornlive

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Longhorn's API group and version.
var GroupVersion = schema.GroupVersion{Group: "longhorn.io", Version: "v1beta2"}

// ControlName is the name of the one InstanceManagerUpgradeControl Longhorn keeps in its
// namespace (fact 10; longhorn-manager types/types.go InstanceManagerUpgradeControlName).
const ControlName = "longhorn-instance-manager-upgrade-control"

// AddToScheme registers the two kinds under longhorn.io/v1beta2, beside longhorn-manager's
// released kinds.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &InstanceManagerUpgrade{}, &InstanceManagerUpgradeList{},
		&InstanceManagerUpgradeControl{}, &InstanceManagerUpgradeControlList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// UpgradeState is where the live upgrade of one node's v2 instance manager stands
// (fact 9).
type UpgradeState string

// The states of an InstanceManagerUpgrade (fact 9).
const (
	UpgradeStatePending                  UpgradeState = "pending"
	UpgradeStateRelocatingEngines        UpgradeState = "relocating-engines"
	UpgradeStateWaitingForSourceIM       UpgradeState = "waiting-for-source-im"
	UpgradeStateRestoringEngines         UpgradeState = "restoring-engines"
	UpgradeStateWaitingForHealthyVolumes UpgradeState = "waiting-for-healthy-volumes"
	UpgradeStateCompleted                UpgradeState = "completed"
	UpgradeStateFailed                   UpgradeState = "failed"
)

// Active says whether an upgrade in this state may have moved engines or detached
// replicas, or may do so next: no node may be taken down meanwhile (fact 37). pending
// counts too, since Longhorn starts relocating from it on its own. An empty state is an
// IMU Longhorn has created but not yet looked at: it starts in pending.
func (s UpgradeState) Active() bool {
	switch s {
	case UpgradeStateCompleted, UpgradeStateFailed:
		return false
	default:
		return true
	}
}

// InstanceManagerUpgradeSpec names the node whose v2 instance manager is upgraded and
// the image it is upgraded to (fact 8).
type InstanceManagerUpgradeSpec struct {
	// nodeID is the node whose v2 instance manager is upgraded.
	NodeID string `json:"nodeID"`
	// targetImage is the instance-manager image the node is upgraded to.
	TargetImage string `json:"targetImage"`
}

// EngineRelocation is where one volume's engine came from and where it runs while its
// node's instance manager is upgraded (fact 8).
type EngineRelocation struct {
	// originalNodeID is the node the engine ran on before the upgrade.
	OriginalNodeID string `json:"originalNodeID"`
	// temporaryNodeID is the node the engine runs on meanwhile.
	// +optional
	TemporaryNodeID string `json:"temporaryNodeID,omitempty"`
}

// InstanceManagerUpgradeStatus is how the upgrade of one node stands, as Longhorn reports
// it (fact 8).
type InstanceManagerUpgradeStatus struct {
	// ownerID is the Longhorn manager that runs this upgrade.
	// +optional
	OwnerID string `json:"ownerID,omitempty"`
	// state is where the upgrade stands.
	// +optional
	State UpgradeState `json:"state,omitempty"`
	// engines maps each volume whose engine was moved off the node to its original and
	// temporary nodes.
	// +optional
	// +nullable
	Engines map[string]EngineRelocation `json:"engines,omitempty"`
	// startedAt is when the timed part of the upgrade began (RFC3339).
	// +optional
	StartedAt string `json:"startedAt,omitempty"`
	// abortRequested says Longhorn is putting the engines back and will fail the upgrade.
	// +optional
	AbortRequested bool `json:"abortRequested,omitempty"`
	// abortReason is why: timeout, target-image-changed, orphaned-imu or no-temporary-node.
	// +optional
	AbortReason string `json:"abortReason,omitempty"`
	// errorMsg is the error the upgrade ended with.
	// +optional
	ErrorMsg string `json:"errorMsg,omitempty"`
}

// InstanceManagerUpgrade is Longhorn's live upgrade of the v2 instance manager of one
// node (fact 8), created by Longhorn's InstanceManagerUpgradeControl, one node at a time.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lhimu
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`,description="The state of the instance manager upgrade"
// +kubebuilder:printcolumn:name="Target Image",type=string,JSONPath=`.spec.targetImage`,description="The desired image after upgrade"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InstanceManagerUpgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Spec InstanceManagerUpgradeSpec `json:"spec,omitempty"`
	// +optional
	Status InstanceManagerUpgradeStatus `json:"status,omitempty"`
}

// InstanceManagerUpgradeList is a list of InstanceManagerUpgrades.
// +kubebuilder:object:root=true
type InstanceManagerUpgradeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InstanceManagerUpgrade `json:"items"`
}

// NodeUpgradeState is where one node stands in Longhorn's roll of v2 instance managers
// (fact 10).
type NodeUpgradeState string

// The node states of an InstanceManagerUpgradeControl (fact 10).
const (
	NodeUpgradeStatePending    NodeUpgradeState = "pending"
	NodeUpgradeStateInProgress NodeUpgradeState = "in-progress"
	NodeUpgradeStateCompleted  NodeUpgradeState = "completed"
	NodeUpgradeStateFailed     NodeUpgradeState = "failed"
)

// InstanceManagerUpgradeControlSpec is the image Longhorn rolls its v2 instance managers
// to and when it starts (fact 10).
type InstanceManagerUpgradeControlSpec struct {
	// targetImage is the instance-manager image every node is upgraded to.
	// +optional
	TargetImage string `json:"targetImage,omitempty"`
	// startAt is when the roll starts (RFC3339); empty starts at once.
	// +optional
	StartAt string `json:"startAt,omitempty"`
}

// NodeUpgradeInfo is one node's place in the roll (fact 10).
type NodeUpgradeInfo struct {
	// state is where the node stands.
	State NodeUpgradeState `json:"state"`
	// imuName is the node's current or last InstanceManagerUpgrade.
	// +optional
	IMUName string `json:"imuName,omitempty"`
	// retryCount is how many times the node's upgrade has been tried.
	// +optional
	RetryCount int `json:"retryCount,omitempty"`
	// startedAt is when the node's upgrade began (RFC3339).
	// +optional
	StartedAt string `json:"startedAt,omitempty"`
	// completedAt is when it ended (RFC3339).
	// +optional
	CompletedAt string `json:"completedAt,omitempty"`
	// errorMsg is the node's last error.
	// +optional
	ErrorMsg string `json:"errorMsg,omitempty"`
}

// InstanceManagerUpgradeControlStatus is how the roll stands (fact 10).
type InstanceManagerUpgradeControlStatus struct {
	// ownerID is the Longhorn manager that runs the roll.
	// +optional
	OwnerID string `json:"ownerID,omitempty"`
	// currentNode is the node being upgraded; empty when none is.
	// +optional
	CurrentNode string `json:"currentNode,omitempty"`
	// nodes maps each node of the roll to its place in it.
	// +optional
	// +nullable
	Nodes map[string]NodeUpgradeInfo `json:"nodes,omitempty"`
}

// InstanceManagerUpgradeControl is Longhorn's roll of its v2 instance managers to a new
// image, one node at a time, a singleton named ControlName that Longhorn creates itself
// (facts 10, 11).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lhimuc
// +kubebuilder:printcolumn:name="Target Image",type=string,JSONPath=`.spec.targetImage`,description="Desired instance manager image"
// +kubebuilder:printcolumn:name="Current Node",type=string,JSONPath=`.status.currentNode`,description="Node currently being upgraded"
// +kubebuilder:printcolumn:name="Start At",type=string,JSONPath=`.spec.startAt`,description="Scheduled start time"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InstanceManagerUpgradeControl struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Spec InstanceManagerUpgradeControlSpec `json:"spec,omitempty"`
	// +optional
	Status InstanceManagerUpgradeControlStatus `json:"status,omitempty"`
}

// InstanceManagerUpgradeControlList is a list of InstanceManagerUpgradeControls.
// +kubebuilder:object:root=true
type InstanceManagerUpgradeControlList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InstanceManagerUpgradeControl `json:"items"`
}
