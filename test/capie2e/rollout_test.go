package capie2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/capi-inplace/capi-inplace/test/capienv"
)

var _ = Describe("A version bump on a ClusterClass Cluster, rolled out by Cluster API's own controllers", Ordered, func() {
	var inPlace *workloadCluster

	BeforeAll(func() {
		// Every cluster is created first, so that Cluster API provisions them together.
		inPlace = newWorkloadCluster("inplace", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 3, Workers: 3})
	})

	It("updates 3 control plane and 3 worker machines in place across a minor (v1.35 to v1.36, where KCP also changes the KubeadmConfig)", func() {
		inPlace.waitProvisioned()
		inPlace.countRunning()
		start := time.Now()
		inPlace.bump("v1.36.3")
		after := inPlace.waitAt("v1.36.3", 6*time.Minute)
		GinkgoWriter.Printf("6 machines upgraded in place in %s\n", time.Since(start))
		inPlace.expectAllInPlace(after, "v1.36.3")
	})
})
