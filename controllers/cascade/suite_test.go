package cascade

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

func TestCascade(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "Annotation cascade on a real API server")
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

// runManager starts mgr (testenv.RunManager); the returned stop ends it and waits until it
// has ended, as a restart of the real manager would.
func runManager(mgr ctrl.Manager) (stop func()) {
	stopManager := testenv.RunManager(ctx, mgr)
	return func() { Expect(stopManager()).To(Succeed()) }
}

// installExternalUpdater installs ExternalUpgrader/default (fixtures.ExternalUpdater) in ns.
func installExternalUpdater(ns string) {
	GinkgoHelper()
	Expect(fixtures.ExternalUpdater(ctx, k8s, ns)).To(Succeed())
}

// simulate runs the external updater simulator (sim.ExternalUpdater) on the NodeUpdates
// of ns, each holding its node for hold, until the spec ends.
func simulate(ns string, hold time.Duration) *sim.ExternalUpdater {
	s := sim.RunExternalUpdater(ctx, k8s, ns, hold, func(format string, args ...any) { GinkgoWriter.Printf(format+"\n", args...) })
	DeferCleanup(s.Stop)
	return s
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

// eventNotes returns the notes of the events of a reason in namespace ns.
func eventNotes(ns, reason string) []string {
	GinkgoHelper()
	list := &eventsv1.EventList{}
	Expect(k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}
