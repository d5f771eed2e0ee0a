package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// ExternalUpgradeRequestRequest asks for an in-place upgrade of the machines of one
// control plane or MachineDeployment.
// +kubebuilder:object:root=true
type ExternalUpgradeRequestRequest struct {
	metav1.TypeMeta `json:",inline"`

	// CommonRequest carries the settings of the caller's registration.
	runtimehooksv1.CommonRequest `json:",inline"`

	// Cluster is the Cluster whose machines are upgraded. Only its namespace and name
	// are relied on; the rest is read from the API server.
	Cluster clusterv1.Cluster `json:"cluster"`

	// ControlPlaneRef names the control plane to upgrade. Exactly one of ControlPlaneRef
	// and MachineDeploymentRef is set.
	// +optional
	ControlPlaneRef *inplacev1.ControlPlaneReference `json:"controlPlaneRef,omitempty"`

	// MachineDeploymentRef names the MachineDeployment to upgrade.
	// +optional
	MachineDeploymentRef *inplacev1.MachineDeploymentReference `json:"machineDeploymentRef,omitempty"`

	// MachinesRequiringUpgrade names the Machines to upgrade. Empty means every machine of
	// the target that is not at the version yet.
	// +optional
	MachinesRequiringUpgrade []string `json:"machinesRequiringUpgrade,omitempty"`

	// NewMachineSpec is what the machines are upgraded to.
	NewMachineSpec NewMachineSpec `json:"newMachineSpec"`

	// UpdaterRef names the updater configuration to use when the Cluster carries no
	// updater annotation.
	// +optional
	UpdaterRef *inplacev1.UpdaterReference `json:"updaterRef,omitempty"`

	// Options tune how carefully the upgrade proceeds.
	// +optional
	Options UpgradeOptions `json:"options,omitempty"`
}

// NewMachineSpec is the desired state of the machines of an upgrade.
type NewMachineSpec struct {
	// Version is the Kubernetes version to upgrade to, as semver (v1.33.3, v1.33.3+rke2r1).
	Version string `json:"version"`

	// BootstrapConfig is the desired bootstrap configuration object, when it changes too.
	// +optional
	BootstrapConfig *runtime.RawExtension `json:"bootstrapConfig,omitempty"`

	// InfrastructureMachine is the desired infrastructure machine object, when it changes too.
	// +optional
	InfrastructureMachine *runtime.RawExtension `json:"infrastructureMachine,omitempty"`
}

// UpgradeOptions are the UpgradeTask settings a caller may choose.
type UpgradeOptions struct {
	// MaxUnavailable is how many nodes may be unavailable at once (an integer or a
	// percentage); defaults to 1.
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// NodeOrder names nodes to upgrade first.
	// +optional
	NodeOrder []string `json:"nodeOrder,omitempty"`

	// PauseNodes names nodes not to start for now.
	// +optional
	PauseNodes []string `json:"pauseNodes,omitempty"`

	// DryRun computes the plan without starting any node.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`
}

// Decision is the extension's answer to an ExternalUpgradeRequest.
type Decision string

const (
	// DecisionAccept: an UpgradeTask was created (or already existed) for the request.
	DecisionAccept Decision = "Accept"
	// DecisionDecline: the extension will not do this upgrade; the message says why and
	// what to do.
	DecisionDecline Decision = "Decline"
)

var _ runtimehooksv1.ResponseObject = &ExternalUpgradeRequestResponse{}

// ExternalUpgradeRequestResponse is the answer to an ExternalUpgradeRequest. Status
// Failure means the request itself could not be processed (malformed, or the API server
// unreachable); a well-formed request is answered with Status Success and a Decision.
// +kubebuilder:object:root=true
type ExternalUpgradeRequestResponse struct {
	metav1.TypeMeta `json:",inline"`

	// CommonResponse carries Status and Message.
	runtimehooksv1.CommonResponse `json:",inline"`

	// Decision is Accept or Decline.
	// +optional
	Decision Decision `json:"decision,omitempty"`

	// UpgradeTaskName is the name of the UpgradeTask that carries out an accepted
	// request, in the Cluster's namespace.
	// +optional
	UpgradeTaskName string `json:"upgradeTaskName,omitempty"`

	// Reason is, for a Decline, a short machine-readable reason (InvalidRequest,
	// ClusterNotFound, TargetNotFound, NotPartOfCluster, InvalidVersion, UnknownMachines,
	// Downgrade, MinorVersionSkip, NoUpdater, InvalidUpdater, UpdaterUnavailable,
	// NameConflict); Message says why and what to do.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// ExternalUpgradeRequest is the hook by which a caller asks capi-inplace for an
// extension-paced in-place upgrade of a control plane or MachineDeployment.
func ExternalUpgradeRequest(*ExternalUpgradeRequestRequest, *ExternalUpgradeRequestResponse) {}

func init() {
	catalogBuilder.RegisterHook(ExternalUpgradeRequest, &runtimecatalog.HookMeta{
		Tags:    []string{"In-Place Upgrade Hooks"},
		Summary: "Ask capi-inplace to upgrade the machines of a control plane or MachineDeployment in place",
		Description: "The extension aborts any older unfinished UpgradeTask of the same target, checks that it " +
			"can do the upgrade (an updater is configured, the version is a valid semver upgrade, a control " +
			"plane does not skip a minor version) and answers Accept with the UpgradeTask's name, or Decline " +
			"with a reason a person can act on. The same request twice creates one UpgradeTask.",
	})
}
