package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// RefreshAnnotation on an UpgradePreview asks for the preview to be computed again: any
// new value (a timestamp, a counter) does. The preview is otherwise computed once per
// generation of its spec, and its status says when (status.computedTime).
const RefreshAnnotation = AnnotationPrefix + "refresh"

// FailClosedAnnotation on a Cluster, with the value "true", asks capi-inplace never to let
// Cluster API replace the Cluster's machines for a change it cannot do in place: the
// CanUpdateMachineSet and CanUpdateMachine hooks then answer Failure, naming the fields no
// updater covers, and Cluster API stops that rollout and retries until the change is
// reverted or the annotation removed.
const FailClosedAnnotation = AnnotationPrefix + "fail-closed"

// UpgradePreviewSpec names the upgrade to preview: a Cluster, a version and, on the
// Cluster API path, the template change the user is about to make.
type UpgradePreviewSpec struct {
	// clusterName is the name of the CAPI Cluster, in the preview's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ClusterName string `json:"clusterName"`

	// version is the Kubernetes version to preview the upgrade to, for example
	// v1.34.2+rke2r1.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Version string `json:"version"`

	// updaterRef names the updater configuration; defaults to the one the run would use
	// (the Cluster's updater annotation, else the manager's default).
	// +optional
	UpdaterRef *UpdaterReference `json:"updaterRef,omitempty"`

	// templateChanges are the template changes the user is about to make together with
	// the version (a ClusterClass or MachineDeployment pointing at other templates): each
	// machine is judged in place or replaced on the version and these, as Cluster API's
	// CanUpdate hooks would be answered.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=100
	TemplateChanges []PreviewTemplateChange `json:"templateChanges,omitempty"`

	// maxUnavailable, nodeOrder and pauseNodes are the options the run would be given, as
	// in an UpgradeTask.
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// nodeOrder names nodes to upgrade first, in this order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	NodeOrder []string `json:"nodeOrder,omitempty"`

	// pauseNodes names nodes that the run would not start while listed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	PauseNodes []string `json:"pauseNodes,omitempty"`
}

// PreviewTemplateChange is one template a control plane or MachineDeployment is about to
// point at.
// +kubebuilder:validation:XValidation:rule="has(self.infrastructureTemplate) || has(self.bootstrapTemplate)",message="name an infrastructureTemplate, a bootstrapTemplate or both"
type PreviewTemplateChange struct {
	// machineDeployment is the name of the MachineDeployment (the object's name, or its
	// name in the Cluster's topology); empty for the control plane.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	MachineDeployment string `json:"machineDeployment,omitempty"`

	// infrastructureTemplate is the infrastructure machine template it would name, in
	// the Cluster's namespace.
	// +optional
	InfrastructureTemplate *PreviewTemplateRef `json:"infrastructureTemplate,omitempty"`

	// bootstrapTemplate is the bootstrap config template it would name, in the Cluster's
	// namespace.
	// +optional
	BootstrapTemplate *PreviewTemplateRef `json:"bootstrapTemplate,omitempty"`
}

// PreviewTemplateRef names a template object.
type PreviewTemplateRef struct {
	// apiVersion of the template, for example infrastructure.cluster.x-k8s.io/v1beta2.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	APIVersion string `json:"apiVersion"`
	// kind of the template.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// name of the template.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// MachineOutcome is what an upgrade would do to one machine.
// +kubebuilder:validation:Enum=InPlace;Replaced;Refused;AtTarget
type MachineOutcome string

const (
	// MachineOutcomeInPlace: the machine would be updated where it stands.
	MachineOutcomeInPlace MachineOutcome = "InPlace"
	// MachineOutcomeReplaced: Cluster API would replace the machine (a new one created,
	// this one deleted with its local disks).
	MachineOutcomeReplaced MachineOutcome = "Replaced"
	// MachineOutcomeRefused: the change cannot be done in place and the Cluster is
	// fail-closed, or the run would refuse the version: nothing would happen to it.
	MachineOutcomeRefused MachineOutcome = "Refused"
	// MachineOutcomeAtTarget: the machine already runs the version.
	MachineOutcomeAtTarget MachineOutcome = "AtTarget"
)

// UnaskedPath is a path of Cluster API that replaces or deletes a machine without asking
// capi-inplace's CanUpdate hooks, or on an answer it cached: the hooks' answer, and a
// fail-closed Cluster, cannot stop it.
// +kubebuilder:validation:Enum=RolloutBefore;RolloutAfter;PreflightFallback;MaxSurge;CachedRefusal
type UnaskedPath string

const (
	// UnaskedPathRolloutBefore: KubeadmControlPlane's spec.rollout.before: the machine's
	// certificates expire within certificatesExpiryDays, so it is replaced.
	UnaskedPathRolloutBefore UnaskedPath = "RolloutBefore"
	// UnaskedPathRolloutAfter: the spec.rollout.after of the KubeadmControlPlane or
	// MachineDeployment has passed and the machine (its MachineSet) is older: replaced.
	UnaskedPathRolloutAfter UnaskedPath = "RolloutAfter"
	// UnaskedPathPreflightFallback: KubeadmControlPlane picked the machine for the next
	// in-place update, and it alone fails KubeadmControlPlane's preflight checks (its
	// control plane components or etcd member are not healthy): deleted instead.
	UnaskedPathPreflightFallback UnaskedPath = "PreflightFallback"
	// UnaskedPathMaxSurge: the rollout surges (maxSurge 1 or more, maxUnavailable 0): Cluster
	// API creates one new machine first, and deletes the last old one rather than update it.
	UnaskedPathMaxSurge UnaskedPath = "MaxSurge"
	// UnaskedPathCachedRefusal: capi-inplace's CanUpdateMachineSet answered "not in place"
	// for the machine's MachineSet, and Cluster API's MachineDeployment controller keeps
	// that answer for 24 hours without asking again: its machines are replaced.
	UnaskedPathCachedRefusal UnaskedPath = "CachedRefusal"
)

// PreviewPhase is where an UpgradePreview stands.
// +kubebuilder:validation:Enum=Computing;Ready;Failed
type PreviewPhase string

const (
	// PreviewPhaseComputing: the preview is being computed.
	PreviewPhaseComputing PreviewPhase = "Computing"
	// PreviewPhaseReady: status holds the preview as of status.computedTime.
	PreviewPhaseReady PreviewPhase = "Ready"
	// PreviewPhaseFailed: the preview cannot be computed; status.message says why.
	PreviewPhaseFailed PreviewPhase = "Failed"
)

// PreviewMachine is what the upgrade would do to one machine.
type PreviewMachine struct {
	// name is the Machine's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// nodeName is the name of the Machine's Node.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`

	// target is the control plane or MachineDeployment the machine belongs to, as
	// "KubeadmControlPlane/name" or "MachineDeployment/name".
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Target string `json:"target,omitempty"`

	// outcome is what the upgrade would do to the machine.
	// +required
	Outcome MachineOutcome `json:"outcome"`

	// reason says why, in words: the fields no updater covers, the updater's or the
	// run's refusal.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Reason string `json:"reason,omitempty"`

	// unaskedPath, on a Replaced machine, names the path of Cluster API that would replace
	// or delete it without asking capi-inplace's hooks (or on an answer it cached), which
	// neither the hooks nor a fail-closed Cluster can stop; empty when the hooks' answer
	// decides.
	// +optional
	UnaskedPath UnaskedPath `json:"unaskedPath,omitempty"`

	// order is the machine's place in the order nodes would go, starting at 1 (0 for a
	// machine that would not be upgraded in place).
	// +optional
	Order int32 `json:"order,omitempty"`

	// orderReason says why it is at that place: control plane first, spec.nodeOrder,
	// witness last, oldest first, by name.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	OrderReason string `json:"orderReason,omitempty"`

	// wouldHold is true when a preflight check would hold the node today.
	// +optional
	WouldHold bool `json:"wouldHold,omitempty"`

	// preflight are the results of every preflight check, as the run would compute them
	// now.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Preflight []PreflightCheckStatus `json:"preflight,omitempty"`

	// disruption is what upgrading the node would disrupt, as its updater tells it.
	// +optional
	Disruption *NodeDisruption `json:"disruption,omitempty"`

	// estimatedDuration is how long the node's upgrade is expected to take.
	// +optional
	EstimatedDuration *metav1.Duration `json:"estimatedDuration,omitempty"`
}

// NodeDisruption is what upgrading one node would disrupt.
type NodeDisruption struct {
	// migratingVMs are the VMs that would be live-migrated off the node.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	MigratingVMs []PreviewVM `json:"migratingVMs,omitempty"`

	// stoppedVMs are the VMs that would be stopped, and restarted after the node, with
	// the reason.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	StoppedVMs []PreviewVM `json:"stoppedVMs,omitempty"`

	// capacity says whether the nodes that stay up have room for the migrating VMs (CPU
	// and memory as KubeVirt requests them).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Capacity string `json:"capacity,omitempty"`

	// blockingPods are the pods whose PodDisruptionBudget would block their eviction now.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	BlockingPods []PreviewPod `json:"blockingPods,omitempty"`

	// degradedVolumes are the volumes that would drop below a healthy replica while the
	// node and the others down at once are down.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	DegradedVolumes []PreviewVolume `json:"degradedVolumes,omitempty"`
}

// PreviewVM is one virtual machine in a preview.
type PreviewVM struct {
	// namespace of the VM.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// name of the VM.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// reason says why the VM would be stopped, or where it would go.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// PreviewPod is one pod whose eviction would be blocked.
type PreviewPod struct {
	// namespace of the pod.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// name of the pod.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// podDisruptionBudget names the budget that blocks it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PodDisruptionBudget string `json:"podDisruptionBudget,omitempty"`
	// reason says why, in words.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// PreviewVolume is one volume that would lose its last healthy replica.
type PreviewVolume struct {
	// name of the volume.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// reason says why, in words (the replicas left healthy and where).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// UpgradePreviewStatus is the preview.
type UpgradePreviewStatus struct {
	// phase is where the preview stands.
	// +optional
	Phase PreviewPhase `json:"phase,omitempty"`

	// observedGeneration is the spec generation the preview was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// observedRefresh is the value of the refresh annotation the preview was computed
	// for.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ObservedRefresh string `json:"observedRefresh,omitempty"`

	// computedTime is when the preview was computed.
	// +optional
	ComputedTime *metav1.Time `json:"computedTime,omitempty"`

	// summary is the preview in one line, for kubectl get.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Summary string `json:"summary,omitempty"`

	// message says why the preview failed, or what it could not judge.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`

	// failClosed is true when the Cluster carries the fail-closed annotation.
	// +optional
	FailClosed bool `json:"failClosed,omitempty"`

	// inPlace, replaced, refused, atTarget and held count the machines by outcome, and
	// those a preflight check would hold today.
	// +optional
	InPlace int32 `json:"inPlace"`
	// +optional
	Replaced int32 `json:"replaced"`
	// +optional
	Refused int32 `json:"refused"`
	// +optional
	AtTarget int32 `json:"atTarget"`
	// +optional
	Held int32 `json:"held"`

	// estimatedDuration is how long the whole upgrade is expected to take, node after
	// node at maxUnavailable.
	// +optional
	EstimatedDuration *metav1.Duration `json:"estimatedDuration,omitempty"`

	// estimateSource says where the estimate comes from: the cluster's past NodeUpdates
	// (how many), or the updater's defaults.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	EstimateSource string `json:"estimateSource,omitempty"`

	// machines are the machines in the order their nodes would go; machines that would
	// not be upgraded in place come last.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=10000
	Machines []PreviewMachine `json:"machines,omitempty"`

	// conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// UpgradePreview shows, before anything changes, what an in-place upgrade of a Cluster to
// a version would do: per machine in place or replaced and why, the order nodes would go,
// what each node would disrupt (VMs, pods held by a PodDisruptionBudget, volumes), every
// check that would hold it today, and how long it would take. It is computed by the same
// code the run uses to decide, without acting, once per spec generation and again on each
// new value of the refresh annotation.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=upv;upgpreview,categories=cluster-api;capi-inplace
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="InPlace",type=integer,JSONPath=`.status.inPlace`
// +kubebuilder:printcolumn:name="Replaced",type=integer,JSONPath=`.status.replaced`
// +kubebuilder:printcolumn:name="Refused",type=integer,JSONPath=`.status.refused`
// +kubebuilder:printcolumn:name="Held",type=integer,JSONPath=`.status.held`
// +kubebuilder:printcolumn:name="Estimate",type=string,JSONPath=`.status.estimatedDuration`
// +kubebuilder:printcolumn:name="Computed",type=date,JSONPath=`.status.computedTime`
// +kubebuilder:printcolumn:name="Summary",type=string,JSONPath=`.status.summary`,priority=1
type UpgradePreview struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the upgrade to preview.
	// +required
	Spec UpgradePreviewSpec `json:"spec"`

	// status is the preview.
	// +optional
	Status UpgradePreviewStatus `json:"status,omitempty"`
}

// UpgradePreviewList is a list of UpgradePreviews.
// +kubebuilder:object:root=true
type UpgradePreviewList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpgradePreview `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &UpgradePreview{}, &UpgradePreviewList{})
}
