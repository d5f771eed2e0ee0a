// Package jobupdater is the built-in updater for clusters that are not Harvester (kubeadm
// or anything else): it upgrades a node by running a Kubernetes Job pinned to the node on
// the workload cluster, with the image and command of a JobUpdater configuration. The
// node update succeeds when the Job succeeds and fails with the Job's reason when it
// fails. It is small on purpose: it shows that the NodeUpdate contract fits more than
// the Harvester adapter.
package jobupdater

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

const (
	// StepName is the JobUpdater's one step in NodeUpdate.status.steps.
	StepName = "Job"

	// NodeUpdateUIDLabel on a Job ties it to the NodeUpdate (by UID) it runs for.
	NodeUpdateUIDLabel = inplacev1.AnnotationPrefix + "nodeupdate-uid"
	// NodeUpdateAnnotation on a Job names its NodeUpdate as namespace/name on the
	// management cluster.
	NodeUpdateAnnotation = inplacev1.AnnotationPrefix + "nodeupdate"
	// NodeAnnotation on a Job names the node it upgrades.
	NodeAnnotation = inplacev1.AnnotationPrefix + "node"
	// ManagedByLabel value on every Job the JobUpdater creates.
	managedBy = "capi-inplace"

	// ContainerName is the name of the Job's container.
	ContainerName = "node-update"

	// DefaultPollInterval is how often a running Job is looked at.
	DefaultPollInterval = 10 * time.Second
)

// WorkloadClients hands out clients of workload clusters; *workloadcluster.Clients is one.
type WorkloadClients interface {
	Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error)
}

// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=jobupdaters,verbs=get;list;watch

// Updater runs a Job per node on the workload cluster.
type Updater struct {
	// Client reads JobUpdater configurations on the management cluster.
	Client client.Reader
	// Clusters gives clients of workload clusters.
	Clusters WorkloadClients
	// PollInterval is how often a running Job is looked at; DefaultPollInterval when zero.
	PollInterval time.Duration
	// Ledger, when set, is asked before the node's Job is created, the node's first
	// disruption (disruption.Admit): the Job waits while the Cluster's ledger has no room.
	Ledger *disruption.Ledger
}

var _ nodeupdater.Updater = &Updater{}
var _ nodeupdater.NodeTimeouter = &Updater{}

// Registration registers the JobUpdater kind with this updater in a nodeupdater.Registry.
func (u *Updater) Registration() nodeupdater.Registration {
	return nodeupdater.Registration{
		GroupKind: schema.GroupKind{Group: inplacev1.GroupVersion.Group, Kind: inplacev1.JobUpdaterKind},
		NewConfig: func() client.Object { return &inplacev1.JobUpdater{} },
		Updater:   u,
	}
}

// JobName is the name of the Job of a NodeUpdate: the same on every call, so that a
// restart never creates a second Job, and unique per NodeUpdate namespace and name.
func JobName(nu *inplacev1.NodeUpdate) string {
	sum := sha256.Sum256([]byte(nu.Namespace + "/" + nu.Name))
	base := strings.ReplaceAll(nu.Name, ".", "-")
	if len(base) > 46 {
		base = base[:46]
	}
	base = strings.TrimRight(base, "-")
	return "nu-" + base + "-" + hex.EncodeToString(sum[:])[:8]
}

// Reconcile creates the node's Job when there is none and follows it to its end.
func (u *Updater) Reconcile(ctx context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	nodeupdater.DeclareSteps(nu, StepName)
	if nodeupdater.StepDone(nu, StepName) {
		return nodeupdater.Result{Done: true}, nil
	}
	cfg, err := u.config(ctx, nu)
	if err != nil {
		return nodeupdater.Result{}, err
	}
	wc, err := u.Clusters.Client(ctx, types.NamespacedName{Namespace: nu.Namespace, Name: nu.Spec.ClusterName})
	if err != nil {
		return nodeupdater.Result{}, fmt.Errorf("reach workload cluster %s: %w", nu.Spec.ClusterName, err)
	}
	key := client.ObjectKey{Namespace: cfg.Spec.Namespace, Name: JobName(nu)}
	log := ctrl.LoggerFrom(ctx).WithValues("job", klog.KRef(key.Namespace, key.Name))

	job := &batchv1.Job{}
	if err := wc.Get(ctx, key, job); err != nil {
		if !apierrors.IsNotFound(err) {
			return nodeupdater.Result{}, fmt.Errorf("read Job %s on the workload cluster: %w", key, err)
		}
		if nodeupdater.StepState(nu, StepName) == inplacev1.StepStateRunning {
			// The Job ran the upgrade, or part of it; running it again blindly could
			// upgrade the node twice. A person decides.
			return nodeupdater.Result{}, nodeupdater.Permanentf("JobDeleted",
				"Job %s was deleted on the workload cluster before it finished", key)
		}
		if u.Ledger != nil {
			held, err := u.Ledger.Admit(ctx, nu, false, "run its update Job")
			if err != nil {
				return nodeupdater.Result{}, err
			}
			if held != "" {
				// The step stays Pending (a Running step without its Job is a deleted Job).
				nodeupdater.SetStepMessage(nu, StepName, held)
				return nodeupdater.Result{RequeueAfter: u.pollInterval()}, nil
			}
		}
		job = desiredJob(nu, cfg, key)
		if err := wc.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			return nodeupdater.Result{}, fmt.Errorf("create Job %s on the workload cluster: %w", key, err)
		}
		log.Info("Created node update Job", "image", cfg.Spec.Image)
		nodeupdater.StartStep(nu, StepName, fmt.Sprintf("Job %s created on node %s", key, nu.Spec.NodeName))
		return nodeupdater.Result{RequeueAfter: u.pollInterval()}, nil
	}

	if owner := job.Labels[NodeUpdateUIDLabel]; owner != string(nu.UID) {
		return nodeupdater.Result{}, fmt.Errorf("job %s on the workload cluster belongs to another NodeUpdate (uid %q, this one is %q); delete it to go on",
			key, owner, nu.UID)
	}
	if nodeupdater.StepState(nu, StepName) != inplacev1.StepStateRunning {
		nodeupdater.StartStep(nu, StepName, fmt.Sprintf("Job %s running on node %s", key, nu.Spec.NodeName))
	}
	if c := jobCondition(job, batchv1.JobComplete); c != nil {
		log.Info("Node update Job succeeded")
		nodeupdater.CompleteStep(nu, StepName, fmt.Sprintf("Job %s succeeded", key))
		return nodeupdater.Result{Done: true}, nil
	}
	if c := jobCondition(job, batchv1.JobFailed); c != nil {
		reason := c.Reason
		if reason == "" {
			reason = "JobFailed"
		}
		msg := fmt.Sprintf("Job %s failed: %s", key, c.Message)
		if c.Message == "" {
			msg = fmt.Sprintf("Job %s failed (%s)", key, reason)
		}
		log.Info("Node update Job failed", "reason", reason, "message", c.Message)
		nodeupdater.FailStep(nu, StepName, msg)
		return nodeupdater.Result{}, nodeupdater.Permanent(reason, errors.New(msg))
	}
	nodeupdater.SetStepMessage(nu, StepName, fmt.Sprintf("Job %s running on node %s (active %d, failed %d)",
		key, nu.Spec.NodeName, job.Status.Active, job.Status.Failed))
	return nodeupdater.Result{RequeueAfter: u.pollInterval()}, nil
}

// Abort stops the node's Job at its safe point, which is the Job's end: a running Job
// is left to succeed or fail, because a node upgrade killed half-way (a kubeadm upgrade
// stopped in the middle) can leave the node half upgraded. Once the Job has ended it is
// deleted, its pods with it, and Abort reports done when it is gone; with the
// JobUpdater's force it is deleted at once. A failed Job of a NodeUpdate that failed
// stays for its logs until the NodeUpdate is deleted: it has ended and does nothing
// more. A workload cluster whose kubeconfig Secret is gone has nothing left to clean up.
func (u *Updater) Abort(ctx context.Context, nu *inplacev1.NodeUpdate) (bool, error) {
	cfg, err := u.config(ctx, nu)
	if err != nil {
		return false, err
	}
	wc, err := u.Clusters.Client(ctx, types.NamespacedName{Namespace: nu.Namespace, Name: nu.Spec.ClusterName})
	if err != nil {
		var missing *workloadcluster.SecretNotFoundError
		if errors.As(err, &missing) {
			ctrl.LoggerFrom(ctx).Info("Workload cluster unreachable for good, nothing to clean up", "reason", err.Error())
			return true, nil
		}
		return false, fmt.Errorf("reach workload cluster %s: %w", nu.Spec.ClusterName, err)
	}
	key := client.ObjectKey{Namespace: cfg.Spec.Namespace, Name: JobName(nu)}
	log := ctrl.LoggerFrom(ctx).WithValues("job", klog.KRef(key.Namespace, key.Name))

	job := &batchv1.Job{}
	if err := wc.Get(ctx, key, job); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("read Job %s on the workload cluster: %w", key, err)
	}
	if !job.DeletionTimestamp.IsZero() {
		return false, nil
	}
	failed := jobCondition(job, batchv1.JobFailed) != nil
	ended := failed || jobCondition(job, batchv1.JobComplete) != nil
	if !ended && !cfg.Spec.Force {
		if nodeupdater.StepState(nu, StepName) == inplacev1.StepStateRunning {
			nodeupdater.SetStepMessage(nu, StepName, fmt.Sprintf(
				"aborting: waiting for Job %s to end before deleting it (spec.force of JobUpdater %s deletes it at once)", key, cfg.Name))
		}
		log.V(4).Info("Waiting for the node update Job to end before deleting it")
		return false, nil
	}
	if failed && nu.Status.FailureReason != "" && nu.DeletionTimestamp.IsZero() {
		return true, nil
	}
	err = wc.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground),
		// Only the Job that was seen to end, never one created since under the same name.
		client.Preconditions{UID: &job.UID})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("delete Job %s on the workload cluster: %w", key, err)
	default:
		log.Info("Deleted node update Job", "ended", ended, "force", cfg.Spec.Force)
		return false, nil
	}
}

// Preflight has no checks of its own: what a Job needs of its node is the Job's business.
func (u *Updater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return nil
}

// NodeTimeout is the JobUpdater's spec.nodeTimeout; zero means the reconciler's default.
func (u *Updater) NodeTimeout(ctx context.Context, nu *inplacev1.NodeUpdate) (time.Duration, error) {
	cfg, err := u.config(ctx, nu)
	if err != nil {
		return 0, err
	}
	if cfg.Spec.NodeTimeout == nil {
		return 0, nil
	}
	return cfg.Spec.NodeTimeout.Duration, nil
}

func (u *Updater) config(ctx context.Context, nu *inplacev1.NodeUpdate) (*inplacev1.JobUpdater, error) {
	cfg := &inplacev1.JobUpdater{}
	key := client.ObjectKey{Namespace: nu.Namespace, Name: nu.Spec.UpdaterRef.Name}
	if err := u.Client.Get(ctx, key, cfg); err != nil {
		return nil, fmt.Errorf("read JobUpdater %s: %w", key, err)
	}
	if cfg.Spec.Namespace == "" {
		cfg.Spec.Namespace = "kube-system"
	}
	return cfg, nil
}

func (u *Updater) pollInterval() time.Duration {
	if u.PollInterval > 0 {
		return u.PollInterval
	}
	return DefaultPollInterval
}

// desiredJob is the Job that upgrades the node of nu as cfg says.
func desiredJob(nu *inplacev1.NodeUpdate, cfg *inplacev1.JobUpdater, key client.ObjectKey) *batchv1.Job {
	labels := map[string]string{
		NodeUpdateUIDLabel:             string(nu.UID),
		"app.kubernetes.io/managed-by": managedBy,
		"app.kubernetes.io/component":  "node-update",
	}
	annotations := map[string]string{
		NodeUpdateAnnotation: nu.Namespace + "/" + nu.Name,
		NodeAnnotation:       nu.Spec.NodeName,
	}
	env := []corev1.EnvVar{
		{Name: "TARGET_VERSION", Value: nu.Spec.Version},
		{Name: "NODE_NAME", Value: nu.Spec.NodeName},
		{Name: "CLUSTER_NAME", Value: nu.Spec.ClusterName},
		{Name: "MACHINE_NAME", Value: nu.Spec.MachineName},
	}
	env = append(env, cfg.Spec.Env...)
	tolerations := cfg.Spec.Tolerations
	if len(tolerations) == 0 {
		tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	}
	container := corev1.Container{
		Name:    ContainerName,
		Image:   cfg.Spec.Image,
		Command: cfg.Spec.Command,
		Args:    cfg.Spec.Args,
		Env:     env,
	}
	podSpec := corev1.PodSpec{
		// Pinned by name: the pod runs on this node, past the scheduler, also when the
		// node is cordoned.
		NodeName:           nu.Spec.NodeName,
		RestartPolicy:      corev1.RestartPolicyNever,
		ServiceAccountName: cfg.Spec.ServiceAccountName,
		Tolerations:        tolerations,
	}
	if cfg.Spec.Privileged {
		container.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		podSpec.HostPID = true
	}
	if cfg.Spec.HostRootMountPath != "" {
		container.VolumeMounts = []corev1.VolumeMount{{Name: "host-root", MountPath: cfg.Spec.HostRootMountPath}}
		podSpec.Volumes = []corev1.Volume{{Name: "host-root", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: ptr.To(corev1.HostPathDirectory)},
		}}}
	}
	podSpec.Containers = []corev1.Container{container}
	backoffLimit := cfg.Spec.BackoffLimit
	if backoffLimit == nil {
		backoffLimit = ptr.To[int32](0)
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: labels, Annotations: annotations},
		Spec: batchv1.JobSpec{
			BackoffLimit: backoffLimit,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
				Spec:       podSpec,
			},
		},
	}
}

func jobCondition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range job.Status.Conditions {
		if job.Status.Conditions[i].Type == t && job.Status.Conditions[i].Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}
