package cascade

import (
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

const (
	cascadeTimeout = 90 * time.Second
	fromVersion    = "v1.33.3+rke2r1"
	nextVersion    = "v1.34.2+rke2r1"
	targetVersion  = "v1.34.1+rke2r1"
	poll           = 100 * time.Millisecond
	timeout        = 40 * time.Second
)

// startCascadeManager runs a manager with the UpgradeTask controller and the annotation
// cascade, asking through a Requester with no default updater (the test Clusters name
// theirs), until the returned stop is called.
func startCascadeManager() (stop func()) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	opts := controller.Options{MaxConcurrentReconciles: 2}
	tasks := &upgradetask.Reconciler{Workload: upgradetask.SameCluster{Management: k8s}, PollInterval: 100 * time.Millisecond}
	Expect(tasks.SetupWithManager(ctx, mgr, opts)).To(Succeed())
	requester := &upgraderequest.Requester{
		Client: mgr.GetClient(), TaskReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("capi-inplace-requests"),
	}
	// A long poll: the cascade must be driven by its watches, not by polling.
	Expect((&UpgradeCascade{Requester: requester, PollInterval: time.Minute}).SetupWithManager(ctx, mgr, opts)).To(Succeed())
	return runManager(mgr)
}

// cascadeWorld is a Cluster "harvester" with a KubeadmControlPlane "cp" of 3 machines and
// the MachineDeployments "workers-a" and "workers-b" of 3 machines each, all at
// fromVersion with Ready Nodes, in its own namespace, and the external updater
// ExternalUpgrader/default.
type cascadeWorld struct {
	ns       string
	machines []string
}

func newCascadeWorld(withUpdater bool) *cascadeWorld {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, k8s, "cascade")
	Expect(err).NotTo(HaveOccurred())
	installExternalUpdater(ns)
	var annotations map[string]string
	if withUpdater {
		annotations = map[string]string{inplacev1.UpdaterAnnotation: "ExternalUpgrader/default"}
	}
	_, err = fixtures.Cluster(ctx, k8s, ns, "harvester", "cp", annotations)
	Expect(err).NotTo(HaveOccurred())
	w := &cascadeWorld{ns: ns}
	_, cp, err := fixtures.ControlPlane(ctx, k8s, ns, "harvester", "cp", fromVersion, 3, false)
	Expect(err).NotTo(HaveOccurred())
	for _, m := range cp {
		w.machines = append(w.machines, m.Name)
	}
	for _, md := range []string{"workers-a", "workers-b"} {
		_, machines, err := fixtures.MachineDeployment(ctx, k8s, ns, "harvester", md, fromVersion, 3)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range machines {
			w.machines = append(w.machines, m.Name)
		}
	}
	return w
}

// controlPlaneAt records on the control plane machines that they run version, as an
// earlier in-place upgrade of the control plane would have: workers never go past it.
func (w *cascadeWorld) controlPlaneAt(version string) {
	GinkgoHelper()
	for _, name := range w.machines {
		if strings.HasPrefix(name, "cp-") {
			annotate(w.machineObj(name), inplacev1.UpgradeReleaseAnnotation, version)
		}
	}
}

func (w *cascadeWorld) cluster() client.Object {
	return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "harvester"}}
}

func (w *cascadeWorld) kcp() client.Object {
	return &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "cp"}}
}

func (w *cascadeWorld) md(name string) client.Object {
	return &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}
}

func (w *cascadeWorld) machineObj(name string) client.Object {
	return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}
}

// annotate sets (or, for an empty value, removes) an annotation the way
// `kubectl annotate` does: a merge patch of the annotation alone.
func annotate(obj client.Object, key, value string) {
	GinkgoHelper()
	Expect(fixtures.Annotate(ctx, k8s, obj, key, value)).To(Succeed())
}

// annotationsOf reads obj's annotations from the API server.
func annotationsOf(obj client.Object) map[string]string {
	GinkgoHelper()
	fresh, ok := obj.DeepCopyObject().(client.Object)
	Expect(ok).To(BeTrue())
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), fresh)).To(Succeed())
	return fresh.GetAnnotations()
}

// upgradeState reads obj's in-place upgrade annotations from the API server.
func upgradeState(obj client.Object) func() upgradeAnnotations {
	return func() upgradeAnnotations {
		fresh, ok := obj.DeepCopyObject().(client.Object)
		Expect(ok).To(BeTrue())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), fresh)).To(Succeed())
		return readUpgradeAnnotations(fresh)
	}
}

// shownAnnotations are an object's in-place upgrade annotations, with exported fields for
// HaveField.
type shownAnnotations struct{ To, Status, Release, Message, Task, Progress string }

func shownState(obj client.Object) func() shownAnnotations {
	return func() shownAnnotations {
		a := upgradeState(obj)()
		return shownAnnotations{To: a.to, Status: a.status, Release: a.release, Message: a.message, Task: a.task, Progress: a.progress}
	}
}

func statusOf(obj client.Object) func() string {
	return func() string { return upgradeState(obj)().status }
}

// expectDone asserts that obj answered done at version: release set, in-place-upgrade-to
// removed, no message.
func expectDone(obj client.Object, version string) upgradeAnnotations {
	GinkgoHelper()
	a := upgradeState(obj)()
	Expect(a.status).To(Equal(inplacev1.UpgradeStatusDone), "%s: %+v", describeObject(obj), a)
	Expect(a.release).To(Equal(version), describeObject(obj))
	Expect(a.to).To(BeEmpty(), describeObject(obj))
	Expect(a.message).To(BeEmpty(), describeObject(obj))
	return a
}

// eventsOn lists the notes of the events with reason recorded on the object of kind and name.
func eventsOn(ns, kind, name, reason string) []string {
	GinkgoHelper()
	list := &eventsv1.EventList{}
	Expect(k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

func eventsOnFn(ns, kind, name, reason string) func() []string {
	return func() []string { return eventsOn(ns, kind, name, reason) }
}

func (w *cascadeWorld) tasks() []inplacev1.UpgradeTask {
	GinkgoHelper()
	list := &inplacev1.UpgradeTaskList{}
	Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
	return list.Items
}

func (w *cascadeWorld) taskNamed(name string) *inplacev1.UpgradeTask {
	GinkgoHelper()
	t := &inplacev1.UpgradeTask{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, t)).To(Succeed())
	return t
}

// snapshot is every annotation of the world's control plane, MachineDeployments and
// machines, to show that nothing changed.
func (w *cascadeWorld) snapshot() map[string]map[string]string {
	GinkgoHelper()
	out := map[string]map[string]string{
		"kcp/cp":       annotationsOf(w.kcp()),
		"md/workers-a": annotationsOf(w.md("workers-a")),
		"md/workers-b": annotationsOf(w.md("workers-b")),
	}
	for _, m := range w.machines {
		got := &clusterv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: m}, got)).To(Succeed())
		labels := map[string]string{}
		for k, v := range got.Labels {
			if strings.HasPrefix(k, inplacev1.AnnotationPrefix) {
				labels[k] = v
			}
		}
		out["machine/"+m] = got.Annotations
		out["machine-labels/"+m] = labels
	}
	return out
}

// timeline watches the NodeUpdates of a namespace and records, in the order the API
// server reports them, when each started (was created) and how it ended. One watch
// delivers events in the order they happened, so the order is exact.
type timeline struct {
	mu      sync.Mutex
	entries []timelineEntry
	ended   map[string]bool
	started map[string]bool
}

type timelineEntry struct {
	machine string
	version string
	// what is "start" or the final phase.
	what string
}

func watchTimeline(ns string) *timeline {
	GinkgoHelper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	t := &timeline{ended: map[string]bool{}, started: map[string]bool{}}
	f, err := sim.Follow(ctx, wc, &inplacev1.NodeUpdateList{}, func(ev watch.Event) {
		nu, ok := ev.Object.(*inplacev1.NodeUpdate)
		if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
			return
		}
		t.mu.Lock()
		if !t.started[nu.Name] {
			t.started[nu.Name] = true
			t.entries = append(t.entries, timelineEntry{machine: nu.Spec.MachineName, version: nu.Spec.Version, what: "start"})
		}
		if nu.Status.Phase.IsFinal() && !t.ended[nu.Name] {
			t.ended[nu.Name] = true
			t.entries = append(t.entries, timelineEntry{machine: nu.Spec.MachineName, version: nu.Spec.Version, what: string(nu.Status.Phase)})
		}
		t.mu.Unlock()
	}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(f.Stop)
	return t
}

func (t *timeline) snapshot() []timelineEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.entries)
}

func (t *timeline) len() int { return len(t.snapshot()) }

// indexes lists the positions of the entries of machines with prefix, at version (any
// when empty), of the kind what.
func (t *timeline) indexes(prefix, version, what string) []int {
	var out []int
	for i, e := range t.snapshot() {
		if strings.HasPrefix(e.machine, prefix) && (version == "" || e.version == version) && e.what == what {
			out = append(out, i)
		}
	}
	return out
}

// startsPerMachine counts the NodeUpdates started for each machine.
func (t *timeline) startsPerMachine() map[string]int {
	out := map[string]int{}
	for _, e := range t.snapshot() {
		if e.what == "start" {
			out[e.machine]++
		}
	}
	return out
}

// machineWitness watches the Machines of a namespace and remembers every machine that was
// ever seen claimed by a task or carrying an annotation of capi-inplace's.
type machineWitness struct {
	mu      sync.Mutex
	touched map[string]bool
}

func watchMachines(ns string) *machineWitness {
	GinkgoHelper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	mw := &machineWitness{touched: map[string]bool{}}
	f, err := sim.Follow(ctx, wc, &clusterv1.MachineList{}, func(ev watch.Event) {
		m, ok := ev.Object.(*clusterv1.Machine)
		if !ok {
			return
		}
		touched := m.Labels[inplacev1.UpgradeTaskLabel] != ""
		for k := range m.Annotations {
			touched = touched || strings.HasPrefix(k, inplacev1.AnnotationPrefix)
		}
		for _, c := range m.Status.Conditions {
			touched = touched || c.Type == inplacev1.InPlaceUpgradeUpToDateCondition
		}
		if touched {
			mw.mu.Lock()
			mw.touched[m.Name] = true
			mw.mu.Unlock()
		}
	}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(f.Stop)
	return mw
}

func (mw *machineWitness) machines() []string {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	var out []string
	for m := range mw.touched {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

func prefixed(prefix string, names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

var _ = Describe("in-place-upgrade-to cascade", func() {
	var stop func()
	BeforeEach(func() { stop = startCascadeManager() })
	AfterEach(func() {
		if stop != nil {
			stop()
		}
	})

	It("upgrades the control plane, then each MachineDeployment in turn, and marks every object done", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		simulate(w.ns, 250*time.Millisecond)

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(statusOf(w.cluster()), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))

		// The order, as the API server saw the NodeUpdates: every control plane node
		// succeeded before any worker started, and workers-a ended before workers-b began.
		cpDone := tl.indexes("cp-", targetVersion, string(inplacev1.NodeUpdatePhaseSucceeded))
		Expect(cpDone).To(HaveLen(3))
		aStarts := tl.indexes("workers-a-", targetVersion, "start")
		aDone := tl.indexes("workers-a-", targetVersion, string(inplacev1.NodeUpdatePhaseSucceeded))
		bStarts := tl.indexes("workers-b-", targetVersion, "start")
		Expect(aStarts).To(HaveLen(3))
		Expect(aDone).To(HaveLen(3))
		Expect(bStarts).To(HaveLen(3))
		Expect(aStarts[0]).To(BeNumerically(">", cpDone[2]), "no worker starts before the control plane is done: %v", tl.snapshot())
		Expect(bStarts[0]).To(BeNumerically(">", aDone[2]), "MachineDeployments go one at a time: %v", tl.snapshot())
		Expect(tl.startsPerMachine()).To(HaveLen(9))
		Expect(tl.startsPerMachine()).To(HaveEach(1), "each machine is upgraded once")

		// The Cluster: done at the version, in-place-upgrade-to removed, the tasks it asked for listed.
		cluster := expectDone(w.cluster(), targetVersion)
		runTasks := strings.Split(cluster.task, ",")
		Expect(runTasks).To(HaveLen(3))
		for i, child := range []client.Object{w.kcp(), w.md("workers-a"), w.md("workers-b")} {
			a := expectDone(child, targetVersion)
			Expect(a.task).To(Equal(runTasks[i]), "the Cluster lists %s's task in order", describeObject(child))
			Expect(a.progress).To(Equal("3/3"))
			task := w.taskNamed(a.task)
			Expect(task.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted))
			Expect(task.Spec.Version).To(Equal(targetVersion))
			Expect(task.Spec.Pacing).To(Equal(inplacev1.PacingExtension))
			Expect(task.Spec.Machines).To(BeEmpty())
		}
		Expect(w.taskNamed(runTasks[0]).Spec.ControlPlaneRef).To(Equal(&inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}))
		Expect(w.tasks()).To(HaveLen(3), "one task per control plane and MachineDeployment, nothing else")

		// Every machine carries the release; the cascade writes nothing else on machines,
		// and no spec.version anywhere changed.
		for _, name := range w.machines {
			m := &clusterv1.Machine{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, m)).To(Succeed())
			Expect(m.Annotations).To(Equal(map[string]string{inplacev1.UpgradeReleaseAnnotation: targetVersion}), name)
			Expect(m.Spec.Version).To(Equal(fromVersion), "spec.version of machine %s is never written", name)
		}
		kcp := &controlplanev1.KubeadmControlPlane{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(w.kcp()), kcp)).To(Succeed())
		Expect(kcp.Spec.Version).To(Equal(fromVersion))
		for _, name := range []string{"workers-a", "workers-b"} {
			md := &clusterv1.MachineDeployment{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, md)).To(Succeed())
			Expect(md.Spec.Template.Spec.Version).To(Equal(fromVersion))
		}

		// Events on each object.
		Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeDoneReason), timeout, poll).Should(ContainElement(
			"upgraded in place to " + targetVersion + ": KubeadmControlPlane cp, MachineDeployment workers-a, MachineDeployment workers-b"))
		Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeInProgressReason), timeout, poll).Should(ContainElements(
			"upgrading in place to "+targetVersion+": KubeadmControlPlane cp first, then 2 MachineDeployment(s) one at a time",
			"asked KubeadmControlPlane cp to upgrade in place to "+targetVersion+": UpgradeTask "+runTasks[0],
			"asked MachineDeployment workers-a to upgrade in place to "+targetVersion+": UpgradeTask "+runTasks[1],
			"asked MachineDeployment workers-b to upgrade in place to "+targetVersion+": UpgradeTask "+runTasks[2],
		))
		for _, ref := range [][2]string{{"KubeadmControlPlane", "cp"}, {"MachineDeployment", "workers-a"}, {"MachineDeployment", "workers-b"}} {
			Eventually(eventsOnFn(w.ns, ref[0], ref[1], inplacev1.InPlaceUpgradeInProgressReason), timeout, poll).ShouldNot(BeEmpty(), "%v", ref)
			Eventually(eventsOnFn(w.ns, ref[0], ref[1], inplacev1.InPlaceUpgradeDoneReason), timeout, poll).Should(
				ContainElement(HavePrefix("upgraded in place to "+targetVersion+": UpgradeTask ")), "%v", ref)
		}
	})

	It("upgrades the MachineDeployments all at once when the Cluster says so, still after the control plane", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		simulate(w.ns, 400*time.Millisecond)
		annotate(w.cluster(), inplacev1.MachineDeploymentConcurrencyAnnotation, inplacev1.MachineDeploymentsAllAtOnce)

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(statusOf(w.cluster()), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))

		cpDone := tl.indexes("cp-", targetVersion, string(inplacev1.NodeUpdatePhaseSucceeded))
		workerStarts := tl.indexes("workers-", targetVersion, "start")
		Expect(cpDone).To(HaveLen(3))
		Expect(workerStarts).To(HaveLen(6))
		Expect(workerStarts[0]).To(BeNumerically(">", cpDone[2]), "no worker starts before the control plane is done: %v", tl.snapshot())
		aDone := tl.indexes("workers-a-", targetVersion, string(inplacev1.NodeUpdatePhaseSucceeded))
		bStarts := tl.indexes("workers-b-", targetVersion, "start")
		Expect(bStarts[0]).To(BeNumerically("<", aDone[2]), "workers-b started while workers-a still ran: %v", tl.snapshot())
		for _, child := range []client.Object{w.kcp(), w.md("workers-a"), w.md("workers-b")} {
			expectDone(child, targetVersion)
		}
		Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeInProgressReason), timeout, poll).Should(
			ContainElement(HaveSuffix("2 MachineDeployment(s) all at once")))
	})

	It("fails the Cluster with the failing machine and its error when the control plane fails, and leaves the workers untouched", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		witness := watchMachines(w.ns)
		sim := simulate(w.ns, 250*time.Millisecond)
		sim.FailMachine("cp-2", "kubeadm upgrade apply: etcd member cp-2 is unhealthy")

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(statusOf(w.cluster()), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusFailed))

		cluster := upgradeState(w.cluster())()
		Expect(cluster.to).To(BeEmpty())
		Expect(cluster.release).To(BeEmpty())
		Expect(cluster.message).To(HavePrefix("KubeadmControlPlane cp: the in-place upgrade to " + targetVersion + " failed: machine cp-2 (node " + fixtures.NodeName(w.ns, "cp-2") + ") failed: kubeadm upgrade apply: etcd member cp-2 is unhealthy"))
		Expect(cluster.message).To(HaveSuffix("; the MachineDeployments were not touched"))
		Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeFailedReason), timeout, poll).Should(ContainElement(cluster.message))

		cp := upgradeState(w.kcp())()
		Expect(cp.status).To(Equal(inplacev1.UpgradeStatusFailed))
		Expect(cp.to).To(BeEmpty())
		Expect(cp.message).To(ContainSubstring("machine cp-2 (node " + fixtures.NodeName(w.ns, "cp-2") + ") failed: kubeadm upgrade apply: etcd member cp-2 is unhealthy"))
		Expect(w.taskNamed(cp.task).Status.Phase).To(Equal(inplacev1.TaskPhaseFailed))
		Eventually(eventsOnFn(w.ns, "KubeadmControlPlane", "cp", inplacev1.InPlaceUpgradeFailedReason), timeout, poll).Should(ContainElement(cp.message))

		// The workers: never annotated, never asked, never started.
		Consistently(func() []timelineEntry {
			var out []timelineEntry
			for _, e := range tl.snapshot() {
				if strings.HasPrefix(e.machine, "workers-") {
					out = append(out, e)
				}
			}
			return out
		}, 2*time.Second, poll).Should(BeEmpty())
		for _, md := range []string{"workers-a", "workers-b"} {
			Expect(annotationsOf(w.md(md))).To(BeEmpty(), md)
		}
		for _, t := range w.tasks() {
			Expect(t.Spec.MachineDeploymentRef).To(BeNil(), "no task for a MachineDeployment: %s", t.Name)
		}
		Expect(prefixed("workers-", witness.machines())).To(BeEmpty())
		Expect(tl.startsPerMachine()).To(Equal(map[string]int{"cp-1": 1, "cp-2": 1}))
	})

	It("aborts the running task when in-place-upgrade-to is removed from the Cluster", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		witness := watchMachines(w.ns)
		sim := simulate(w.ns, time.Hour)
		sim.SetAbortDelay(500 * time.Millisecond)

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(func() []int { return tl.indexes("cp-", "", "start") }, cascadeTimeout, poll).Should(HaveLen(1))
		cpTask := upgradeState(w.kcp())().task
		Expect(cpTask).NotTo(BeEmpty())

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, "")

		Eventually(func() inplacev1.TaskPhase { return w.taskNamed(cpTask).Status.Phase }, cascadeTimeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Expect(w.taskNamed(cpTask).Spec.Phase).To(Equal(inplacev1.TaskActionAbort))
		Eventually(shownState(w.cluster()), timeout, poll).Should(And(
			HaveField("To", ""), HaveField("Status", ""),
			HaveField("Message", HavePrefix("the in-place upgrade to "+targetVersion+" was aborted: "+inplacev1.UpgradeToAnnotation+" was removed from the Cluster; withdrew KubeadmControlPlane cp")),
		))
		Eventually(shownState(w.kcp()), timeout, poll).Should(And(
			HaveField("To", ""), HaveField("Status", ""), HaveField("Task", cpTask),
			HaveField("Message", HavePrefix("the in-place upgrade to "+targetVersion+" was aborted: "+inplacev1.UpgradeToAnnotation+" was removed")),
		))
		Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeAbortedReason), timeout, poll).ShouldNot(BeEmpty())
		Eventually(eventsOnFn(w.ns, "KubeadmControlPlane", "cp", inplacev1.InPlaceUpgradeAbortedReason), timeout, poll).ShouldNot(BeEmpty())

		Consistently(func() map[string]int { return tl.startsPerMachine() }, 2*time.Second, poll).Should(HaveLen(1), "nothing started after the abort")
		Expect(prefixed("workers-", witness.machines())).To(BeEmpty())
		Expect(w.tasks()).To(HaveLen(1))
		for _, md := range []string{"workers-a", "workers-b"} {
			Expect(annotationsOf(w.md(md))).To(BeEmpty(), md)
		}
	})

	It("starts over from the control plane when the Cluster's in-place-upgrade-to changes mid-flight, aborting the running MachineDeployment", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		sim := simulate(w.ns, 800*time.Millisecond)
		sim.SetAbortDelay(300 * time.Millisecond)

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(func() []int { return tl.indexes("workers-a-", targetVersion, "start") }, cascadeTimeout, poll).ShouldNot(BeEmpty())
		oldTask := upgradeState(w.md("workers-a"))().task
		Expect(oldTask).NotTo(BeEmpty())
		changedAt := tl.len()

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, nextVersion)

		Eventually(func() inplacev1.TaskPhase { return w.taskNamed(oldTask).Status.Phase }, cascadeTimeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Eventually(statusOf(w.cluster()), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))
		expectDone(w.cluster(), nextVersion)
		for _, child := range []client.Object{w.kcp(), w.md("workers-a"), w.md("workers-b")} {
			expectDone(child, nextVersion)
		}
		for _, name := range w.machines {
			Expect(annotationsOf(w.machineObj(name))).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, nextVersion), name)
		}

		// After the change: the control plane again first, then the workers.
		cpDone := tl.indexes("cp-", nextVersion, string(inplacev1.NodeUpdatePhaseSucceeded))
		workerStarts := tl.indexes("workers-", nextVersion, "start")
		Expect(cpDone).To(HaveLen(3))
		Expect(workerStarts).To(HaveLen(6))
		Expect(cpDone[0]).To(BeNumerically(">=", changedAt))
		Expect(workerStarts[0]).To(BeNumerically(">", cpDone[2]), "%v", tl.snapshot())
		Expect(tl.indexes("workers-b-", targetVersion, "start")).To(BeEmpty(), "workers-b never started at the superseded version")
		Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeAbortedReason), timeout, poll).Should(ContainElement(
			HavePrefix("the in-place upgrade to " + nextVersion + " superseded the one to " + targetVersion)))
	})

	It("aborts the running task and starts the new one when a control plane's in-place-upgrade-to changes", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		witness := watchMachines(w.ns)
		sim := simulate(w.ns, 600*time.Millisecond)
		sim.SetAbortDelay(300 * time.Millisecond)

		annotate(w.kcp(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(func() []int { return tl.indexes("cp-", targetVersion, "start") }, cascadeTimeout, poll).ShouldNot(BeEmpty())
		oldTask := upgradeState(w.kcp())().task
		Expect(oldTask).NotTo(BeEmpty())

		annotate(w.kcp(), inplacev1.UpgradeToAnnotation, nextVersion)
		Eventually(statusOf(w.kcp()), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))
		a := expectDone(w.kcp(), nextVersion)
		Expect(a.task).NotTo(Equal(oldTask))
		Expect(w.taskNamed(oldTask).Spec.Phase).To(Equal(inplacev1.TaskActionAbort))
		Eventually(func() inplacev1.TaskPhase { return w.taskNamed(oldTask).Status.Phase }, timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Expect(w.taskNamed(a.task).Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted))
		for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
			Expect(annotationsOf(w.machineObj(name))).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, nextVersion), name)
		}
		Expect(tl.indexes("cp-", targetVersion, "start")).To(HaveLen(1), "the old task stopped after its running node")
		Expect(prefixed("workers-", witness.machines())).To(BeEmpty(), "machines outside the target are never annotated")
		Expect(upgradeState(w.cluster())()).To(Equal(upgradeAnnotations{}), "a control plane's own ask leaves its Cluster alone")
	})

	DescribeTable("refuses a bad value on the Cluster, says why, and changes nothing else",
		func(value string, withUpdater bool, why string) {
			w := newCascadeWorld(withUpdater)
			before := w.snapshot()

			annotate(w.cluster(), inplacev1.UpgradeToAnnotation, value)
			Eventually(statusOf(w.cluster()), timeout, poll).Should(Equal(inplacev1.UpgradeStatusFailed))
			a := upgradeState(w.cluster())()
			Expect(a.message).To(HavePrefix("KubeadmControlPlane cp: the upgrade was declined: "))
			Expect(a.message).To(ContainSubstring(why))
			Expect(a.to).To(BeEmpty())
			Expect(a.task).To(BeEmpty())
			Expect(a.release).To(BeEmpty())
			Eventually(eventsOnFn(w.ns, "Cluster", "harvester", inplacev1.InPlaceUpgradeFailedReason), timeout, poll).Should(ContainElement(a.message))

			Consistently(func() []inplacev1.UpgradeTask { return w.tasks() }, time.Second, poll).Should(BeEmpty())
			Expect(w.snapshot()).To(Equal(before), "nothing else changed")
			list := &inplacev1.NodeUpdateList{}
			Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
			Expect(list.Items).To(BeEmpty())
		},
		Entry("not a semantic version", "1.34", true, `version "1.34" is not a valid semantic version`),
		Entry("a downgrade", "v1.32.9+rke2r1", true, "version v1.32.9+rke2r1 is older than "+fromVersion),
		Entry("a skipped minor version for the control plane", "v1.35.0+rke2r1", true, "v1.35.0+rke2r1 would skip a minor version"),
		Entry("no updater configured", targetVersion, false, "no updater configured for Cluster"),
	)

	DescribeTable("refuses a bad value on a control plane, a MachineDeployment or a Machine, and changes nothing else",
		func(obj func(*cascadeWorld) client.Object, value, why string) {
			w := newCascadeWorld(true)
			target := obj(w)
			before := w.snapshot()

			annotate(target, inplacev1.UpgradeToAnnotation, value)
			Eventually(statusOf(target), timeout, poll).Should(Equal(inplacev1.UpgradeStatusFailed))
			a := upgradeState(target)()
			Expect(a.message).To(ContainSubstring(why))
			Expect(a.to).To(BeEmpty())
			Expect(a.task).To(BeEmpty())
			Eventually(eventsOnFn(w.ns, strings.Fields(describeObject(target))[0], target.GetName(), inplacev1.InPlaceUpgradeFailedReason), timeout, poll).
				Should(ContainElement(a.message))

			Consistently(func() []inplacev1.UpgradeTask { return w.tasks() }, time.Second, poll).Should(BeEmpty())
			after := w.snapshot()
			for key, annotations := range after {
				if strings.HasSuffix(key, "/"+target.GetName()) && !strings.HasPrefix(key, "machine-labels/") {
					// The refused object carries only its answer.
					Expect(annotations).To(Equal(map[string]string{
						inplacev1.UpgradeStatusAnnotation: inplacev1.UpgradeStatusFailed, inplacev1.UpgradeMessageAnnotation: a.message,
					}))
					continue
				}
				Expect(annotations).To(Equal(before[key]), key)
			}
			Expect(upgradeState(w.cluster())()).To(Equal(upgradeAnnotations{}))
		},
		Entry("a skipped minor version on the KubeadmControlPlane", func(w *cascadeWorld) client.Object { return w.kcp() }, "v1.35.0+rke2r1", "would skip a minor version"),
		Entry("a downgrade on a MachineDeployment", func(w *cascadeWorld) client.Object { return w.md("workers-a") }, "v1.33.1+rke2r1", "in-place downgrades are not supported"),
		Entry("not a semantic version on a Machine", func(w *cascadeWorld) client.Object { return w.machineObj("workers-b-2") }, "latest", `version "latest" is not a valid semantic version`),
	)

	It("upgrades a single Machine with a one-machine UpgradeTask and annotates no other machine", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		witness := watchMachines(w.ns)
		simulate(w.ns, 200*time.Millisecond)
		w.controlPlaneAt(targetVersion)

		annotate(w.machineObj("workers-b-2"), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(statusOf(w.machineObj("workers-b-2")), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))
		a := expectDone(w.machineObj("workers-b-2"), targetVersion)
		Expect(a.progress).To(Equal("1/1"))
		task := w.taskNamed(a.task)
		Expect(task.Spec.Machines).To(Equal([]string{"workers-b-2"}))
		Expect(task.Spec.MachineDeploymentRef).To(Equal(&inplacev1.MachineDeploymentReference{Name: "workers-b"}))
		Expect(task.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted))
		Eventually(eventsOnFn(w.ns, "Machine", "workers-b-2", inplacev1.InPlaceUpgradeDoneReason), timeout, poll).ShouldNot(BeEmpty())

		// The control plane machines carry the release of their own (earlier) upgrade.
		Consistently(func() []string { return prefixed("workers-", witness.machines()) }, time.Second, poll).Should(Equal([]string{"workers-b-2"}))
		Expect(tl.startsPerMachine()).To(Equal(map[string]int{"workers-b-2": 1}))
		Expect(annotationsOf(w.md("workers-b"))).To(BeEmpty())
		Expect(upgradeState(w.cluster())()).To(Equal(upgradeAnnotations{}))
	})

	It("upgrades a MachineDeployment's machines only", func() {
		w := newCascadeWorld(true)
		witness := watchMachines(w.ns)
		simulate(w.ns, 200*time.Millisecond)
		w.controlPlaneAt(targetVersion)

		annotate(w.md("workers-b"), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(statusOf(w.md("workers-b")), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))
		expectDone(w.md("workers-b"), targetVersion)
		Consistently(func() []string { return prefixed("workers-", witness.machines()) }, time.Second, poll).Should(Equal([]string{"workers-b-1", "workers-b-2", "workers-b-3"}))
		Expect(annotationsOf(w.kcp())).To(BeEmpty())
		Expect(annotationsOf(w.md("workers-a"))).To(BeEmpty())
	})

	It("neither starts a machine twice nor loses its place across a restart of the manager", func() {
		w := newCascadeWorld(true)
		tl := watchTimeline(w.ns)
		simulate(w.ns, 400*time.Millisecond)

		annotate(w.cluster(), inplacev1.UpgradeToAnnotation, targetVersion)
		Eventually(func() []int { return tl.indexes("workers-a-", "", "start") }, cascadeTimeout, poll).ShouldNot(BeEmpty())
		stop()
		stop = nil
		// While the manager is down, the running node finishes.
		time.Sleep(time.Second)
		stop = startCascadeManager()

		Eventually(statusOf(w.cluster()), cascadeTimeout, poll).Should(Equal(inplacev1.UpgradeStatusDone))
		Expect(tl.startsPerMachine()).To(HaveLen(9))
		Expect(tl.startsPerMachine()).To(HaveEach(1))
		Expect(w.tasks()).To(HaveLen(3))
		bStarts := tl.indexes("workers-b-", "", "start")
		aDone := tl.indexes("workers-a-", "", string(inplacev1.NodeUpdatePhaseSucceeded))
		Expect(bStarts[0]).To(BeNumerically(">", aDone[2]))
	})
})

var _ = Describe("a child's place in the Cluster's cascade", func() {
	const v = "v1.34.1"
	child := func(runTask string, a upgradeAnnotations) *cascadeChild {
		return &cascadeChild{upgradeSubject: upgradeSubject{obj: &clusterv1.MachineDeployment{}}, cur: a, runTask: runTask}
	}
	DescribeTable("childState",
		func(c *cascadeChild, want childProgress, why string) {
			got, msg := childState(c, v)
			Expect(got).To(Equal(want))
			Expect(msg).To(Equal(why))
		},
		Entry("not asked by this run, whatever it says", child("", upgradeAnnotations{status: "failed", task: "old"}), childNotAsked, ""),
		Entry("asked, its controller not yet answered", child("t", upgradeAnnotations{to: v, task: "t"}), childRunning, ""),
		Entry("asked again over an earlier answer", child("t", upgradeAnnotations{to: v, task: "t", status: "done", release: v}), childRunning, ""),
		Entry("done at the version", child("t", upgradeAnnotations{task: "t", status: "done", release: v}), childDone, ""),
		Entry("failed", child("t", upgradeAnnotations{task: "t", status: "failed", message: "machine m failed: boom"}), childFailed, "machine m failed: boom"),
		Entry("answered for another task: asked again", child("t", upgradeAnnotations{task: "other", status: "failed"}), childNotAsked, ""),
		Entry("its ask withdrawn, abort in progress", child("t", upgradeAnnotations{task: "t", status: "in-progress"}), childRunning, ""),
		Entry("its ask withdrawn and aborted", child("t", upgradeAnnotations{task: "t", message: "the in-place upgrade to v1.34.1 was aborted: ..."}), childFailed, "the in-place upgrade to v1.34.1 was aborted: ..."),
		Entry("asked for another version by someone else", child("t", upgradeAnnotations{to: "v1.35.0", task: "t"}), childFailed,
			"its "+inplacev1.UpgradeToAnnotation+" was changed to v1.35.0 while the Cluster's upgrade to v1.34.1 ran"),
	)

	DescribeTable("followTask",
		func(cur upgradeAnnotations, phase inplacev1.TaskPhase, action inplacev1.TaskAction, want upgradeAnnotations, reason string) {
			task := &inplacev1.UpgradeTask{
				ObjectMeta: metav1.ObjectMeta{Name: "t"},
				Spec:       inplacev1.UpgradeTaskSpec{Version: v, Phase: action},
				Status: inplacev1.UpgradeTaskStatus{Phase: phase, Progress: "1/3", Conditions: []metav1.Condition{
					{Type: inplacev1.DegradedCondition, Status: metav1.ConditionTrue, Reason: "Failed", Message: "machine m (node n) failed: boom"},
				}},
			}
			got, ev := followTask(cur, task)
			Expect(got).To(Equal(want))
			if reason == "" {
				Expect(ev).To(BeNil())
			} else {
				Expect(ev).NotTo(BeNil())
				Expect(ev.reason).To(Equal(reason))
			}
		},
		Entry("started", upgradeAnnotations{to: v}, inplacev1.TaskPhasePending, inplacev1.TaskActionOngoing,
			upgradeAnnotations{to: v, status: "in-progress", task: "t", progress: "1/3"}, inplacev1.InPlaceUpgradeInProgressReason),
		Entry("still running: no new event", upgradeAnnotations{to: v, status: "in-progress", task: "t"}, inplacev1.TaskPhaseInProgress, inplacev1.TaskActionOngoing,
			upgradeAnnotations{to: v, status: "in-progress", task: "t", progress: "1/3"}, ""),
		Entry("completed", upgradeAnnotations{to: v, status: "in-progress", task: "t", message: "old"}, inplacev1.TaskPhaseCompleted, inplacev1.TaskActionOngoing,
			upgradeAnnotations{status: "done", release: v, task: "t", progress: "1/3"}, inplacev1.InPlaceUpgradeDoneReason),
		Entry("failed", upgradeAnnotations{to: v, status: "in-progress", task: "t"}, inplacev1.TaskPhaseFailed, inplacev1.TaskActionOngoing,
			upgradeAnnotations{status: "failed", task: "t", progress: "1/3", message: "the in-place upgrade to v1.34.1 failed: machine m (node n) failed: boom (UpgradeTask t)"}, inplacev1.InPlaceUpgradeFailedReason),
		Entry("aborted by someone else", upgradeAnnotations{to: v, status: "in-progress", task: "t"}, inplacev1.TaskPhaseInProgress, inplacev1.TaskActionAbort,
			upgradeAnnotations{status: "failed", task: "t", progress: "1/3", message: "the in-place upgrade to v1.34.1 was aborted: UpgradeTask t was superseded by a newer request for the same target, or aborted by hand; set " + inplacev1.UpgradeToAnnotation + " again to ask anew"},
			inplacev1.InPlaceUpgradeAbortedReason),
	)
})
