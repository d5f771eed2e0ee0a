package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Release says where the Harvester release to install comes from: an ISO that the
// upgrade repository downloads and serves, a Harvester VirtualMachineImage of the ISO
// that the upgrade repository serves, or a repository that already serves it.
// +kubebuilder:validation:XValidation:rule="[has(self.isoURL), has(self.repositoryURL), has(self.image)].filter(x, x).size() == 1",message="set exactly one of release.isoURL (with release.isoChecksum), release.repositoryURL or release.image"
// +kubebuilder:validation:XValidation:rule="!has(self.isoURL) || has(self.isoChecksum)",message="release.isoChecksum is required with release.isoURL: the repository refuses an ISO it cannot verify"
type Release struct {
	// version is the Harvester version of the release, for example v1.8.1. The release
	// metadata served by the repository must say the same. It is also the SUC Plans'
	// version, which SUC writes into a label of each Job: at most 63 characters. It must
	// be a formal release that a supported hop leads to (releases.CheckTarget: v1.7.x or
	// v1.8.x; the UpgradePlan checks the whole hop from the nodes' version).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^v[0-9]+[.][0-9]+[.][0-9]+(-[0-9A-Za-z.-]+)?$')",message="release.version must be a Harvester version such as v1.8.1"
	// +kubebuilder:validation:XValidation:rule="self.matches('^v1[.](7|8)[.][0-9]+$')",message="release.version must be a formal Harvester release capi-inplace upgrades to, v1.7.x or v1.8.x (no pre-release): the supported hops are v1.7.x -> v1.8.x and patch upgrades inside v1.7 and v1.8 (docs/harvester.md, Supported hops)"
	Version string `json:"version"`

	// isoURL is the http(s) URL of the Harvester ISO. The repository's leader pod
	// downloads it once per cluster and version.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[^ ]+$')",message="release.isoURL must be an http:// or https:// URL"
	ISOURL string `json:"isoURL,omitempty"`

	// isoChecksum is the SHA-512 of the ISO, as 128 hexadecimal digits (Harvester
	// publishes it beside each ISO).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-fA-F]{128}$')",message="release.isoChecksum must be a SHA-512 checksum: 128 hexadecimal digits"
	ISOChecksum string `json:"isoChecksum,omitempty"`

	// repositoryURL is the base URL of an existing upgrade repository (air-gapped or
	// external) that serves harvester-release.yaml and the release's files, reachable
	// from the nodes. No repository is deployed when it is set.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[^ ]+$')",message="release.repositoryURL must be an http:// or https:// URL"
	RepositoryURL string `json:"repositoryURL,omitempty"`

	// image is an existing Harvester VirtualMachineImage of the release ISO, as
	// <namespace>/<name>, as the image of Harvester's own upgrade (its Upgrade's and
	// upgrade-toolkit's spec.image). The upgrade repository serves the ISO from the
	// image's volume and downloads nothing: the image must be imported with the cdi
	// backend and the annotation harvesterhci.io/os-upgrade-image: "True", which is what
	// makes Harvester give it a ReadWriteMany file system volume, named as the image,
	// holding the ISO as disk.img. It must be in harvester-system, where the repository
	// runs, since a pod mounts volumes of its own namespace only.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$')",message="release.image must be <namespace>/<name> of a VirtualMachineImage, such as harvester-system/harvester-v1.6.0"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('harvester-system/')",message="release.image must be in the namespace harvester-system, where the upgrade repository runs: a pod mounts volumes of its own namespace only"
	Image string `json:"image,omitempty"`
}

// Images are the container images the Harvester updater runs. The updater tags every
// image of its SUC Plans itself, so that SUC never does (SUC tags an untagged image with
// the Plan's version, which for the RKE2 Plan is a Kubernetes version): an image given
// with a tag or digest is used as it is.
type Images struct {
	// rke2Upgrade is the rancher/rke2-upgrade image; untagged, it gets the target
	// Kubernetes version with '+' replaced by '-' (v1.33.3-rke2r1).
	// +optional
	// +kubebuilder:default="rancher/rke2-upgrade"
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^ ]+$')",message="images.rke2Upgrade must be an image reference without spaces"
	RKE2Upgrade string `json:"rke2Upgrade,omitempty"`

	// node is the capi-inplace image whose node program (`capi-inplace node ...`) does
	// the work on the nodes: the repository's downloader and loop-mounter, the image
	// preload and the OS upgrade. Empty (the default) is the manager's own image at the
	// manager's version, the manager's --harvester-node-image, so that the node program
	// always matches the manager that plans its work; set it to use a mirror. Untagged,
	// it gets the manager's version as its tag. Each node keeps the image it started with
	// (status.updaterConfig of its NodeUpdate), even across a manager upgrade.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^ ]+$')",message="images.node must be an image reference without spaces"
	Node string `json:"node,omitempty"`

	// kubectl is the image that drains the node (kubectl drain), with a tag or digest:
	// it runs as a Plan's upgrade container, which SUC would otherwise tag with the
	// release version. The default is the kubectl image SUC itself drains with.
	// +optional
	// +kubebuilder:default="rancher/kubectl:v1.30.3"
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^ ]+(:[^/:@ ]+|@[^ ]+)$')",message="images.kubectl needs a tag or digest, such as rancher/kubectl:v1.30.3: SUC would tag an untagged image with the release version"
	Kubectl string `json:"kubectl,omitempty"`

	// upgrade is Harvester's upgrade image, from which the cluster upgrade Job takes the
	// release's own files: the add-ons (/usr/local/share/addons) and the extra manifests
	// (/usr/local/share/extra_manifests), copied out by an init container; nothing else of
	// it runs. Untagged, it gets the release version as its tag, as Harvester tags it
	// (rancher/harvester-upgrade:v1.8.1). Set it to use a mirror.
	// +optional
	// +kubebuilder:default="rancher/harvester-upgrade"
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^ ]+$')",message="images.upgrade must be an image reference without spaces"
	Upgrade string `json:"upgrade,omitempty"`

	// rancherInstaller is Rancher's installer image, built FROM scratch with helm and the
	// Rancher chart, from which the release upgrades Rancher (upgrade_rancher). The cluster
	// upgrade Job copies its /helm and /rancher-<version>.tgz out with a copy of the node
	// program and runs `helm upgrade rancher` with them. Untagged, it gets the release's
	// Rancher version as its tag (rancher/system-agent-installer-rancher:v2.13.3). The
	// release ships it in its image archives (the repository's agent images), so a node
	// preloaded with the release has it. Set it to use a mirror.
	// +optional
	// +kubebuilder:default="rancher/system-agent-installer-rancher"
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^ ]+$')",message="images.rancherInstaller must be an image reference without spaces"
	RancherInstaller string `json:"rancherInstaller,omitempty"`

	// nginx serves the mounted ISO in the repository's pods.
	// +optional
	// +kubebuilder:default="rancher/mirrored-library-nginx:1.27-alpine"
	// +kubebuilder:validation:MaxLength=512
	Nginx string `json:"nginx,omitempty"`
}

// SystemUpgradeController says where System Upgrade Controller runs on the workload cluster.
type SystemUpgradeController struct {
	// namespace is where SUC watches Plans (SUC acts on Plans of its own namespace only).
	// +optional
	// +kubebuilder:default="cattle-system"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`

	// serviceAccountName is the service account the Plans' Jobs run as. It drains the
	// node with kubectl, so it needs to evict pods and update nodes.
	// +optional
	// +kubebuilder:default="system-upgrade-controller"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
}

// Drain says how a node is drained, once, before its first disruptive step.
type Drain struct {
	// enabled drains the node; when false the node is only cordoned (its virtual
	// machines are still evacuated, through KubeVirt's API).
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// force deletes pods that no controller manages.
	// +optional
	Force bool `json:"force,omitempty"`

	// timeout bounds the drain: a number of seconds (900) or a duration such as 15m or
	// 1h30m. The updater always hands SUC a duration: SUC reads a number as nanoseconds.
	// It must not exceed timeouts.drain, the drain Job's deadline.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="drain.timeout must be a number of seconds of at least 1, or a duration such as 15m or 1h30m"
	Timeout *intstr.IntOrString `json:"timeout,omitempty"`

	// gracePeriodSeconds overrides the pods' termination grace period.
	// +optional
	// +kubebuilder:validation:Minimum=0
	GracePeriodSeconds *int32 `json:"gracePeriodSeconds,omitempty"`

	// ignoreDaemonSets leaves DaemonSet pods running.
	// +optional
	// +kubebuilder:default=true
	IgnoreDaemonSets *bool `json:"ignoreDaemonSets,omitempty"`

	// deleteEmptyDirData deletes pods with emptyDir volumes (their data is lost).
	// +optional
	// +kubebuilder:default=true
	DeleteEmptyDirData *bool `json:"deleteEmptyDirData,omitempty"`
}

// LonghornV2Swap says what to do with Longhorn's v2 data engine on a node.
// +kubebuilder:validation:Enum=Auto;Skip
type LonghornV2Swap string

const (
	// LonghornV2SwapAuto holds a node while attached v2 volumes have their engine on it,
	// and, where Longhorn serves its live upgrade of v2 instance managers, pauses that
	// upgrade while the node is down and waits for a running one to end.
	LonghornV2SwapAuto LonghornV2Swap = "Auto"
	// LonghornV2SwapSkip does none of that: the node is upgraded even if v2 volumes have
	// their engine on it, whose I/O is then interrupted while the node restarts.
	LonghornV2SwapSkip LonghornV2Swap = "Skip"
)

// Timeouts bound each step of a node's upgrade. A step that takes longer fails the node.
type Timeouts struct {
	// repository bounds the wait for the upgrade repository (download, checksum, serve).
	// +optional
	// +kubebuilder:default="1h"
	Repository *metav1.Duration `json:"repository,omitempty"`
	// drain bounds each of the cordon, the virtual machine evacuation and the drain
	// of one node.
	// +optional
	// +kubebuilder:default="1h"
	Drain *metav1.Duration `json:"drain,omitempty"`
	// imagePreload bounds the image preload of one node.
	// +optional
	// +kubebuilder:default="30m"
	ImagePreload *metav1.Duration `json:"imagePreload,omitempty"`
	// kubernetesUpgrade bounds the RKE2 upgrade of one node.
	// +optional
	// +kubebuilder:default="1h"
	KubernetesUpgrade *metav1.Duration `json:"kubernetesUpgrade,omitempty"`
	// osUpgrade bounds the OS upgrade of one node, reboot included.
	// +optional
	// +kubebuilder:default="45m"
	OSUpgrade *metav1.Duration `json:"osUpgrade,omitempty"`
	// dataEngineUpgrade bounds how long a node waits, before it is drained, for Longhorn
	// v2 to let it go: for Longhorn's own live upgrade of v2 instance managers to end, and
	// for attached v2 volumes to move their engine off the node. (The name is kept from
	// an earlier design.)
	// +optional
	// +kubebuilder:default="30m"
	DataEngineUpgrade *metav1.Duration `json:"dataEngineUpgrade,omitempty"`
	// node bounds the whole upgrade of one node.
	// +optional
	// +kubebuilder:default="4h"
	Node *metav1.Duration `json:"node,omitempty"`
	// clusterUpgrade bounds how long a node waits for its cluster's UpgradePlan to finish
	// the cluster-level phases (repository, metadata, preload of every node, the cluster
	// upgrade) before it is let go.
	// +optional
	// +kubebuilder:default="3h"
	ClusterUpgrade *metav1.Duration `json:"clusterUpgrade,omitempty"`
}

// ClusterUpgradeOptions says how the cluster upgrade Job runs on the workload cluster.
type ClusterUpgradeOptions struct {
	// serviceAccountName is the service account of the cluster upgrade Job, in
	// harvester-system. It updates Rancher's provisioning Cluster, Deployments in
	// cattle-system, the harvester-charts ClusterRepo and Harvester's ManagedCharts. The
	// default is Harvester's own service account, which holds those rights.
	// +optional
	// +kubebuilder:default="harvester"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// attachedV2Volumes says what the cluster upgrade does about attached Longhorn v2
	// volumes where Longhorn serves no live upgrade of its v2 instance managers (every
	// Longhorn release up to 1.12.1): Longhorn's upgrade, which Harvester's chart makes,
	// cannot complete on a node while a v2 volume is attached there. Hold (the default)
	// holds the plan before the cluster upgrade starts, naming each volume and the
	// virtual machine that uses it, until they are detached. StopVirtualMachines stops
	// those virtual machines (each recorded on itself, as the node steps record what
	// they stop), waits until their volumes are detached, and starts them again when the
	// cluster upgrade is done, or when the plan ends otherwise; a volume used by
	// something else than a virtual machine, or a virtual machine that could not be
	// started again (runStrategy Manual or Once), still holds the plan.
	// +optional
	// +kubebuilder:default=Hold
	AttachedV2Volumes AttachedV2Volumes `json:"attachedV2Volumes,omitempty"`
}

// AttachedV2Volumes says what the cluster upgrade does about attached Longhorn v2
// volumes that Longhorn's upgrade cannot pass.
// +kubebuilder:validation:Enum=Hold;StopVirtualMachines
type AttachedV2Volumes string

const (
	// AttachedV2VolumesHold holds the plan until the volumes are detached.
	AttachedV2VolumesHold AttachedV2Volumes = "Hold"
	// AttachedV2VolumesStopVirtualMachines stops the virtual machines that use them for
	// the cluster upgrade and starts them again afterwards.
	AttachedV2VolumesStopVirtualMachines AttachedV2Volumes = "StopVirtualMachines"
)

// RepositoryStorage is the room each repository pod keeps its copy of the ISO in.
type RepositoryStorage struct {
	// storageClassName is not used any more and is kept so that existing objects stay
	// valid: the repository shares no volume (a ReadWriteMany volume can stay attaching
	// after a drain, and every pod with it: harvester/harvester#9597,
	// longhorn/longhorn#12226); each pod keeps its own copy in an emptyDir.
	// +optional
	// +kubebuilder:default="longhorn"
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName,omitempty"`
	// size is the size limit of each repository pod's emptyDir, on the node's ephemeral
	// storage (the kubelet evicts a pod that grows past it); it must hold the ISO.
	// +optional
	// +kubebuilder:default="30Gi"
	// +kubebuilder:validation:MaxLength=32
	Size string `json:"size,omitempty"`
}

// HarvesterUpgraderSpec configures how the nodes of a Harvester cluster are upgraded in place.
type HarvesterUpgraderSpec struct {
	// release is the Harvester release to install.
	// +required
	Release Release `json:"release"`

	// images are the container images the updater runs.
	// +optional
	Images Images `json:"images,omitempty"`

	// systemUpgradeController says where SUC runs on the workload cluster.
	// +optional
	SystemUpgradeController SystemUpgradeController `json:"systemUpgradeController,omitempty"`

	// drain says how each node is drained before its Kubernetes upgrade.
	// +optional
	Drain Drain `json:"drain,omitempty"`

	// preloadImages pulls the release's images on a node from the repository before it
	// is drained, to shorten the time it is down.
	// +optional
	// +kubebuilder:default=true
	PreloadImages *bool `json:"preloadImages,omitempty"`

	// upgradeOS installs the release's operating system on each node and reboots it.
	// +optional
	// +kubebuilder:default=true
	UpgradeOS *bool `json:"upgradeOS,omitempty"`

	// restoreVM starts again, once a node is back on the release, the virtual machines
	// the updater stopped on it because they could not be live-migrated (as Harvester's
	// own upgrade does with its restoreVM setting). When false they stay stopped; find
	// them by the label harvester.inplace.cluster.x-k8s.io/stopped-by. A virtual machine
	// stopped by its user is never started. Witness nodes run no virtual machines and
	// are never restored.
	// +optional
	// +kubebuilder:default=true
	RestoreVM *bool `json:"restoreVM,omitempty"`

	// longhornV2Swap says what to do with nodes that run Longhorn's v2 data engine.
	// +optional
	// +kubebuilder:default=Auto
	LonghornV2Swap LonghornV2Swap `json:"longhornV2Swap,omitempty"`

	// imagePreload says how the cluster's UpgradePlan preloads the release's images on
	// every node before the first node is disrupted; it is copied into the UpgradePlan
	// the updater creates.
	// +optional
	ImagePreload ImagePreloadOption `json:"imagePreload,omitempty"`

	// clusterUpgrade says how the cluster upgrade Job runs.
	// +optional
	ClusterUpgrade ClusterUpgradeOptions `json:"clusterUpgrade,omitempty"`

	// repositoryStorage is the volume of the deployed repository.
	// +optional
	RepositoryStorage RepositoryStorage `json:"repositoryStorage,omitempty"`

	// timeouts bound each step.
	// +optional
	Timeouts Timeouts `json:"timeouts,omitempty"`
}

// HarvesterUpgraderStatus shows what the configuration resolved to.
type HarvesterUpgraderStatus struct {
	// observedGeneration is the spec generation last looked at.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions report whether the configuration is usable.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// HarvesterUpgrader configures capi-inplace's Harvester updater: which release to install
// and how to upgrade each node (image preload, RKE2, OS, Longhorn v2 data engine).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hvu,categories=cluster-api;capi-inplace
// +kubebuilder:printcolumn:name="Release",type=string,JSONPath=`.spec.release.version`
// +kubebuilder:printcolumn:name="OS",type=boolean,JSONPath=`.spec.upgradeOS`
// +kubebuilder:printcolumn:name="Preload",type=boolean,JSONPath=`.spec.preloadImages`
// +kubebuilder:printcolumn:name="V2 Swap",type=string,JSONPath=`.spec.longhornV2Swap`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type HarvesterUpgrader struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the configuration.
	// +required
	Spec HarvesterUpgraderSpec `json:"spec"`

	// status shows what the configuration resolved to.
	// +optional
	Status HarvesterUpgraderStatus `json:"status,omitempty"`
}

// HarvesterUpgraderList is a list of HarvesterUpgraders.
// +kubebuilder:object:root=true
type HarvesterUpgraderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HarvesterUpgrader `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &HarvesterUpgrader{}, &HarvesterUpgraderList{})
}
