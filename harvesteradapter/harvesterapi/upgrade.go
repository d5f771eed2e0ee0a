package harvesterapi

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// LabelUpgradeState is the label Harvester's upgrade controller keeps on each Upgrade
// with the state it is in; an Upgrade is in progress while the label is absent or is
// neither UpgradeStateSucceeded nor UpgradeStateFailed (harvester/harvester
// pkg/util/constants.go; the node-down controller's isOnUpgrade and the Upgrade
// admission webhook select with NotIn, shared/facts/harvester-node-upgrade.md fact 4a,
// harvester-release-steps.md fact 38).
const LabelUpgradeState = "harvesterhci.io/upgradeState"

// The final states of an Upgrade.
const (
	UpgradeStateSucceeded = "Succeeded"
	UpgradeStateFailed    = "Failed"
)

// UpgradeNamespace is where Harvester's Upgrades live.
const UpgradeNamespace = "harvester-system"

// Upgrade is Harvester's own upgrade of the cluster (harvester/harvester
// pkg/apis/harvesterhci.io/v1beta1/upgrade.go at v1.8.2), which Harvester's upgrade
// controller runs. capi-inplace never creates one: it holds its own nodes while one is in
// progress and keeps new ones out while its own UpgradePlan runs. Only the fields a test
// needs to create a valid object are here; like Harvester's CRD it has no status
// subresource.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
type Upgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec UpgradeSpec `json:"spec"`
}

// UpgradeSpec is the release an Upgrade goes to.
type UpgradeSpec struct {
	// +optional
	Version string `json:"version"`
	// +optional
	Image string `json:"image"`
}

// UpgradeList is a list of Upgrades.
//
// +kubebuilder:object:root=true
type UpgradeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Upgrade `json:"items"`
}

// InProgress reports whether Harvester counts the Upgrade as in progress: its
// upgradeState label is absent or not final.
func (u *Upgrade) InProgress() bool {
	s, ok := u.Labels[LabelUpgradeState]
	return !ok || (s != UpgradeStateSucceeded && s != UpgradeStateFailed)
}
