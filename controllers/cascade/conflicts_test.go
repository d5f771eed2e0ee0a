package cascade

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/internal/faults"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// The conflict test: another writer changes every object the manager is about to write,
// on the real API server, just before the manager's first attempt of that write. A write
// that carries the resourceVersion it read then gets a real 409 Conflict from
// kube-apiserver, and the controllers must resolve it by reconciling again from a fresh
// read; a write that carries none goes through, and must not undo the other writer's change.

const (
	// otherWriterPrefix is the prefix of the annotations the other writer adds.
	otherWriterPrefix = "conflict-test/"
	// otherWriterFinalizer is the finalizer the other writer adds to every object it
	// touches: a list field, which a merge patch without resourceVersion replaces whole.
	otherWriterFinalizer = "conflict-test.inplace.example.com/other-writer"
)

// writeKey names one object and the part of it a write goes to ("" or "status").
type writeKey struct {
	gvk         schema.GroupVersionKind
	namespace   string
	name        string
	subresource string
}

// writeSite counts what happened to the writes of one call site of the product.
type writeSite struct {
	kind, subresource, verb, site string
}

type siteCounts struct {
	// disturbed: first attempts before which the other writer changed the object.
	disturbed int
	// conflicted: disturbed first attempts the API server refused with 409 Conflict.
	conflicted int
	// notLocked: disturbed first attempts the API server accepted: the write carried no
	// resourceVersion (a merge patch without optimistic lock).
	notLocked int
	// retried: later attempts (after a conflict) that went through.
	retried int
	// realConflicts: later attempts that conflicted again (a stale cache, a concurrent
	// writer of the product itself).
	realConflicts int
}

// otherWriterChange is one change the other writer made.
type otherWriterChange struct {
	key        writeKey
	annotation string
	value      string
}

// conflictInjector wraps the manager's client. Before the first attempt of every write
// (Update, Patch, and their status subresource forms) of an object in its namespace, it
// has the other writer (a separate client straight to the API server) add an annotation,
// and on its first visit a finalizer, to that object. After a write that conflicted, the
// next attempt on the same object goes through undisturbed, so that every write is
// disturbed once and the controllers can make progress.
type conflictInjector struct {
	namespace string
	other     client.Client

	mu       sync.Mutex
	disarmed map[writeKey]bool
	visited  map[writeKey]bool
	changes  []otherWriterChange
	sites    map[writeSite]*siteCounts
	seq      int
	errs     []error
}

func newConflictInjector(namespace string, other client.Client) *conflictInjector {
	return &conflictInjector{
		namespace: namespace, other: other,
		disarmed: map[writeKey]bool{}, visited: map[writeKey]bool{}, sites: map[writeSite]*siteCounts{},
	}
}

// newClient is the manager's Options.NewClient: the usual client, wrapped.
func (inj *conflictInjector) newClient(cfg *rest.Config, opts client.Options) (client.Client, error) {
	c, err := client.NewWithWatch(cfg, opts)
	if err != nil {
		return nil, err
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return inj.write(ctx, c, obj, "", "update", func() error { return c.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return inj.write(ctx, c, obj, "", "patch", func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return inj.write(ctx, c, obj, sub, "update", func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return inj.write(ctx, c, obj, sub, "patch", func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
	}), nil
}

func (inj *conflictInjector) write(ctx context.Context, c client.Client, obj client.Object, sub, verb string, do func() error) error {
	if obj.GetNamespace() != inj.namespace {
		return do()
	}
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return do()
	}
	key := writeKey{gvk: gvk, namespace: obj.GetNamespace(), name: obj.GetName(), subresource: sub}
	site := writeSite{kind: gvk.Kind, subresource: sub, verb: verb, site: callSite()}

	inj.mu.Lock()
	first := !inj.disarmed[key]
	inj.mu.Unlock()
	if first {
		if err := inj.disturb(ctx, key); err != nil {
			inj.mu.Lock()
			inj.errs = append(inj.errs, err)
			inj.mu.Unlock()
		}
	}
	werr := do()

	inj.mu.Lock()
	defer inj.mu.Unlock()
	counts := inj.sites[site]
	if counts == nil {
		counts = &siteCounts{}
		inj.sites[site] = counts
	}
	conflict := apierrors.IsConflict(werr)
	switch {
	case first && conflict:
		counts.disturbed++
		counts.conflicted++
		inj.disarmed[key] = true
	case first:
		counts.disturbed++
		if werr == nil {
			counts.notLocked++
		}
	case conflict:
		counts.realConflicts++
	default:
		counts.retried++
		inj.disarmed[key] = false
	}
	return werr
}

// disturb is the other writer: it reads the object and adds an annotation (and, on its
// first visit, a finalizer) with an update that carries what it read, retried on conflict
// as a well-behaved controller does.
func (inj *conflictInjector) disturb(ctx context.Context, key writeKey) error {
	inj.mu.Lock()
	inj.seq++
	annotation := fmt.Sprintf("%s%d", otherWriterPrefix, inj.seq)
	value := fmt.Sprintf("%s-%s-%d", strings.ToLower(key.gvk.Kind), key.subresource, inj.seq)
	addFinalizer := !inj.visited[writeKey{gvk: key.gvk, namespace: key.namespace, name: key.name}]
	inj.mu.Unlock()

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(key.gvk)
		if err := inj.other.Get(ctx, client.ObjectKey{Namespace: key.namespace, Name: key.name}, u); err != nil {
			return err
		}
		annotations := u.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[annotation] = value
		u.SetAnnotations(annotations)
		if addFinalizer {
			controllerutil.AddFinalizer(u, otherWriterFinalizer)
		}
		return inj.other.Update(ctx, u)
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("other writer on %s %s/%s: %w", key.gvk.Kind, key.namespace, key.name, err)
	}
	inj.mu.Lock()
	defer inj.mu.Unlock()
	inj.visited[writeKey{gvk: key.gvk, namespace: key.namespace, name: key.name}] = true
	inj.changes = append(inj.changes, otherWriterChange{key: key, annotation: annotation, value: value})
	return nil
}

// callSite names the function of the product that made a write.
func callSite() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/capi-inplace/capi-inplace/") && !strings.HasSuffix(f.File, "_test.go") {
			return strings.TrimPrefix(f.Function, "github.com/capi-inplace/capi-inplace/")
		}
		if !more {
			return "(test code)"
		}
	}
}

func (inj *conflictInjector) report() (table string, byKind map[string]siteCounts) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	keys := make([]writeSite, 0, len(inj.sites))
	for k := range inj.sites {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return fmt.Sprint(a.kind, a.subresource, a.verb, a.site) < fmt.Sprint(b.kind, b.subresource, b.verb, b.site)
	})
	byKind = map[string]siteCounts{}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-18s %-7s %-6s %-62s %9s %10s %9s %7s %13s\n", "KIND", "SUB", "VERB", "SITE", "DISTURBED", "CONFLICTED", "NOTLOCKED", "RETRIED", "REALCONFLICTS")
	for _, k := range keys {
		c := inj.sites[k]
		fmt.Fprintf(&sb, "%-18s %-7s %-6s %-62s %9d %10d %9d %7d %13d\n", k.kind, k.subresource, k.verb, k.site, c.disturbed, c.conflicted, c.notLocked, c.retried, c.realConflicts)
		sum := byKind[k.kind]
		sum.disturbed += c.disturbed
		sum.conflicted += c.conflicted
		sum.notLocked += c.notLocked
		sum.retried += c.retried
		sum.realConflicts += c.realConflicts
		byKind[k.kind] = sum
	}
	return sb.String(), byKind
}

func (inj *conflictInjector) otherWrites() []otherWriterChange {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return slices.Clone(inj.changes)
}

func (inj *conflictInjector) visitedObjects() []writeKey {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	var out []writeKey
	for k := range inj.visited {
		out = append(out, k)
	}
	return out
}

// steppingUpdater is an Updater the manager runs for the ConfigMap kind: each node goes
// through one step that takes a few calls.
type steppingUpdater struct {
	mu    sync.Mutex
	calls map[string]int
}

const steppingStep = "Upgrade"

func (u *steppingUpdater) Reconcile(_ context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	u.mu.Lock()
	u.calls[nu.Name]++
	n := u.calls[nu.Name]
	u.mu.Unlock()
	nodeupdater.DeclareSteps(nu, steppingStep)
	if n < 3 {
		nodeupdater.StartStep(nu, steppingStep, fmt.Sprintf("call %d", n))
		return nodeupdater.Result{RequeueAfter: 50 * time.Millisecond}, nil
	}
	nodeupdater.CompleteStep(nu, steppingStep, "node at "+nu.Spec.Version)
	return nodeupdater.Result{Done: true}, nil
}

func (u *steppingUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) {
	return true, nil
}

func (u *steppingUpdater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return nil
}

// startConflictManager runs, for one namespace, the whole orchestration in one manager
// whose client is inj's: the annotation cascade and its Requester, the UpgradeTask
// controller and the NodeUpdate reconciler with steppingUpdater for ConfigMap updaters.
func startConflictManager(ns string, inj *conflictInjector) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		NewClient:              inj.newClient,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	registry := nodeupdater.NewRegistry()
	Expect(registry.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "ConfigMap"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater:   &steppingUpdater{calls: map[string]int{}},
	})).To(Succeed())
	opts := controller.Options{MaxConcurrentReconciles: 2}
	Expect((&nodeupdater.Reconciler{
		Registry: registry, PollInterval: 50 * time.Millisecond, UpdaterRecheckInterval: 200 * time.Millisecond,
		RetryBaseDelay: 100 * time.Millisecond, RetryMaxDelay: time.Second,
	}).SetupWithManager(mgr, opts)).To(Succeed())
	Expect((&upgradetask.Reconciler{Registry: registry, Workload: upgradetask.SameCluster{Management: k8s}, PollInterval: 200 * time.Millisecond}).
		SetupWithManager(ctx, mgr, opts)).To(Succeed())
	requester := &upgraderequest.Requester{
		Client: mgr.GetClient(), TaskReader: mgr.GetAPIReader(), Registry: registry,
		Recorder: mgr.GetEventRecorder("capi-inplace-requests"),
	}
	Expect((&UpgradeCascade{Requester: requester, PollInterval: time.Second}).SetupWithManager(ctx, mgr, opts)).To(Succeed())
	DeferCleanup(runManager(mgr))
}

var _ = Describe("conflicts on every write", func() {
	It("completes the upgrade when another writer changes every object before each first write, and loses none of its changes", func() {
		start := time.Now()
		ns, err := fixtures.Namespace(ctx, k8s, "conflict")
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "updater"}})).To(Succeed())
		_, err = fixtures.Cluster(ctx, k8s, ns, "harvester", "cp", map[string]string{inplacev1.UpdaterAnnotation: "ConfigMap/updater"})
		Expect(err).NotTo(HaveOccurred())
		_, cpMachines, err := fixtures.ControlPlane(ctx, k8s, ns, "harvester", "cp", fromVersion, 1, false)
		Expect(err).NotTo(HaveOccurred())
		_, mdMachines, err := fixtures.MachineDeployment(ctx, k8s, ns, "harvester", "workers", fromVersion, 2)
		Expect(err).NotTo(HaveOccurred())
		var machines []string
		for _, m := range append(cpMachines, mdMachines...) {
			machines = append(machines, m.Name)
		}
		rec := watchNodeUpdates(ns)

		inj := newConflictInjector(ns, k8s)
		startConflictManager(ns, inj)
		cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "harvester"}}
		annotate(cluster, inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(statusOf(cluster), 2*cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))
		expectDone(cluster, targetVersion)

		table, byKind := inj.report()
		var total siteCounts
		for _, c := range byKind {
			total.disturbed += c.disturbed
			total.conflicted += c.conflicted
			total.notLocked += c.notLocked
			total.realConflicts += c.realConflicts
		}
		summary := fmt.Sprintf("%d writes disturbed by %d other-writer changes: %d got 409 Conflict and were retried by a new reconcile, %d carried no resourceVersion and went through, %d later attempts conflicted again; in %s",
			total.disturbed, len(inj.otherWrites()), total.conflicted, total.notLocked, total.realConflicts, time.Since(start).Round(time.Millisecond))
		AddReportEntry("conflict injection", summary+"\n"+table)
		GinkgoWriter.Printf("conflict injection: %s\n%s", summary, table)

		// The upgrade completed: every task, every machine, one NodeUpdate each.
		tasks := &inplacev1.UpgradeTaskList{}
		Expect(k8s.List(ctx, tasks, client.InNamespace(ns))).To(Succeed())
		Expect(tasks.Items).To(HaveLen(2), "one task for the control plane, one for the MachineDeployment")
		for _, t := range tasks.Items {
			Expect(t.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted), t.Name)
			Expect(t.Status.Upgraded).To(BeEquivalentTo(t.Status.Total), t.Name)
		}
		for _, name := range machines {
			m := &clusterv1.Machine{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m)).To(Succeed())
			Expect(m.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, targetVersion), name)
			Expect(meta.IsStatusConditionTrue(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)).To(BeTrue(), name)
			Expect(m.Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel), "the claim of %s is released", name)
		}
		Expect(rec.Creations()).To(HaveLen(len(machines)))
		Expect(rec.Creations()).To(HaveEach(1), "exactly one NodeUpdate per machine")
		nus := &inplacev1.NodeUpdateList{}
		Expect(k8s.List(ctx, nus, client.InNamespace(ns))).To(Succeed())
		for _, nu := range nus.Items {
			Expect(nu.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSucceeded), nu.Name)
		}

		// Nothing the other writer did was undone: every annotation it added and its
		// finalizer are still on every object it touched.
		changes := inj.otherWrites()
		for _, ch := range changes {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(ch.key.gvk)
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ch.key.namespace, Name: ch.key.name}, u)).To(Succeed())
			Expect(u.GetAnnotations()).To(HaveKeyWithValue(ch.annotation, ch.value),
				"the other writer's annotation on %s %s was overwritten", ch.key.gvk.Kind, ch.key.name)
		}
		for _, k := range inj.visitedObjects() {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(k.gvk)
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: k.name}, u)).To(Succeed())
			Expect(u.GetFinalizers()).To(ContainElement(otherWriterFinalizer),
				"the other writer's finalizer on %s %s was dropped by a write that replaced the list", k.gvk.Kind, k.name)
		}
		Expect(inj.errs).To(BeEmpty())

		// Conflicts really happened, on each kind the product writes with a resourceVersion,
		// and none was reported as a failure.
		Expect(total.conflicted).To(BeNumerically(">", 0), "no write conflicted: the test tests nothing")
		for _, kind := range []string{"Machine", "NodeUpdate", "UpgradeTask", "Cluster", "KubeadmControlPlane", "MachineDeployment"} {
			Expect(byKind[kind].disturbed).To(BeNumerically(">", 0), "no write of a %s was disturbed", kind)
		}
		// NodeUpdates are written by the manager only with status patches of its own
		// (see this file's report), which carry no resourceVersion.
		for _, kind := range []string{"Machine", "UpgradeTask", "Cluster", "KubeadmControlPlane", "MachineDeployment"} {
			Expect(byKind[kind].conflicted).To(BeNumerically(">", 0), "no write of a %s conflicted", kind)
		}
		Expect(eventNotes(ns, faults.ReconcileErrorReason)).To(BeEmpty(), "a conflict is retried, not reported as an error")
	})
})
