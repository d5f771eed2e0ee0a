package v1alpha1

// Annotations, all under the prefix inplace.cluster.x-k8s.io/.
const (
	// AnnotationPrefix is the prefix of every annotation and label capi-inplace owns.
	AnnotationPrefix = "inplace.cluster.x-k8s.io/"

	// UpdaterAnnotation on a Cluster names the updater configuration for its in-place
	// upgrades, as <Kind>/<name> in the Cluster's namespace, for example
	// HarvesterUpgrader/default. It takes precedence over what a request carries and over
	// the manager's --default-updater.
	UpdaterAnnotation = AnnotationPrefix + "updater"

	// UpgradeToAnnotation, set by the user on a Cluster, control plane, MachineDeployment
	// or Machine, asks for an in-place upgrade to that version.
	UpgradeToAnnotation = AnnotationPrefix + "in-place-upgrade-to"

	// UpgradeStatusAnnotation, set by capi-inplace, says how the asked upgrade stands:
	// in-progress, done or failed.
	UpgradeStatusAnnotation = AnnotationPrefix + "in-place-upgrade-status"

	// UpgradeReleaseAnnotation, set by capi-inplace, is the version an object's machines
	// reached in place. Every upgraded Machine carries it.
	UpgradeReleaseAnnotation = AnnotationPrefix + "in-place-upgrade-release"

	// UpgradeMessageAnnotation, set by capi-inplace, says why an asked upgrade failed or
	// was refused.
	UpgradeMessageAnnotation = AnnotationPrefix + "in-place-upgrade-message"

	// UpgradeTaskAnnotation, set by capi-inplace on a Cluster, control plane,
	// MachineDeployment or Machine, names the UpgradeTask that carries out its asked upgrade.
	UpgradeTaskAnnotation = AnnotationPrefix + "upgrade-task"

	// MachineDeploymentConcurrencyAnnotation on a Cluster says how the cascade upgrades its
	// MachineDeployments: one-at-a-time (the default) or all-at-once.
	MachineDeploymentConcurrencyAnnotation = AnnotationPrefix + "machine-deployment-concurrency"

	// GatesAnnotation on a Cluster is a JSON list of health gates (the type of
	// UpgradeTask spec.gates) added to every UpgradeTask of the Cluster, whichever path
	// created it; a task's own gate of the same name wins.
	GatesAnnotation = AnnotationPrefix + "gates"

	// DrainPolicyAnnotation on a Cluster is a JSON drain policy (the type of UpgradeTask
	// spec.drainPolicy) for every UpgradeTask of the Cluster that sets none, whichever
	// path created it.
	DrainPolicyAnnotation = AnnotationPrefix + "drain-policy"
)

// Values of UpgradeStatusAnnotation.
const (
	// UpgradeStatusInProgress: the asked upgrade is running.
	UpgradeStatusInProgress = "in-progress"
	// UpgradeStatusDone: the asked upgrade finished; UpgradeReleaseAnnotation has the version.
	UpgradeStatusDone = "done"
	// UpgradeStatusFailed: the asked upgrade failed or was refused; UpgradeMessageAnnotation
	// says why.
	UpgradeStatusFailed = "failed"
)

// UpgradeTurnAnnotation on a workload Node says that the owner of the node's Kubernetes
// (Rancher's provisioning, on a Harvester cluster) cordoned it to hand it to its upgrade
// and waits for its NodeUpdate (at a drain hook): the cordon is the upgrade's turn, not
// an operator's. The value names the owner. The NodeSchedulable preflight check passes
// such a node; the disruption budget still counts it as down for every other node. An
// updater sets it while the owner waits, and removes it.
const UpgradeTurnAnnotation = AnnotationPrefix + "upgrade-turn"

// Values of MachineDeploymentConcurrencyAnnotation.
const (
	// MachineDeploymentsOneAtATime upgrades the MachineDeployments of a Cluster one after another.
	MachineDeploymentsOneAtATime = "one-at-a-time"
	// MachineDeploymentsAllAtOnce upgrades the MachineDeployments of a Cluster together.
	MachineDeploymentsAllAtOnce = "all-at-once"
)

// Taints.
const (
	// UpgradePendingTaint, with effect PreferNoSchedule and the task's <namespace>.<name>
	// as its value, is on the workload Node of every machine an UpgradeTask has
	// still to upgrade, from the task's first reconcile until the machine's NodeUpdate
	// ends or the task does (any outcome, or deletion). For pods, kube-scheduler then
	// prefers other nodes: a preference, which a pod's own preferred affinities can
	// outweigh (TaintToleration weighs 3, NodeAffinity and InterPodAffinity 2 each). It
	// is also what marks a node as still to go in a running roll: the Harvester updater
	// confines the live migrations of its evacuation (KubeVirt's addedNodeSelector,
	// v1.6.0 on) to nodes without it, a rule, so that an evacuated VM moves once; where
	// no such node can take the VM, or KubeVirt is older, the preference alone steers it.
	UpgradePendingTaint = AnnotationPrefix + "upgrade-pending"
)

// Labels.
const (
	// UpgradeTaskLabel on a Machine claims it for the named UpgradeTask; on a NodeUpdate it
	// names the UpgradeTask it belongs to. A claim is a label, never an ownerReference, so
	// that garbage collection can never reach a Machine.
	UpgradeTaskLabel = AnnotationPrefix + "upgrade-task"

	// ClusterNameLabel on UpgradeTasks and NodeUpdates names their Cluster, for selection.
	ClusterNameLabel = "cluster.x-k8s.io/cluster-name"

	// NodeUpdaterCRDLabel on a CustomResourceDefinition declares that its kind is an
	// updater configuration served by a controller outside the manager, which follows
	// the NodeUpdate contract at the given version.
	NodeUpdaterCRDLabel = AnnotationPrefix + "node-updater"

	// NodeUpdaterContractVersion is the version of the NodeUpdate contract this API serves.
	NodeUpdaterContractVersion = "v1alpha1"
)

// Finalizers.
const (
	// UpgradeTaskFinalizer keeps an UpgradeTask until its claims on Machines are released.
	UpgradeTaskFinalizer = AnnotationPrefix + "upgradetask"

	// NodeUpdateFinalizer keeps a NodeUpdate until its updater has cleaned up on the node.
	NodeUpdateFinalizer = AnnotationPrefix + "nodeupdate"
)

// Condition types of an UpgradeTask.
const (
	// ReadyCondition is True when the task completed: every machine reached the version.
	// On a NodeUpdate, True when the node succeeded.
	ReadyCondition = "Ready"

	// ProgressingCondition is True while nodes are being upgraded or wait to be.
	ProgressingCondition = "Progressing"

	// DegradedCondition is True when a node failed; the message is the node's error.
	DegradedCondition = "Degraded"

	// PausedCondition is True while the task starts no new node: spec.paused, a closed
	// maintenance window, a soak delay, or a preflight check holding every candidate back.
	PausedCondition = "Paused"
)

// Condition types of a NodeUpdate.
const (
	// UpdaterAvailableCondition is True when the updater named by spec.updaterRef is run
	// by the manager or by an external controller, and its configuration object exists.
	UpdaterAvailableCondition = "UpdaterAvailable"
)

// InPlaceUpgradeUpToDateCondition is capi-inplace's own condition on a CAPI Machine: False
// while the machine waits for or undergoes an in-place upgrade (reasons Waiting,
// InProgress, Failed), True with reason Done once it reached the version. CAPI's own
// UpToDate condition stays CAPI's. It is False for queued and running machines too, so a
// MachineHealthCheck must not match it: use InPlaceUpgradeFailedCondition.
const InPlaceUpgradeUpToDateCondition = "InPlaceUpgradeUpToDate"

// InPlaceUpgradeFailedCondition is capi-inplace's Machine condition that is True only
// while the machine's last in-place upgrade failed (reason Failed, the node's own error as
// message), and absent otherwise: a MachineHealthCheck, which matches a condition's type,
// status and timeout only, can remediate on it (docs/upgradetask.md).
const InPlaceUpgradeFailedCondition = "InPlaceUpgradeFailed"

// SkipRemediationSetByAnnotation marks a Machine on which capi-inplace set Cluster API's
// cluster.x-k8s.io/skip-remediation while its NodeUpdate runs (its node reboots, and a
// MachineHealthCheck must not replace it for that); its value is the task's claim. Only a
// skip-remediation capi-inplace set is removed when the NodeUpdate ends.
const SkipRemediationSetByAnnotation = AnnotationPrefix + "skip-remediation-set-by"

// Condition reasons.
const (
	// WaitingReason: queued, or held back by a preflight check (named in the message).
	WaitingReason = "Waiting"
	// InProgressReason: being upgraded.
	InProgressReason = "InProgress"
	// FailedReason: the upgrade failed; the message is the node's own error.
	FailedReason = "Failed"
	// AbortedReason: the upgrade was aborted.
	AbortedReason = "Aborted"
	// DoneReason: the upgrade finished well.
	DoneReason = "Done"
	// CompletedReason: every machine of a task reached the version.
	CompletedReason = "Completed"
	// PreflightHoldReason: a preflight check holds every candidate node back.
	PreflightHoldReason = "PreflightHold"
	// PausedByUserReason: spec.paused is true.
	PausedByUserReason = "PausedByUser"
	// OutsideWindowReason: the maintenance window is closed.
	OutsideWindowReason = "OutsideWindow"
	// SoakingReason: the postNodeDelay after the previous node has not passed yet.
	SoakingReason = "Soaking"
	// GateRedReason: a health gate (spec.gates or the Cluster's gates) is red, or has not
	// been green for spec.gateSoak since the last node ended.
	GateRedReason = "GateRed"
	// GateGreenReason: a health gate turned green (event).
	GateGreenReason = "GateGreen"
	// DryRunReason: a dry run, nothing is started.
	DryRunReason = "DryRun"
	// UpdaterNotFoundReason: no updater runs for spec.updaterRef's kind, or its object is missing.
	UpdaterNotFoundReason = "UpdaterNotFound"
	// UpdaterFoundReason: the updater runs and its configuration object exists.
	UpdaterFoundReason = "UpdaterFound"
	// TimedOutReason: the NodeUpdate took longer than its timeout.
	TimedOutReason = "TimedOut"
	// StepFailedReason: a step of the NodeUpdate failed.
	StepFailedReason = "StepFailed"
	// AsExpectedReason: nothing to report.
	AsExpectedReason = "AsExpected"
)

// Condition reasons of a NodeUpdate, added with the generic NodeUpdate reconciler.
const (
	// RetriesExhaustedReason: a step kept failing with retryable errors until the bound
	// of attempts was reached.
	RetriesExhaustedReason = "RetriesExhausted"
	// RetryingReason: the current step failed with a retryable error and is tried again
	// at status.nextRetryTime.
	RetryingReason = "Retrying"
	// AbortingReason: the updater is stopping at a safe point and cleaning up.
	AbortingReason = "Aborting"
	// ExternalUpdaterReason: spec.updaterRef names a kind served by a controller outside
	// the manager (its CRD carries NodeUpdaterCRDLabel), which drives the steps and the result.
	ExternalUpdaterReason = "ExternalUpdater"
	// UpdaterErrorReason: the manager could not tell whether the updater is available,
	// for example because reading its configuration object failed.
	UpdaterErrorReason = "UpdaterError"
)

// Annotations of the UpgradeTask controller and request admission.
const (
	// RequestHashAnnotation on an UpgradeTask is a digest of the request that created it
	// (target, version, machines, updater, options). The same request finds the same task;
	// a different request for the same target aborts it and creates a new one.
	RequestHashAnnotation = AnnotationPrefix + "request-hash"
)

// Event reasons of the UpgradeTask controller, besides the condition reasons above.
const (
	// NodeStartedReason: a NodeUpdate was created for a machine.
	NodeStartedReason = "NodeStarted"
	// NodeUpgradedReason: a machine's NodeUpdate succeeded.
	NodeUpgradedReason = "NodeUpgraded"
	// NodeFailedReason: a machine's NodeUpdate failed.
	NodeFailedReason = "NodeFailed"
	// NodeHeldReason: a preflight check holds a machine back; the message names it.
	NodeHeldReason = "NodeHeld"
	// MachineClaimedReason: a machine was claimed for the task.
	MachineClaimedReason = "MachineClaimed"
	// SupersededReason: a newer request for the same target aborted this task.
	SupersededReason = "Superseded"
	// MachineDeletedReason: the machine is being deleted (scale down, remediation); its
	// NodeUpdate is aborted at a safe point, and that is not a failure of the task.
	MachineDeletedReason = "MachineDeleted"
	// TaskAbortedReason: the NodeUpdate's UpgradeTask was aborted.
	TaskAbortedReason = "TaskAborted"
	// TaskDeletedReason: the NodeUpdate's UpgradeTask was deleted.
	TaskDeletedReason = "TaskDeleted"
	// VersionSkewReason: a worker task waits until its control plane runs the target, so
	// that no kubelet is newer than the API server.
	VersionSkewReason = "VersionSkew"
	// DuplicateTaskReason: another live task has the same target; this one waits for it.
	DuplicateTaskReason = "DuplicateTask"
)

// Annotations and event reasons of the in-place-upgrade-to annotation cascade
// (docs/annotations.md). The events are recorded on the annotated object.
const (
	// UpgradeProgressAnnotation, set by capi-inplace on a control plane, MachineDeployment or
	// Machine whose asked upgrade has an UpgradeTask, mirrors the task's progress as
	// upgraded/total machines.
	UpgradeProgressAnnotation = AnnotationPrefix + "in-place-upgrade-progress"

	// InPlaceUpgradeInProgressReason: an asked upgrade started; on a Cluster, also each
	// control plane or MachineDeployment the cascade asked in turn.
	InPlaceUpgradeInProgressReason = "InPlaceUpgradeInProgress"
	// InPlaceUpgradeDoneReason: an asked upgrade finished; the release annotation has the version.
	InPlaceUpgradeDoneReason = "InPlaceUpgradeDone"
	// InPlaceUpgradeFailedReason: an asked upgrade failed or was refused; the message says why.
	InPlaceUpgradeFailedReason = "InPlaceUpgradeFailed"
	// InPlaceUpgradeAbortedReason: an asked upgrade was aborted, because in-place-upgrade-to
	// was removed or a newer request for the same target superseded it.
	InPlaceUpgradeAbortedReason = "InPlaceUpgradeAborted"
)

// Fields.
const (
	// NodeUpdateMachineNameField selects NodeUpdates by spec.machineName: a selectable
	// field of the CRD (kubectl get nu --field-selector spec.machineName=m), and the name
	// of the manager's cache index of the same field.
	NodeUpdateMachineNameField = "spec.machineName"
)

// The failure budget of a Cluster (docs/upgradetask.md, "Failure budget"): how many nodes
// of the Cluster's UpgradeTasks may fail before every task of the Cluster starts no new
// node, and how a person lifts it.
const (
	// FailureBudgetAnnotation, on a CAPI Cluster, is how many failed nodes (NodeUpdates of
	// the Cluster's UpgradeTasks that ended Failed) the Cluster tolerates before every
	// task of the Cluster stops starting nodes: a whole number of at least 1; 1 when
	// absent, and 1 (with a Warning) when it is not such a number.
	FailureBudgetAnnotation = AnnotationPrefix + "failure-budget"
	// FailureBudgetResetAnnotation, on a CAPI Cluster, lifts the failure budget: an
	// RFC3339 time; failures that ended at or before it no longer count.
	FailureBudgetResetAnnotation = AnnotationPrefix + "failure-budget-reset"

	// FailureBudgetExhaustedCondition is True on an UpgradeTask while its Cluster's failure
	// budget is exhausted; its message names the failed nodes and how to lift it. False
	// otherwise, with the count so far, or with reason InvalidFailureBudget when an
	// annotation of the budget is not usable.
	FailureBudgetExhaustedCondition = "FailureBudgetExhausted"
	// FailureBudgetExhaustedReason: the Cluster's failed nodes reached its failure budget;
	// no task of the Cluster starts a new node until a person lifts it.
	FailureBudgetExhaustedReason = "FailureBudgetExhausted"
	// InvalidDrainPolicyReason: the Cluster's drain-policy annotation is not usable; the
	// task starts no node until it is fixed or removed.
	InvalidDrainPolicyReason = "InvalidDrainPolicy"

	// DrainBlockedCondition on a NodeUpdate is True while a pod whose eviction a
	// PodDisruptionBudget refuses keeps the node's drain from ending; its message names
	// the pods and what the drain policy does about them. It turns False when no pod
	// blocks the drain any more, with the reason saying how.
	DrainBlockedCondition = "DrainBlocked"
	// DrainHeldReason: the drain is blocked and the policy is Hold: the node waits until
	// the pods can be evicted or its drain step times out.
	DrainHeldReason = "DrainHeld"
	// EvictionPendingReason: the drain is blocked and the policy is Evict: the blocking
	// pods are deleted, their budgets ignored, once the grace period has passed.
	EvictionPendingReason = "EvictionPending"
	// BlockingPodsDeletedReason: the policy Evict deleted the pods that blocked the drain,
	// ignoring their PodDisruptionBudgets; one event per pod names it.
	BlockingPodsDeletedReason = "BlockingPodsDeleted"
	// BlockingVMsStoppedReason: the policy Evict stopped the virtual machines whose live
	// migration off the node failed, as Harvester's own upgrade does; they are started
	// again once the node is upgraded.
	BlockingVMsStoppedReason = "BlockingVMsStopped"
	// SkipPendingReason: the drain is blocked and the policy is Skip: the node is put
	// back and skipped once the drain has been blocked for the grace period.
	SkipPendingReason = "SkipPending"
	// DrainUnblockedReason: the pods that blocked the drain could be evicted after all.
	DrainUnblockedReason = "DrainUnblocked"
	// NodeSkippedReason: the drain was blocked for longer than the grace period of
	// drainPolicy Skip; the node is put back and its NodeUpdate ends Skipped. It is the
	// DrainBlocked condition's reason, the failureReason and the Ready condition's reason
	// of the Skipped NodeUpdate, and the reason of the events.
	NodeSkippedReason = "NodeSkipped"
	// NodesSkippedCondition on an UpgradeTask is True while a machine's NodeUpdate was
	// skipped (drainPolicy Skip) and the machine is not upgraded; its message names each
	// node and what blocked its drain. False (reason Done) once every skipped machine was
	// upgraded when tried again; absent on a task none of whose machines was skipped.
	NodesSkippedCondition = "NodesSkipped"
	// SkippedAgainReason: a machine was skipped again when the task came back to it
	// after every other machine; the task fails with it.
	SkippedAgainReason = "SkippedAgain"
	// InvalidFailureBudgetReason: an annotation of the Cluster's failure budget is not
	// usable; the message names the value and what is used instead.
	InvalidFailureBudgetReason = "InvalidFailureBudget"
)
