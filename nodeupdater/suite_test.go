package nodeupdater_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env *testenv.Environment
	k8s client.Client
	ctx = context.Background()
	seq atomic.Int64
)

func TestNodeUpdater(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "NodeUpdate reconciler on a real API server")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(GinkgoLogr)
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s = env.Client
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// runningManager is a manager with the NodeUpdate reconciler, watching one namespace, so
// that the tests' managers never see each other's objects.
type runningManager struct {
	cancel context.CancelFunc
	done   chan error
}

// startManager starts a manager for namespace ns running r, and stops it when the test ends.
func startManager(ns string, r *nodeupdater.Reconciler) *runningManager {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	m := &runningManager{cancel: cancel, done: make(chan error, 1)}
	go func() {
		defer GinkgoRecover()
		m.done <- mgr.Start(mctx)
	}()
	DeferCleanup(m.stop)
	return m
}

// stop stops the manager and waits until it has stopped; it may be called twice.
func (m *runningManager) stop() {
	GinkgoHelper()
	if m.cancel == nil {
		return
	}
	m.cancel()
	m.cancel = nil
	Eventually(m.done, 30*time.Second).Should(Receive(BeNil()))
}

// fastReconciler is a reconciler tuned to the milliseconds of a test.
func fastReconciler(u nodeupdater.Updater) *nodeupdater.Reconciler {
	GinkgoHelper()
	reg := nodeupdater.NewRegistry()
	Expect(reg.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "ConfigMap"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater:   u,
	})).To(Succeed())
	return &nodeupdater.Reconciler{
		Registry:               reg,
		DefaultTimeout:         time.Hour,
		PollInterval:           20 * time.Millisecond,
		UpdaterRecheckInterval: 100 * time.Millisecond,
		RetryBaseDelay:         100 * time.Millisecond,
		RetryMaxDelay:          time.Second,
		MaxAttempts:            4,
		ExternalAbortTimeout:   time.Hour,
	}
}

func newNamespace() string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("nu-test-%d", seq.Add(1))}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// createUpdaterConfig creates the ConfigMap the test updater is configured by.
func createUpdaterConfig(ns, name string) {
	GinkgoHelper()
	Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})).To(Succeed())
}

func newNodeUpdate(ns string, ref inplacev1.UpdaterReference) *inplacev1.NodeUpdate {
	n := seq.Add(1)
	return &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", n), Namespace: ns},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName: "workload",
			MachineName: fmt.Sprintf("machine-%d", n),
			NodeName:    fmt.Sprintf("node-%d", n),
			Version:     "v1.36.3",
			UpdaterRef:  ref,
		},
	}
}

func get(nu *inplacev1.NodeUpdate) *inplacev1.NodeUpdate {
	GinkgoHelper()
	got := &inplacev1.NodeUpdate{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
	return got
}

// phaseOf is for Eventually: the NodeUpdate's phase, read from the API server.
func phaseOf(nu *inplacev1.NodeUpdate) func(Gomega) inplacev1.NodeUpdatePhase {
	return func(g Gomega) inplacev1.NodeUpdatePhase {
		got := &inplacev1.NodeUpdate{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
		return got.Status.Phase
	}
}

// stepStates is for Eventually: name=state of every step, in order.
func stepStates(nu *inplacev1.NodeUpdate) func(Gomega) []string {
	return func(g Gomega) []string {
		got := &inplacev1.NodeUpdate{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
		out := make([]string, 0, len(got.Status.Steps))
		for _, s := range got.Status.Steps {
			out = append(out, s.Name+"="+string(s.State))
		}
		return out
	}
}

// eventsOf lists the events of the NodeUpdate as "Type Reason: note", oldest first.
func eventsOf(nu *inplacev1.NodeUpdate) func(Gomega) []string {
	return func(g Gomega) []string {
		list := &corev1.EventList{}
		g.Expect(k8s.List(ctx, list, client.InNamespace(nu.Namespace))).To(Succeed())
		sort.SliceStable(list.Items, func(i, j int) bool {
			return eventTime(list.Items[i]).Before(eventTime(list.Items[j]))
		})
		var out []string
		for _, e := range list.Items {
			if e.InvolvedObject.Name == nu.Name && e.InvolvedObject.Kind == "NodeUpdate" {
				out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
			}
		}
		return out
	}
}

func eventTime(e corev1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// kubectlGet returns the columns `kubectl get nodeupdate -o wide` shows, by column name,
// as the API server renders them for kubectl.
func kubectlGet(nu *inplacev1.NodeUpdate) map[string]string {
	GinkgoHelper()
	httpClient, err := rest.HTTPClientFor(env.Config)
	Expect(err).NotTo(HaveOccurred())
	url := fmt.Sprintf("%s/apis/%s/namespaces/%s/nodeupdates/%s", strings.TrimSuffix(env.Config.Host, "/"),
		inplacev1.GroupVersion, nu.Namespace, nu.Name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := httpClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.StatusCode).To(Equal(http.StatusOK), string(body))
	table := &metav1.Table{}
	Expect(json.Unmarshal(body, table)).To(Succeed())
	Expect(table.Rows).To(HaveLen(1))
	out := map[string]string{}
	for i, col := range table.ColumnDefinitions {
		out[col.Name] = fmt.Sprint(table.Rows[0].Cells[i])
	}
	return out
}

// metricValue reads a counter, gauge or histogram sample count from controller-runtime's
// registry, where the manager's metrics endpoint serves it from; 0 when absent.
func metricValue(name string, labels map[string]string) float64 {
	GinkgoHelper()
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !labelsMatch(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// scriptedUpdater is an Updater whose steps the test drives: a step completes when the
// test opens its gate, and fails with the errors the test queues for it. It decides
// from the NodeUpdate's status alone, as a real updater must, and records every call, so
// that the tests can assert what ran and how often, across restarts of the manager.
type scriptedUpdater struct {
	steps []string

	mu         sync.Mutex
	open       map[string]bool
	errs       map[string][]error
	abortAfter int
	aborts     int
	// abortHeld keeps Abort from reporting done, as an updater waiting for its safe point.
	abortHeld bool
	// abortErrs are returned by the next calls of Abort, one each.
	abortErrs []error
	timeout   time.Duration
	// pollAfter is when a step whose gate is closed asks to be called again; 20ms when zero.
	pollAfter time.Duration
	calls     []call
}

type call struct {
	op   string // run (the step's one-time work), poll, error, complete, done, abort
	step string
	at   time.Time
}

func newScriptedUpdater(steps ...string) *scriptedUpdater {
	return &scriptedUpdater{steps: steps, open: map[string]bool{}, errs: map[string][]error{}, abortAfter: 1}
}

func (u *scriptedUpdater) Reconcile(_ context.Context, nu *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	nodeupdater.DeclareSteps(nu, u.steps...)
	for _, name := range u.steps {
		if nodeupdater.StepDone(nu, name) {
			continue
		}
		if nodeupdater.StepState(nu, name) == inplacev1.StepStatePending {
			// The step's work, which must run once only: it starts only from Pending.
			nodeupdater.StartStep(nu, name, "working on "+name)
			u.record("run", name)
		}
		if queued := u.errs[name]; len(queued) > 0 {
			err := queued[0]
			u.errs[name] = queued[1:]
			u.record("error", name)
			if _, ok := nodeupdater.AsPermanent(err); ok {
				nodeupdater.FailStep(nu, name, err.Error())
			}
			return nodeupdater.Result{}, err
		}
		if !u.open[name] {
			u.record("poll", name)
			after := u.pollAfter
			if after == 0 {
				after = 20 * time.Millisecond
			}
			return nodeupdater.Result{RequeueAfter: after}, nil
		}
		nodeupdater.CompleteStep(nu, name, name+" done")
		u.record("complete", name)
		return nodeupdater.Result{RequeueAfter: time.Millisecond}, nil
	}
	u.record("done", "")
	return nodeupdater.Result{Done: true}, nil
}

func (u *scriptedUpdater) Abort(_ context.Context, nu *inplacev1.NodeUpdate) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.aborts++
	u.record("abort", nu.Status.CurrentStep)
	if len(u.abortErrs) > 0 {
		err := u.abortErrs[0]
		u.abortErrs = u.abortErrs[1:]
		return false, err
	}
	return !u.abortHeld && u.aborts >= u.abortAfter, nil
}

// holdAbort keeps Abort from reporting done until releaseAbort.
func (u *scriptedUpdater) holdAbort() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.abortHeld = true
}

func (u *scriptedUpdater) releaseAbort() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.abortHeld = false
}

func (u *scriptedUpdater) queueAbortErrors(errs ...error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.abortErrs = append(u.abortErrs, errs...)
}

func (u *scriptedUpdater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return nil
}

func (u *scriptedUpdater) NodeTimeout(context.Context, *inplacev1.NodeUpdate) (time.Duration, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.timeout, nil
}

func (u *scriptedUpdater) record(op, step string) {
	u.calls = append(u.calls, call{op: op, step: step, at: time.Now()})
}

func (u *scriptedUpdater) openGate(step string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.open[step] = true
}

func (u *scriptedUpdater) queueErrors(step string, errs ...error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.errs[step] = append(u.errs[step], errs...)
}

// count is how many calls of op (and step, when not empty) were recorded.
func (u *scriptedUpdater) count(op, step string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.calls {
		if c.op == op && (step == "" || c.step == step) {
			n++
		}
	}
	return n
}

func (u *scriptedUpdater) snapshot() []call {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]call(nil), u.calls...)
}

// requestAbort sets spec.phase Abort as the UpgradeTask controller does, again on a
// conflict with the reconciler's own writes.
func requestAbort(nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	requestAbortFor(nu, "")
}

// requestAbortFor sets spec.phase Abort with spec.abortReason, as the UpgradeTask
// controller does when it says why.
func requestAbortFor(nu *inplacev1.NodeUpdate, reason string) {
	GinkgoHelper()
	Eventually(func() error {
		got := &inplacev1.NodeUpdate{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(nu), got); err != nil {
			return err
		}
		got.Spec.Phase = inplacev1.TaskActionAbort
		got.Spec.AbortReason = reason
		return k8s.Update(ctx, got)
	}).Should(Succeed())
}

// poke changes an annotation of the NodeUpdate, which makes the reconciler look at it now.
func poke(nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Eventually(func() error {
		got := &inplacev1.NodeUpdate{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(nu), got); err != nil {
			return err
		}
		if got.Annotations == nil {
			got.Annotations = map[string]string{}
		}
		got.Annotations["test.inplace.cluster.x-k8s.io/poke"] = fmt.Sprint(seq.Add(1))
		return k8s.Update(ctx, got)
	}).Should(Succeed())
}

// nodeUpdateGets is a reader that counts its Gets of NodeUpdates.
type nodeUpdateGets struct {
	client.Reader
	mu   sync.Mutex
	gets int
}

func (r *nodeUpdateGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*inplacev1.NodeUpdate); ok {
		r.mu.Lock()
		r.gets++
		r.mu.Unlock()
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *nodeUpdateGets) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets
}

// frozenNodeUpdates is a client whose Gets of a NodeUpdate, once frozen, answer the copy
// the API server held when it was frozen, as a cache whose watch stopped delivering
// would. Everything else goes through.
type frozenNodeUpdates struct {
	client.Client
	mu     sync.Mutex
	frozen map[client.ObjectKey]*inplacev1.NodeUpdate
}

// freeze makes the client answer nu as the API server holds it now.
func (c *frozenNodeUpdates) freeze(ctx context.Context, nu *inplacev1.NodeUpdate) error {
	now := &inplacev1.NodeUpdate{}
	if err := c.Client.Get(ctx, client.ObjectKeyFromObject(nu), now); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen == nil {
		c.frozen = map[client.ObjectKey]*inplacev1.NodeUpdate{}
	}
	c.frozen[client.ObjectKeyFromObject(nu)] = now
	return nil
}

func (c *frozenNodeUpdates) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	nu, ok := obj.(*inplacev1.NodeUpdate)
	if !ok {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	c.mu.Lock()
	old, frozen := c.frozen[key]
	c.mu.Unlock()
	if frozen {
		old.DeepCopyInto(nu)
		return nil
	}
	return c.Client.Get(ctx, key, nu, opts...)
}

// staleNodeUpdates is a client whose Gets of a NodeUpdate answer the first copy they
// read, as a cache that never catches up would; everything else goes through.
type staleNodeUpdates struct {
	client.Client
	mu    sync.Mutex
	first map[client.ObjectKey]*inplacev1.NodeUpdate
}

func (c *staleNodeUpdates) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	nu, ok := obj.(*inplacev1.NodeUpdate)
	if !ok {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.first[key]; ok {
		old.DeepCopyInto(nu)
		return nil
	}
	if err := c.Client.Get(ctx, key, nu, opts...); err != nil {
		return err
	}
	if c.first == nil {
		c.first = map[client.ObjectKey]*inplacev1.NodeUpdate{}
	}
	c.first[key] = nu.DeepCopy()
	return nil
}

// failingStatusWrites is a client whose next status write, once failNext is set, lands
// on the API server and then answers an error, as a write whose answer was lost with its
// connection; from then on its Gets of that NodeUpdate answer the copy from before the
// write, as a cache whose watch broke with the connection.
type failingStatusWrites struct {
	client.Client
	failNext atomic.Bool
	mu       sync.Mutex
	stale    map[client.ObjectKey]*inplacev1.NodeUpdate
}

func (c *failingStatusWrites) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if nu, ok := obj.(*inplacev1.NodeUpdate); ok {
		c.mu.Lock()
		old := c.stale[key]
		c.mu.Unlock()
		if old != nil {
			old.DeepCopyInto(nu)
			return nil
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *failingStatusWrites) Status() client.SubResourceWriter {
	return &lostAnswers{SubResourceWriter: c.Client.Status(), c: c}
}

type lostAnswers struct {
	client.SubResourceWriter
	c *failingStatusWrites
}

func (w *lostAnswers) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if !w.c.failNext.CompareAndSwap(true, false) {
		return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	}
	before := &inplacev1.NodeUpdate{}
	if err := w.c.Client.Get(ctx, client.ObjectKeyFromObject(obj), before); err != nil {
		return err
	}
	if err := w.SubResourceWriter.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	w.c.mu.Lock()
	if w.c.stale == nil {
		w.c.stale = map[client.ObjectKey]*inplacev1.NodeUpdate{}
	}
	w.c.stale[client.ObjectKeyFromObject(obj)] = before
	w.c.mu.Unlock()
	return errors.New("the answer to the status write was lost")
}

// countingReader is an APIReader that counts the reads of each NodeUpdate by name.
type countingReader struct {
	client.Reader
	mu    sync.Mutex
	reads map[string]int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*inplacev1.NodeUpdate); ok {
		c.mu.Lock()
		if c.reads == nil {
			c.reads = map[string]int{}
		}
		c.reads[key.Name]++
		c.mu.Unlock()
	}
	return c.Reader.Get(ctx, key, obj, opts...)
}

func (c *countingReader) gets(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads[name]
}
