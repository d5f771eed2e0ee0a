// Package cascade holds the in-place-upgrade-to annotation cascade controllers: Cluster,
// control plane, MachineDeployment and Machine.
package cascade

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/internal/faults"
)

// The in-place-upgrade-to annotation cascade (DESIGN.md section 2C, docs/annotations.md).
//
// A user asks for an in-place upgrade by annotating a Cluster, its control plane, a
// MachineDeployment or a single Machine with inplace.cluster.x-k8s.io/in-place-upgrade-to.
// Every upgrade is carried out by an UpgradeTask admitted by the shared
// upgraderequest.Requester, exactly as an ExternalUpgradeRequest is. All state lives in
// the objects' annotations and in the UpgradeTasks, whose names are deterministic, so a
// restart of the manager picks up where it stood. Every annotation write carries the
// resourceVersion read: a change made in between is a conflict that is re-read, never
// overwritten. Nothing on this path writes spec.version of a Cluster API object.

// DefaultCascadePollInterval is how often an object whose asked upgrade runs is looked at
// again when nothing it watches changed (control plane kinds that are not watched).
const DefaultCascadePollInterval = 30 * time.Second

// defaultControlPlaneKinds are the control plane kinds whose objects the cascade watches,
// so that an in-place-upgrade-to set on one of them directly is seen at once; their
// permissions are in the manager's ClusterRole. A control plane of another kind is
// upgraded through its Cluster's annotation.
func defaultControlPlaneKinds() []schema.GroupKind {
	return []schema.GroupKind{
		{Group: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane"},
		{Group: "controlplane.cluster.x-k8s.io", Kind: "RKE2ControlPlane"},
	}
}

// UpgradeCascade sets up the four controllers of the in-place-upgrade-to annotation: on
// Clusters, on control planes, on MachineDeployments and on Machines.
type UpgradeCascade struct {
	// Requester admits every upgrade the cascade asks for; the ExternalUpgradeRequest hook
	// uses the same one.
	Requester *upgraderequest.Requester
	// Recorder records the InPlaceUpgrade* events; nil means the manager's recorder.
	Recorder events.EventRecorder
	// ControlPlaneKinds are the control plane kinds watched; nil means KubeadmControlPlane
	// and RKE2ControlPlane.
	// Kinds the API server does not serve when the manager starts are not watched.
	ControlPlaneKinds []schema.GroupKind
	// PollInterval is how often a running upgrade is looked at again without an event;
	// zero means DefaultCascadePollInterval.
	PollInterval time.Duration
}

// SetupWithManager registers the cascade's controllers with the manager.
func (c *UpgradeCascade) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if c.Requester == nil {
		return fmt.Errorf("the in-place-upgrade-to cascade needs the Requester that admits upgrade requests")
	}
	recorder := c.Recorder
	if recorder == nil {
		recorder = mgr.GetEventRecorder("inplace-upgrade-cascade")
	}
	recorder = faults.CountWarnings(recorder)
	kinds := c.ControlPlaneKinds
	if kinds == nil {
		kinds = defaultControlPlaneKinds()
	}
	poll := c.PollInterval
	if poll <= 0 {
		poll = DefaultCascadePollInterval
	}
	upgrader := &targetUpgrader{
		Client:       mgr.GetClient(),
		APIReader:    mgr.GetAPIReader(),
		Requester:    c.Requester,
		Recorder:     recorder,
		PollInterval: poll,
	}
	watched := servedControlPlaneKinds(ctx, mgr, kinds)
	if err := (&clusterUpgradeReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Requester: c.Requester, Recorder: recorder, PollInterval: poll,
	}).SetupWithManager(mgr, options, watched); err != nil {
		return fmt.Errorf("set up the Cluster in-place-upgrade-to controller: %w", err)
	}
	if err := (&controlPlaneUpgradeReconciler{upgrader: upgrader}).SetupWithManager(mgr, options, watched); err != nil {
		return fmt.Errorf("set up the control plane in-place-upgrade-to controller: %w", err)
	}
	if err := (&machineDeploymentUpgradeReconciler{upgrader: upgrader}).SetupWithManager(mgr, options); err != nil {
		return fmt.Errorf("set up the MachineDeployment in-place-upgrade-to controller: %w", err)
	}
	if err := (&machineUpgradeReconciler{upgrader: upgrader}).SetupWithManager(mgr, options); err != nil {
		return fmt.Errorf("set up the Machine in-place-upgrade-to controller: %w", err)
	}
	return nil
}

// servedControlPlaneKinds resolves the kinds the API server serves to their preferred
// version; the others are logged and left out.
func servedControlPlaneKinds(ctx context.Context, mgr ctrl.Manager, kinds []schema.GroupKind) []schema.GroupVersionKind {
	log := ctrl.LoggerFrom(ctx).WithName("inplace-upgrade-cascade")
	var out []schema.GroupVersionKind
	for _, gk := range kinds {
		mapping, err := mgr.GetRESTMapper().RESTMapping(gk)
		if err != nil {
			log.Info("control plane kind not served: its objects are not watched; an in-place-upgrade-to on their Cluster still upgrades them", "kind", gk.String())
			continue
		}
		out = append(out, mapping.GroupVersionKind)
	}
	return out
}

// upgradeAnnotations is the in-place upgrade state an object carries in its annotations.
// An empty field is an absent annotation.
type upgradeAnnotations struct {
	to       string
	status   string
	release  string
	message  string
	task     string
	progress string
}

var upgradeAnnotationKeys = []struct {
	key   string
	field func(*upgradeAnnotations) *string
}{
	{inplacev1.UpgradeToAnnotation, func(a *upgradeAnnotations) *string { return &a.to }},
	{inplacev1.UpgradeStatusAnnotation, func(a *upgradeAnnotations) *string { return &a.status }},
	{inplacev1.UpgradeReleaseAnnotation, func(a *upgradeAnnotations) *string { return &a.release }},
	{inplacev1.UpgradeMessageAnnotation, func(a *upgradeAnnotations) *string { return &a.message }},
	{inplacev1.UpgradeTaskAnnotation, func(a *upgradeAnnotations) *string { return &a.task }},
	{inplacev1.UpgradeProgressAnnotation, func(a *upgradeAnnotations) *string { return &a.progress }},
}

func readUpgradeAnnotations(obj client.Object) upgradeAnnotations {
	var a upgradeAnnotations
	annotations := obj.GetAnnotations()
	for _, k := range upgradeAnnotationKeys {
		*k.field(&a) = annotations[k.key]
	}
	return a
}

// version is the asked version; empty (also for a blank annotation) means none is asked.
func (a upgradeAnnotations) version() string { return strings.TrimSpace(a.to) }

// answered reports whether the status is an answer (done or failed). capi-inplace removes
// in-place-upgrade-to whenever it answers, so an answer next to in-place-upgrade-to means
// the upgrade was asked for again.
func (a upgradeAnnotations) answered() bool {
	return a.status == inplacev1.UpgradeStatusDone || a.status == inplacev1.UpgradeStatusFailed
}

// writeUpgradeAnnotations brings obj's in-place upgrade annotations to want with one merge
// patch that carries the resourceVersion read, and reports whether obj changed. Other
// annotations are left alone.
func writeUpgradeAnnotations(ctx context.Context, c client.Client, obj client.Object, want upgradeAnnotations) (bool, error) {
	if readUpgradeAnnotations(obj) == want {
		return false, nil
	}
	orig, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return false, fmt.Errorf("copy %s: not a client.Object", describeObject(obj))
	}
	annotations := maps.Clone(obj.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	for _, k := range upgradeAnnotationKeys {
		if v := *k.field(&want); v != "" {
			annotations[k.key] = v
		} else {
			delete(annotations, k.key)
		}
	}
	obj.SetAnnotations(annotations)
	if err := c.Patch(ctx, obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("write the in-place upgrade annotations of %s: %w", describeObject(obj), err)
	}
	return true, nil
}

// getUpgradeTask reads an UpgradeTask from the cache, and from the API server when the
// cache has not seen it yet (or when live); nil when it does not exist.
func getUpgradeTask(ctx context.Context, cache, apiReader client.Reader, key client.ObjectKey, live bool) (*inplacev1.UpgradeTask, error) {
	task := &inplacev1.UpgradeTask{}
	if !live {
		err := cache.Get(ctx, key, task)
		if err == nil {
			return task, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read UpgradeTask %s: %w", key, err)
		}
	}
	if err := apiReader.Get(ctx, key, task); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read UpgradeTask %s: %w", key, err)
	}
	return task, nil
}

// describeObject names an object in messages: "KubeadmControlPlane cp".
func describeObject(obj client.Object) string {
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if kind == "" {
		kind = fmt.Sprintf("%T", obj)
		if i := strings.LastIndex(kind, "."); i >= 0 {
			kind = kind[i+1:]
		}
	}
	return kind + " " + obj.GetName()
}

// reportingErrors wraps a cascade reconciler whose requests name objects of newObject's
// kind: an error it returns becomes a Warning event ReconcileError on that object. The
// objects are Cluster API's, so no condition of theirs is written.
func reportingErrors(r reconcile.Reconciler, c client.Client, recorder events.EventRecorder, newObject func() client.Object) reconcile.Reconciler {
	return faults.ErrorReporter{Reconciler: r, Client: c, Recorder: recorder, NewObject: newObject}
}

// cascadeEvent is an event to record on an annotated object once its annotations are written.
type cascadeEvent struct {
	eventType string
	reason    string
	action    string
	note      string
}

// recordCascadeEvent records ev on obj; related is the UpgradeTask concerned, or nil.
func recordCascadeEvent(recorder events.EventRecorder, obj client.Object, related runtime.Object, ev *cascadeEvent) {
	if ev == nil {
		return
	}
	recorder.Eventf(obj, related, ev.eventType, ev.reason, ev.action, "%s", ev.note)
}
