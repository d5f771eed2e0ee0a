package upgradetask

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env *testenv.Environment
	k8s client.Client
	ctx = context.Background()
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "UpgradeTask controller on a real API server")
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

// startManager runs a manager with the UpgradeTask controller until the returned stop is
// called; stop waits for the manager to end, as a restart of the real manager would.
func startManager(clk clock.PassiveClock) (stop func()) {
	GinkgoHelper()
	return startManagerWith(clk, nil)
}

// startManagerWith is startManager with the updaters of registry (for their preflight
// checks and their word on whether a node is at the target).
func startManagerWith(clk clock.PassiveClock, registry *nodeupdater.Registry) (stop func()) {
	GinkgoHelper()
	return startReconciler(newManager(), &Reconciler{
		Workload:     SameCluster{Management: k8s},
		Registry:     registry,
		Clock:        clk,
		PollInterval: 100 * time.Millisecond,
	})
}

// newManager makes a manager of the suite's API server without metrics or probe
// listeners, whose controllers may take names an earlier spec's manager took.
func newManager() ctrl.Manager {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	return mgr
}

// startReconciler sets r up on mgr with two workers and runs mgr (runManager).
func startReconciler(mgr ctrl.Manager, r *Reconciler) (stop func()) {
	GinkgoHelper()
	Expect(r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	return runManager(mgr)
}

// runManager starts mgr (testenv.RunManager); the returned stop ends it and waits until it
// has ended, as a restart of the real manager would.
func runManager(mgr ctrl.Manager) (stop func()) {
	stopManager := testenv.RunManager(ctx, mgr)
	return func() { Expect(stopManager()).To(Succeed()) }
}

// world is one test's Cluster with a MachineDeployment "workers" (or a control plane "cp")
// in its own namespace.
type world struct {
	ns       string
	machines []*clusterv1.Machine
}

func newMDWorld(replicas int) *world {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, k8s, "ut")
	Expect(err).NotTo(HaveOccurred())
	_, err = fixtures.Cluster(ctx, k8s, ns, "harvester", "", nil)
	Expect(err).NotTo(HaveOccurred())
	_, machines, err := fixtures.MachineDeployment(ctx, k8s, ns, "harvester", "workers", "v1.33.3+rke2r1", replicas)
	Expect(err).NotTo(HaveOccurred())
	return &world{ns: ns, machines: machines}
}

func newCPWorld(replicas int) *world {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, k8s, "ut")
	Expect(err).NotTo(HaveOccurred())
	_, err = fixtures.Cluster(ctx, k8s, ns, "harvester", "cp", nil)
	Expect(err).NotTo(HaveOccurred())
	_, machines, err := fixtures.ControlPlane(ctx, k8s, ns, "harvester", "cp", "v1.33.3+rke2r1", replicas, false)
	Expect(err).NotTo(HaveOccurred())
	return &world{ns: ns, machines: machines}
}

func (w *world) node(i int) string { return fixtures.NodeName(w.ns, w.machines[i].Name) }

// mdTask returns an UpgradeTask of the MachineDeployment to v1.34.1+rke2r1.
func (w *world) mdTask(name string, mutate ...func(*inplacev1.UpgradeTask)) *inplacev1.UpgradeTask {
	t := &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name, Labels: map[string]string{inplacev1.ClusterNameLabel: "harvester"}},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName:          "harvester",
			MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
			Version:              "v1.34.1+rke2r1",
			UpdaterRef:           inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"},
		},
	}
	for _, m := range mutate {
		m(t)
	}
	return t
}

func (w *world) task(name string) *inplacev1.UpgradeTask {
	GinkgoHelper()
	t := &inplacev1.UpgradeTask{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, t)).To(Succeed())
	return t
}

// editTask changes a task's spec the way a person does with kubectl edit: on the latest
// version, again when the controller wrote the task in between.
func (w *world) editTask(name string, edit func(*inplacev1.UpgradeTask)) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		t := &inplacev1.UpgradeTask{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, t); err != nil {
			return err
		}
		edit(t)
		return k8s.Update(ctx, t)
	})).To(Succeed())
}

func (w *world) phaseOf(name string) func() inplacev1.TaskPhase {
	return func() inplacev1.TaskPhase {
		t := &inplacev1.UpgradeTask{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, t); err != nil {
			return ""
		}
		return t.Status.Phase
	}
}

func (w *world) machine(name string) *clusterv1.Machine {
	GinkgoHelper()
	m := &clusterv1.Machine{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, m)).To(Succeed())
	return m
}

// setFinalizers sets a machine's finalizers: Cluster API's own finalizer keeps a deleted
// Machine until its node is drained.
func (w *world) setFinalizers(machine string, finalizers []string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &clusterv1.Machine{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: machine}, m); err != nil {
			return err
		}
		m.Finalizers = finalizers
		return k8s.Update(ctx, m)
	})
}

func (w *world) nodeUpdates() []inplacev1.NodeUpdate {
	GinkgoHelper()
	list := &inplacev1.NodeUpdateList{}
	Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
	return list.Items
}

func (w *world) nodeUpdateOf(machine string) *inplacev1.NodeUpdate {
	for _, nu := range w.nodeUpdates() {
		if nu.Spec.MachineName == machine {
			return &nu
		}
	}
	return nil
}

func (w *world) machineStatus(task, machine string) inplacev1.MachineUpgradeStatus {
	for _, ms := range w.task(task).Status.Machines {
		if ms.Name == machine {
			return ms
		}
	}
	return inplacev1.MachineUpgradeStatus{}
}

func (w *world) events(reason string) []string {
	GinkgoHelper()
	list := &eventsv1.EventList{}
	Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

// eventsRelated returns, for each event of a reason, the name of the object it names as
// related, and for a series, once per occurrence.
func (w *world) eventsRelated(reason string) []string {
	GinkgoHelper()
	list := &eventsv1.EventList{}
	Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Reason != reason {
			continue
		}
		name := ""
		if e.Related != nil {
			name = e.Related.Name
		}
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		for range n {
			out = append(out, name)
		}
	}
	return out
}

// watchNodeUpdates starts a sim.NodeUpdateWitness of the NodeUpdates of ns until the spec ends.
func watchNodeUpdates(ns string) *sim.NodeUpdateWitness {
	GinkgoHelper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	rec, err := sim.WatchNodeUpdates(ctx, wc, ns)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(rec.Stop)
	return rec
}

// simulate runs the external updater simulator (sim.ExternalUpdater) on the NodeUpdates
// of ns, each holding its node for hold, until the spec ends.
func simulate(ns string, hold time.Duration) *sim.ExternalUpdater {
	s := sim.RunExternalUpdater(ctx, k8s, ns, hold, func(format string, args ...any) { GinkgoWriter.Printf(format+"\n", args...) })
	DeferCleanup(s.Stop)
	return s
}

func condition(conds []metav1.Condition, t string) metav1.Condition {
	for _, c := range conds {
		if c.Type == t {
			return c
		}
	}
	return metav1.Condition{}
}

var _ = corev1.NodeReady

// installExternalUpdater installs ExternalUpgrader/default (fixtures.ExternalUpdater) in ns.
func installExternalUpdater(ns string) {
	GinkgoHelper()
	Expect(fixtures.ExternalUpdater(ctx, k8s, ns)).To(Succeed())
}

// metricSample finds a sample of a metric family in controller-runtime's registry whose
// labels include want.
func metricSample(name string, want map[string]string) *dto.Metric {
	GinkgoHelper()
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range want {
				if labels[k] != v {
					match = false
				}
			}
			if match {
				return m
			}
		}
	}
	return nil
}

func gauge(name string, labels map[string]string) float64 {
	GinkgoHelper()
	m := metricSample(name, labels)
	Expect(m).NotTo(BeNil(), "metric %s%v", name, labels)
	return m.GetGauge().GetValue()
}

func histogramCount(name string, labels map[string]string) uint64 {
	GinkgoHelper()
	m := metricSample(name, labels)
	Expect(m).NotTo(BeNil(), "metric %s%v", name, labels)
	return m.GetHistogram().GetSampleCount()
}
