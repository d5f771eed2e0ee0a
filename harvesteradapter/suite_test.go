package harvesteradapter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// Two real API servers: env is the management cluster (HarvesterUpgraders, NodeUpdates,
// the kubeconfig Secret), workload the Harvester cluster (Nodes, SUC Plans and Jobs,
// Longhorn, the repository), reached only through the kubeconfig Secret, as in production.
var (
	env      *testenv.Environment
	workload *testenv.Environment
	// simCaches holds, for each workload API server startRancher started simulators on,
	// a started cache of it: the simulators read from it and run on its events, as the
	// controllers they stand for do (test/sim passLoop), instead of listing from the API
	// server every few milliseconds, which on two cores slowed every spec.
	simCaches = map[*testenv.Environment]*testenv.StartedCache{}
	ctx       = context.Background()
)

func TestHarvesterAdapter(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "Harvester updater on a real API server with simulated SUC, kubelets, Longhorn and repository")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	workload, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	startRancher(workload)
})

// startRancher seeds the Rancher objects of a Harvester cluster at v1.7.1 on a workload
// API server and plays Rancher, Fleet and the cluster upgrade Jobs there until the suite
// ends: the first UpgradePlan to v1.8.1 upgrades them, the next ones find them done. The
// cache of wl they run on is kept in simCaches for the spec's other simulators.
func startRancher(wl *testenv.Environment) {
	GinkgoHelper()
	startRancherAt(wl, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"}, nil)
}

// startRancherAt is startRancher for a cluster seeded at release, its Rancher simulator
// changed by mutate (when set) before it starts.
func startRancherAt(wl *testenv.Environment, release sim.HarvesterRelease, mutate func(*sim.Rancher)) {
	GinkgoHelper()
	Expect(sim.Seed(ctx, wl.Client, release)).To(Succeed())
	rctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	cache, err := wl.StartCache(rctx)
	Expect(err).NotTo(HaveOccurred())
	r := &sim.Rancher{Client: wl.Client, Cache: cache, ChartDelay: 50 * time.Millisecond, DownloadDelay: 20 * time.Millisecond, RolloutDelay: 20 * time.Millisecond}
	if mutate != nil {
		mutate(r)
	}
	r.Start(rctx)
	(&sim.ClusterUpgradeJobs{Client: wl.Client, Kubeconfig: wl.Kubeconfig, Cache: cache}).Start(rctx)
	simCaches[wl] = cache
	DeferCleanup(func() { delete(simCaches, wl) })
}

var _ = AfterSuite(func() {
	for _, e := range []*testenv.Environment{env, workload} {
		if e != nil {
			Expect(e.Stop()).To(Succeed())
		}
	}
})

// simCache is the started cache of wl that startRancher keeps, or nil (the simulators then
// poll).
func simCache(wl *testenv.Environment) ctrlcache.Cache {
	if c, ok := simCaches[wl]; ok {
		return c
	}
	return nil
}
