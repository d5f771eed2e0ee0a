package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// UpgradePlanPhase is where an UpgradePlan is in its run. The phases follow
// upgrade-toolkit's UpgradePlan (shared/facts/harvester-node-upgrade.md, facts 44-56),
// with the ISO download folded into the repository: capi-inplace's repository downloads
// the ISO itself, or reads a VirtualMachineImage, or is an existing one.
// +kubebuilder:validation:Enum=Initializing;RepoCreating;MetadataPopulating;ImagePreloading;ClusterUpgrading;NodeUpgrading;ImageCleaning;CleaningUp;Succeeded;Failed
type UpgradePlanPhase string

const (
	// UpgradePlanInitializing runs the preflight checks (status.preflight); a failing
	// check holds the plan here, Degraded, and is looked at again.
	UpgradePlanInitializing UpgradePlanPhase = "Initializing"
	// UpgradePlanRepoCreating deploys the release's upgrade repository on the cluster
	// (nothing with release.repositoryURL) and waits until it serves.
	UpgradePlanRepoCreating UpgradePlanPhase = "RepoCreating"
	// UpgradePlanMetadataPopulating reads harvester-release.yaml into
	// status.releaseMetadata and checks the release installs over the running one
	// (unless spec.force).
	UpgradePlanMetadataPopulating UpgradePlanPhase = "MetadataPopulating"
	// UpgradePlanImagePreloading pulls the release's images onto every node at once
	// (spec.imagePreload.concurrency at a time), before any node is disrupted.
	UpgradePlanImagePreloading UpgradePlanPhase = "ImagePreloading"
	// UpgradePlanClusterUpgrading runs the cluster upgrade Job on the cluster: Rancher,
	// the cluster repository and Harvester's charts (status.clusterUpgrade).
	UpgradePlanClusterUpgrading UpgradePlanPhase = "ClusterUpgrading"
	// UpgradePlanNodeUpgrading lets the nodes go (their NodeUpdates wait until here) and
	// waits until every node of the cluster is at the release (status.nodes).
	UpgradePlanNodeUpgrading UpgradePlanPhase = "NodeUpgrading"
	// UpgradePlanImageCleaning removes the previous release's images from the nodes, one
	// node at a time.
	UpgradePlanImageCleaning UpgradePlanPhase = "ImageCleaning"
	// UpgradePlanCleaningUp removes what the plan created on the cluster: the
	// repository, its volume and Service, the Plans and the Job.
	UpgradePlanCleaningUp UpgradePlanPhase = "CleaningUp"
	// UpgradePlanSucceeded: every node is at the release and nothing of the plan is left.
	UpgradePlanSucceeded UpgradePlanPhase = "Succeeded"
	// UpgradePlanFailed: the plan cannot go on (status.message says why); what it
	// created is removed. Delete it to start again.
	UpgradePlanFailed UpgradePlanPhase = "Failed"
)

// Condition types of an UpgradePlan, as upgrade-toolkit reports them (fact 44).
const (
	// UpgradePlanAvailable is True once the plan succeeded: the release is installed.
	UpgradePlanAvailable = "Available"
	// UpgradePlanProgressing is True while the plan runs.
	UpgradePlanProgressing = "Progressing"
	// UpgradePlanDegraded is True while something holds or failed the plan (a preflight
	// check, an ineligible release, a failed Job or node); the message says what.
	UpgradePlanDegraded = "Degraded"
)

// ImagePreloadOption says how the cluster preloads the release's images.
type ImagePreloadOption struct {
	// concurrency is how many nodes preload at once: unset or 0 is every node, a
	// positive number is at most that many, a negative number skips the cluster's
	// preload (each node then preloads in its own turn, before it is drained, unless
	// the HarvesterUpgrader's preloadImages is false).
	// +optional
	Concurrency *int32 `json:"concurrency,omitempty"`
}

// UpgradePlanSpec says which cluster goes to which release, with which HarvesterUpgrader.
// +kubebuilder:validation:XValidation:rule="self.clusterName == oldSelf.clusterName && self.upgraderName == oldSelf.upgraderName && self.version == oldSelf.version",message="clusterName, upgraderName and version are immutable: create another UpgradePlan"
type UpgradePlanSpec struct {
	// clusterName is the CAPI Cluster (in this namespace) to upgrade.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ClusterName string `json:"clusterName"`

	// upgraderName is the HarvesterUpgrader (in this namespace) whose release, images
	// and settings the plan uses; its release.version must be spec.version.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	UpgraderName string `json:"upgraderName"`

	// version is the Harvester release, for example v1.6.0.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^v[0-9]+[.][0-9]+[.][0-9]+(-[0-9A-Za-z.-]+)?$')",message="version must be a Harvester version such as v1.6.0"
	Version string `json:"version"`

	// force installs the release even if its metadata says it does not install over
	// the running one (minUpgradableVersion), as upgrade-toolkit's spec.force skips its
	// version guard.
	// +optional
	Force bool `json:"force,omitempty"`

	// imagePreload says how the cluster preloads the release's images.
	// +optional
	ImagePreload ImagePreloadOption `json:"imagePreload,omitempty"`

	// nodeSelector selects the nodes of the workload cluster the plan covers (preloads,
	// counts and waits for); unset is every node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// PhaseTransition is when the plan entered a phase.
type PhaseTransition struct {
	// phase is the phase entered.
	// +required
	Phase UpgradePlanPhase `json:"phase"`
	// time is when.
	// +required
	Time metav1.Time `json:"time"`
}

// CheckResult is the outcome of one preflight check.
// +kubebuilder:validation:Enum=Passed;Failed;Skipped
type CheckResult string

const (
	// CheckPassed: the check holds.
	CheckPassed CheckResult = "Passed"
	// CheckFailed: the check does not hold; the plan waits in Initializing.
	CheckFailed CheckResult = "Failed"
	// CheckSkipped: the plan's skip annotation for the check is set.
	CheckSkipped CheckResult = "Skipped"
)

// PreflightCheck is one of the cluster's preflight checks.
type PreflightCheck struct {
	// name names the check, for example ImageGCDiskSpace; the annotation
	// skip-check.harvester.inplace.cluster.x-k8s.io/<name>: "true" skips it.
	// +required
	Name string `json:"name"`
	// result is Passed, Failed or Skipped.
	// +required
	Result CheckResult `json:"result"`
	// message says what failed and what to do, or why it was skipped.
	// +optional
	Message string `json:"message,omitempty"`
}

// ClusterUpgradeStep is one sub-step of the ClusterUpgrading phase: the cluster upgrade
// Job's, as the Job reports it, or the plan's own.
type ClusterUpgradeStep struct {
	// name names the sub-step, for example UpgradeHarvesterChart.
	// +required
	Name string `json:"name"`
	// state is Pending, Running, Done, Skipped or Failed.
	// +required
	State string `json:"state"`
	// message says what the sub-step did or waits for.
	// +optional
	Message string `json:"message,omitempty"`
}

// ReleaseInfo is the release metadata the repository serves (harvester-release.yaml).
type ReleaseInfo struct {
	// harvester is the release's Harvester version.
	Harvester string `json:"harvester,omitempty"`
	// harvesterChart is the Harvester chart's version.
	HarvesterChart string `json:"harvesterChart,omitempty"`
	// os is the operating system, for example "Harvester v1.6.0".
	OS string `json:"os,omitempty"`
	// kubernetes is the RKE2 version.
	Kubernetes string `json:"kubernetes,omitempty"`
	// rancher is the embedded Rancher's version.
	Rancher string `json:"rancher,omitempty"`
	// kubevirt is the KubeVirt version the release ships; the cluster upgrade waits for
	// it to be deployed. Empty when the metadata names none.
	KubeVirt string `json:"kubevirt,omitempty"`
	// monitoringChart is the version of the rancher-monitoring charts the release ships.
	// +optional
	MonitoringChart string `json:"monitoringChart,omitempty"`
	// loggingChart is the version of the rancher-logging charts the release ships.
	// +optional
	LoggingChart string `json:"loggingChart,omitempty"`
	// loggingChartHarvesterEventRouter is the eventrouter image the release's
	// rancher-logging add-on runs.
	// +optional
	LoggingChartHarvesterEventRouter string `json:"loggingChartHarvesterEventRouter,omitempty"`
	// rancherDependencies are the versions of the Fleet and rancher-webhook charts that
	// Rancher installs itself; the cluster upgrade waits for them after Rancher's.
	// +optional
	RancherDependencies *RancherDependencies `json:"rancherDependencies,omitempty"`
	// minUpgradableVersion is the oldest Harvester version the release installs over.
	MinUpgradableVersion string `json:"minUpgradableVersion,omitempty"`
}

// RancherDependencies are the charts Rancher installs itself, as the release metadata
// names them (rancherDependencies).
type RancherDependencies struct {
	// fleet is the fleet chart.
	// +optional
	Fleet ChartVersions `json:"fleet,omitempty"`
	// fleetCRD is the fleet-crd chart.
	// +optional
	FleetCRD ChartVersions `json:"fleetCRD,omitempty"`
	// rancherWebhook is the rancher-webhook chart.
	// +optional
	RancherWebhook ChartVersions `json:"rancherWebhook,omitempty"`
}

// ChartVersions are a chart's version and the app version Helm records for it.
type ChartVersions struct {
	// chart is the chart's version.
	// +optional
	Chart string `json:"chart,omitempty"`
	// app is the chart's app version.
	// +optional
	App string `json:"app,omitempty"`
}

// NodeRole is a node's part in a Harvester cluster, which orders the node upgrades:
// management nodes first, then the witness, then workers.
// +kubebuilder:validation:Enum=Management;Witness;Worker
type NodeRole string

const (
	// NodeRoleManagement runs the control plane and etcd.
	NodeRoleManagement NodeRole = "Management"
	// NodeRoleWitness runs etcd only (node-role.harvesterhci.io/witness=true).
	NodeRoleWitness NodeRole = "Witness"
	// NodeRoleWorker runs workloads only.
	NodeRoleWorker NodeRole = "Worker"
)

// NodeUpgradeStatus is one node of the cluster as the plan sees it.
type NodeUpgradeStatus struct {
	// name is the node.
	// +required
	Name string `json:"name"`
	// role is Management, Witness or Worker.
	// +optional
	Role NodeRole `json:"role,omitempty"`
	// state is ImagePreloaded until the node's NodeUpdate starts, then the NodeUpdate's
	// phase and step (Running/Drain), and AtRelease once the node runs the release.
	// +optional
	State string `json:"state,omitempty"`
	// nodeUpdate is the NodeUpdate upgrading the node, if any.
	// +optional
	NodeUpdate string `json:"nodeUpdate,omitempty"`
	// message is the NodeUpdate's message or failure.
	// +optional
	Message string `json:"message,omitempty"`
}

// UpgradePlanStatus is where the plan is.
type UpgradePlanStatus struct {
	// observedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is the current phase.
	// +optional
	Phase UpgradePlanPhase `json:"phase,omitempty"`

	// conditions are Available, Progressing and Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// phaseTransitionTimestamps says when each phase was entered, in order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	PhaseTransitionTimestamps []PhaseTransition `json:"phaseTransitionTimestamps,omitempty"`

	// previousVersion is the Harvester version the cluster ran when the plan started.
	// +optional
	PreviousVersion string `json:"previousVersion,omitempty"`

	// releaseMetadata is the release as its repository describes it.
	// +optional
	ReleaseMetadata *ReleaseInfo `json:"releaseMetadata,omitempty"`

	// singleNode is true for a cluster of one node: it is not drained (nowhere to drain
	// to), its virtual machines are shut down and started again.
	// +optional
	SingleNode bool `json:"singleNode,omitempty"`

	// preflight are the results of the preflight checks, last run.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Preflight []PreflightCheck `json:"preflight,omitempty"`

	// clusterUpgrade are the sub-steps of the ClusterUpgrading phase in the order they
	// run: the plan's own before the cluster upgrade Job (FreeV2Volumes,
	// PlaceRestartGuard), the Job's, then the plan's own after it (StartStoppedVMs,
	// RaiseReplicaReplenishment, DisableDescheduler, SkipMultusManifest).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=48
	ClusterUpgrade []ClusterUpgradeStep `json:"clusterUpgrade,omitempty"`

	// nodes are the cluster's nodes, management first, then witness, then workers.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	Nodes []NodeUpgradeStatus `json:"nodes,omitempty"`

	// upgraderConfig is the HarvesterUpgrader the plan runs with, fixed when it started
	// (its name, generation and spec, images resolved): editing the HarvesterUpgrader
	// afterwards does not change a running plan.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	UpgraderConfig *runtime.RawExtension `json:"upgraderConfig,omitempty"`

	// upgraded is how many of the nodes run the release, as "n/total".
	// +optional
	Upgraded string `json:"upgraded,omitempty"`

	// message says what the plan does or waits for now.
	// +optional
	Message string `json:"message,omitempty"`
}

// UpgradePlan is one Harvester cluster's upgrade to one release: the cluster-level work
// done once (repository, release metadata, image preload on every node, the cluster
// upgrade of Rancher and Harvester's charts), then the nodes (each by its NodeUpdate,
// which waits for the plan), then image cleanup and cleanup. The Harvester updater
// creates it for the first node of a cluster and release, named <cluster>-<version>;
// it can be created by hand ahead of the nodes, to run the cluster part first.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hup,categories=cluster-api;capi-inplace
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Upgraded",type=string,JSONPath=`.status.upgraded`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.conditions[?(@.type=="Available")].status`
// +kubebuilder:printcolumn:name="Progressing",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Previous",type=string,JSONPath=`.status.previousVersion`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
type UpgradePlan struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says which cluster goes to which release.
	// +required
	Spec UpgradePlanSpec `json:"spec"`

	// status is where the plan is.
	// +optional
	Status UpgradePlanStatus `json:"status,omitempty"`
}

// UpgradePlanList is a list of UpgradePlans.
// +kubebuilder:object:root=true
type UpgradePlanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpgradePlan `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &UpgradePlan{}, &UpgradePlanList{})
}
