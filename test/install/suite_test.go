// Package install checks what capi-inplace ships for installation: the kustomize
// manifests against a real API server, clusterctl's files, the Dockerfile and Tilt's
// provider file.
package install

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env *testenv.Environment
	ctx = context.Background()
)

func TestInstall(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "Install manifests, clusterctl, image and Tilt")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.StartWithOptions(testenv.Options{CertManagerCRDs: true})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
