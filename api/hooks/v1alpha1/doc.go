// Package v1alpha1 is capi-inplace's own runtime hook catalog, group
// hooks.inplace.cluster.x-k8s.io: the ExternalUpgradeRequest hook, by which any caller
// (a Cluster API fork implementing the external-upgrade proposal, a script, the
// annotation cascade) asks for an extension-paced in-place upgrade. It is served on its
// own hook server, because Cluster API's discovery rejects hooks outside its catalog.
//
// +kubebuilder:object:generate=true
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
)

var (
	// GroupVersion is the group and version of capi-inplace's hook catalog.
	GroupVersion = schema.GroupVersion{Group: "hooks.inplace.cluster.x-k8s.io", Version: "v1alpha1"}

	catalogBuilder = &runtimecatalog.Builder{GroupVersion: GroupVersion}

	// AddToCatalog adds capi-inplace's hooks and their request and response types to a catalog.
	AddToCatalog = catalogBuilder.AddToCatalog
)
