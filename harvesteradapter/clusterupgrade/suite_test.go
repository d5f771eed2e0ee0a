package clusterupgrade_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/test/testenv"
)

var (
	env *testenv.Environment
	ctx = context.Background()
)

func TestClusterUpgrade(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Harvester cluster upgrade on a real API server")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
