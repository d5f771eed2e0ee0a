package harvesteradapter_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

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
})

var _ = AfterSuite(func() {
	for _, e := range []*testenv.Environment{env, workload} {
		if e != nil {
			Expect(e.Stop()).To(Succeed())
		}
	}
})
