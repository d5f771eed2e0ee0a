package harvesterapi

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Addon is Harvester's add-on (harvester/harvester pkg/apis/harvesterhci.io/v1beta1
// addon.go at v1.8.2): a Helm chart Harvester's addon controller installs while
// spec.enabled is true and uninstalls when it is false. Harvester's upgrade turns the
// descheduler add-on (kube-system/descheduler) off for its node phase and on again at its
// cleanup (shared/facts/harvester-release-steps.md facts 36 and 37); the updater does the
// same and reads or writes nothing else of it. The fields are those of Harvester's type,
// its status left out.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:printcolumn:name="HelmRepo",type=string,JSONPath=`.spec.repo`
// +kubebuilder:printcolumn:name="ChartName",type=string,JSONPath=`.spec.chart`
// +kubebuilder:printcolumn:name="Enabled",type=boolean,JSONPath=`.spec.enabled`
type Addon struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AddonSpec `json:"spec"`
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

// AddonList is a list of Addons.
//
// +kubebuilder:object:root=true
type AddonList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Addon `json:"items"`
}
