package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HealthGate is one health gate of an UpgradeTask: exactly one of prometheus, cel and job.
// +kubebuilder:validation:XValidation:rule="[has(self.prometheus), has(self.cel), has(self.job)].filter(x, x).size() == 1",message="set exactly one of prometheus, cel and job"
type HealthGate struct {
	// name names the gate in the task's status, conditions and events.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// prometheus is green when no named alert fires, or when a query returns nothing.
	// +optional
	Prometheus *PrometheusGate `json:"prometheus,omitempty"`

	// cel is green when an expression over objects of the workload cluster is true.
	// It reads with the manager's rights, except the kinds the operator denies (Secrets
	// by default), and gives only true or false: never a value of what it read.
	// +optional
	CEL *CELGate `json:"cel,omitempty"`

	// job is green when a Job run on the workload cluster succeeds (exit 0). It runs only
	// in the namespace the operator allowed (capi-inplace-gates by default), under Pod
	// Security's restricted profile and the ServiceAccount capi-inplace-gate, which has
	// no rights unless the operator binds some. A job gate of the Cluster's gates
	// annotation runs only when the manager allows it (--allow-annotation-job-gates).
	// +optional
	Job *JobGate `json:"job,omitempty"`
}

// PrometheusGate reads the Prometheus HTTP API.
// +kubebuilder:validation:XValidation:rule="has(self.alerts) != has(self.query)",message="set exactly one of alerts and query"
type PrometheusGate struct {
	// secretRef names a Secret in the task's namespace with the key address (for example
	// https://prometheus.monitoring:9090), and optionally token (a bearer token) or
	// username and password, and ca.crt (PEM) to verify the server. The address must be
	// https (http only when the manager runs with --allow-http-fetch); link-local, cloud
	// metadata and loopback addresses and redirects to another host are refused.
	// +required
	SecretRef corev1.LocalObjectReference `json:"secretRef"`

	// alerts are names of alerts that must not be firing (GET /api/v1/alerts).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=256
	Alerts []string `json:"alerts,omitempty"`

	// query is a PromQL instant query (GET /api/v1/query); the gate is red while its
	// result is not empty, for example ALERTS{severity="critical",alertstate="firing"}.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query,omitempty"`
}

// CELGate evaluates a CEL expression over objects of the workload cluster.
type CELGate struct {
	// resource says which objects the expression sees as the list `objects`.
	// +required
	Resource GateResource `json:"resource"`

	// expression is a CEL expression that must be true, over `objects` (a list of the
	// objects as maps), for example objects.all(v, v.status.robustness == "healthy").
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Expression string `json:"expression"`
}

// GateResource selects objects of the workload cluster.
type GateResource struct {
	// apiVersion of the objects, for example longhorn.io/v1beta2.
	// +required
	// +kubebuilder:validation:MinLength=1
	APIVersion string `json:"apiVersion"`
	// kind of the objects, for example Volume.
	// +required
	// +kubebuilder:validation:MinLength=1
	Kind string `json:"kind"`
	// namespace of the objects; empty means every namespace (or a cluster-scoped kind).
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// selector selects the objects by label; empty means all.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// JobGate runs a Job on the workload cluster.
type JobGate struct {
	// namespace of the Job on the workload cluster: empty, or the one namespace the
	// manager runs gate Jobs in (its --gate-job-namespace, capi-inplace-gates by
	// default). Any other namespace is a red gate; the Job is never created there.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// template is the Job's pod template (a core/v1 PodTemplateSpec; the workload
	// cluster's API server validates it). Its restartPolicy is set to Never, its
	// serviceAccountName to capi-inplace-gate, and each container's
	// terminationMessagePolicy to FallbackToLogsOnError, so a failed container's last
	// log lines are kept as the gate's message. What Pod Security's restricted profile
	// requires and the template leaves unset is set (runAsNonRoot, a RuntimeDefault
	// seccomp profile, no privilege escalation, every capability dropped): the image must
	// run as a non-root user. A template that names another ServiceAccount, or asks for a
	// privileged container, a hostPath volume, hostNetwork, hostPID or hostIPC, is a red
	// gate, as is one the namespace's Pod Security admission refuses (checked by a dry
	// run before the Job is created).
	// +required
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Template corev1.PodTemplateSpec `json:"template"`

	// activeDeadlineSeconds bounds the Job's run; 600 when unset.
	// +optional
	// +kubebuilder:validation:Minimum=1
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
}

// GateState is the state of a health gate.
// +kubebuilder:validation:Enum=Green;Red
type GateState string

// Gate states.
const (
	GateGreen GateState = "Green"
	GateRed   GateState = "Red"
)

// HealthGateStatus is the result of a health gate's last evaluation.
type HealthGateStatus struct {
	// name is the gate's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// state is Green or Red.
	// +required
	State GateState `json:"state"`
	// message says why the gate is red, or what it saw.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
	// lastTransitionTime is when the gate last changed state.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
}
