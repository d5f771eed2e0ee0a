package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JobUpdaterKind is the kind of the JobUpdater configuration, as updaterRef names it.
const JobUpdaterKind = "JobUpdater"

// JobUpdaterSpec says which Job upgrades a node.
type JobUpdaterSpec struct {
	// image is the container image of the Job that upgrades a node, for example
	// registry.example.com/node-upgrade:v2. It finds the target version in the environment
	// variable TARGET_VERSION and the node's name in NODE_NAME.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`

	// command is the entrypoint of the container; the image's own when empty.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Command []string `json:"command,omitempty"`

	// args are the arguments of the container's command.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Args []string `json:"args,omitempty"`

	// env is extra environment of the container. TARGET_VERSION, NODE_NAME, CLUSTER_NAME
	// and MACHINE_NAME are set by capi-inplace and cannot be overridden.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(e.name in ['TARGET_VERSION', 'NODE_NAME', 'CLUSTER_NAME', 'MACHINE_NAME']))",message="TARGET_VERSION, NODE_NAME, CLUSTER_NAME and MACHINE_NAME are set by capi-inplace"
	Env []corev1.EnvVar `json:"env,omitempty"`

	// namespace is the namespace of the workload cluster the Job runs in.
	// +optional
	// +kubebuilder:default=kube-system
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`

	// serviceAccountName is the service account of the Job's pod in the workload cluster;
	// the namespace's default one when empty.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// backoffLimit is how many times the Job retries its pod before it fails.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`

	// nodeTimeout is how long the upgrade of one node may take, from its start until the
	// Job succeeds, for example 45m. When it passes, the NodeUpdate fails with reason
	// TimedOut once the Job has ended and been deleted (at once with force). The
	// manager's default (2h) when unset.
	// +optional
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`

	// force deletes a node's running Job at once when its NodeUpdate is aborted, times
	// out, fails or is deleted. By default capi-inplace waits until the Job has ended
	// (succeeded or failed) and deletes it then, because a Job killed half-way, such as a
	// kubeadm upgrade stopped in the middle, can leave the node half upgraded. Set it
	// only when that is acceptable, for example when a Job can never end because its
	// node is gone for good.
	// +optional
	Force bool `json:"force,omitempty"`

	// tolerations of the Job's pod. The pod is pinned to its node by name, past the
	// scheduler, so only NoExecute taints matter. When empty the pod tolerates every
	// taint, so that it also runs on a cordoned or tainted node.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// privileged runs the container privileged, with the node's PID namespace, as a node
	// upgrade usually needs.
	// +optional
	Privileged bool `json:"privileged,omitempty"`

	// hostRootMountPath, when set, mounts the node's root file system at this path of the
	// container, for example /host.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^/.*`
	HostRootMountPath string `json:"hostRootMountPath,omitempty"`
}

// JobUpdater configures the built-in updater that upgrades a node of any cluster (kubeadm,
// or anything that is not Harvester) by running a Kubernetes Job pinned to the node on
// the workload cluster, with the image and command given here. The node update succeeds
// when the Job succeeds and fails with the Job's reason when it fails. Name it in a
// NodeUpdate's updaterRef (or the Cluster's inplace.cluster.x-k8s.io/updater annotation)
// as JobUpdater/<name>, in the Cluster's namespace.
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=capi-inplace
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.namespace`
// +kubebuilder:printcolumn:name="Timeout",type=string,JSONPath=`.spec.nodeTimeout`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type JobUpdater struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says which Job upgrades a node.
	// +required
	Spec JobUpdaterSpec `json:"spec"`
}

// JobUpdaterList is a list of JobUpdaters.
// +kubebuilder:object:root=true
type JobUpdaterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []JobUpdater `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &JobUpdater{}, &JobUpdaterList{})
}
