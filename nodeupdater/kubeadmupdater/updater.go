// Package kubeadmupdater is the built-in updater for kubeadm clusters (issue #56): on each
// node it runs Kubernetes' documented kubeadm upgrade sequence
// (kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/) with the
// capi-inplace node program (docs/kubeadm-node-program.md) as privileged Jobs pinned to
// the node on the workload cluster, and drains the node itself in between:
//
//	Fetch     Job: node kubeadm fetch     the target kubeadm (and kubelet, kubectl staged)
//	Upgrade   Job: node kubeadm upgrade   kubeadm upgrade apply (first control plane node) or node
//	Drain     cordon (recorded as ours), evict through the Eviction API
//	Kubelet   Job: node kubeadm kubelet   kubelet and kubectl, kubelet restarted
//	Uncordon  once the Node reports the target kubelet version and Ready
//
// Each step is one entry of NodeUpdate.status.steps; the state lives there and in the
// Jobs (named per NodeUpdate UID and step), so a restarted manager carries on.
package kubeadmupdater

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// The steps of a node, in order, as NodeUpdate.status.steps shows them.
const (
	StepFetch    = "Fetch"
	StepUpgrade  = "Upgrade"
	StepDrain    = "Drain"
	StepKubelet  = "Kubelet"
	StepUncordon = "Uncordon"
)

// ControlPlaneLabel marks a control plane node (kubeadm sets it at init and join).
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// Defaults of the updater and of a KubeadmUpdater's fields left empty.
const (
	// DefaultPollInterval is how often a running Job, a drain or a node coming back is
	// looked at.
	DefaultPollInterval = 5 * time.Second
	// DefaultDrainTimeout is drain.timeout when the KubeadmUpdater has none.
	DefaultDrainTimeout = 15 * time.Minute
)

// WorkloadClients hands out clients of workload clusters; *workloadcluster.Clients is one.
type WorkloadClients interface {
	Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error)
}

// +kubebuilder:rbac:groups=inplace.cluster.x-k8s.io,resources=kubeadmupdaters,verbs=get;list;watch

// Updater upgrades the nodes of kubeadm clusters.
type Updater struct {
	// Client reads KubeadmUpdater configurations on the management cluster.
	Client client.Reader
	// Clusters gives clients of workload clusters.
	Clusters WorkloadClients
	// NodeImage is the manager's own node image, fully tagged: the image of the Jobs when
	// a KubeadmUpdater leaves spec.image empty.
	NodeImage string
	// PollInterval is how often running work is looked at; DefaultPollInterval when zero.
	PollInterval time.Duration
	// Ledger, when set, is asked before the node's disruptive steps: kubeadm's upgrade of
	// a control plane node (it restarts the static pods) and the cordon.
	Ledger *disruption.Ledger
	// Recorder, when set, records events on NodeUpdates for what the drain policy does
	// (a drain blocked, pods deleted under drainPolicy Evict).
	Recorder events.EventRecorder
}

var _ nodeupdater.Updater = &Updater{}
var _ nodeupdater.NodeTimeouter = &Updater{}

// Registration registers the KubeadmUpdater kind with this updater in a nodeupdater.Registry.
func (u *Updater) Registration() nodeupdater.Registration {
	return nodeupdater.Registration{
		GroupKind: schema.GroupKind{Group: inplacev1.GroupVersion.Group, Kind: inplacev1.KubeadmUpdaterKind},
		NewConfig: func() client.Object { return &inplacev1.KubeadmUpdater{} },
		Updater:   u,
	}
}

// nodeRun is what one reconcile of a node reads once and every step uses.
type nodeRun struct {
	nu           *inplacev1.NodeUpdate
	cfg          *inplacev1.KubeadmUpdater
	wc           client.Client
	node         *corev1.Node
	controlPlane bool
	image        string
}

// step is one step of a node: run is called while the step is not done and says whether
// it is now. It records its own state and message in the NodeUpdate.
type step struct {
	name string
	run  func(u *Updater, ctx context.Context, r *nodeRun) (done bool, err error)
}

// steps are the node's steps in order. Adding a step is adding its name here.
var steps = []step{
	{name: StepFetch, run: (*Updater).fetch},
	{name: StepUpgrade, run: (*Updater).upgrade},
	{name: StepDrain, run: (*Updater).drain},
	{name: StepKubelet, run: (*Updater).kubelet},
	{name: StepUncordon, run: (*Updater).uncordon},
}

func stepNames() []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.name
	}
	return names
}

// releasedVersion is what the node program accepts as --version: vMAJOR.MINOR.PATCH.
var releasedVersion = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// Reconcile runs the node's steps in order, each as far as it goes without blocking. A
// step that has not ended stops the walk; a failed one ends the NodeUpdate with a
// permanent error, so no later step runs.
func (u *Updater) Reconcile(ctx context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	nodeupdater.DeclareSteps(nu, stepNames()...)
	if !releasedVersion.MatchString(nu.Spec.Version) {
		return nodeupdater.Result{}, nodeupdater.Permanentf("IneligibleVersion",
			"version %q is not a released Kubernetes version (vMAJOR.MINOR.PATCH, such as v1.36.3): kubeadm and its packages have no other", nu.Spec.Version)
	}
	r, err := u.run(ctx, nu)
	if err != nil {
		return nodeupdater.Result{}, err
	}
	if nodeupdater.StepState(nu, StepFetch) == inplacev1.StepStatePending && kubeletAt(r.node, nu.Spec.Version) {
		// Nothing was started for this node and its kubelet runs the target already: an
		// earlier NodeUpdate (or a person) upgraded it. Only the end is left.
		why := fmt.Sprintf("node %s already runs kubelet %s", nu.Spec.NodeName, nu.Spec.Version)
		for _, name := range []string{StepFetch, StepUpgrade, StepDrain, StepKubelet} {
			nodeupdater.SkipStep(nu, name, why)
		}
	}
	for _, s := range steps {
		if nodeupdater.StepDone(nu, s.name) {
			continue
		}
		done, err := s.run(u, ctx, r)
		if err != nil {
			return nodeupdater.Result{}, err
		}
		if !done {
			return nodeupdater.Result{RequeueAfter: u.pollInterval()}, nil
		}
	}
	return nodeupdater.Result{Done: true}, nil
}

// run reads what every step needs: the configuration, the workload client, the Node.
func (u *Updater) run(ctx context.Context, nu *inplacev1.NodeUpdate) (*nodeRun, error) {
	cfg, err := u.config(ctx, nu)
	if err != nil {
		return nil, err
	}
	r := &nodeRun{nu: nu, cfg: cfg, image: cfg.Spec.Image}
	if r.image == "" {
		r.image = u.NodeImage
	}
	if r.image == "" {
		return nil, nodeupdater.Permanentf("NoNodeImage",
			"KubeadmUpdater %s has no spec.image and the manager has no node image (--harvester-node-image)", cfg.Name)
	}
	r.wc, err = u.Clusters.Client(ctx, types.NamespacedName{Namespace: nu.Namespace, Name: nu.Spec.ClusterName})
	if err != nil {
		return nil, fmt.Errorf("reach workload cluster %s: %w", nu.Spec.ClusterName, err)
	}
	r.node = &corev1.Node{}
	if err := r.wc.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, r.node); err != nil {
		return nil, fmt.Errorf("read node %s of workload cluster %s: %w", nu.Spec.NodeName, nu.Spec.ClusterName, err)
	}
	_, r.controlPlane = r.node.Labels[ControlPlaneLabel]
	return r, nil
}

// Abort stops at the safe point of the node, which is the end of its running Job: a
// kubeadm upgrade or a package install killed half-way can leave the node half upgraded,
// so a running Job is waited for (deleted at once with force). Then the NodeUpdate's Jobs
// are deleted (a failed Job of a NodeUpdate that failed stays for its logs until the
// NodeUpdate is deleted) and the node is uncordoned if this NodeUpdate cordoned it.
// Abort starts nothing. A workload cluster whose kubeconfig Secret is gone has nothing
// left to clean up; a KubeadmUpdater that is gone is read as force false.
func (u *Updater) Abort(ctx context.Context, nu *inplacev1.NodeUpdate) (bool, error) {
	log := ctrl.LoggerFrom(ctx)
	force := false
	cfg := &inplacev1.KubeadmUpdater{}
	switch err := u.Client.Get(ctx, client.ObjectKey{Namespace: nu.Namespace, Name: nu.Spec.UpdaterRef.Name}, cfg); {
	case err == nil:
		force = cfg.Spec.Force
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("read KubeadmUpdater %s/%s: %w", nu.Namespace, nu.Spec.UpdaterRef.Name, err)
	}
	wc, err := u.Clusters.Client(ctx, types.NamespacedName{Namespace: nu.Namespace, Name: nu.Spec.ClusterName})
	if err != nil {
		var missing *workloadcluster.SecretNotFoundError
		if errors.As(err, &missing) {
			log.Info("Workload cluster unreachable for good, nothing to clean up", "reason", err.Error())
			return true, nil
		}
		return false, fmt.Errorf("reach workload cluster %s: %w", nu.Spec.ClusterName, err)
	}
	jobs := &batchv1.JobList{}
	if err := wc.List(ctx, jobs, client.MatchingLabels{NodeUpdateUIDLabel: string(nu.UID)}); err != nil {
		return false, fmt.Errorf("list the Jobs of NodeUpdate %s on the workload cluster: %w", nu.Name, err)
	}
	pending := false
	for i := range jobs.Items {
		job := &jobs.Items[i]
		key := client.ObjectKeyFromObject(job)
		if !job.DeletionTimestamp.IsZero() {
			pending = true
			continue
		}
		complete, failed := jobEnded(job)
		if !complete && failed == nil && !force {
			pending = true
			if step := job.Labels[StepLabel]; nodeupdater.StepState(nu, step) == inplacev1.StepStateRunning {
				nodeupdater.SetStepMessage(nu, step, fmt.Sprintf(
					"aborting: waiting for Job %s to end before deleting it (spec.force of the KubeadmUpdater deletes it at once)", key))
			}
			log.V(4).Info("Waiting for a kubeadm node Job to end before deleting it", "job", key)
			continue
		}
		if failed != nil && nu.Status.FailureReason != "" && nu.DeletionTimestamp.IsZero() {
			continue // kept for its logs until the NodeUpdate is deleted
		}
		err := wc.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground),
			client.Preconditions{UID: &job.UID})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return false, fmt.Errorf("delete Job %s on the workload cluster: %w", key, err)
		default:
			log.Info("Deleted kubeadm node Job", "job", key, "ended", complete || failed != nil, "force", force)
			pending = true
		}
	}
	if pending {
		return false, nil
	}
	uncordoned, err := nodedrain.UncordonIfOurs(ctx, wc, nu.Spec.NodeName, nu.UID)
	if err != nil {
		return false, err
	}
	if uncordoned {
		log.Info("Uncordoned the node this NodeUpdate cordoned", "node", nu.Spec.NodeName)
	}
	return true, nil
}

// NodeTimeout is the KubeadmUpdater's spec.nodeTimeout; zero means the reconciler's default.
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

func (u *Updater) config(ctx context.Context, nu *inplacev1.NodeUpdate) (*inplacev1.KubeadmUpdater, error) {
	cfg := &inplacev1.KubeadmUpdater{}
	key := client.ObjectKey{Namespace: nu.Namespace, Name: nu.Spec.UpdaterRef.Name}
	if err := u.Client.Get(ctx, key, cfg); err != nil {
		return nil, fmt.Errorf("read KubeadmUpdater %s: %w", key, err)
	}
	if cfg.Spec.Namespace == "" {
		cfg.Spec.Namespace = "kube-system"
	}
	if cfg.Spec.KubeletUnit == "" {
		cfg.Spec.KubeletUnit = "kubelet"
	}
	return cfg, nil
}

func (u *Updater) pollInterval() time.Duration {
	if u.PollInterval > 0 {
		return u.PollInterval
	}
	return DefaultPollInterval
}

// kubeletAt reports whether node's kubelet reports version.
func kubeletAt(node *corev1.Node, version string) bool {
	order, err := kubeversion.CompareStrings(node.Status.NodeInfo.KubeletVersion, version)
	return err == nil && order == 0
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
