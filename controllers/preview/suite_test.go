package preview

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env *testenv.Environment
	k8s client.Client
	ctx = context.Background()
	// managerHooks are the running manager's hooks, which Cluster API would call.
	managerHooks *extension.InPlaceHooks
)

func TestPreview(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "UpgradePreview controller on a real API server")
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

const (
	fromVersion   = "v1.33.3+rke2r1"
	targetVersion = "v1.34.1+rke2r1"
)

// fakeUpdater stands for an updater the manager runs: its preflight holds the nodes listed
// in hold, and it previews a disruption that names the nodes down with the node.
type fakeUpdater struct {
	mu   sync.Mutex
	hold map[string]string // node -> message
}

func (u *fakeUpdater) Reconcile(context.Context, *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	return nodeupdater.Result{}, nil
}

func (u *fakeUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) { return true, nil }

func (u *fakeUpdater) Preflight(_ context.Context, t nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	u.mu.Lock()
	defer u.mu.Unlock()
	if msg, ok := u.hold[t.NodeName]; ok {
		return []nodeupdater.CheckResult{{Name: "FakeVolumes", Passed: false, Message: msg}}
	}
	return []nodeupdater.CheckResult{{Name: "FakeVolumes", Passed: true}}
}

func (u *fakeUpdater) PreviewDisruption(_ context.Context, t nodeupdater.PreflightTarget) (inplacev1.NodeDisruption, error) {
	return inplacev1.NodeDisruption{StoppedVMs: []inplacev1.PreviewVM{{Namespace: "vms", Name: "vm-on-" + t.NodeName, Reason: "down with: " + strings.Join(t.Disrupted, ",")}}}, nil
}

// estimatingUpdater also tells how long a node typically takes.
type estimatingUpdater struct{ fakeUpdater }

func (*estimatingUpdater) TypicalNodeDuration() time.Duration { return 7 * time.Minute }

func registryWith(u nodeupdater.Updater) *nodeupdater.Registry {
	GinkgoHelper()
	reg := nodeupdater.NewRegistry()
	Expect(reg.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Group: "updaters.example.com", Kind: "ExternalUpgrader"},
		NewConfig: func() client.Object {
			o := &metav1.PartialObjectMetadata{}
			o.SetGroupVersionKind(schema.GroupVersionKind{Group: "updaters.example.com", Version: "v1", Kind: "ExternalUpgrader"})
			return o
		},
		Updater: u,
	})).To(Succeed())
	return reg
}

// startManager runs a manager with the UpgradePreview controller and the UpgradeTask
// controller, sharing one registry and one list of checks as main.go wires them.
func startManager(registry *nodeupdater.Registry) (stop func()) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	checks := preflight.Default(registry)
	workload := upgradetask.SameCluster{Management: k8s}
	Expect((&upgradetask.Reconciler{Workload: workload, Registry: registry, Checks: checks, PollInterval: 100 * time.Millisecond}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	// With an event recorder, as main.go builds them: a preview must still record none.
	hooks := &extension.InPlaceHooks{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Registry: registry, Recorder: mgr.GetEventRecorder("capi-inplace-hooks"),
		Refusals: extension.NewRefusalLog()}
	managerHooks = hooks
	Expect((&Reconciler{Workload: workload, Registry: registry, Checks: checks, Hooks: hooks}).
		SetupWithManager(mgr, controller.Options{})).To(Succeed())
	stopManager := testenv.RunManager(ctx, mgr)
	return func() { Expect(stopManager()).To(Succeed()) }
}

// world is one spec's Cluster "harvester" with the control plane "cp" and the
// MachineDeployment "workers", 3 machines each, in its own namespace, and the updater
// ExternalUpgrader/default.
type world struct {
	ns string
}

func newWorld(spaced bool) *world {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, k8s, "upv")
	Expect(err).NotTo(HaveOccurred())
	_, err = fixtures.Cluster(ctx, k8s, ns, "harvester", "cp", nil)
	Expect(err).NotTo(HaveOccurred())
	_, _, err = fixtures.ControlPlane(ctx, k8s, ns, "harvester", "cp", fromVersion, 3, spaced)
	Expect(err).NotTo(HaveOccurred())
	_, _, err = fixtures.MachineDeployment(ctx, k8s, ns, "harvester", "workers", fromVersion, 3)
	Expect(err).NotTo(HaveOccurred())
	Expect(fixtures.ExternalUpdater(ctx, k8s, ns)).To(Succeed())
	return &world{ns: ns}
}

func (w *world) node(machine string) string { return fixtures.NodeName(w.ns, machine) }

// createPreview creates an UpgradePreview "preview" of the cluster to version.
func (w *world) createPreview(version string, mutate ...func(*inplacev1.UpgradePreview)) {
	GinkgoHelper()
	p := &inplacev1.UpgradePreview{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "preview"},
		Spec: inplacev1.UpgradePreviewSpec{
			ClusterName: "harvester", Version: version,
			UpdaterRef: &inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	Expect(k8s.Create(ctx, p)).To(Succeed())
}

func (w *world) preview() *inplacev1.UpgradePreview {
	GinkgoHelper()
	p := &inplacev1.UpgradePreview{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "preview"}, p)).To(Succeed())
	return p
}

// computed waits for the preview to be computed for its current spec and refresh value,
// in phase, and returns it.
func (w *world) computed(phase inplacev1.PreviewPhase) *inplacev1.UpgradePreview {
	GinkgoHelper()
	var p *inplacev1.UpgradePreview
	Eventually(func(g Gomega) {
		p = &inplacev1.UpgradePreview{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "preview"}, p)).To(Succeed())
		g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
		g.Expect(p.Status.ObservedRefresh).To(Equal(p.Annotations[inplacev1.RefreshAnnotation]))
		g.Expect(p.Status.Phase).To(Equal(phase), "message: %s", p.Status.Message)
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	return p
}

func machineOf(p *inplacev1.UpgradePreview, name string) inplacev1.PreviewMachine {
	GinkgoHelper()
	for _, m := range p.Status.Machines {
		if m.Name == name {
			return m
		}
	}
	Fail(fmt.Sprintf("machine %s is not in the preview", name))
	return inplacev1.PreviewMachine{}
}

// orderOf names the preview's machines of a target that would go in place, in order.
func orderOf(p *inplacev1.UpgradePreview, target string) []string {
	var out []string
	var last int32
	for _, m := range p.Status.Machines {
		if m.Target != target || m.Order == 0 {
			continue
		}
		Expect(m.Order).To(BeNumerically(">", last), "orders increase along status.machines")
		last = m.Order
		out = append(out, m.Name)
	}
	return out
}
