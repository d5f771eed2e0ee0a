package harvesteradapter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// Two real API servers: env is the management cluster (HarvesterUpgraders, NodeUpdates,
// the kubeconfig Secret), workload the Harvester cluster (Nodes, SUC Plans and Jobs,
// Longhorn, the repository), reached only through the kubeconfig Secret, as in production.
var (
	env      *testenv.Environment
	workload *testenv.Environment
	ctx      = context.Background()
)

func TestHarvesterAdapter(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Harvester updater on a real API server with simulated SUC, kubelets, Longhorn and repository")
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
// ends: the first UpgradePlan to v1.8.1 upgrades them, the next ones find them done.
func startRancher(wl *testenv.Environment) {
	GinkgoHelper()
	Expect(sim.Seed(ctx, wl.Client, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1"})).To(Succeed())
	rctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	(&sim.Rancher{Client: wl.Client, ChartDelay: 50 * time.Millisecond, DownloadDelay: 20 * time.Millisecond, RolloutDelay: 20 * time.Millisecond, Interval: 20 * time.Millisecond}).Start(rctx)
	(&sim.ClusterUpgradeJobs{Client: wl.Client, Kubeconfig: wl.Kubeconfig}).Start(rctx)
}

var _ = AfterSuite(func() {
	for _, e := range []*testenv.Environment{env, workload} {
		if e != nil {
			Expect(e.Stop()).To(Succeed())
		}
	}
})
