package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TaskAction is what the user asks of an UpgradeTask.
// +kubebuilder:validation:Enum=Ongoing;Abort
type TaskAction string

const (
	// TaskActionOngoing asks the controller to carry the upgrade on.
	TaskActionOngoing TaskAction = "Ongoing"
	// TaskActionAbort asks the controller to stop at the next safe point: in-progress
	// NodeUpdates are aborted, claims are released, nothing new is started. Nodes
	// already upgraded stay upgraded.
	TaskActionAbort TaskAction = "Abort"
)

// Pacing says who chooses the machines of an UpgradeTask and when.
// +kubebuilder:validation:Enum=Extension;External
type Pacing string

const (
	// PacingExtension: the UpgradeTask controller picks the machines, one preflight-checked
	// batch at a time under maxUnavailable.
	PacingExtension Pacing = "Extension"
	// PacingExternal: Cluster API picks the machines (through the UpdateMachine hook) and
	// honours its own maxSurge / maxUnavailable; the controller upgrades the machines it is
	// handed once preflight allows.
	PacingExternal Pacing = "External"
)

// Weekday is a day of the week, in English, capitalised.
// +kubebuilder:validation:Enum=Monday;Tuesday;Wednesday;Thursday;Friday;Saturday;Sunday
type Weekday string

// MaintenanceWindow is a recurring time span during which new nodes may be started.
// A node already started when the window closes is finished.
// +kubebuilder:validation:XValidation:rule="self.start != self.end",message="window start and end must differ; to allow any time, leave spec.window out"
type MaintenanceWindow struct {
	// timeZone is the IANA time zone the window is expressed in, for example
	// Europe/Berlin. Defaults to UTC.
	// +optional
	// +kubebuilder:default=UTC
	// +kubebuilder:validation:MaxLength=64
	TimeZone string `json:"timeZone,omitempty"`

	// days are the days on which the window opens. Empty means every day.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=7
	Days []Weekday `json:"days,omitempty"`

	// start is the time of day the window opens, as HH:MM in 24-hour form.
	// +required
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:XValidation:rule="self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')",message="start must be a time of day as HH:MM, from 00:00 to 23:59"
	Start string `json:"start"`

	// end is the time of day the window closes, as HH:MM in 24-hour form. An end before
	// the start means the window runs past midnight into the next day.
	// +required
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:XValidation:rule="self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')",message="end must be a time of day as HH:MM, from 00:00 to 23:59"
	End string `json:"end"`
}

// UpgradeTaskSpec is the upgrade asked for: which machines, to which version, with which
// updater, and how carefully.
// +kubebuilder:validation:XValidation:rule="has(self.controlPlaneRef) != has(self.machineDeploymentRef)",message="exactly one of spec.controlPlaneRef or spec.machineDeploymentRef must be set"
// +kubebuilder:validation:XValidation:rule="has(self.controlPlaneRef) == has(oldSelf.controlPlaneRef)",message="the target of an UpgradeTask is immutable; create a new task for another target"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phase) || oldSelf.phase != 'Abort' || self.phase == 'Abort'",message="an aborted UpgradeTask cannot be resumed; create a new one"
// +kubebuilder:validation:XValidation:rule="!has(self.controlPlaneRef) || !has(self.maxUnavailable) || type(self.maxUnavailable) != int || self.maxUnavailable <= 1",message="a control plane is upgraded one node at a time (etcd and API server quorum): maxUnavailable must be 1 when controlPlaneRef is set"
type UpgradeTaskSpec struct {
	// clusterName is the name of the CAPI Cluster, in this namespace, whose machines are
	// upgraded.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	ClusterName string `json:"clusterName"`

	// controlPlaneRef names the control plane whose machines are upgraded. Exactly one of
	// controlPlaneRef and machineDeploymentRef is set.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="controlPlaneRef is immutable"
	ControlPlaneRef *ControlPlaneReference `json:"controlPlaneRef,omitempty"`

	// machineDeploymentRef names the MachineDeployment whose machines are upgraded.
	// Exactly one of controlPlaneRef and machineDeploymentRef is set.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="machineDeploymentRef is immutable"
	MachineDeploymentRef *MachineDeploymentReference `json:"machineDeploymentRef,omitempty"`

	// machines restricts the upgrade to these Machines of the target. Empty means every
	// machine of the target that is not at the version yet. With pacing External, Cluster
	// API adds machines here as it hands them over.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	Machines []string `json:"machines,omitempty"`

	// version is the Kubernetes version to upgrade to, as semver, for example v1.33.3 or
	// v1.33.3+rke2r1.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^v?(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)(-[0-9A-Za-z-]+([.][0-9A-Za-z-]+)*)?([+][0-9A-Za-z-]+([.][0-9A-Za-z-]+)*)?$')",message="version must be a semantic version such as v1.33.3 or v1.33.3+rke2r1"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="version is immutable; to change the target, abort this task and create a new one"
	Version string `json:"version"`

	// desiredMachine carries the desired bootstrap and infrastructure objects when the
	// caller gave them; updaters that can apply them read them from here.
	// +optional
	DesiredMachine *DesiredMachine `json:"desiredMachine,omitempty"`

	// updaterRef names the updater configuration that performs the work on each node.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="updaterRef is immutable"
	UpdaterRef UpdaterReference `json:"updaterRef"`

	// phase is what is asked of the task: Ongoing carries the upgrade on, Abort stops it
	// at the next safe point. An aborted task cannot be resumed.
	// +optional
	// +kubebuilder:default=Ongoing
	Phase TaskAction `json:"phase,omitempty"`

	// pacing says who picks the machines: Extension (this controller, under
	// maxUnavailable) or External (Cluster API, through the UpdateMachine hook).
	// +optional
	// +kubebuilder:default=Extension
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="pacing is immutable"
	Pacing Pacing `json:"pacing,omitempty"`

	// maxUnavailable is how many nodes of the target may be unavailable at once, counting
	// nodes that are already NotReady: a whole number of at least 1, or a percentage of
	// the target's machines (rounded down, at least one node). Defaults to 1. A control
	// plane is upgraded one node at a time, whatever this says: a whole number above 1
	// is refused for a control plane, and so is, by request admission, a percentage
	// that comes to more than one of its machines.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="maxUnavailable must be a whole number of at least 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// nodeOrder names nodes to upgrade first, in this order. Other nodes follow in the
	// default order (control plane: oldest machine first; workers: by name).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	NodeOrder []string `json:"nodeOrder,omitempty"`

	// pauseNodes names nodes that must not be started while they are listed. The task
	// waits for them; it does not complete without them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	PauseNodes []string `json:"pauseNodes,omitempty"`

	// paused stops the task from starting new nodes. Nodes already in progress finish.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// window restricts the start of new nodes to a recurring maintenance window.
	// +optional
	Window *MaintenanceWindow `json:"window,omitempty"`

	// postNodeDelay is how long to wait after one node finished before the next is
	// started (a soak time), for example 5m.
	// +optional
	PostNodeDelay *metav1.Duration `json:"postNodeDelay,omitempty"`

	// gates are health gates: each is evaluated before a node starts, and every gate must
	// be green for gateSoak after a node ended before the next starts. A red gate pauses
	// the task (it never fails it; a node in progress goes on) until every gate is green.
	// Gates of the Cluster's inplace.cluster.x-k8s.io/gates annotation are added; a gate
	// here wins over one of the same name there.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Gates []HealthGate `json:"gates,omitempty"`

	// gateSoak is how long every health gate must stay green after a node ended before
	// the next node starts, for example 2m. Zero (the default) means green once.
	// +optional
	GateSoak *metav1.Duration `json:"gateSoak,omitempty"`

	// dryRun computes and shows the plan (order and each machine's preflight result) in
	// status without starting any node.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`

	// notify configures a webhook told when the task starts, a node fails, the task
	// pauses or resumes, and the task ends. Unset means the Cluster's
	// inplace.cluster.x-k8s.io/notify-secret annotation, if any.
	// +optional
	Notify *NotifySpec `json:"notify,omitempty"`

	// drainPolicy says what a node's updater does when the node's drain is blocked (a pod
	// whose eviction a PodDisruptionBudget refuses): Hold (the default), Skip (after a
	// grace period the node is put back, the task goes on with the others and tries it
	// once more at the end) or, only when asked, Evict after a grace period. Unset means the Cluster's
	// inplace.cluster.x-k8s.io/drain-policy annotation, if any. Each NodeUpdate carries
	// the policy it was started with.
	// +optional
	DrainPolicy *DrainPolicy `json:"drainPolicy,omitempty"`
}

// TaskPhase is where an UpgradeTask stands.
// +kubebuilder:validation:Enum=Pending;InProgress;Completed;Failed;Aborting;Aborted;Planned
type TaskPhase string

const (
	// TaskPhasePending: accepted, no node started yet.
	TaskPhasePending TaskPhase = "Pending"
	// TaskPhaseInProgress: at least one node started, not all done.
	TaskPhaseInProgress TaskPhase = "InProgress"
	// TaskPhaseCompleted: every machine of the task reached the version.
	TaskPhaseCompleted TaskPhase = "Completed"
	// TaskPhaseFailed: a node failed; no further node is started.
	TaskPhaseFailed TaskPhase = "Failed"
	// TaskPhaseAborting: abort asked; waiting for in-progress nodes to stop safely.
	TaskPhaseAborting TaskPhase = "Aborting"
	// TaskPhaseAborted: stopped on request; claims released.
	TaskPhaseAborted TaskPhase = "Aborted"
	// TaskPhasePlanned: a dry run whose plan is in status.
	TaskPhasePlanned TaskPhase = "Planned"
)

// IsFinal reports whether the task has ended and will not change any more.
func (p TaskPhase) IsFinal() bool {
	return p == TaskPhaseCompleted || p == TaskPhaseFailed || p == TaskPhaseAborted || p == TaskPhasePlanned
}

// MachineState is where one machine of an UpgradeTask stands.
// +kubebuilder:validation:Enum=Waiting;InProgress;Upgraded;Failed;Aborted;Skipped
type MachineState string

const (
	// MachineStateWaiting: not started yet (queued or held back by a preflight check).
	MachineStateWaiting MachineState = "Waiting"
	// MachineStateInProgress: its NodeUpdate is running.
	MachineStateInProgress MachineState = "InProgress"
	// MachineStateUpgraded: its NodeUpdate succeeded.
	MachineStateUpgraded MachineState = "Upgraded"
	// MachineStateFailed: its NodeUpdate failed.
	MachineStateFailed MachineState = "Failed"
	// MachineStateAborted: its NodeUpdate was aborted, or it was never started before the abort.
	MachineStateAborted MachineState = "Aborted"
	// MachineStateSkipped: its NodeUpdate was skipped (drainPolicy Skip: its drain stayed
	// blocked) and its node put back; the task tries it once more when every other
	// machine is done.
	MachineStateSkipped MachineState = "Skipped"
)

// MachineUpgradeStatus is the state of one machine of an UpgradeTask.
type MachineUpgradeStatus struct {
	// name is the Machine's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// nodeName is the name of the Machine's Node in the workload cluster.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`

	// state is where the machine stands in this task.
	// +required
	State MachineState `json:"state"`

	// order is the machine's place in the planned order, starting at 1.
	// +optional
	Order int32 `json:"order,omitempty"`

	// nodeUpdate is the name of the machine's NodeUpdate, once created.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeUpdate string `json:"nodeUpdate,omitempty"`

	// startTime is when the machine's NodeUpdate was created.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the machine's NodeUpdate ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// message says why the machine waits (the preflight check holding it back) or why it
	// failed (the node's own error).
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	Message string `json:"message,omitempty"`

	// preflight are the results of the preflight checks the last time the machine was
	// considered for a start: every check in a dry run, the failing check otherwise.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Preflight []PreflightCheckStatus `json:"preflight,omitempty"`
}

// PreflightCheckStatus is the outcome of one named preflight check for one machine.
type PreflightCheckStatus struct {
	// name names the check, for example NodeReady, Availability or
	// UpdaterChecks/LonghornVolumesHealthy.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// passed is true when the check does not hold the machine back.
	// +required
	Passed bool `json:"passed"`

	// message says what holds the machine back, when the check did not pass.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
}

// UpgradeTaskStatus shows at a glance how the upgrade is going.
type UpgradeTaskStatus struct {
	// phase is where the task stands.
	// +optional
	Phase TaskPhase `json:"phase,omitempty"`

	// observedGeneration is the spec generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// total is the number of machines in the task.
	// +optional
	Total int32 `json:"total"`

	// upgraded is the number of machines that reached the version.
	// +optional
	Upgraded int32 `json:"upgraded"`

	// inProgress is the number of machines being upgraded now.
	// +optional
	InProgress int32 `json:"inProgress"`

	// failed is the number of machines whose upgrade failed.
	// +optional
	Failed int32 `json:"failed"`

	// waiting is the number of machines not started yet.
	// +optional
	Waiting int32 `json:"waiting"`

	// progress is upgraded/total, for kubectl get.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Progress string `json:"progress,omitempty"`

	// currentNodes lists, comma-separated, the nodes being upgraded now.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	CurrentNodes string `json:"currentNodes,omitempty"`

	// machines is the per-machine state, in the planned order.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=10000
	Machines []MachineUpgradeStatus `json:"machines,omitempty"`

	// startTime is when the first node was started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the task ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// lastNodeCompletionTime is when the last node finished; postNodeDelay counts from here.
	// +optional
	LastNodeCompletionTime *metav1.Time `json:"lastNodeCompletionTime,omitempty"`

	// gates are the results of the health gates (spec.gates and the Cluster's), from their
	// last evaluation.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Gates []HealthGateStatus `json:"gates,omitempty"`

	// conditions are Ready, Progressing, Degraded, Paused, FailureBudgetExhausted and
	// NodesSkipped (True while a node skipped by drainPolicy Skip is not upgraded; only on a
	// task that skipped one).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// UpgradeTask is one in-place upgrade of the machines of a control plane or a
// MachineDeployment to one version, node by node. It is created by capi-inplace's hooks
// or by the in-place-upgrade-to annotation, and can be created by hand.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ut;upgtask,categories=cluster-api;capi-inplace
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Upgraded",type=string,JSONPath=`.status.progress`,description="upgraded/total machines"
// +kubebuilder:printcolumn:name="Current",type=string,JSONPath=`.status.currentNodes`,description="nodes being upgraded now"
// +kubebuilder:printcolumn:name="Paused",type=string,JSONPath=`.status.conditions[?(@.type=="Paused")].reason`,description="why no new node starts (GateRed: a health gate is red)"
// +kubebuilder:printcolumn:name="Red Gates",type=string,JSONPath=`.status.gates[?(@.state=="Red")].name`,description="health gates that are red"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.spec.machineDeploymentRef.name`,priority=1,description="MachineDeployment name (empty for a control plane)"
// +kubebuilder:printcolumn:name="Updater",type=string,JSONPath=`.spec.updaterRef.name`,priority=1
type UpgradeTask struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the upgrade asked for.
	// +required
	Spec UpgradeTaskSpec `json:"spec"`

	// status is how the upgrade is going.
	// +optional
	Status UpgradeTaskStatus `json:"status,omitempty"`
}

// UpgradeTaskList is a list of UpgradeTasks.
// +kubebuilder:object:root=true
type UpgradeTaskList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpgradeTask `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &UpgradeTask{}, &UpgradeTaskList{})
}
