package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeadmUpdaterKind is the kind of the KubeadmUpdater configuration, as updaterRef names it.
const KubeadmUpdaterKind = "KubeadmUpdater"

// DefaultKubeadmURLTemplate is where the Kubernetes project publishes its release binaries
// (kubernetes.io/releases/download/), the default of spec.source.url.template.
const DefaultKubeadmURLTemplate = "https://dl.k8s.io/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"

// KubeadmUpdaterSpec says how the nodes of a kubeadm cluster are upgraded in place.
type KubeadmUpdaterSpec struct {
	// image is the capi-inplace image whose node program (capi-inplace node kubeadm ...)
	// runs on each node, with a tag or a digest. Empty: the manager's own node image
	// (its --harvester-node-image), the same program the manager was released with.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('(@sha256:[0-9a-f]{64}|:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$')",message="the image needs a tag or a digest, such as registry.example.com/capi-inplace:v0.4.0"
	Image string `json:"image,omitempty"`

	// source is where the target kubeadm, kubelet and kubectl come from: exactly one of
	// packages (the node's apt or dnf/yum and the pkgs.k8s.io repositories), url
	// (downloaded and checked against a SHA-256 each) or image (an image that carries
	// them).
	// +required
	Source KubeadmBinarySource `json:"source"`

	// kubeletUnit is the kubelet's systemd unit on the nodes, restarted once the new
	// kubelet is installed.
	// +optional
	// +kubebuilder:default=kubelet
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9:_.@-]+$`
	KubeletUnit string `json:"kubeletUnit,omitempty"`

	// namespace is the namespace of the workload cluster the node Jobs run in. Their pods
	// are privileged: the namespace must allow that (Pod Security "privileged").
	// +optional
	// +kubebuilder:default=kube-system
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`

	// drain says how a node is drained between kubeadm's upgrade and the kubelet's
	// restart.
	// +optional
	// +kubebuilder:default={}
	Drain KubeadmDrain `json:"drain,omitempty"`

	// nodeTimeout is how long the upgrade of one node may take, from its start until it
	// is uncordoned, for example 45m. When it passes, the NodeUpdate fails with reason
	// TimedOut once its running Job has ended (at once with force). The manager's default
	// (2h) when unset.
	// +optional
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`

	// force deletes a node's running Job at once when its NodeUpdate is aborted, times
	// out, fails or is deleted. By default capi-inplace waits until the Job has ended,
	// because a kubeadm upgrade or a package install killed half-way can leave the node
	// half upgraded. Set it only when that is acceptable, for example when a node is gone
	// for good and its Job can never end.
	// +optional
	Force bool `json:"force,omitempty"`
}

// KubeadmBinarySource is where the target kubeadm, kubelet and kubectl come from.
// +kubebuilder:validation:XValidation:rule="(has(self.packages) ? 1 : 0) + (has(self.url) ? 1 : 0) + (has(self.image) ? 1 : 0) == 1",message="set exactly one of packages, url and image"
type KubeadmBinarySource struct {
	// packages installs them with the node's package manager (apt-get, dnf or yum) from
	// the Kubernetes community repositories (pkgs.k8s.io), switching the repository file
	// to the target's minor release as Kubernetes documents it. The package manager checks
	// the packages' signatures with the repository's key the node already trusts.
	// +optional
	Packages *KubeadmPackagesSource `json:"packages,omitempty"`

	// url downloads them from a URL template and checks each against its SHA-256.
	// +optional
	URL *KubeadmURLSource `json:"url,omitempty"`

	// image takes them out of an image that carries them: an init container copies them
	// into the node Job's pod.
	// +optional
	Image *KubeadmImageSource `json:"image,omitempty"`
}

// KubeadmPackagesSource has no settings: the node's own package manager and repository
// file decide.
type KubeadmPackagesSource struct{}

// KubeadmURLSource downloads the binaries from a URL template.
type KubeadmURLSource struct {
	// template is the URL of each binary, a Go template with {{.Version}} (the target,
	// such as v1.36.3), {{.Arch}} (the node's architecture: amd64, arm64) and {{.Binary}}
	// (kubeadm, kubelet, kubectl). A mirror of dl.k8s.io's layout serves air-gapped sites.
	// +optional
	// +kubebuilder:default="https://dl.k8s.io/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.startsWith('https://') || self.startsWith('http://')",message="the template must give an http:// or https:// URL"
	Template string `json:"template,omitempty"`

	// sha256 are the SHA-256 checksums of the three binaries of the target version and
	// the nodes' architecture (dl.k8s.io publishes each as <binary>.sha256 next to it).
	// They belong to one version: change them with the version, or keep a KubeadmUpdater
	// per version. A binary that does not match is not installed and the node fails.
	// +required
	SHA256 KubeadmChecksums `json:"sha256"`
}

// KubeadmImageSource takes the binaries out of an image.
type KubeadmImageSource struct {
	// image carries kubeadm, kubelet and kubectl at path, with a tag or a digest. It needs
	// no shell: the node program's copy-files does the copy.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('(@sha256:[0-9a-f]{64}|:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$')",message="the image needs a tag or a digest"
	Image string `json:"image"`

	// path is the directory of the image that holds kubeadm, kubelet and kubectl.
	// +optional
	// +kubebuilder:default=/
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^/[^\s]*$`
	Path string `json:"path,omitempty"`

	// sha256, when set, are checked on the node before the binaries are installed.
	// +optional
	SHA256 *KubeadmChecksums `json:"sha256,omitempty"`
}

// KubeadmChecksums are the SHA-256 checksums of the three binaries, as 64 hex digits.
type KubeadmChecksums struct {
	// kubeadm is the SHA-256 of the kubeadm binary.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	Kubeadm string `json:"kubeadm"`
	// kubelet is the SHA-256 of the kubelet binary.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	Kubelet string `json:"kubelet"`
	// kubectl is the SHA-256 of the kubectl binary.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	Kubectl string `json:"kubectl"`
}

// KubeadmDrain says how a node is drained: cordoned, then its pods evicted through the
// Eviction API, so PodDisruptionBudgets are honoured.
type KubeadmDrain struct {
	// timeout is how long the drain may wait for pods to leave, PodDisruptionBudgets
	// included; then the node fails naming the pods still there.
	// +optional
	// +kubebuilder:default="15m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// gracePeriod, when set, overrides each pod's own terminationGracePeriodSeconds.
	// +optional
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`

	// ignoreDaemonSets leaves DaemonSet pods on the node (their controller would put them
	// back at once). When false, a node with DaemonSet pods is not drained and fails.
	// +optional
	// +kubebuilder:default=true
	IgnoreDaemonSets *bool `json:"ignoreDaemonSets,omitempty"`

	// deleteEmptyDirData evicts pods with emptyDir volumes, whose data is lost. When
	// false, a node with such pods is not drained and fails, naming them.
	// +optional
	DeleteEmptyDirData bool `json:"deleteEmptyDirData,omitempty"`
}

// KubeadmUpdater configures the built-in updater for kubeadm clusters: on each node it
// runs kubeadm's own upgrade sequence (fetch the binaries, kubeadm upgrade apply on the
// first control plane node and kubeadm upgrade node elsewhere, drain, kubelet and
// kubectl with a kubelet restart, uncordon) as privileged Jobs of the capi-inplace node
// program pinned to the node. Name it in a NodeUpdate's updaterRef (or the Cluster's
// inplace.cluster.x-k8s.io/updater annotation) as KubeadmUpdater/<name>, in the
// Cluster's namespace.
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=capi-inplace
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.source.url.template`
// +kubebuilder:printcolumn:name="Binaries-Image",type=string,JSONPath=`.spec.source.image.image`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.namespace`
// +kubebuilder:printcolumn:name="Timeout",type=string,JSONPath=`.spec.nodeTimeout`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type KubeadmUpdater struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says how the nodes are upgraded.
	// +required
	Spec KubeadmUpdaterSpec `json:"spec"`
}

// KubeadmUpdaterList is a list of KubeadmUpdaters.
// +kubebuilder:object:root=true
type KubeadmUpdaterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeadmUpdater `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &KubeadmUpdater{}, &KubeadmUpdaterList{})
}
