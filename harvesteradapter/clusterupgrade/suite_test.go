package clusterupgrade_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"

	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

var (
	env *testenv.Environment
	ctx = context.Background()
	// releaseFiles holds the simulated release upgrade image's files, as the Job's init
	// container copies them (input's ReleaseFiles).
	releaseFiles string
	// kubeconfig reaches env for the helm the upgrade runs (input's Kubeconfig), and
	// rancherInstaller holds the simulated installer image of newRelease's Rancher
	// (input's RancherInstaller), as the Job's init containers copy it.
	kubeconfig, rancherInstaller string
)

func TestClusterUpgrade(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "Harvester cluster upgrade on a real API server")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	dir, err := os.MkdirTemp("", "clusterupgrade-release-files-")
	Expect(err).NotTo(HaveOccurred())
	releaseFiles = filepath.Join(dir, "share")
	Expect(sim.WriteHarvesterUpgradeFiles(releaseFiles)).To(Succeed())
	kubeconfig = filepath.Join(dir, "kubeconfig")
	Expect(env.WriteKubeconfig(kubeconfig)).To(Succeed())
	var ok bool
	rancherInstaller, ok = sim.DefaultRancherInstallers(clusterupgrade.DefaultRancherInstallerImage + ":" + newRelease.Rancher)
	Expect(ok).To(BeTrue(), "the simulated installer image of Rancher %s (helm from KUBEBUILDER_ASSETS)", newRelease.Rancher)
})

var _ = AfterSuite(func() {
	if releaseFiles != "" {
		Expect(os.RemoveAll(filepath.Dir(releaseFiles))).To(Succeed())
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
