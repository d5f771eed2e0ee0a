// Package managementv3 holds the two kinds of Rancher's management.cattle.io/v3 that the
// Harvester cluster upgrade touches: ManagedChart, the Fleet-deployed Helm chart through
// which Harvester installs and upgrades itself in fleet-local (shared/facts/
// harvester-node-upgrade.md, facts 41.4, 41.13, 41.15 and 42), and Setting, Rancher's
// global settings such as server-version (fact 41.8). Rancher's and Fleet's Go modules
// (github.com/rancher/rancher/pkg/apis, github.com/rancher/fleet/pkg/apis) are not
// available through the Go module proxy, so these are our own types with the JSON names of
// rancher/rancher@59bd052e44553e77e5c570b84ed4a24dfa7b44ab
// pkg/apis/management.cattle.io/v3/managed_chart.go and global_types.go, and of
// rancher/fleet@3b2c622ce176b11644abc7fb768f87c3ffb5a3ab
// pkg/apis/fleet.cattle.io/v1alpha1/bundle_types.go (BundleStatus, BundleSummary, which a
// ManagedChart's status inlines). Rancher installs ManagedChart with the status
// subresource and Setting without (pkg/crds/dashboard/crds.go). The types hold only what
// the upgrade reads or writes; the CRDs keep every other field, and the upgrade only ever
// sends merge patches of the fields it changes.
//
// +kubebuilder:object:generate=true
// +groupName=management.cattle.io
// +versionName=v3
package managementv3

import (
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Rancher's management API group and version.
var GroupVersion = schema.GroupVersion{Group: "management.cattle.io", Version: "v3"}

// AddToScheme registers ManagedChart and Setting with their lists.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ManagedChart{}, &ManagedChartList{}, &Setting{}, &SettingList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// ManagedChartSpec is the part of Rancher's ManagedChartSpec the upgrade uses.
// +kubebuilder:pruning:PreserveUnknownFields
type ManagedChartSpec struct {
	// paused stops Fleet from deploying changes of the chart.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// chart is the chart's name in the repository.
	// +optional
	Chart string `json:"chart,omitempty"`
	// repoName is the ClusterRepo the chart comes from.
	// +optional
	RepoName string `json:"repoName,omitempty"`
	// releaseName is the Helm release's name.
	// +optional
	ReleaseName string `json:"releaseName,omitempty"`
	// version is the chart version Fleet deploys.
	// +optional
	Version string `json:"version,omitempty"`
	// timeoutSeconds is Helm's timeout; Harvester's upgrade also bumps it to make the
	// generation change (fact 41.13).
	// +optional
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// values are the chart's Helm values, kept as they are.
	// +optional
	Values *apiextensionsv1.JSON `json:"values,omitempty"`
	// defaultNamespace is where the chart's namespaced objects go by default.
	// +optional
	DefaultNamespace string `json:"defaultNamespace,omitempty"`
	// namespace forces every namespaced object of the chart into one namespace.
	// +optional
	TargetNamespace string `json:"namespace,omitempty"`
}

// BundleSummary is Fleet's count of the chart's bundle deployments by state.
// +kubebuilder:pruning:PreserveUnknownFields
type BundleSummary struct {
	// notReady counts deployments that are applied but not ready.
	// +optional
	NotReady int `json:"notReady,omitempty"`
	// waitApplied counts deployments waiting to be applied.
	// +optional
	WaitApplied int `json:"waitApplied,omitempty"`
	// errApplied counts deployments whose apply (helm install or upgrade) failed.
	// +optional
	ErrApplied int `json:"errApplied,omitempty"`
	// outOfSync counts deployments not yet at the bundle's current content.
	// +optional
	OutOfSync int `json:"outOfSync,omitempty"`
	// modified counts deployments whose objects were changed by someone else.
	// +optional
	Modified int `json:"modified,omitempty"`
	// ready counts ready deployments.
	// +optional
	Ready int `json:"ready"`
	// pending counts deployments not yet processed.
	// +optional
	Pending int `json:"pending,omitempty"`
	// desiredReady is how many deployments should be ready.
	// +optional
	DesiredReady int `json:"desiredReady"`
}

// ManagedChartStatus is Fleet's BundleStatus, which Rancher copies from the chart's
// bundle: the part the upgrade reads.
// +kubebuilder:pruning:PreserveUnknownFields
type ManagedChartStatus struct {
	// conditions are the bundle's conditions; Ready carries the reason it is not.
	// +optional
	Conditions []genericcondition.GenericCondition `json:"conditions,omitempty"`
	// summary counts the bundle's deployments by state.
	// +optional
	Summary BundleSummary `json:"summary,omitempty"`
	// unavailable counts deployments not ready.
	// +optional
	Unavailable int `json:"unavailable"`
	// observedGeneration is the generation of the ManagedChart Rancher last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration"`
}

// ManagedChart is a Helm chart that Rancher deploys through Fleet.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=managedcharts,scope=Namespaced
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=".spec.version"
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=".spec.paused"
type ManagedChart struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Spec ManagedChartSpec `json:"spec"`
	// +optional
	Status ManagedChartStatus `json:"status"`
}

// ManagedChartList is a list of ManagedCharts.
// +kubebuilder:object:root=true
type ManagedChartList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ManagedChart `json:"items"`
}

// Setting is one of Rancher's global settings, such as server-version.
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=settings,scope=Cluster
// +kubebuilder:printcolumn:name="Value",type=string,JSONPath=".value"
type Setting struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// value is the setting's value; empty means default.
	// +optional
	Value string `json:"value"`
	// default is the value Rancher uses when value is empty.
	// +optional
	Default string `json:"default"`
	// customized says value was set by a user.
	// +optional
	Customized bool `json:"customized"`
	// source is where value came from: db, default or env.
	// +optional
	Source string `json:"source"`
}

// Effective is the setting's value, or its default when the value is empty, as Rancher
// reads it.
func (s *Setting) Effective() string {
	if s.Value != "" {
		return s.Value
	}
	return s.Default
}

// SettingList is a list of Settings.
// +kubebuilder:object:root=true
type SettingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Setting `json:"items"`
}
