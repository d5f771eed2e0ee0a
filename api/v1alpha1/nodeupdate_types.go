package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// NodeUpdatePhase is where a NodeUpdate stands.
// +kubebuilder:validation:Enum=Pending;InProgress;Succeeded;Failed;Aborted;Skipped
type NodeUpdatePhase string

const (
	// NodeUpdatePhasePending: created, the updater has not started yet.
	NodeUpdatePhasePending NodeUpdatePhase = "Pending"
	// NodeUpdatePhaseInProgress: the updater is working on the node.
	NodeUpdatePhaseInProgress NodeUpdatePhase = "InProgress"
	// NodeUpdatePhaseSucceeded: the node is at the target version.
	NodeUpdatePhaseSucceeded NodeUpdatePhase = "Succeeded"
	// NodeUpdatePhaseFailed: the updater gave up; failureReason and failureMessage say why.
	NodeUpdatePhaseFailed NodeUpdatePhase = "Failed"
	// NodeUpdatePhaseAborted: stopped on request at a safe point; what the updater
	// created for this node is cleaned up.
	NodeUpdatePhaseAborted NodeUpdatePhase = "Aborted"
	// NodeUpdatePhaseSkipped: its drain was blocked for longer than the grace period of
	// drainPolicy Skip, and the node was put back (drain stopped, uncordoned, what was
	// stopped restored, its Plans removed); failureReason is NodeSkipped and
	// failureMessage names the pods that blocked the drain and their budgets. Not a
	// failure: the node was not upgraded and nothing of the upgrade runs on it.
	NodeUpdatePhaseSkipped NodeUpdatePhase = "Skipped"
)

// IsFinal reports whether the NodeUpdate has ended and will not change any more.
func (p NodeUpdatePhase) IsFinal() bool {
	return p == NodeUpdatePhaseSucceeded || p == NodeUpdatePhaseFailed || p == NodeUpdatePhaseAborted || p == NodeUpdatePhaseSkipped
}

// StepState is where one step of a NodeUpdate stands.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;Skipped;Aborted
type StepState string

const (
	// StepStatePending: not started.
	StepStatePending StepState = "Pending"
	// StepStateRunning: started, not finished.
	StepStateRunning StepState = "Running"
	// StepStateSucceeded: finished well.
	StepStateSucceeded StepState = "Succeeded"
	// StepStateFailed: finished badly; the NodeUpdate fails with it.
	StepStateFailed StepState = "Failed"
	// StepStateSkipped: not needed for this node; the message says why.
	StepStateSkipped StepState = "Skipped"
	// StepStateAborted: stopped by an abort.
	StepStateAborted StepState = "Aborted"
)

// NodeUpdateStep is one step of a node's upgrade, in the order the updater runs them.
type NodeUpdateStep struct {
	// name is the step's name, for example Repository, KubernetesUpgrade, OSUpgrade.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// state is where the step stands.
	// +required
	State StepState `json:"state"`

	// startTime is when the step started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the step ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// message says what the step is doing or why it ended as it did.
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	Message string `json:"message,omitempty"`
}

// NodeUpdateSpec is the upgrade of one node: which, to what, by which updater.
type NodeUpdateSpec struct {
	// clusterName is the name of the CAPI Cluster, in this namespace, the node belongs to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	ClusterName string `json:"clusterName"`

	// machineName is the name of the CAPI Machine whose node is upgraded.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="machineName is immutable"
	MachineName string `json:"machineName"`

	// nodeName is the name of the Node in the workload cluster.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`

	// version is the Kubernetes version the node is upgraded to, as semver, for example
	// v1.33.3 or v1.33.3+rke2r1.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^v?(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)(-[0-9A-Za-z-]+([.][0-9A-Za-z-]+)*)?([+][0-9A-Za-z-]+([.][0-9A-Za-z-]+)*)?$')",message="version must be a semantic version such as v1.33.3 or v1.33.3+rke2r1"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="version is immutable; create a new NodeUpdate for another version"
	Version string `json:"version"`

	// desiredMachine carries the desired bootstrap and infrastructure objects when the
	// upgrade was asked with them.
	// +optional
	DesiredMachine *DesiredMachine `json:"desiredMachine,omitempty"`

	// updaterRef names the updater configuration that performs the work, for example
	// HarvesterUpgrader/default.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="updaterRef is immutable"
	UpdaterRef UpdaterReference `json:"updaterRef"`

	// phase is what is asked: Ongoing carries the update on, Abort stops it at the next
	// safe point and cleans up. An aborted NodeUpdate cannot be resumed.
	// +optional
	// +kubebuilder:default=Ongoing
	Phase TaskAction `json:"phase,omitempty"`

	// abortReason says why an abort was asked, for example MachineDeleted (the Machine is
	// being deleted), TaskAborted, TaskDeleted or Superseded. It is set with phase Abort
	// and shown on the aborted NodeUpdate's conditions and events.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9]*$`
	AbortReason string `json:"abortReason,omitempty"`

	// drainPolicy is what the updater does when the node's drain is blocked, copied from
	// the UpgradeTask (or its Cluster's annotation) when the NodeUpdate was created. Unset
	// means Hold.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="drainPolicy is immutable"
	DrainPolicy *DrainPolicy `json:"drainPolicy,omitempty"`
}

// NodeUpdateStatus tells the story of the node's upgrade.
type NodeUpdateStatus struct {
	// phase is where the NodeUpdate stands.
	// +optional
	Phase NodeUpdatePhase `json:"phase,omitempty"`

	// observedGeneration is the spec generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// currentStep is the name of the step running now, or the step that failed.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	CurrentStep string `json:"currentStep,omitempty"`

	// steps are the updater's steps for this node, in order.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Steps []NodeUpdateStep `json:"steps,omitempty"`

	// attempts is how many times the current step has been tried: 1 on its first try,
	// one more after each retryable error. It starts again at 1 when the updater moves on
	// to another step. When it would exceed the manager's bound, the NodeUpdate fails
	// with reason RetriesExhausted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempts int32 `json:"attempts,omitempty"`

	// lastError is the text of the last retryable error of the current step; it is kept
	// until the step moves on, so a person sees what is being retried.
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	LastError string `json:"lastError,omitempty"`

	// lastAttemptTime is when the current step was last tried after a retryable error.
	// +optional
	LastAttemptTime *metav1.MicroTime `json:"lastAttemptTime,omitempty"`

	// nextRetryTime is when the current step is tried again after a retryable error. The
	// updater is not called before then, also not after a restart of the manager.
	// +optional
	NextRetryTime *metav1.MicroTime `json:"nextRetryTime,omitempty"`

	// abortStartTime is when the manager started to abort the NodeUpdate, on request
	// (spec.phase Abort), on timeout, on deletion, or to clean up after a failure
	// (failureReason set): the NodeUpdate is final once the updater has cleaned up.
	// +optional
	AbortStartTime *metav1.MicroTime `json:"abortStartTime,omitempty"`

	// startTime is when the updater started on the node.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// lastCheckTime is when the updater last judged, right before the node's first
	// disruption, whether the cluster can let it go now (the Harvester updater: no other
	// upgrader, control-plane quorum, version skew, Longhorn's roll settled and its volumes
	// with a healthy replica off every node down now), whether that held the node or let it
	// go; the step's message says what was found. Unset for an updater that disrupts the
	// node as soon as it starts, right after the pick-time preflight.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`

	// completionTime is when the NodeUpdate ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// failureReason is a short, machine-readable reason of the failure, for example
	// StepFailed, TimedOut, RetriesExhausted, or a reason of the updater's own such as
	// BackoffLimitExceeded. While phase is still InProgress, a failureReason means the
	// NodeUpdate is failing and the updater is cleaning up. NodeSkipped is not a failure:
	// the node is being put back (drainPolicy Skip), and the phase ends Skipped.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	FailureReason string `json:"failureReason,omitempty"`

	// failureMessage is the node's own error, for a person to read.
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	FailureMessage string `json:"failureMessage,omitempty"`

	// conditions are Ready, Progressing and UpdaterAvailable.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// updaterConfig is the configuration the updater upgrades this node with, fixed
	// when it started the node: editing the updater's configuration afterwards changes
	// the nodes not yet started, never this one. Its content is the updater's (the
	// Harvester updater's: the HarvesterUpgrader's name, generation and spec).
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	UpdaterConfig *runtime.RawExtension `json:"updaterConfig,omitempty"`
}

// NodeUpdate is the in-place upgrade of one node, carried out by the updater its
// updaterRef names. It is created by an UpgradeTask, which owns it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=nu,categories=cluster-api;capi-inplace
// +kubebuilder:selectablefield:JSONPath=`.spec.machineName`
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Step",type=string,JSONPath=`.status.currentStep`
// +kubebuilder:printcolumn:name="Attempts",type=integer,JSONPath=`.status.attempts`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.failureReason`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.failureMessage`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeUpdate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the upgrade asked for this node.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phase) || oldSelf.phase != 'Abort' || self.phase == 'Abort'",message="an aborted NodeUpdate cannot be resumed; create a new one"
	Spec NodeUpdateSpec `json:"spec"`

	// status is the story of the node's upgrade.
	// +optional
	Status NodeUpdateStatus `json:"status,omitempty"`
}

// NodeUpdateList is a list of NodeUpdates.
// +kubebuilder:object:root=true
type NodeUpdateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeUpdate `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &NodeUpdate{}, &NodeUpdateList{})
}
