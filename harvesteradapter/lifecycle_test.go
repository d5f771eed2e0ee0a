package harvesteradapter_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// startLifecycle runs the real NodeUpdate reconciler, with the Harvester updater
// registered, on the cluster's namespace, as the manager does.
func startLifecycle(c *harvesterCluster) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:     env.Scheme,
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{c.ns: {}}},
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	registry := nodeupdater.NewRegistry()
	Expect(registry.Register(c.updater.Registration())).To(Succeed())
	r := &nodeupdater.Reconciler{Registry: registry, PollInterval: 50 * time.Millisecond, RetryBaseDelay: 50 * time.Millisecond}
	Expect(r.SetupWithManager(mgr, controller.Options{})).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(mctx) }()
	DeferCleanup(func() { cancel(); <-done })
}

var _ = Describe("The Harvester updater under the NodeUpdate lifecycle", func() {
	It("brings a node to Succeeded, and a failing node to Failed with the step and the SUC Job's reason", func() {
		c := newHarvesterCluster(2, "Harvester v1.5.0", nil)
		startLifecycle(c)
		bad := c.nodes[1]
		c.suc.FailNode("capi-inplace-os-"+bad, bad, "elemental upgrade failed with return code: 33")

		good := c.nodeUpdate(c.nodes[0])
		failed := c.nodeUpdate(bad)
		phaseOf := func(nu *inplacev1.NodeUpdate) func(Gomega) inplacev1.NodeUpdatePhase {
			return func(g Gomega) inplacev1.NodeUpdatePhase {
				g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
				return nu.Status.Phase
			}
		}
		Eventually(phaseOf(good), 60*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		Eventually(phaseOf(failed), 60*time.Second, 100*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseFailed))

		Expect(failed.Status.CurrentStep).To(Equal(harvesteradapter.StepOSUpgrade))
		Expect(failed.Status.FailureMessage).To(ContainSubstring("elemental upgrade failed with return code: 33"))
		Expect(nodeupdater.StepState(failed, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStateSucceeded))
		Expect(nodeupdater.StepState(failed, harvesteradapter.StepOSUpgrade)).To(Equal(inplacev1.StepStateFailed))
		Expect(nodeupdater.StepState(failed, harvesteradapter.StepFinish)).To(Equal(inplacev1.StepStatePending))
		for _, node := range c.nodes {
			Expect(c.rec.RunsOf("capi-inplace-rke2-"+node)).To(Equal(map[string]int{node: 1}), "no step runs twice under the reconciler")
		}
	})
})
