package nodeupdater

// FieldObject says which object of a machine a field belongs to, in the terms of Cluster
// API's in-place update hooks.
type FieldObject string

const (
	// MachineObject is the Machine (a MachineSet's machine template on the MachineSet path).
	MachineObject FieldObject = "Machine"
	// BootstrapConfigObject is the bootstrap config (its template on the MachineSet path).
	BootstrapConfigObject FieldObject = "BootstrapConfig"
	// InfrastructureMachineObject is the infrastructure machine (its template on the
	// MachineSet path).
	InfrastructureMachineObject FieldObject = "InfrastructureMachine"
)

// InPlaceField is a field of a machine's objects that an updater changes in place, besides
// the Kubernetes version, which every updater changes. Cluster API asks, before it rolls
// out a change, whether an extension can do it in place; capi-inplace answers yes only for
// the version and the fields the cluster's updater declares.
type InPlaceField struct {
	// Object is the object whose spec holds the field.
	Object FieldObject
	// Kinds restricts the field to these kinds of a bootstrap config or infrastructure
	// machine, for example KubeadmConfig; the kind's template (KubeadmConfigTemplate)
	// matches too. Empty means every kind.
	Kinds []string
	// Path is the field's path under the object's spec (under spec.template.spec of a
	// template), for example ["clusterConfiguration", "featureGates", "SomeGate"].
	Path []string
	// WithVersion restricts the field to changes that come with a version change: a field
	// Cluster API derives from the version, which the node upgrade itself applies.
	WithVersion bool
}

// InPlaceFieldsDeclarer is implemented by an Updater that changes more in place than the
// Kubernetes version (and the fields every updater covers, VersionDerivedFields).
type InPlaceFieldsDeclarer interface {
	// InPlaceFields lists the fields the updater changes in place. It is called on a hot
	// path and must not do I/O.
	InPlaceFields() []InPlaceField
}

// VersionDerivedFields are the fields every updater covers because Cluster API derives
// them from the Kubernetes version, so that a version bump alone is not more than the
// version. KubeadmControlPlane sets kubeadm's ControlPlaneKubeletLocalMode feature gate
// for v1.31 up to v1.35 and drops it from v1.36 (where the behaviour is the default); the
// node upgrade (kubeadm upgrade) applies the new version's configuration itself.
var VersionDerivedFields = []InPlaceField{{
	Object:      BootstrapConfigObject,
	Kinds:       []string{"KubeadmConfig"},
	Path:        []string{"clusterConfiguration", "featureGates", "ControlPlaneKubeletLocalMode"},
	WithVersion: true,
}}

// InPlaceFieldsOf returns the fields the updater of reg changes in place, besides the
// version: VersionDerivedFields and what the updater declares.
func InPlaceFieldsOf(reg *Registration) []InPlaceField {
	fields := append([]InPlaceField(nil), VersionDerivedFields...)
	if reg == nil {
		return fields
	}
	if d, ok := reg.Updater.(InPlaceFieldsDeclarer); ok {
		fields = append(fields, d.InPlaceFields()...)
	}
	return fields
}
