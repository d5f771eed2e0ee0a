package harvesteradapter_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capi-inplace/capi-inplace/harvesteradapter"
)

// startPlans runs the real UpgradePlan controller on namespace ns, as the manager does,
// with the updater's clients; it stops when the spec ends.
func startPlans(ns string, u *harvesteradapter.Updater) *harvesteradapter.PlanReconciler {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:     env.Scheme,
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	r := &harvesteradapter.PlanReconciler{Updater: u, PollInterval: 50 * time.Millisecond, ClusterUpgradePollInterval: 50 * time.Millisecond}
	Expect(r.SetupWithManager(mgr, controller.Options{})).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(mctx) }()
	DeferCleanup(func() { cancel(); <-done })
	return r
}
