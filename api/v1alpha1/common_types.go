package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
)

// UpdaterReference names the object that configures the updater which performs the
// node-level work, in the namespace of the Cluster, for example HarvesterUpgrader/default.
type UpdaterReference struct {
	// apiGroup is the API group of the updater's configuration kind. When empty, the
	// manager resolves the kind among the updaters it runs.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	APIGroup string `json:"apiGroup,omitempty"`

	// kind is the kind of the updater's configuration object, for example HarvesterUpgrader.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Kind string `json:"kind"`

	// name is the name of the updater's configuration object, in the Cluster's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// String returns the reference in the form of the updater annotation: Kind/name, or
// Kind.group/name when the group is set. ParseUpdaterReference reads it back.
func (r UpdaterReference) String() string {
	if r.APIGroup != "" {
		return r.Kind + "." + r.APIGroup + "/" + r.Name
	}
	return r.Kind + "/" + r.Name
}

// ControlPlaneReference names the control plane object of a Cluster, of any kind
// (KubeadmControlPlane, RKE2ControlPlane, ...), in the Cluster's namespace.
type ControlPlaneReference struct {
	// apiGroup is the API group of the control plane kind, for example
	// controlplane.cluster.x-k8s.io.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	APIGroup string `json:"apiGroup"`

	// kind is the control plane kind, for example KubeadmControlPlane.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Kind string `json:"kind"`

	// name is the name of the control plane object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// MachineDeploymentReference names a MachineDeployment in the Cluster's namespace.
type MachineDeploymentReference struct {
	// name is the name of the MachineDeployment.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// DesiredMachine carries the parts of the desired machine that go beyond the version,
// as the caller of the upgrade gave them. Updaters that can apply them read them;
// others ignore them.
type DesiredMachine struct {
	// bootstrapConfig is the desired bootstrap configuration object (for example a
	// KubeadmConfig or RKE2Config), as a whole object.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:EmbeddedResource
	BootstrapConfig *runtime.RawExtension `json:"bootstrapConfig,omitempty"`

	// infrastructureMachine is the desired infrastructure machine object, as a whole object.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:EmbeddedResource
	InfrastructureMachine *runtime.RawExtension `json:"infrastructureMachine,omitempty"`
}

// ParseUpdaterReference parses the Kind/name form used by the updater annotation and the
// manager's --default-updater flag, for example HarvesterUpgrader/default. A group may
// be given as Kind.group/name, for example HarvesterUpgrader.harvester.inplace.cluster.x-k8s.io/default.
func ParseUpdaterReference(s string) (UpdaterReference, error) {
	kindPart, name, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok || kindPart == "" || name == "" || strings.Contains(name, "/") {
		return UpdaterReference{}, fmt.Errorf("updater reference %q is not of the form Kind/name (for example HarvesterUpgrader/default)", s)
	}
	kind, group, _ := strings.Cut(kindPart, ".")
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return UpdaterReference{}, fmt.Errorf("updater reference %q: name %q is not a valid object name: %s", s, name, strings.Join(errs, "; "))
	}
	if !kindPattern.MatchString(kind) {
		return UpdaterReference{}, fmt.Errorf("updater reference %q: kind %q must start with a letter and hold only letters, digits and '-'", s, kind)
	}
	if group != "" {
		if errs := validation.IsDNS1123Subdomain(group); len(errs) > 0 {
			return UpdaterReference{}, fmt.Errorf("updater reference %q: API group %q is not valid: %s", s, group, strings.Join(errs, "; "))
		}
	}
	return UpdaterReference{APIGroup: group, Kind: kind, Name: name}, nil
}

var kindPattern = regexp.MustCompile(`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)
