package harvesterapi

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Addon is Harvester's add-on (harvester/harvester pkg/apis/harvesterhci.io/v1beta1
// addon.go at v1.8.2): a Helm chart Harvester's addon controller installs while
// spec.enabled is true and uninstalls when it is false. Harvester's upgrade turns the
// descheduler add-on (kube-system/descheduler) off for its node phase and on again at its
// cleanup (shared/facts/harvester-release-steps.md facts 36 and 37); the updater does the
// same. The cluster upgrade brings the add-ons to the release (fact 29) and, as the
// release's script, waits for some of them to be deployed again, reading their status.
// The fields are those of Harvester's type, with its status subresource (pkg/data/crd.go
// at v1.8.2 registers the kind WithStatus).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="HelmRepo",type=string,JSONPath=`.spec.repo`
// +kubebuilder:printcolumn:name="ChartName",type=string,JSONPath=`.spec.chart`
// +kubebuilder:printcolumn:name="Enabled",type=boolean,JSONPath=`.spec.enabled`
type Addon struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AddonSpec `json:"spec"`
	// +optional
	Status AddonStatus `json:"status,omitempty"`
}

// AddonSpec is what Harvester's addon controller installs.
type AddonSpec struct {
	Repo    string `json:"repo"`
	Chart   string `json:"chart"`
	Version string `json:"version"`
	// Enabled says whether the add-on is installed.
	Enabled       bool   `json:"enabled"`
	ValuesContent string `json:"valuesContent"`
}

// AddonState is where Harvester's addon controller has the add-on (AddonStatus.Status).
type AddonState string

// The states of an add-on (Harvester's addon.go at v1.8.2). An enabled add-on goes from
// none (or AddonDisabled) through AddonEnabling to AddonDeploySuccessful; a change of its
// chart, version or values takes it from AddonDeploySuccessful to AddonUpdating and, once
// its Helm job succeeded, back. A failed job leaves it AddonEnabling or AddonUpdating with
// the condition OperationFailed True, until someone disables it (addon_processing.go).
const (
	AddonEnabling  AddonState = "AddonEnabling"
	AddonDeployed  AddonState = "AddonDeploySuccessful"
	AddonDisabled  AddonState = "AddonDisabled"
	AddonDisabling AddonState = "AddonDisabling"
	AddonUpdating  AddonState = "AddonUpdating"
)

// The condition types of an add-on's operations (Harvester's addon.go at v1.8.2).
const (
	// AddonOperationInProgress is True from the moment the controller takes a change on
	// until its Helm job ended.
	AddonOperationInProgress = "InProgress"
	// AddonOperationCompleted is True once the last operation succeeded.
	AddonOperationCompleted = "Completed"
	// AddonOperationFailed is True once the last operation failed; its message says why.
	AddonOperationFailed = "OperationFailed"
)

// AddonStatus is what Harvester's addon controller reports of an add-on.
type AddonStatus struct {
	// +optional
	Status AddonState `json:"status,omitempty"`
	// +optional
	Conditions []SettingCondition `json:"conditions,omitempty"`
}

// Condition is the add-on's condition of type t, nil when it has none.
func (s *AddonStatus) Condition(t string) *SettingCondition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			return &s.Conditions[i]
		}
	}
	return nil
}

// IsTrue says whether the add-on's condition of type t is True.
func (s *AddonStatus) IsTrue(t string) bool {
	c := s.Condition(t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// AddonList is a list of Addons.
//
// +kubebuilder:object:root=true
type AddonList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Addon `json:"items"`
}
