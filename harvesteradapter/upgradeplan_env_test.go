package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
)

// planPoll is the PollInterval of the UpgradePlan controllers startPlans starts.
var planPoll = 50 * time.Millisecond

// startPlans runs the real UpgradePlan controller on namespace ns, as the manager does,
// with the updater's clients; it stops when the spec ends, or at cellStopPlans (a
// manager that went away: startPlans again is the restarted one).
func startPlans(ns string, u *harvesteradapter.Updater) *upgradeplan.PlanReconciler {
	GinkgoHelper()
	r, stop := runPlans(ns, u)
	DeferCleanup(stop)
	cellPlanStops[ns] = stop
	return r
}

// cellPlanStops stops the UpgradePlan controller startPlans runs on a
// namespace (each spec's cluster has its own).
var cellPlanStops = map[string]func(){}

// cellStopPlans stops the UpgradePlan controller running on namespace ns, as a manager
// that went away, and waits until it stopped.
func cellStopPlans(ns string) {
	GinkgoHelper()
	stop := cellPlanStops[ns]
	Expect(stop).NotTo(BeNil(), "no UpgradePlan controller runs on namespace %s", ns)
	stop()
	delete(cellPlanStops, ns)
}

// runPlans starts the UpgradePlan controller on namespace ns and returns how to stop it
// (once, waiting until it stopped).
func runPlans(ns string, u *harvesteradapter.Updater) (*upgradeplan.PlanReconciler, func()) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:     env.Scheme,
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	r := &upgradeplan.PlanReconciler{Env: u.PlanEnv(), PollInterval: planPoll, ClusterUpgradePollInterval: 50 * time.Millisecond, ClusterUpgradeCAPIStableFor: 300 * time.Millisecond, PlannerSettle: u.PlannerSettle}
	Expect(r.SetupWithManager(mgr, controller.Options{})).To(Succeed())
	return r, runManager(mgr)
}

var _ = Describe("The UpgradePlan controller's wake", func() {
	It("looks again at once at a plan held on its nodes when one of them changed (Wake), not only at its next poll", func() {
		planPoll = time.Hour
		DeferCleanup(func() { planPoll = 50 * time.Millisecond })
		c := newHarvesterCluster(2, "SLES 15 SP6", nil)
		held := func(g Gomega) string {
			plan := &harvesterv1.UpgradePlan{}
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
			return string(plan.Status.Phase) + ": " + plan.Status.Message
		}
		Eventually(held).Should(HavePrefix("Initializing: node " + c.nodes[0] + ": the node's OS image \"SLES 15 SP6\" is not a Harvester OS image"))
		// The reconciles the plan's own status writes start are over: nothing looks at it
		// before its poll, an hour away.
		settled := held(Default)
		Consistently(held, 500*time.Millisecond).Should(Equal(settled))

		for _, n := range c.nodes {
			Expect(c.kubelet.SetVersion(ctx, n, "", "Harvester v1.7.1")).To(Succeed())
		}
		cluster := types.NamespacedName{Namespace: c.ns, Name: c.name}
		c.plans.Wake(types.NamespacedName{Namespace: c.ns, Name: "another-cluster"}, c.nodes[0])
		c.plans.Wake(types.NamespacedName{Namespace: "another-namespace", Name: c.name}, c.nodes[0])
		Consistently(held, 500*time.Millisecond).Should(Equal(settled),
			"the plan is looked at before its poll for a change of another cluster's node")

		c.plans.Wake(cluster, c.nodes[1])
		Eventually(held).ShouldNot(HavePrefix("Initializing"))
	})
})
