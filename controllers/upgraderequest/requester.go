// Package upgraderequest admits requests for in-place upgrades: it validates a request,
// aborts older unfinished UpgradeTasks of the same target, and creates the UpgradeTask
// (or finds the one an identical request created). It is shared by the
// ExternalUpgradeRequest hook, the annotation cascade and Cluster API's hooks, so that an
// upgrade is admitted the same way whichever path asked for it.
package upgraderequest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Decline reasons, short and machine-readable; the message says what to do.
const (
	ReasonInvalidRequest     = "InvalidRequest"
	ReasonClusterNotFound    = "ClusterNotFound"
	ReasonTargetNotFound     = "TargetNotFound"
	ReasonNotPartOfCluster   = "NotPartOfCluster"
	ReasonInvalidVersion     = "InvalidVersion"
	ReasonUnknownMachines    = "UnknownMachines"
	ReasonDowngrade          = "Downgrade"
	ReasonMinorVersionSkip   = "MinorVersionSkip"
	ReasonNoUpdater          = "NoUpdater"
	ReasonInvalidUpdater     = "InvalidUpdater"
	ReasonUpdaterUnavailable = "UpdaterUnavailable"
	ReasonNameConflict       = "NameConflict"
	// ReasonAmbiguousVersion: the version and a machine's differ only in build metadata
	// that has no order (kubeversion.Compare), so it is not known to be an upgrade.
	ReasonAmbiguousVersion = "AmbiguousBuildMetadata"
	// ReasonVersionSkew: the workers would run a kubelet newer than their control plane.
	ReasonVersionSkew = inplacev1.VersionSkewReason
	// ReasonControlPlaneMaxUnavailable: a control plane request lets more than one node
	// be upgraded at once.
	ReasonControlPlaneMaxUnavailable = "ControlPlaneMaxUnavailable"
)

// maxAttempts bounds how many times the same request is retried under new task names
// after earlier attempts failed or were aborted.
const maxAttempts = 20

// Request is an asked in-place upgrade of one control plane or MachineDeployment.
type Request struct {
	// Namespace is the Cluster's namespace.
	Namespace string
	// ClusterName is the Cluster's name.
	ClusterName string
	// Target is the control plane or MachineDeployment.
	Target Target
	// Machines restricts the upgrade to these machines of the target; empty means all.
	Machines []string
	// Version is the target Kubernetes version.
	Version string
	// DesiredMachine carries the desired bootstrap and infrastructure objects.
	DesiredMachine *inplacev1.DesiredMachine
	// UpdaterRef is the updater the request names, used when the Cluster has no annotation.
	UpdaterRef *inplacev1.UpdaterReference
	// Pacing is who picks the machines; empty means Extension.
	Pacing inplacev1.Pacing
	// MaxUnavailable, NodeOrder, PauseNodes and DryRun tune the task.
	MaxUnavailable *intstr.IntOrString
	NodeOrder      []string
	PauseNodes     []string
	DryRun         bool
	// KeepRunningNodes makes an older live task of the target that another path created
	// and that has a NodeUpdate not final a reason to wait rather than to abort: the
	// request is neither accepted nor declined, and Decision.Wait names that node.
	// UpdateMachine sets it, so that Cluster API's rollout never aborts a node upgrade an
	// annotation or an ExternalUpgradeRequest started.
	KeepRunningNodes bool
}

// Wait names the node upgrade of another task a request with KeepRunningNodes waits for.
type Wait struct {
	// Task is the older live task of the target.
	Task string
	// Pacing is the task's pacing.
	Pacing inplacev1.Pacing
	// NodeUpdate and Node are its NodeUpdate that is not final, and that NodeUpdate's node.
	NodeUpdate, Node string
}

// Decision is the answer to a Request.
type Decision struct {
	// Accepted is true when an UpgradeTask carries the request out.
	Accepted bool
	// TaskName is the accepted UpgradeTask's name.
	TaskName string
	// Created is true when this call created the task (false when an identical request
	// had already created it).
	Created bool
	// Reason is the short reason of a decline (Reason* constants).
	Reason string
	// Message says, for a decline, why and what to do.
	Message string
	// Aborted names the older unfinished tasks of the target this request aborted.
	Aborted []string
	// Wait, when set, says that the request waits for a node upgrade of an older task
	// (Request.KeepRunningNodes); nothing was created or aborted. Ask again later.
	Wait *Wait
}

func decline(reason, format string, args ...any) Decision {
	return Decision{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Requester admits upgrade requests.
type Requester struct {
	// Client reads the Cluster, its target and machines, and creates and aborts tasks.
	Client client.Client
	// TaskReader reads UpgradeTasks straight from the API server (the manager's API
	// reader), so that a request right after an identical one finds the task it created
	// even before the cache has seen it. Nil means Client.
	TaskReader client.Reader
	// Registry holds the updaters the manager runs.
	Registry *nodeupdater.Registry
	// DefaultUpdater is the manager's --default-updater, in Kind/name form; empty for none.
	DefaultUpdater string
	// Recorder, when set, records events on the tasks it creates and aborts.
	Recorder events.EventRecorder
}

// Request admits req: it aborts older unfinished tasks of the same target, then declines
// with a reason a person can act on, or accepts with the UpgradeTask that carries it out.
// The same request twice yields the same task. An error means the API server could not
// be asked; a decline is not an error.
func (r *Requester) Request(ctx context.Context, req Request) (Decision, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KRef(req.Namespace, req.ClusterName), "target", req.Target.String(), "version", req.Version)

	if d, bad := validateShape(req); bad {
		log.Info("declining upgrade request", "reason", d.Reason, "message", d.Message)
		return d, nil
	}

	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.ClusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return decline(ReasonClusterNotFound, "Cluster %s/%s not found", req.Namespace, req.ClusterName), nil
		}
		return Decision{}, fmt.Errorf("read Cluster %s/%s: %w", req.Namespace, req.ClusterName, err)
	}
	if d, err := r.checkTarget(ctx, cluster, req.Target); err != nil || d != nil {
		if d != nil {
			log.Info("declining upgrade request", "reason", d.Reason, "message", d.Message)
			return *d, nil
		}
		return Decision{}, err
	}

	if d, err := r.checkOptions(ctx, cluster, req); err != nil || d != nil {
		if d != nil {
			log.Info("declining upgrade request", "reason", d.Reason, "message", d.Message)
			return *d, nil
		}
		return Decision{}, err
	}

	hash := requestHash(req)
	tasks, err := r.tasksOfTarget(ctx, req)
	if err != nil {
		return Decision{}, err
	}
	if req.KeepRunningNodes {
		wait, err := r.runningNodeOfOlder(ctx, tasks, hash, req.Pacing)
		if err != nil || wait != nil {
			if wait != nil {
				log.V(2).Info("waiting for a node upgrade of an older task", "upgradeTask", wait.Task, "node", wait.Node)
			}
			return Decision{Wait: wait}, err
		}
	}
	aborted, err := r.abortOlder(ctx, tasks, hash, req.Pacing)
	if err != nil {
		return Decision{}, err
	}

	d, err := r.decide(ctx, cluster, req)
	if err != nil {
		return Decision{}, err
	}
	if d != nil {
		d.Aborted = aborted
		if len(aborted) > 0 {
			d.Message += fmt.Sprintf(" (the older unfinished UpgradeTask(s) %s of %s were aborted)", strings.Join(aborted, ", "), req.Target)
		}
		log.Info("declining upgrade request", "reason", d.Reason, "message", d.Message, "aborted", aborted)
		return *d, nil
	}

	updaterRef, _, _ := nodeupdater.ResolveUpdater(cluster, req.UpdaterRef, r.DefaultUpdater)
	accepted, err := r.createOrFind(ctx, cluster, req, updaterRef, hash, tasks)
	if err != nil {
		return Decision{}, err
	}
	accepted.Aborted = aborted
	log.Info("accepted upgrade request", "upgradeTask", accepted.TaskName, "created", accepted.Created, "aborted", aborted)
	return accepted, nil
}

func (r *Requester) taskReader() client.Reader {
	if r.TaskReader != nil {
		return r.TaskReader
	}
	return r.Client
}

func validateShape(req Request) (Decision, bool) {
	switch {
	case req.Namespace == "" || req.ClusterName == "":
		return decline(ReasonInvalidRequest, "the request names no Cluster: set cluster.metadata.namespace and cluster.metadata.name"), true
	case (req.Target.ControlPlaneRef == nil) == (req.Target.MachineDeploymentRef == nil):
		return decline(ReasonInvalidRequest, "the request must name exactly one of controlPlaneRef or machineDeploymentRef"), true
	case req.Target.Name() == "":
		return decline(ReasonInvalidRequest, "the request's target has no name"), true
	case strings.TrimSpace(req.Version) == "":
		return decline(ReasonInvalidVersion, "the request carries no version: set newMachineSpec.version (for example v1.33.3 or v1.33.3+rke2r1)"), true
	}
	return Decision{}, false
}

// checkTarget declines a target that does not exist or does not belong to the Cluster.
func (r *Requester) checkTarget(ctx context.Context, cluster *clusterv1.Cluster, t Target) (*Decision, error) {
	if md := t.MachineDeploymentRef; md != nil {
		obj := &clusterv1.MachineDeployment{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: md.Name}, obj); err != nil {
			if apierrors.IsNotFound(err) {
				d := decline(ReasonTargetNotFound, "MachineDeployment %s/%s not found", cluster.Namespace, md.Name)
				return &d, nil
			}
			return nil, fmt.Errorf("read MachineDeployment %s/%s: %w", cluster.Namespace, md.Name, err)
		}
		if obj.Spec.ClusterName != cluster.Name {
			d := decline(ReasonNotPartOfCluster, "MachineDeployment %s/%s belongs to Cluster %s, not to Cluster %s", cluster.Namespace, md.Name, obj.Spec.ClusterName, cluster.Name)
			return &d, nil
		}
		return nil, nil
	}

	cp := t.ControlPlaneRef
	clusterCP := cluster.Spec.ControlPlaneRef
	if clusterCP.Name != cp.Name || clusterCP.Kind != cp.Kind || clusterCP.APIGroup != cp.APIGroup {
		current := "none"
		if clusterCP.Name != "" {
			current = clusterCP.Kind + " " + clusterCP.Name
		}
		d := decline(ReasonNotPartOfCluster, "%s %s/%s is not the control plane of Cluster %s (its spec.controlPlaneRef names %s)", cp.Kind, cluster.Namespace, cp.Name, cluster.Name, current)
		return &d, nil
	}
	mapping, err := r.Client.RESTMapper().RESTMapping(schema.GroupKind{Group: cp.APIGroup, Kind: cp.Kind})
	if err != nil {
		d := decline(ReasonTargetNotFound, "control plane kind %s.%s is not served by the API server: %v", cp.Kind, cp.APIGroup, err)
		return &d, nil
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cp.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			d := decline(ReasonTargetNotFound, "%s %s/%s not found", cp.Kind, cluster.Namespace, cp.Name)
			return &d, nil
		}
		return nil, fmt.Errorf("read %s %s/%s: %w", cp.Kind, cluster.Namespace, cp.Name, err)
	}
	return nil, nil
}

// checkOptions declines options that cannot be safe, before anything is aborted: a
// control plane is upgraded one node at a time (etcd and API server quorum), so its
// maxUnavailable must resolve to 1 for its machine count.
func (r *Requester) checkOptions(ctx context.Context, cluster *clusterv1.Cluster, req Request) (*Decision, error) {
	if !req.Target.IsControlPlane() || req.MaxUnavailable == nil {
		return nil, nil
	}
	machines, err := sharedTargetMachines(ctx, r.Client, cluster.Namespace, cluster.Name, req.Target)
	if err != nil {
		return nil, err
	}
	n, err := preflight.ResolveMaxUnavailable(req.MaxUnavailable, len(machines))
	if err != nil {
		d := decline(ReasonInvalidRequest, "%v: give a whole number of at least 1 or a percentage from 1%% to 100%%", err)
		return &d, nil
	}
	if n > 1 {
		d := decline(ReasonControlPlaneMaxUnavailable, "maxUnavailable %s would let %d of the %d machines of %s be upgraded at once: capi-inplace upgrades a control plane one node at a time, so that etcd and the API servers keep quorum. Set maxUnavailable to 1 or leave it out",
			req.MaxUnavailable.String(), n, len(machines), req.Target)
		return &d, nil
	}
	return nil, nil
}

// Judge decides, reading only, whether Request would decline req for what it asks: its
// shape, its options, the version against the target's machines (a downgrade, a skipped
// minor version of a control plane), the updater, and a worker kubelet newer than its
// control plane (VersionSkew). It is the judgement Request makes after it aborted older
// tasks, without the abort and without creating a task, so that a question asked before
// the upgrade (Cluster API's CanUpdateMachineSet and CanUpdateMachine) is answered as
// UpdateMachine's request will be. The target's existence is not checked (Request does):
// the CanUpdate hooks' target is the object Cluster API asks about. Nil means acceptable.
func (r *Requester) Judge(ctx context.Context, req Request) (*Decision, error) {
	if d, bad := validateShape(req); bad {
		return &d, nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.ClusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			d := decline(ReasonClusterNotFound, "Cluster %s/%s not found", req.Namespace, req.ClusterName)
			return &d, nil
		}
		return nil, fmt.Errorf("read Cluster %s/%s: %w", req.Namespace, req.ClusterName, err)
	}
	if d, err := r.checkOptions(ctx, cluster, req); err != nil || d != nil {
		return d, err
	}
	return r.decide(ctx, cluster, req)
}

// controlPlaneAtKey carries the version the control plane is assumed to run (WithControlPlaneAt).
type controlPlaneAtKey struct{}

// WithControlPlaneAt makes the VersionSkew judgement of ctx take the control plane as
// running v: UpgradePreview judges the workers of an upgrade whose control plane goes
// first, to v, in the same run. Nothing on the path that acts sets it.
func WithControlPlaneAt(ctx context.Context, v string) context.Context {
	return context.WithValue(ctx, controlPlaneAtKey{}, v)
}

// decide checks that the upgrade can be done: the version, the machines, the updater.
// It returns nil when the request is acceptable.
func (r *Requester) decide(ctx context.Context, cluster *clusterv1.Cluster, req Request) (*Decision, error) {
	target, d := ParseTargetVersion(req.Version)
	if d != nil {
		return d, nil
	}

	machines, err := sharedTargetMachines(ctx, r.Client, cluster.Namespace, cluster.Name, req.Target)
	if err != nil {
		return nil, err
	}
	byName := map[string]*clusterv1.Machine{}
	for i := range machines {
		byName[machines[i].Name] = &machines[i]
	}
	var unknown []string
	for _, name := range req.Machines {
		if byName[name] == nil {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		d := decline(ReasonUnknownMachines, "machine(s) %s are not machines of %s in Cluster %s/%s", strings.Join(unknown, ", "), req.Target, cluster.Namespace, cluster.Name)
		return &d, nil
	}
	scope := machines
	if len(req.Machines) > 0 {
		scope = scope[:0:0]
		for _, name := range req.Machines {
			scope = append(scope, *byName[name])
		}
	}

	if d := CheckMachineVersions(req.Version, target, scope, req.Target.IsControlPlane()); d != nil {
		return d, nil
	}

	ref, source, err := nodeupdater.ResolveUpdater(cluster, req.UpdaterRef, r.DefaultUpdater)
	if err != nil {
		var none *nodeupdater.NoUpdaterError
		if errors.As(err, &none) {
			d := decline(ReasonNoUpdater, "%s", err.Error())
			return &d, nil
		}
		d := decline(ReasonInvalidUpdater, "%s", err.Error())
		return &d, nil
	}
	if err := nodeupdater.CheckUpdaterAvailable(ctx, r.Client, r.Registry, cluster.Namespace, ref); err != nil {
		var unavailable *nodeupdater.UnavailableUpdaterError
		if errors.As(err, &unavailable) {
			d := decline(ReasonUpdaterUnavailable, "%s (named by %s)", unavailable.Message, source)
			return &d, nil
		}
		return nil, err
	}
	if !req.Target.IsControlPlane() {
		return r.checkSkew(ctx, cluster, req, target)
	}
	return nil, nil
}

// ParseTargetVersion parses the version an upgrade asks for; a version that does not
// parse is declined with what to give instead. UpgradePreview shows the same words.
func ParseTargetVersion(v string) (*version.Version, *Decision) {
	target, err := kubeversion.ParseSemantic(v)
	if err != nil {
		d := decline(ReasonInvalidVersion, "version %q is not a valid semantic version: give MAJOR.MINOR.PATCH with an optional v prefix, pre-release and build metadata, for example v1.33.3 or v1.33.3+rke2r1", v)
		return nil, &d
	}
	return target, nil
}

// CheckMachineVersions declines version v (parsed: target) for machines when it is not an
// upgrade of every one of them: older than a machine runs (a downgrade), not ordered
// against it, or, for a control plane, a skipped minor version. Nil when it is.
// UpgradePreview shows the same words.
func CheckMachineVersions(v string, target *version.Version, machines []clusterv1.Machine, controlPlane bool) *Decision {
	for i := range machines {
		m := &machines[i]
		cur, err := kubeversion.ParseSemantic(CurrentVersion(m))
		if err != nil {
			continue
		}
		order, err := kubeversion.Compare(target, cur)
		if err != nil {
			d := decline(ReasonAmbiguousVersion, "version %s and %s, which machine %s runs, cannot be ordered: %v. Ask for a version with a higher MAJOR.MINOR.PATCH, or for the machine's build form with a higher N%s",
				v, CurrentVersion(m), m.Name, err, example(CurrentVersion(m)))
			return &d
		}
		if order < 0 {
			d := decline(ReasonDowngrade, "version %s is older than %s, which machine %s already runs: in-place downgrades are not supported", v, CurrentVersion(m), m.Name)
			return &d
		}
		if controlPlane && (target.Major() != cur.Major() || target.Minor() > cur.Minor()+1) {
			d := decline(ReasonMinorVersionSkip, "control plane machine %s runs %s; %s would skip a minor version, which Kubernetes does not support for a control plane: upgrade to v%d.%d first",
				m.Name, CurrentVersion(m), v, cur.Major(), cur.Minor()+1)
			return &d
		}
	}
	return nil
}

// example suggests, in a decline, the version one build newer than cur, when cur carries
// counted build metadata.
func example(cur string) string {
	if next, ok := kubeversion.NextBuild(cur); ok {
		return " (for example " + next + ")"
	}
	return ""
}

// checkSkew declines workers newer than their control plane: a kubelet must never be
// newer than the API server. The control plane's version is the lowest its machines run.
// A live or completed UpgradeTask of the control plane (not a dry run) to the target or
// newer makes the request acceptable: the task controller holds the workers until the
// control plane is there. A version that cannot be ordered against the control plane's is not known to be
// older, so it counts as newer.
func (r *Requester) checkSkew(ctx context.Context, cluster *clusterv1.Cluster, req Request, target *version.Version) (*Decision, error) {
	ref := cluster.Spec.ControlPlaneRef
	if !ref.IsDefined() {
		// A Cluster without a control plane object has no control plane machines to compare.
		return nil, nil
	}
	cpTarget := Target{ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: ref.APIGroup, Kind: ref.Kind, Name: ref.Name}}
	cpMachines, err := sharedTargetMachines(ctx, r.Client, cluster.Namespace, cluster.Name, cpTarget)
	if err != nil {
		return nil, err
	}
	var lowest *clusterv1.Machine
	var lowestVersion *version.Version
	for i := range cpMachines {
		v, err := kubeversion.ParseSemantic(CurrentVersion(&cpMachines[i]))
		if err != nil {
			continue
		}
		if lowest == nil || v.LessThan(lowestVersion) {
			lowest, lowestVersion = &cpMachines[i], v
		}
	}
	if lowest == nil {
		return nil, nil
	}
	if order, err := kubeversion.Compare(target, lowestVersion); err == nil && order <= 0 {
		return nil, nil
	}
	if assumed, ok := ctx.Value(controlPlaneAtKey{}).(string); ok {
		if order, err := kubeversion.CompareStrings(assumed, req.Version); err == nil && order >= 0 {
			return nil, nil
		}
	}
	tasks, err := r.tasksOf(ctx, cluster.Namespace, cluster.Name, cpTarget)
	if err != nil {
		return nil, err
	}
	for i := range tasks {
		t := &tasks[i]
		// A completed task counts too: the cache may not show the release annotations it
		// wrote on the control plane machines yet (it writes them before it completes).
		// The task controller's VersionSkew hold judges the machines themselves anyway.
		if (!IsLive(t) && t.Status.Phase != inplacev1.TaskPhaseCompleted) || t.Spec.DryRun {
			continue
		}
		if order, err := kubeversion.CompareStrings(t.Spec.Version, req.Version); err == nil && order >= 0 {
			return nil, nil
		}
	}
	d := decline(ReasonVersionSkew, "version %s is newer than %s, which control plane machine %s of Cluster %s/%s runs, and no UpgradeTask upgrades %s to %s or newer: a worker's kubelet must never be newer than its control plane. Upgrade the control plane first (or annotate the Cluster with %s, which upgrades the control plane, then the workers)",
		req.Version, CurrentVersion(lowest), lowest.Name, cluster.Namespace, cluster.Name, cpTarget, req.Version, inplacev1.UpgradeToAnnotation)
	return &d, nil
}

// tasksOfTarget lists the tasks of the request's Cluster and target, oldest first.
func (r *Requester) tasksOfTarget(ctx context.Context, req Request) ([]inplacev1.UpgradeTask, error) {
	return r.tasksOf(ctx, req.Namespace, req.ClusterName, req.Target)
}

// tasksOf lists the tasks of a Cluster's target, oldest first.
func (r *Requester) tasksOf(ctx context.Context, namespace, clusterName string, target Target) ([]inplacev1.UpgradeTask, error) {
	list := &inplacev1.UpgradeTaskList{}
	if err := r.taskReader().List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list UpgradeTasks in namespace %s: %w", namespace, err)
	}
	var out []inplacev1.UpgradeTask
	for _, t := range list.Items {
		if t.Spec.ClusterName == clusterName && TargetOf(&t).Same(target) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b inplacev1.UpgradeTask) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// abortOlder asks every unfinished task of the target that another request created to
// abort. A live task of this very request is kept: asking twice is not a new request.
// Externally paced tasks do not abort one another: Cluster API paces them, one machine at
// a time, and a machine it is updating to an older version finishes there while newer
// machines go to the newer version.
func (r *Requester) abortOlder(ctx context.Context, tasks []inplacev1.UpgradeTask, hash string, pacing inplacev1.Pacing) ([]string, error) {
	var aborted []string
	for i := range tasks {
		t := &tasks[i]
		if !supersedes(t, hash, pacing) {
			continue
		}
		orig := t.DeepCopy()
		t.Spec.Phase = inplacev1.TaskActionAbort
		if err := r.Client.Patch(ctx, t, client.MergeFrom(orig)); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return aborted, fmt.Errorf("abort older UpgradeTask %s: %w", client.ObjectKeyFromObject(t), err)
		}
		ctrl.LoggerFrom(ctx).Info("aborted older UpgradeTask superseded by a new request", "upgradeTask", klog.KObj(t))
		if r.Recorder != nil {
			r.Recorder.Eventf(t, nil, corev1.EventTypeWarning, inplacev1.SupersededReason, "Abort", "a newer upgrade request for the same target superseded this task; aborting")
		}
		aborted = append(aborted, t.Name)
	}
	return aborted, nil
}

// supersedes reports whether a request (its hash and pacing) aborts the older task t.
func supersedes(t *inplacev1.UpgradeTask, hash string, pacing inplacev1.Pacing) bool {
	if !IsLive(t) || t.Annotations[inplacev1.RequestHashAnnotation] == hash {
		return false
	}
	return pacing != inplacev1.PacingExternal || t.Spec.Pacing != inplacev1.PacingExternal
}

// runningNodeOfOlder returns, for a request with KeepRunningNodes, the first NodeUpdate
// that is not final of an older task the request would abort; nil when there is none.
func (r *Requester) runningNodeOfOlder(ctx context.Context, tasks []inplacev1.UpgradeTask, hash string, pacing inplacev1.Pacing) (*Wait, error) {
	for i := range tasks {
		t := &tasks[i]
		if !supersedes(t, hash, pacing) {
			continue
		}
		list := &inplacev1.NodeUpdateList{}
		if err := r.Client.List(ctx, list, client.InNamespace(t.Namespace), client.MatchingLabels{inplacev1.UpgradeTaskLabel: LabelValue(t.Name)}); err != nil {
			return nil, fmt.Errorf("list NodeUpdates of UpgradeTask %s: %w", client.ObjectKeyFromObject(t), err)
		}
		slices.SortFunc(list.Items, func(a, b inplacev1.NodeUpdate) int { return strings.Compare(a.Name, b.Name) })
		for _, nu := range list.Items {
			if !nu.Status.Phase.IsFinal() {
				return &Wait{Task: t.Name, Pacing: t.Spec.Pacing, NodeUpdate: nu.Name, Node: nu.Spec.NodeName}, nil
			}
		}
	}
	return nil, nil
}

// IsLive reports whether a task is unfinished and not asked to abort. A dry run whose plan
// is shown (Planned) is live: it stands for its target until a newer request aborts it.
func IsLive(t *inplacev1.UpgradeTask) bool {
	return (!t.Status.Phase.IsFinal() || t.Status.Phase == inplacev1.TaskPhasePlanned) && t.Spec.Phase != inplacev1.TaskActionAbort
}

// createOrFind returns the task of this request: a live (or completed) task an identical
// request created, else a new one named TaskName(..., attempt) with the first attempt
// whose name is free.
func (r *Requester) createOrFind(ctx context.Context, cluster *clusterv1.Cluster, req Request, updaterRef inplacev1.UpdaterReference, hash string, tasks []inplacev1.UpgradeTask) (Decision, error) {
	existing := map[string]*inplacev1.UpgradeTask{}
	for i := range tasks {
		existing[tasks[i].Name] = &tasks[i]
	}
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		name := TaskName(req.Target.Name(), req.Version, hash, attempt)
		t := existing[name]
		if t == nil {
			t = &inplacev1.UpgradeTask{}
			if err := r.taskReader().Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: name}, t); err != nil {
				if !apierrors.IsNotFound(err) {
					return Decision{}, fmt.Errorf("read UpgradeTask %s/%s: %w", req.Namespace, name, err)
				}
				t = nil
			}
		}
		if t == nil {
			task := newTask(cluster, req, updaterRef, hash, name)
			err := r.Client.Create(ctx, task)
			switch {
			case err == nil:
				if r.Recorder != nil {
					r.Recorder.Eventf(task, nil, corev1.EventTypeNormal, "Accepted", "Create", "accepted the upgrade of %s to %s with updater %s", req.Target, req.Version, updaterRef)
				}
				return Decision{Accepted: true, TaskName: name, Created: true}, nil
			case apierrors.IsAlreadyExists(err):
				// A concurrent identical request won the race; read what it created.
				t = &inplacev1.UpgradeTask{}
				if err := r.taskReader().Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: name}, t); err != nil {
					return Decision{}, fmt.Errorf("read UpgradeTask %s/%s after a conflicting create: %w", req.Namespace, name, err)
				}
			default:
				return Decision{}, fmt.Errorf("create UpgradeTask %s/%s: %w", req.Namespace, name, err)
			}
		}
		if t.Annotations[inplacev1.RequestHashAnnotation] != hash || !TargetOf(t).Same(req.Target) {
			return decline(ReasonNameConflict, "UpgradeTask %s/%s exists and was not created by this request; delete it or rename it", req.Namespace, name), nil
		}
		if IsLive(t) || (t.Status.Phase == inplacev1.TaskPhaseCompleted && req.Pacing != inplacev1.PacingExternal) {
			return Decision{Accepted: true, TaskName: name}, nil
		}
		// Failed, aborted or aborting: the same request again is a retry under the next
		// name. So is a completed externally paced task: Cluster API hands a machine it
		// chose later to a new task, since a completed one starts nothing.
	}
	return decline(ReasonNameConflict, "this request was already tried %d times for %s; delete old UpgradeTasks of this target to try again", maxAttempts, req.Target), nil
}

func newTask(cluster *clusterv1.Cluster, req Request, updaterRef inplacev1.UpdaterReference, hash, name string) *inplacev1.UpgradeTask {
	pacing := req.Pacing
	if pacing == "" {
		pacing = inplacev1.PacingExtension
	}
	return &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   cluster.Namespace,
			Labels:      map[string]string{inplacev1.ClusterNameLabel: cluster.Name},
			Annotations: map[string]string{inplacev1.RequestHashAnnotation: hash},
		},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName:          cluster.Name,
			ControlPlaneRef:      req.Target.ControlPlaneRef,
			MachineDeploymentRef: req.Target.MachineDeploymentRef,
			Machines:             slices.Clone(req.Machines),
			Version:              req.Version,
			DesiredMachine:       req.DesiredMachine,
			UpdaterRef:           updaterRef,
			Phase:                inplacev1.TaskActionOngoing,
			Pacing:               pacing,
			MaxUnavailable:       req.MaxUnavailable,
			NodeOrder:            slices.Clone(req.NodeOrder),
			PauseNodes:           slices.Clone(req.PauseNodes),
			DryRun:               req.DryRun,
		},
	}
}

// requestHash digests what makes two requests the same request.
func requestHash(req Request) string {
	machines := slices.Clone(req.Machines)
	slices.Sort(machines)
	pauseNodes := slices.Clone(req.PauseNodes)
	slices.Sort(pauseNodes)
	data, _ := json.Marshal(struct {
		Namespace, Cluster string
		Target             Target
		Machines           []string
		Version            string
		Desired            *inplacev1.DesiredMachine
		Updater            *inplacev1.UpdaterReference
		Pacing             inplacev1.Pacing
		MaxUnavailable     *intstr.IntOrString
		NodeOrder          []string
		PauseNodes         []string
		DryRun             bool
	}{req.Namespace, req.ClusterName, req.Target, machines, req.Version, req.DesiredMachine, req.UpdaterRef, req.Pacing, req.MaxUnavailable, req.NodeOrder, pauseNodes, req.DryRun})
	return digest(string(data))
}
