package upgradetask

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/cascade"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/internal/faults"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// The failure paths of the controllers and hooks, each driven on a real API server: each
// must say what failed in a Warning event and a condition (or, on objects that are Cluster
// API's, the in-place-upgrade-message annotation; for a hook, its answer) carrying the
// underlying error, and increment a metric.

// scriptedUpdater is an updater the manager runs for ConfigMap configurations, which
// fails as it is told.
type scriptedUpdater struct {
	// reconcileErr is returned by every Reconcile once the step started.
	reconcileErr error
	// abortErr is returned by every Abort.
	abortErr error
}

func (u *scriptedUpdater) Reconcile(_ context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	nodeupdater.DeclareSteps(nu, "Work")
	nodeupdater.StartStep(nu, "Work", "working on node "+nu.Spec.NodeName)
	if u.reconcileErr != nil {
		return nodeupdater.Result{}, u.reconcileErr
	}
	return nodeupdater.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

func (u *scriptedUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) {
	if u.abortErr != nil {
		return false, u.abortErr
	}
	return true, nil
}

func (u *scriptedUpdater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return nil
}

// unreachableWorkload is a workload cluster whose kubeconfig cannot be used.
type unreachableWorkload struct{ err error }

func (u unreachableWorkload) Client(context.Context, types.NamespacedName) (client.Client, error) {
	return nil, u.err
}

// faultWorld is one failure path's namespace: a Cluster "harvester" whose updater is
// ConfigMap/updater, a MachineDeployment "workers" of one machine, and a manager for the
// namespace only.
type faultWorld struct {
	ns       string
	machine  string
	updater  *scriptedUpdater
	workload WorkloadClusters
	registry *nodeupdater.Registry
}

func newFaultWorld() *faultWorld {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, k8s, "fault")
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "updater"}})).To(Succeed())
	_, err = fixtures.Cluster(ctx, k8s, ns, "harvester", "", map[string]string{inplacev1.UpdaterAnnotation: "ConfigMap/updater"})
	Expect(err).NotTo(HaveOccurred())
	_, machines, err := fixtures.MachineDeployment(ctx, k8s, ns, "harvester", "workers", fromVersion, 1)
	Expect(err).NotTo(HaveOccurred())
	f := &faultWorld{ns: ns, machine: machines[0].Name, updater: &scriptedUpdater{}, workload: SameCluster{Management: k8s}}
	f.registry = nodeupdater.NewRegistry()
	Expect(f.registry.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "ConfigMap"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater:   f.updater,
	})).To(Succeed())
	return f
}

// start runs the NodeUpdate reconciler, the UpgradeTask controller and the cascade, wired
// as main.go wires them, for the world's namespace only.
func (f *faultWorld) start() {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{f.ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	opts := controller.Options{MaxConcurrentReconciles: 2}
	Expect((&nodeupdater.Reconciler{
		Registry: f.registry, PollInterval: 100 * time.Millisecond, UpdaterRecheckInterval: 200 * time.Millisecond,
		RetryBaseDelay: 200 * time.Millisecond, RetryMaxDelay: time.Second, MaxAttempts: 100,
	}).SetupWithManager(mgr, opts)).To(Succeed())
	Expect((&Reconciler{Registry: f.registry, Workload: f.workload, PollInterval: 200 * time.Millisecond}).
		SetupWithManager(ctx, mgr, opts)).To(Succeed())
	requester := &upgraderequest.Requester{
		Client: mgr.GetClient(), TaskReader: mgr.GetAPIReader(), Registry: f.registry,
		Recorder: faults.CountWarnings(mgr.GetEventRecorder("capi-inplace-requests")),
	}
	Expect((&cascade.UpgradeCascade{Requester: requester, PollInterval: time.Second}).SetupWithManager(ctx, mgr, opts)).To(Succeed())
	DeferCleanup(runManager(mgr))
}

// task creates the UpgradeTask of the MachineDeployment with the given updater.
func (f *faultWorld) task(updater string) {
	GinkgoHelper()
	ref, err := inplacev1.ParseUpdaterReference(updater)
	Expect(err).NotTo(HaveOccurred())
	t := (&world{ns: f.ns}).mdTask("upgrade", func(t *inplacev1.UpgradeTask) { t.Spec.UpdaterRef = ref })
	Expect(k8s.Create(ctx, t)).To(Succeed())
}

// nodeUpdate creates a NodeUpdate of the world's machine by hand, owned by nobody.
func (f *faultWorld) nodeUpdate(name, updater string) {
	GinkgoHelper()
	ref, err := inplacev1.ParseUpdaterReference(updater)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx, &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName: "harvester", MachineName: f.machine, NodeName: fixtures.NodeName(f.ns, f.machine),
			Version: targetVersion, UpdaterRef: ref, Phase: inplacev1.TaskActionOngoing,
		},
	})).To(Succeed())
}

// onlyNodeUpdate returns the name of the namespace's one NodeUpdate, once it exists.
func (f *faultWorld) onlyNodeUpdate() string {
	GinkgoHelper()
	var name string
	Eventually(func() []inplacev1.NodeUpdate { return (&world{ns: f.ns}).nodeUpdates() }, timeout, poll).Should(HaveLen(1))
	name = (&world{ns: f.ns}).nodeUpdates()[0].Name
	return name
}

// warningNotes lists the notes of the Warning events of reason on objects of kind.
func (f *faultWorld) warningNotes(kind, reason string) []string {
	list := &eventsv1.EventList{}
	if err := k8s.List(ctx, list, client.InNamespace(f.ns)); err != nil {
		return nil
	}
	var out []string
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning && e.Regarding.Kind == kind && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

// conditionsOf renders the conditions of the namespace's objects of kind (UpgradeTask,
// NodeUpdate, Machine), or the in-place-upgrade-message annotation of a
// MachineDeployment, one per line.
func (f *faultWorld) conditionsOf(kind string) string {
	var lines []string
	add := func(name string, conds []metav1.Condition) {
		for _, c := range conds {
			lines = append(lines, fmt.Sprintf("%s %s %s=%s %s: %s", kind, name, c.Type, c.Status, c.Reason, c.Message))
		}
	}
	switch kind {
	case "UpgradeTask":
		list := &inplacev1.UpgradeTaskList{}
		_ = k8s.List(ctx, list, client.InNamespace(f.ns))
		for _, o := range list.Items {
			add(o.Name, o.Status.Conditions)
		}
	case "NodeUpdate":
		list := &inplacev1.NodeUpdateList{}
		_ = k8s.List(ctx, list, client.InNamespace(f.ns))
		for _, o := range list.Items {
			add(o.Name, o.Status.Conditions)
		}
	case "Machine":
		list := &clusterv1.MachineList{}
		_ = k8s.List(ctx, list, client.InNamespace(f.ns))
		for _, o := range list.Items {
			add(o.Name, o.Status.Conditions)
		}
	case "MachineDeployment":
		list := &clusterv1.MachineDeploymentList{}
		_ = k8s.List(ctx, list, client.InNamespace(f.ns))
		for _, o := range list.Items {
			lines = append(lines, fmt.Sprintf("%s %s %s: %s", kind, o.Name, inplacev1.UpgradeMessageAnnotation, o.Annotations[inplacev1.UpgradeMessageAnnotation]))
		}
	}
	return strings.Join(lines, "\n")
}

func counterValue(name string, labels map[string]string) float64 {
	m := metricSample(name, labels)
	if m == nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// observed is one thing a failure path must show: a Warning event of reason on an object
// of kind, and a condition of that kind, both carrying the underlying error.
type observed struct {
	kind, reason string
	// conditionKind is the kind whose conditions carry the error; kind when empty.
	conditionKind string
}

type faultCase struct {
	// arrange changes the world before the manager starts.
	arrange func(f *faultWorld)
	// act makes the failure happen once the manager runs.
	act func(f *faultWorld)
	// underlying is the text of the underlying error every observation must carry.
	underlying string
	expect     []observed
}

const diskFull = "no space left on device: /var/lib/rancher on the node"

var _ = Describe("every failure path is observable", func() {
	DescribeTable("a Warning event and a condition with the underlying error, and capi_inplace_warnings_total",
		func(c faultCase) {
			f := newFaultWorld()
			if c.arrange != nil {
				c.arrange(f)
			}
			before := map[observed]float64{}
			for _, o := range c.expect {
				before[o] = counterValue(faults.WarningsMetric, map[string]string{"kind": o.kind, "reason": o.reason})
			}
			f.start()
			c.act(f)
			for _, o := range c.expect {
				Eventually(func() []string { return f.warningNotes(o.kind, o.reason) }, timeout, poll).Should(
					ContainElement(ContainSubstring(c.underlying)), "a Warning event %s on a %s that says %q", o.reason, o.kind, c.underlying)
				condKind := o.conditionKind
				if condKind == "" {
					condKind = o.kind
				}
				Eventually(func() string { return f.conditionsOf(condKind) }, timeout, poll).Should(
					ContainSubstring(c.underlying), "a condition of a %s that says %q", condKind, c.underlying)
				Eventually(func() float64 {
					return counterValue(faults.WarningsMetric, map[string]string{"kind": o.kind, "reason": o.reason})
				}, timeout, poll).Should(BeNumerically(">", before[o]), "%s{kind=%q,reason=%q}", faults.WarningsMetric, o.kind, o.reason)
			}
		},
		Entry("the updater's step fails (permanent error): NodeUpdate failed, the task failed with the node's error", faultCase{
			arrange:    func(f *faultWorld) { f.updater.reconcileErr = nodeupdater.Permanentf("DiskFull", "%s", diskFull) },
			act:        func(f *faultWorld) { f.task("ConfigMap/updater") },
			underlying: diskFull,
			expect: []observed{
				{kind: "NodeUpdate", reason: inplacev1.StepFailedReason},
				{kind: "NodeUpdate", reason: "DiskFull"},
				{kind: "UpgradeTask", reason: inplacev1.NodeFailedReason},
				{kind: "UpgradeTask", reason: inplacev1.NodeFailedReason, conditionKind: "Machine"},
			},
		}),
		Entry("the updater's step fails with a retryable error: retried, and said so", faultCase{
			arrange: func(f *faultWorld) {
				f.updater.reconcileErr = errors.New("the SUC plan was rejected: admission webhook denied it")
			},
			act:        func(f *faultWorld) { f.task("ConfigMap/updater") },
			underlying: "admission webhook denied it",
			expect:     []observed{{kind: "NodeUpdate", reason: nodeupdater.EventRetryScheduled}},
		}),
		Entry("the updater's configuration is missing", faultCase{
			act:        func(f *faultWorld) { f.nodeUpdate("by-hand", "ConfigMap/missing") },
			underlying: "ConfigMap missing does not exist in namespace",
			expect:     []observed{{kind: "NodeUpdate", reason: inplacev1.UpdaterNotFoundReason}},
		}),
		Entry("the updater's kind is served by nobody (an invalid updater reference)", faultCase{
			act:        func(f *faultWorld) { f.nodeUpdate("by-hand", "NoSuchUpgrader/default") },
			underlying: "no updater serves kind NoSuchUpgrader",
			expect:     []observed{{kind: "NodeUpdate", reason: inplacev1.UpdaterNotFoundReason}},
		}),
		Entry("the updater's abort fails", faultCase{
			arrange: func(f *faultWorld) { f.updater.abortErr = errors.New("cannot delete Plan capi-inplace-os: forbidden") },
			act: func(f *faultWorld) {
				f.task("ConfigMap/updater")
				name := f.onlyNodeUpdate()
				Eventually(func() inplacev1.NodeUpdatePhase {
					nu := &inplacev1.NodeUpdate{}
					_ = k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, nu)
					return nu.Status.Phase
				}, timeout, poll).Should(Equal(inplacev1.NodeUpdatePhaseInProgress))
				(&world{ns: f.ns}).editTask("upgrade", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })
			},
			underlying: "cannot delete Plan capi-inplace-os: forbidden",
			expect:     []observed{{kind: "NodeUpdate", reason: nodeupdater.EventAbortFailed}},
		}),
		Entry("the workload cluster is unreachable", faultCase{
			arrange: func(f *faultWorld) {
				f.workload = unreachableWorkload{err: errors.New(`kubeconfig Secret harvester-kubeconfig: key "value" holds no valid kubeconfig`)}
			},
			act:        func(f *faultWorld) { f.task("ConfigMap/updater") },
			underlying: `key "value" holds no valid kubeconfig`,
			expect:     []observed{{kind: "UpgradeTask", reason: inplacev1.WaitingReason}},
		}),
		Entry("the task cannot create a machine's NodeUpdate (its name is taken): a reconcile error", faultCase{
			arrange: func(f *faultWorld) {
				// An ended hand-made NodeUpdate: a running one would hold the machine instead
				// (a machine another NodeUpdate upgrades is never started).
				name := upgraderequest.NodeUpdateName("upgrade", f.machine)
				f.nodeUpdate(name, "NoSuchUpgrader/default")
				nu := &inplacev1.NodeUpdate{}
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, nu)).To(Succeed())
				nu.Status.Phase = inplacev1.NodeUpdatePhaseFailed
				Expect(k8s.Status().Update(ctx, nu)).To(Succeed())
			},
			act:        func(f *faultWorld) { f.task("ConfigMap/updater") },
			underlying: "exists and belongs to another owner",
			expect:     []observed{{kind: "UpgradeTask", reason: faults.ReconcileErrorReason}},
		}),
		Entry("the upgrade asked by annotation is refused", faultCase{
			act: func(f *faultWorld) {
				Expect(fixtures.Annotate(ctx, k8s, &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "workers"}}, inplacev1.UpgradeToAnnotation, "v1.32.0")).To(Succeed())
			},
			underlying: "in-place downgrades are not supported",
			expect:     []observed{{kind: "MachineDeployment", reason: inplacev1.InPlaceUpgradeFailedReason}},
		}),
	)

	DescribeTable("a hook's Failure answer (or decline) with the underlying error, and capi_inplace_hook_failures_total",
		func(hook, reason, underlying string, call func(f *faultWorld) (status runtimehooksv1.ResponseStatus, message string)) {
			f := newFaultWorld()
			labels := map[string]string{"hook": hook, "reason": reason}
			before := counterValue(faults.HookFailuresMetric, labels)
			_, message := call(f)
			Expect(message).To(ContainSubstring(underlying))
			Expect(counterValue(faults.HookFailuresMetric, labels)).To(Equal(before+1), "%s%v", faults.HookFailuresMetric, labels)
		},
		Entry("UpdateMachine for a machine that does not exist", "UpdateMachine", extension.HookReasonMachineNotFound, "not found",
			func(f *faultWorld) (runtimehooksv1.ResponseStatus, string) {
				h := &extension.InPlaceHooks{Client: k8s, Requester: &upgraderequest.Requester{Client: k8s, Registry: f.registry}, Registry: f.registry}
				req := &runtimehooksv1.UpdateMachineRequest{}
				req.Desired.Machine = clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "gone"}, Spec: clusterv1.MachineSpec{ClusterName: "harvester", Version: targetVersion}}
				resp := &runtimehooksv1.UpdateMachineResponse{}
				h.UpdateMachine(ctx, req, resp)
				Expect(resp.GetStatus()).To(Equal(runtimehooksv1.ResponseStatusFailure))
				return resp.GetStatus(), resp.GetMessage()
			}),
		Entry("UpdateMachine declined: a downgrade", "UpdateMachine", upgraderequest.ReasonDowngrade, "in-place downgrades are not supported",
			func(f *faultWorld) (runtimehooksv1.ResponseStatus, string) {
				h := &extension.InPlaceHooks{Client: k8s, Requester: &upgraderequest.Requester{Client: k8s, Registry: f.registry}, Registry: f.registry}
				// Marked as Cluster API marks a machine before it calls UpdateMachine.
				m := (&world{ns: f.ns}).machine(f.machine)
				Expect(fixtures.Annotate(ctx, k8s, m, clusterv1.UpdateInProgressAnnotation, "true")).To(Succeed())
				Expect(fixtures.Annotate(ctx, k8s, m, runtimev1.PendingHooksAnnotation, "UpdateMachine")).To(Succeed())
				m = (&world{ns: f.ns}).machine(f.machine)
				req := &runtimehooksv1.UpdateMachineRequest{}
				req.Desired.Machine = *m.DeepCopy()
				req.Desired.Machine.Spec.Version = "v1.30.0"
				resp := &runtimehooksv1.UpdateMachineResponse{}
				h.UpdateMachine(ctx, req, resp)
				Expect(resp.GetStatus()).To(Equal(runtimehooksv1.ResponseStatusFailure))
				return resp.GetStatus(), resp.GetMessage()
			}),
		Entry("CanUpdateMachineSet with a body of another hook", "CanUpdateMachineSet", extension.HookReasonWrongKind, "this hook takes a",
			func(f *faultWorld) (runtimehooksv1.ResponseStatus, string) {
				h := &extension.InPlaceHooks{Client: k8s, Registry: f.registry}
				req := &runtimehooksv1.CanUpdateMachineSetRequest{}
				req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("UpdateMachineRequest"))
				resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
				h.CanUpdateMachineSet(ctx, req, resp)
				Expect(resp.GetStatus()).To(Equal(runtimehooksv1.ResponseStatusFailure))
				return resp.GetStatus(), resp.GetMessage()
			}),
		Entry("CanUpdateMachine for a Cluster whose updater is not there", "CanUpdateMachine", upgraderequest.ReasonUpdaterUnavailable, "not found in namespace",
			func(f *faultWorld) (runtimehooksv1.ResponseStatus, string) {
				h := &extension.InPlaceHooks{Client: k8s, Registry: f.registry}
				req := &runtimehooksv1.CanUpdateMachineRequest{CommonRequest: runtimehooksv1.CommonRequest{Settings: map[string]string{extension.DefaultUpdaterSetting: "ConfigMap/absent"}}}
				_, err := fixtures.Cluster(ctx, k8s, f.ns, "no-annotation", "", nil)
				Expect(err).NotTo(HaveOccurred())
				for _, m := range []*clusterv1.Machine{&req.Current.Machine, &req.Desired.Machine} {
					*m = clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "cp-1"}, Spec: clusterv1.MachineSpec{ClusterName: "no-annotation", Version: fromVersion}}
				}
				req.Desired.Machine.Spec.Version = targetVersion
				resp := &runtimehooksv1.CanUpdateMachineResponse{}
				h.CanUpdateMachine(ctx, req, resp)
				Expect(resp.GetStatus()).To(Equal(runtimehooksv1.ResponseStatusFailure))
				return resp.GetStatus(), resp.GetMessage()
			}),
		Entry("ExternalUpgradeRequest declined: a downgrade", "ExternalUpgradeRequest", upgraderequest.ReasonDowngrade, "in-place downgrades are not supported",
			func(f *faultWorld) (runtimehooksv1.ResponseStatus, string) {
				h := extension.NewExternalUpgradeHandler(&upgraderequest.Requester{Client: k8s, Registry: f.registry})
				req := &hooksv1.ExternalUpgradeRequestRequest{
					Cluster:              clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "harvester"}},
					MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
					NewMachineSpec:       hooksv1.NewMachineSpec{Version: "v1.30.0"},
				}
				resp := &hooksv1.ExternalUpgradeRequestResponse{}
				h.ExternalUpgradeRequest(ctx, req, resp)
				Expect(resp.Decision).To(Equal(hooksv1.DecisionDecline))
				return resp.GetStatus(), resp.GetMessage()
			}),
	)
})
