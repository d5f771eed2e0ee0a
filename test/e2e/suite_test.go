package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// The end-to-end suite runs the manager binary as a separate process against a real
// API server and talks to it only over the network, as Cluster API and operators do.
var (
	env        *testenv.Environment
	workDir    string
	kubeconfig string
	managerBin string
	certs      *manager.ServingCerts
	ctx        = context.Background()
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.RunWhole(t, "capi-inplace end to end")
}

var _ = BeforeSuite(func() {
	var err error
	workDir, err = os.MkdirTemp("", "capi-inplace-e2e-")
	Expect(err).NotTo(HaveOccurred())

	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())

	kubeconfig = filepath.Join(workDir, "kubeconfig")
	Expect(env.WriteKubeconfig(kubeconfig)).To(Succeed())

	managerBin, err = manager.Build(ctx, env.RepoRoot, workDir)
	Expect(err).NotTo(HaveOccurred())

	certs, err = manager.NewServingCerts(filepath.Join(workDir, "certs"))
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	// Deferred: the API server and etcd are stopped even when the check below fails (as
	// it does when BeforeSuite failed half-way), so that none is left running.
	defer func() {
		if workDir != "" {
			_ = os.RemoveAll(workDir)
		}
	}()
	defer func() {
		if env != nil {
			Expect(env.Stop()).To(Succeed())
		}
	}()
	if env != nil && workDir != "" {
		By("no log line or event of the suite carries secret material")
		expectNoSecretsLeaked()
	}
})
