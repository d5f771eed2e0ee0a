package extension

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// DefaultUpdaterSetting is the key of the ExtensionConfig's spec.settings that names the
// updater of clusters without the updater annotation, as <Kind>/<name> in the Cluster's
// namespace, for example HarvesterUpgrader/default. Cluster API passes the settings in
// every hook request.
const DefaultUpdaterSetting = "defaultUpdater"

// Retry intervals UpdateMachine answers with by default. Cluster API calls again after
// them (it caches the answer until then).
const (
	// retryWhileWaiting: the machine is handed over and waits for its NodeUpdate
	// (a preflight check may hold it).
	retryWhileWaiting int32 = 10
	// retryWhileRunning: the machine's NodeUpdate is running.
	retryWhileRunning int32 = 15
)

// InPlaceHooks serves Cluster API's in-place update hooks.
//
// CanUpdateMachineSet and CanUpdateMachine are hot (Cluster API calls them while it plans
// every rollout): they read only from the manager's cache and write nothing. They answer
// patches that cover the Kubernetes version, when it is an upgrade capi-inplace can do in
// place, and the fields the cluster's updater declares; anything else is left out, so that
// Cluster API rolls those changes out by replacing machines.
//
// UpdateMachine hands the machine to the externally paced UpgradeTask of its control
// plane or MachineDeployment and answers from the machine's NodeUpdate.
type InPlaceHooks struct {
	// Client reads from the manager's cache.
	Client client.Client
	// Reader reads from the API server itself. Cluster API marks a Machine for an
	// in-place update and calls UpdateMachine at once, so the cache may not show the mark
	// yet: a Machine the cache shows unmarked is read again through Reader before the
	// call is refused. Nil trusts the cache.
	Reader client.Reader
	// Requester admits the UpgradeTask that UpdateMachine hands machines to.
	Requester *upgraderequest.Requester
	// Registry holds the updaters the manager runs, and what they change in place.
	Registry *nodeupdater.Registry
	// DefaultUpdater is the manager's --default-updater, in Kind/name form; empty for none.
	DefaultUpdater string
	// RetryAfterSeconds, when above 0, replaces both retry intervals UpdateMachine answers
	// with (10 s while a machine waits, 15 s while its node is upgraded): the manager sets
	// it from a short --poll-interval, for simulated clusters whose nodes take seconds.
	RetryAfterSeconds int32
	// Recorder shows a fail-closed Cluster's refusals as events on the Cluster; nil
	// records none.
	Recorder events.EventRecorder
	// Refusals, when set, remembers the CanUpdateMachineSet answers "not in place" that
	// Cluster API keeps for 24 hours (RefusalLog), for UpgradePreview to name the
	// machines Cluster API would replace on them. Nil remembers none.
	Refusals *RefusalLog
}

// retryAfter returns the retry interval to answer: def, or RetryAfterSeconds when set.
func (h *InPlaceHooks) retryAfter(def int32) int32 {
	if h.RetryAfterSeconds > 0 {
		return h.RetryAfterSeconds
	}
	return def
}

var _ CAPIHooks = &InPlaceHooks{}

// CanUpdateMachineSet implements CAPIHooks: the MachineDeployment controller asks whether
// the change from the current to the desired MachineSet (and templates) can be done in place.
func (h *InPlaceHooks) CanUpdateMachineSet(ctx context.Context, req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) {
	call := startHook(ctx, "CanUpdateMachineSet", resp)
	defer call.end()
	if call.failIfWrongKind(req.APIVersion, req.Kind, "CanUpdateMachineSetRequest") {
		return
	}
	current, desired := &req.Current.MachineSet, &req.Desired.MachineSet
	in := canUpdateInput{
		hook:           "CanUpdateMachineSet",
		object:         "MachineSet",
		namespace:      current.Namespace,
		name:           current.Name,
		clusterName:    firstNonEmpty(current.Spec.ClusterName, desired.Spec.ClusterName, current.Labels[clusterv1.ClusterNameLabel]),
		currentVersion: current.Spec.Template.Spec.Version,
		desiredVersion: desired.Spec.Template.Spec.Version,
		controlPlane:   false,
		settings:       req.Settings,
		prefix:         []string{"spec", "template", "spec"},
	}
	in.target = func(ctx context.Context, h *InPlaceHooks, _ *clusterv1.Cluster) (upgraderequest.Target, error) {
		return machineSetTarget(ctx, h, in, firstNonEmptyLabels(current.Labels, desired.Labels))
	}
	patches, message, err := h.canUpdate(ctx, in, current, desired,
		[2]namedRaw{{"current.bootstrapConfigTemplate", req.Current.BootstrapConfigTemplate}, {"desired.bootstrapConfigTemplate", req.Desired.BootstrapConfigTemplate}},
		[2]namedRaw{{"current.infrastructureMachineTemplate", req.Current.InfrastructureMachineTemplate}, {"desired.infrastructureMachineTemplate", req.Desired.InfrastructureMachineTemplate}})
	if err != nil {
		call.fail(ReasonOf(err), err)
		return
	}
	resp.MachineSetPatch = patches.machine
	resp.BootstrapConfigTemplatePatch = patches.bootstrap
	resp.InfrastructureMachineTemplatePatch = patches.infrastructure
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
	resp.SetMessage(message)
	if h.Refusals != nil {
		// What Cluster API will keep: "not in place" when anything is left after the patches.
		left, err := RemainingMachineSet(req, resp)
		if werr := h.Refusals.answered(ctx, client.ObjectKeyFromObject(current), client.ObjectKeyFromObject(desired), err != nil || len(left) > 0, message, time.Now()); werr != nil {
			ctrl.LoggerFrom(ctx).Error(werr, "cannot record the CanUpdateMachineSet answer Cluster API keeps; UpgradePreview will not name the machines it replaces without asking again",
				"machineSet", client.ObjectKeyFromObject(current), "desired", client.ObjectKeyFromObject(desired))
		}
	}
}

// CanUpdateMachine implements CAPIHooks: KubeadmControlPlane asks whether the change from
// the current to the desired control plane Machine (and its objects) can be done in place.
// Only control planes call it, so the control plane rule (no skipped minor version) applies.
func (h *InPlaceHooks) CanUpdateMachine(ctx context.Context, req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) {
	call := startHook(ctx, "CanUpdateMachine", resp)
	defer call.end()
	if call.failIfWrongKind(req.APIVersion, req.Kind, "CanUpdateMachineRequest") {
		return
	}
	current, desired := &req.Current.Machine, &req.Desired.Machine
	in := canUpdateInput{
		hook:           "CanUpdateMachine",
		object:         "Machine",
		namespace:      current.Namespace,
		name:           current.Name,
		clusterName:    firstNonEmpty(current.Spec.ClusterName, desired.Spec.ClusterName, current.Labels[clusterv1.ClusterNameLabel]),
		currentVersion: current.Spec.Version,
		desiredVersion: desired.Spec.Version,
		controlPlane:   true,
		settings:       req.Settings,
		prefix:         []string{"spec"},
		target: func(_ context.Context, _ *InPlaceHooks, cluster *clusterv1.Cluster) (upgraderequest.Target, error) {
			return controlPlaneTarget(cluster)
		},
	}
	patches, message, err := h.canUpdate(ctx, in, current, desired,
		[2]namedRaw{{"current.bootstrapConfig", req.Current.BootstrapConfig}, {"desired.bootstrapConfig", req.Desired.BootstrapConfig}},
		[2]namedRaw{{"current.infrastructureMachine", req.Current.InfrastructureMachine}, {"desired.infrastructureMachine", req.Desired.InfrastructureMachine}})
	if err != nil {
		call.fail(ReasonOf(err), err)
		return
	}
	resp.MachinePatch = patches.machine
	resp.BootstrapConfigPatch = patches.bootstrap
	resp.InfrastructureMachinePatch = patches.infrastructure
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
	resp.SetMessage(message)
}

// canUpdateInput is what both CanUpdate hooks have in common.
type canUpdateInput struct {
	hook, object                   string
	namespace, name, clusterName   string
	currentVersion, desiredVersion string
	controlPlane                   bool
	settings                       map[string]string
	// prefix is where the machine spec sits in the Machine or MachineSet document.
	prefix []string
	// target finds the control plane or MachineDeployment whose machines are asked about.
	target func(context.Context, *InPlaceHooks, *clusterv1.Cluster) (upgraderequest.Target, error)
}

type namedRaw struct {
	field string
	raw   runtime.RawExtension
}

type canUpdatePatches struct {
	machine, bootstrap, infrastructure runtimehooksv1.Patch
}

// canUpdate answers both CanUpdate hooks. A request it cannot read, or a cluster whose
// configured updater is unusable, is an error (a Failure, so that Cluster API retries and
// replaces nothing on our account); a cluster without an updater, or a change that cannot
// be done in place, is a Success without patches, with the reason in the message.
func (h *InPlaceHooks) canUpdate(ctx context.Context, in canUpdateInput, current, desired any, bootstrap, infra [2]namedRaw) (canUpdatePatches, string, error) {
	var out canUpdatePatches
	if in.namespace == "" || in.name == "" {
		return out, "", withReason(HookReasonInvalidRequest, fmt.Errorf("the request's current %s has no namespace or name: Cluster API sends metadata.namespace and metadata.name of the object it plans to update", in.object))
	}
	if in.clusterName == "" {
		return out, "", withReason(HookReasonInvalidRequest, fmt.Errorf("%s %s/%s names no Cluster (spec.clusterName is empty)", in.object, in.namespace, in.name))
	}
	log := ctrl.LoggerFrom(ctx).WithValues("hook", in.hook, strings.ToLower(in.object), klog.KRef(in.namespace, in.name), "cluster", klog.KRef(in.namespace, in.clusterName))

	docs := map[string]objectDoc{}
	for _, nr := range append(bootstrap[:], infra[:]...) {
		d, err := decodeObject(nr.field, nr.raw)
		if err != nil {
			return out, "", withReason(HookReasonInvalidRequest, err)
		}
		docs[nr.field] = d
	}
	curDoc, err := typedDoc(current)
	if err != nil {
		return out, "", withReason(HookReasonInvalidRequest, fmt.Errorf("encode current %s: %w", in.object, err))
	}
	wantDoc, err := typedDoc(desired)
	if err != nil {
		return out, "", withReason(HookReasonInvalidRequest, fmt.Errorf("encode desired %s: %w", in.object, err))
	}

	cluster := &clusterv1.Cluster{}
	if err := h.Client.Get(ctx, client.ObjectKey{Namespace: in.namespace, Name: in.clusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return out, "", withReason(upgraderequest.ReasonClusterNotFound, failuref("Cluster %s/%s not found", in.namespace, in.clusterName))
		}
		return out, "", withReason(HookReasonAPIError, fmt.Errorf("read Cluster %s/%s: %w", in.namespace, in.clusterName, err))
	}
	// answer answers with patches and msg, unless something is left that Cluster API
	// would replace machines for: then a Failure naming it on a fail-closed Cluster, else
	// a Success whose message names it (when msg does not already say it is replaced).
	//
	// An answer that lets Cluster API update machines in place (something covered,
	// nothing left) is judged first as UpdateMachine will judge it (judgeHandOver): what
	// UpdateMachine would decline is refused now, before Cluster API moves any machine.
	answer := func(msg string, patches canUpdatePatches, saysReplaced bool, inPlace bool) (canUpdatePatches, string, error) {
		left, err := remainingAfter(in, curDoc, wantDoc, docs, bootstrap, infra, patches)
		if err != nil {
			return out, "", withReason(HookReasonInvalidRequest, err)
		}
		if len(left) == 0 {
			if inPlace {
				if err := h.judgeHandOver(ctx, in, cluster); err != nil {
					return out, "", err
				}
			}
			return patches, msg, nil
		}
		if FailClosed(cluster) {
			err := failClosedError(cluster, in, msg, left)
			h.recordRefusal(cluster, in.hook, err.Error())
			return out, "", withReason(HookReasonFailClosed, err)
		}
		if saysReplaced {
			return patches, msg, nil
		}
		return patches, fmt.Sprintf("%s; not covered, so Cluster API replaces the machines: %s", msg, strings.Join(left, ", ")), nil
	}

	fields, ref, message, err := h.updaterFields(ctx, cluster, in.settings)
	if err != nil {
		return out, message, err
	}
	if fields == nil {
		log.V(4).Info("not in place", "reason", message)
		return answer(message, out, true, false)
	}

	verdict := judgeVersion(in.currentVersion, in.desiredVersion, in.controlPlane)
	if verdict.changed && !verdict.covered {
		msg := fmt.Sprintf("capi-inplace cannot do this change in place: %s; Cluster API rolls it out by replacing machines", verdict.reason)
		log.V(4).Info("not in place", "reason", msg)
		return answer(msg, out, true, false)
	}
	machinePaths := fieldPaths(fields, nodeupdater.MachineObject, in.object, verdict.changed)
	if verdict.changed {
		machinePaths = append([][]string{{"version"}}, machinePaths...)
	}
	var covered []string
	var changed []string
	if out.machine, changed, err = coverPatch(curDoc, wantDoc, in.prefix, machinePaths); err != nil {
		return out, "", withReason(HookReasonInvalidRequest, err)
	}
	covered = append(covered, prefixed(in.object, changed)...)

	for _, pair := range []struct {
		object nodeupdater.FieldObject
		docs   [2]namedRaw
		patch  *runtimehooksv1.Patch
	}{
		{nodeupdater.BootstrapConfigObject, bootstrap, &out.bootstrap},
		{nodeupdater.InfrastructureMachineObject, infra, &out.infrastructure},
	} {
		cur, want := docs[pair.docs[0].field], docs[pair.docs[1].field]
		paths := fieldPaths(fields, pair.object, cur.kind(), verdict.changed)
		// A bootstrap config's or infrastructure machine's fields sit where the machine
		// spec's do: under spec of an object, under spec.template.spec of a template.
		if *pair.patch, changed, err = coverPatch(cur, want, in.prefix, paths); err != nil {
			return out, "", withReason(HookReasonInvalidRequest, err)
		}
		covered = append(covered, prefixed(cur.kind(), changed)...)
	}

	msg := "capi-inplace covers no change of this request"
	if len(covered) > 0 {
		msg = fmt.Sprintf("capi-inplace covers %s in place with updater %s", strings.Join(covered, ", "), ref)
	}
	log.V(4).Info("answered", "covered", covered)
	return answer(msg, out, false, len(covered) > 0)
}

func prefixed(object string, paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, object+" "+p)
	}
	return out
}

// updaterFields resolves the cluster's updater for the CanUpdate hooks. It returns the
// fields the updater changes in place; nil fields with a message when the cluster has no
// updater (no in-place update, said plainly); an error when its configured updater is
// unusable.
func (h *InPlaceHooks) updaterFields(ctx context.Context, cluster *clusterv1.Cluster, settings map[string]string) ([]nodeupdater.InPlaceField, inplacev1.UpdaterReference, string, error) {
	namespace := cluster.Namespace
	ref, source, err := h.resolveUpdater(cluster, settings)
	if err != nil {
		var none *nodeupdater.NoUpdaterError
		if errors.As(err, &none) {
			return nil, ref, "not in place: " + err.Error(), nil
		}
		return nil, ref, "", withReason(upgraderequest.ReasonInvalidUpdater, err)
	}
	if err := nodeupdater.CheckUpdaterAvailable(ctx, h.Client, h.Registry, namespace, ref); err != nil {
		var unavailable *nodeupdater.UnavailableUpdaterError
		if errors.As(err, &unavailable) {
			return nil, ref, "", withReason(upgraderequest.ReasonUpdaterUnavailable, fmt.Errorf("%s (named by %s); fix it, or remove it to let Cluster API replace machines", unavailable.Message, source))
		}
		return nil, ref, "", withReason(HookReasonAPIError, err)
	}
	var reg *nodeupdater.Registration
	if h.Registry != nil {
		if r, found, _ := h.Registry.Lookup(ref); found {
			reg = &r
		}
	}
	return nodeupdater.InPlaceFieldsOf(reg), ref, "", nil
}

// resolveUpdater applies the one rule of every path: the Cluster's annotation, else the
// ExtensionConfig's defaultUpdater setting, else the manager's --default-updater.
func (h *InPlaceHooks) resolveUpdater(cluster *clusterv1.Cluster, settings map[string]string) (inplacev1.UpdaterReference, nodeupdater.UpdaterSource, error) {
	fromSettings, err := updaterFromSettings(settings)
	if err != nil {
		return inplacev1.UpdaterReference{}, "", err
	}
	return nodeupdater.ResolveUpdater(cluster, fromSettings, h.DefaultUpdater)
}

// updaterFromSettings reads the ExtensionConfig's defaultUpdater setting; nil when unset.
func updaterFromSettings(settings map[string]string) (*inplacev1.UpdaterReference, error) {
	v := strings.TrimSpace(settings[DefaultUpdaterSetting])
	if v == "" {
		return nil, nil
	}
	ref, err := inplacev1.ParseUpdaterReference(v)
	if err != nil {
		return nil, fmt.Errorf("the ExtensionConfig's settings.%s: %w", DefaultUpdaterSetting, err)
	}
	return &ref, nil
}

// UpdateMachine implements CAPIHooks: the Machine controller asks to update a machine in
// place, and calls again until the answer is done or failed. The machine's spec already
// carries the desired version (Cluster API writes it before it calls).
//
// Only a machine Cluster API marked for an in-place update (update-in-progress, and
// UpdateMachine pending) is considered; any other answers Failure and changes nothing.
// The first calls find or create the externally paced UpgradeTask of the machine's control
// plane or MachineDeployment and hand the machine over; the task controller creates its
// NodeUpdate once preflight allows. Later calls answer from that NodeUpdate: retry while it
// runs, done when it succeeded, Failure with the node's own error when it failed. A machine
// already at the version is done without a task; a machine is handed to one task per
// version; a node upgrade that an annotation or an ExternalUpgradeRequest started on the
// same target is waited for, never aborted. Repeated calls change nothing more.
func (h *InPlaceHooks) UpdateMachine(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) {
	call := startHook(ctx, "UpdateMachine", resp)
	defer call.end()
	if call.failIfWrongKind(req.APIVersion, req.Kind, "UpdateMachineRequest") {
		return
	}
	desired := &req.Desired.Machine
	if desired.Namespace == "" || desired.Name == "" {
		call.fail(HookReasonInvalidRequest, errors.New("the request's desired.machine has no namespace or name: Cluster API sends the Machine to update"))
		return
	}
	log := ctrl.LoggerFrom(ctx).WithValues("hook", "UpdateMachine", "machine", klog.KObj(desired))
	ctx = ctrl.LoggerInto(ctx, log)
	if strings.TrimSpace(desired.Spec.Version) == "" {
		call.fail(upgraderequest.ReasonInvalidVersion, failuref("Machine %s/%s: desired.machine.spec.version is empty; capi-inplace upgrades machines to a Kubernetes version", desired.Namespace, desired.Name))
		return
	}

	// Read-only until the steady state below has answered (most calls end there): the
	// cache's own Machine, not a copy; it is copied before anything else uses it.
	machine := &clusterv1.Machine{}
	if err := h.Client.Get(ctx, client.ObjectKeyFromObject(desired), machine, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			call.fail(HookReasonMachineNotFound, failuref("Machine %s/%s not found", desired.Namespace, desired.Name))
			return
		}
		call.fail(HookReasonAPIError, fmt.Errorf("read Machine %s/%s: %w", desired.Namespace, desired.Name, err))
		return
	}
	if desired.Spec.ClusterName != "" && desired.Spec.ClusterName != machine.Spec.ClusterName {
		call.fail(upgraderequest.ReasonNotPartOfCluster, failuref("Machine %s/%s belongs to Cluster %s, not to Cluster %s named in the request", machine.Namespace, machine.Name, machine.Spec.ClusterName, desired.Spec.ClusterName))
		return
	}
	if !markedForUpdate(machine) && h.Reader != nil {
		fresh := &clusterv1.Machine{}
		if err := h.Reader.Get(ctx, client.ObjectKeyFromObject(desired), fresh); err != nil {
			call.fail(HookReasonAPIError, fmt.Errorf("read Machine %s/%s: %w", desired.Namespace, desired.Name, err))
			return
		}
		machine = fresh
	}
	if !markedForUpdate(machine) {
		call.fail(HookReasonNotMarked, failuref("Machine %s/%s is not marked for an in-place update by Cluster API: it needs the annotation %s and %s in its %s annotation, which Cluster API sets before it calls this hook; capi-inplace changed nothing",
			machine.Namespace, machine.Name, clusterv1.UpdateInProgressAnnotation, updateMachineHook, runtimev1.PendingHooksAnnotation))
		return
	}
	version := desired.Spec.Version

	// Steady state: the machine's NodeUpdate for this version answers.
	nu, err := h.latestNodeUpdate(ctx, machine, version)
	if err != nil {
		call.fail(HookReasonAPIError, err)
		return
	}
	if nu != nil && nu.Status.Phase != inplacev1.NodeUpdatePhaseAborted && nu.Spec.Phase != inplacev1.TaskActionAbort {
		answerFromNodeUpdate(resp, machine, nu, h.retryAfter(retryWhileRunning))
		call.reason = HookReasonNodeUpdateFailed
		return
	}
	machine = machine.DeepCopy()

	target, err := h.ownerTarget(ctx, machine)
	if err != nil {
		call.fail(ReasonOf(err), err)
		return
	}
	fromSettings, err := updaterFromSettings(req.Settings)
	if err != nil {
		call.fail(upgraderequest.ReasonInvalidUpdater, err)
		return
	}
	done, err := h.atTarget(ctx, machine, target, version, req.Settings)
	if err != nil {
		call.fail(HookReasonAPIError, err)
		return
	}
	if done {
		resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
		resp.SetRetryAfterSeconds(0)
		resp.SetMessage(fmt.Sprintf("Machine %s/%s already runs %s: nothing to update in place", machine.Namespace, machine.Name, version))
		return
	}
	handed, err := h.handedTo(ctx, machine, version)
	if err != nil {
		call.fail(HookReasonAPIError, err)
		return
	}
	switch {
	case handed != nil && upgraderequest.IsLive(handed):
		resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
		resp.SetRetryAfterSeconds(h.retryAfter(retryWhileWaiting))
		resp.SetMessage(waitingMessage(handed, machine.Name))
		return
	case handed != nil && handed.Status.Phase == inplacev1.TaskPhaseCompleted:
		// Another task would judge the machine as this one did; handing it over again
		// would only repeat that, one task after another.
		call.fail(HookReasonTaskCompleted, fmt.Errorf("UpgradeTask %s/%s completed without upgrading Machine %s, whose node does not run %s yet: capi-inplace does not hand a machine to a second task for the same version. See the task's status; delete the task to hand the machine over again",
			handed.Namespace, handed.Name, machine.Name, version))
		return
	}

	// Cluster API paces the machines (maxUnavailable, maxSurge, KCP one at a time); the
	// task's own checks still hold a node that is not safe to start. The CanUpdate hooks
	// judged this same request before Cluster API marked the machine (judgeHandOver).
	decision, err := h.Requester.Request(ctx, handOverRequest(machine.Namespace, machine.Spec.ClusterName, target, version, fromSettings))
	if err != nil {
		call.fail(HookReasonAPIError, fmt.Errorf("could not hand Machine %s/%s over: %w", machine.Namespace, machine.Name, err))
		return
	}
	if w := decision.Wait; w != nil {
		resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
		resp.SetRetryAfterSeconds(h.retryAfter(retryWhileWaiting))
		resp.SetMessage(fmt.Sprintf("waiting for UpgradeTask %s/%s (%s) to finish node %s (NodeUpdate %s): capi-inplace never aborts a node upgrade in progress; Machine %s is handed over once none of that task's NodeUpdates runs",
			machine.Namespace, w.Task, pacedBy(w.Pacing), w.Node, w.NodeUpdate, machine.Name))
		return
	}
	if !decision.Accepted {
		call.fail(decision.Reason, fmt.Errorf("capi-inplace declines to update Machine %s/%s in place (%s): %s", machine.Namespace, machine.Name, decision.Reason, decision.Message))
		return
	}
	task, err := h.Requester.HandOver(ctx, machine.Namespace, decision.TaskName, machine.Name)
	if err != nil {
		call.fail(HookReasonHandOverFailed, fmt.Errorf("could not hand Machine %s/%s over to UpgradeTask %s: %w", machine.Namespace, machine.Name, decision.TaskName, err))
		return
	}
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
	resp.SetRetryAfterSeconds(h.retryAfter(retryWhileWaiting))
	resp.SetMessage(waitingMessage(task, machine.Name))
}

// updateMachineHook is the name Cluster API lists in a Machine's pending-hooks annotation
// when it wants UpdateMachine called.
var updateMachineHook = runtimecatalog.HookName(runtimehooksv1.UpdateMachine)

// markedForUpdate reports whether Cluster API marked the machine for an in-place update,
// as its Machine controller requires before it calls UpdateMachine
// (shared/facts/capi-inplace-updates.md, E.16-19): the update-in-progress annotation, and
// UpdateMachine in the comma-separated pending-hooks annotation.
func markedForUpdate(m *clusterv1.Machine) bool {
	if _, ok := m.Annotations[clusterv1.UpdateInProgressAnnotation]; !ok {
		return false
	}
	for _, hook := range strings.Split(m.Annotations[runtimev1.PendingHooksAnnotation], ",") {
		if strings.TrimSpace(hook) == updateMachineHook {
			return true
		}
	}
	return false
}

// atTarget reports whether the machine already runs version as its updater upgrades it
// (upgraderequest.AtTarget). A cluster whose updater cannot be resolved, or a version
// that does not parse, is not at target here: the Requester then declines with the reason.
func (h *InPlaceHooks) atTarget(ctx context.Context, machine *clusterv1.Machine, target upgraderequest.Target, v string, settings map[string]string) (bool, error) {
	want, err := utilversion.ParseSemantic(v)
	if err != nil {
		return false, nil
	}
	cluster := &clusterv1.Cluster{}
	if err := h.Client.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: machine.Spec.ClusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("read Cluster %s/%s of Machine %s: %w", machine.Namespace, machine.Spec.ClusterName, machine.Name, err)
	}
	ref, _, err := h.resolveUpdater(cluster, settings)
	if err != nil {
		return false, nil
	}
	at, why, err := upgraderequest.AtTarget(ctx, h.Registry, nodeupdater.PreflightTarget{
		Namespace: machine.Namespace, ClusterName: machine.Spec.ClusterName, MachineName: machine.Name,
		NodeName: machine.Status.NodeRef.Name, Version: v, UpdaterRef: ref, ControlPlane: target.IsControlPlane(),
	}, machine, want)
	if err != nil {
		return false, fmt.Errorf("ask updater %s whether the node of Machine %s/%s runs %s: %w", ref, machine.Namespace, machine.Name, v, err)
	}
	if !at && why != "" {
		ctrl.LoggerFrom(ctx).V(4).Info("machine not at target", "why", why)
	}
	return at, nil
}

// handedTo returns the externally paced task of version the machine was handed to, the
// newest first, or nil. A machine is handed to one task per version: while that task is
// live it answers for the machine, and once it completed another would judge the machine
// the same way. A failed or aborted task lets the next attempt take the machine.
func (h *InPlaceHooks) handedTo(ctx context.Context, machine *clusterv1.Machine, v string) (*inplacev1.UpgradeTask, error) {
	list := &inplacev1.UpgradeTaskList{}
	if err := h.Client.List(ctx, list, client.InNamespace(machine.Namespace), client.MatchingLabels{inplacev1.ClusterNameLabel: machine.Spec.ClusterName}); err != nil {
		return nil, fmt.Errorf("list UpgradeTasks of Cluster %s/%s: %w", machine.Namespace, machine.Spec.ClusterName, err)
	}
	var found *inplacev1.UpgradeTask
	for i := range list.Items {
		t := &list.Items[i]
		if t.Spec.Pacing != inplacev1.PacingExternal || t.Spec.Version != v || !slices.Contains(t.Spec.Machines, machine.Name) {
			continue
		}
		if !upgraderequest.IsLive(t) && t.Status.Phase != inplacev1.TaskPhaseCompleted {
			continue
		}
		// A live task answers before a completed one.
		if found == nil || (upgraderequest.IsLive(t) && !upgraderequest.IsLive(found)) {
			found = t
		}
	}
	return found, nil
}

// pacedBy says, in a message, who paces a task and so which path asked for it.
func pacedBy(p inplacev1.Pacing) string {
	if p == inplacev1.PacingExternal {
		return "paced by Cluster API"
	}
	return "paced by capi-inplace: an in-place-upgrade-to annotation or an ExternalUpgradeRequest"
}

// latestNodeUpdate returns the newest NodeUpdate of the machine for version, or nil.
func (h *InPlaceHooks) latestNodeUpdate(ctx context.Context, machine *clusterv1.Machine, version string) (*inplacev1.NodeUpdate, error) {
	list := &inplacev1.NodeUpdateList{}
	// Read-only and called for every machine Cluster API updates, again and again: the
	// machine's own NodeUpdates through the cache's index (IndexNodeUpdates), not copied;
	// a client without a cache asks the API server, where the field is selectable.
	if err := h.Client.List(ctx, list, client.InNamespace(machine.Namespace),
		client.MatchingLabels{inplacev1.ClusterNameLabel: machine.Spec.ClusterName},
		client.MatchingFields{inplacev1.NodeUpdateMachineNameField: machine.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list NodeUpdates of Cluster %s/%s: %w", machine.Namespace, machine.Spec.ClusterName, err)
	}
	var latest *inplacev1.NodeUpdate
	for i := range list.Items {
		nu := &list.Items[i]
		if nu.Spec.MachineName != machine.Name || nu.Spec.Version != version || !nu.DeletionTimestamp.IsZero() {
			continue
		}
		if latest == nil || latest.CreationTimestamp.Before(&nu.CreationTimestamp) ||
			(latest.CreationTimestamp.Equal(&nu.CreationTimestamp) && latest.Name < nu.Name) {
			latest = nu
		}
	}
	return latest, nil
}

// answerFromNodeUpdate says how the machine's NodeUpdate stands, in Cluster API's terms.
func answerFromNodeUpdate(resp *runtimehooksv1.UpdateMachineResponse, machine *clusterv1.Machine, nu *inplacev1.NodeUpdate, retryAfter int32) {
	node := nu.Spec.NodeName
	switch nu.Status.Phase {
	case inplacev1.NodeUpdatePhaseSucceeded:
		resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
		resp.SetRetryAfterSeconds(0)
		resp.SetMessage(fmt.Sprintf("node %s of Machine %s upgraded in place to %s (NodeUpdate %s)", node, machine.Name, nu.Spec.Version, nu.Name))
	case inplacev1.NodeUpdatePhaseFailed:
		msg := nu.Status.FailureMessage
		if msg == "" {
			msg = "the NodeUpdate failed without a message"
		}
		step := ""
		if nu.Status.CurrentStep != "" {
			step = " at step " + nu.Status.CurrentStep
		}
		reason := ""
		if nu.Status.FailureReason != "" {
			reason = " (" + nu.Status.FailureReason + ")"
		}
		resp.SetStatus(runtimehooksv1.ResponseStatusFailure)
		resp.SetMessage(fmt.Sprintf("in-place upgrade of node %s to %s failed%s%s: %s; see NodeUpdate %s/%s. Delete that NodeUpdate to try again", node, nu.Spec.Version, step, reason, msg, nu.Namespace, nu.Name))
	case inplacev1.NodeUpdatePhaseSkipped:
		// drainPolicy Skip put the node back. Cluster API picks the machines on this
		// path, so there are no other nodes for capi-inplace to go on with: the machine's
		// update fails with what blocked its drain, and Cluster API decides what next.
		resp.SetStatus(runtimehooksv1.ResponseStatusFailure)
		resp.SetMessage(fmt.Sprintf("in-place upgrade of node %s to %s was skipped (%s, drainPolicy Skip): %s; see NodeUpdate %s/%s. Free the drain (or change the Cluster's drain policy) and delete that NodeUpdate to try again",
			node, nu.Spec.Version, nu.Status.FailureReason, nu.Status.FailureMessage, nu.Namespace, nu.Name))
	default:
		resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
		resp.SetRetryAfterSeconds(retryAfter)
		resp.SetMessage(progressMessage(nu))
	}
}

// progressMessage describes a running NodeUpdate: its step, and what is being retried.
func progressMessage(nu *inplacev1.NodeUpdate) string {
	if nu.Status.CurrentStep == "" {
		return fmt.Sprintf("node %s: NodeUpdate %s is starting", nu.Spec.NodeName, nu.Name)
	}
	position := ""
	for i, s := range nu.Status.Steps {
		if s.Name == nu.Status.CurrentStep {
			position = fmt.Sprintf(" (%d/%d)", i+1, len(nu.Status.Steps))
		}
	}
	msg := fmt.Sprintf("node %s: step %s%s of NodeUpdate %s", nu.Spec.NodeName, nu.Status.CurrentStep, position, nu.Name)
	if nu.Status.LastError != "" {
		msg += "; retrying after: " + nu.Status.LastError
	}
	return msg
}

// waitingMessage says what a handed-over machine waits for, from the task's status.
func waitingMessage(task *inplacev1.UpgradeTask, machine string) string {
	for _, m := range task.Status.Machines {
		if m.Name == machine && m.Message != "" {
			return fmt.Sprintf("waiting in UpgradeTask %s: %s", task.Name, m.Message)
		}
	}
	return fmt.Sprintf("handed to UpgradeTask %s; its NodeUpdate starts once the preflight checks pass", task.Name)
}

// ownerTarget finds the control plane or MachineDeployment a machine belongs to.
func (h *InPlaceHooks) ownerTarget(ctx context.Context, machine *clusterv1.Machine) (upgraderequest.Target, error) {
	for _, ref := range machine.OwnerReferences {
		if ref.Kind == "MachineSet" && groupOf(ref.APIVersion) == clusterv1.GroupVersion.Group {
			ms := &clusterv1.MachineSet{}
			if err := h.Client.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: ref.Name}, ms); err != nil {
				return upgraderequest.Target{}, withReason(HookReasonAPIError, fmt.Errorf("read MachineSet %s/%s of Machine %s: %w", machine.Namespace, ref.Name, machine.Name, err))
			}
			for _, msRef := range ms.OwnerReferences {
				if msRef.Kind == "MachineDeployment" && groupOf(msRef.APIVersion) == clusterv1.GroupVersion.Group {
					return upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: msRef.Name}}, nil
				}
			}
			return upgraderequest.Target{}, withReason(HookReasonUnknownOwner, failuref("Machine %s/%s belongs to MachineSet %s, which no MachineDeployment owns: capi-inplace upgrades machines of a control plane or a MachineDeployment", machine.Namespace, machine.Name, ms.Name))
		}
	}
	cluster := &clusterv1.Cluster{}
	if err := h.Client.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: machine.Spec.ClusterName}, cluster); err != nil {
		return upgraderequest.Target{}, withReason(HookReasonAPIError, fmt.Errorf("read Cluster %s/%s of Machine %s: %w", machine.Namespace, machine.Spec.ClusterName, machine.Name, err))
	}
	cp := cluster.Spec.ControlPlaneRef
	for _, ref := range machine.OwnerReferences {
		if cp.IsDefined() && ref.Kind == cp.Kind && ref.Name == cp.Name && groupOf(ref.APIVersion) == cp.APIGroup {
			return upgraderequest.Target{ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: cp.APIGroup, Kind: cp.Kind, Name: cp.Name}}, nil
		}
	}
	return upgraderequest.Target{}, withReason(HookReasonUnknownOwner, failuref("Machine %s/%s is owned by neither a MachineDeployment nor the control plane of Cluster %s: capi-inplace upgrades machines of a control plane or a MachineDeployment", machine.Namespace, machine.Name, cluster.Name))
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

func groupOf(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}

// failure is an answer's message that names an object first ("Machine ns/m not found"),
// as Cluster API and kubectl write them.
type failure string

func (f failure) Error() string { return string(f) }

func failuref(format string, args ...any) error { return failure(fmt.Sprintf(format, args...)) }

// IndexNodeUpdates adds the cache index UpdateMachine reads NodeUpdates through (by
// spec.machineName): the manager calls it once, before its cache starts.
func IndexNodeUpdates(ctx context.Context, indexer client.FieldIndexer) error {
	return indexer.IndexField(ctx, &inplacev1.NodeUpdate{}, inplacev1.NodeUpdateMachineNameField, func(obj client.Object) []string {
		nu, ok := obj.(*inplacev1.NodeUpdate)
		if !ok || nu.Spec.MachineName == "" {
			return nil
		}
		return []string{nu.Spec.MachineName}
	})
}

// firstNonEmptyLabels returns the first of the label maps that has any label.
func firstNonEmptyLabels(maps ...map[string]string) map[string]string {
	for _, m := range maps {
		if len(m) > 0 {
			return m
		}
	}
	return nil
}
