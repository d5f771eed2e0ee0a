package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

var _ = Describe("A node's SUC Plan brought back to what the updater wants", func() {
	It("keeps the labels another writer put on it", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", nil)
		nu := c.nodeUpdate(c.nodes[0])

		// Run the node until its first Plan exists.
		var plan sucv1.Plan
		Eventually(func() []sucv1.Plan {
			_, _ = c.updater.Reconcile(ctx, nu) // retryable errors while the repository comes up
			Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
			return ourPlans(c)
		}, 30*time.Second, 20*time.Millisecond).ShouldNot(BeEmpty())
		plan = ourPlans(c)[0]

		// Someone labels the Plan for their own use, and its NodeUpdate label goes stale.
		// SUC writes the Plan's status meanwhile: a conflict is read again.
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := workload.Client.Get(ctx, client.ObjectKeyFromObject(&plan), &plan); err != nil {
				return err
			}
			plan.Labels["team.example.com/watched-by"] = "ops"
			plan.Labels[suc.LabelNodeUpdate] = "stale"
			return workload.Client.Update(ctx, &plan)
		})).To(Succeed())

		_, err := c.updater.Reconcile(ctx, nu)
		Expect(err).NotTo(HaveOccurred())
		got := &sucv1.Plan{}
		Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(&plan), got)).To(Succeed())
		Expect(got.Labels).To(HaveKeyWithValue(suc.LabelNodeUpdate, string(nu.UID)), "the updater's own label is restored")
		Expect(got.Labels).To(HaveKeyWithValue("team.example.com/watched-by", "ops"), "the other writer's label stays")
	})
})

// plansOf lists the Plans the updater wrote for one NodeUpdate.
func plansOf(nu *inplacev1.NodeUpdate) []sucv1.Plan {
	GinkgoHelper()
	plans := &sucv1.PlanList{}
	Expect(workload.Client.List(ctx, plans, client.InNamespace("cattle-system"), client.MatchingLabels{suc.LabelNodeUpdate: string(nu.UID)})).To(Succeed())
	return plans.Items
}

// reconcileUntilPlan runs a NodeUpdate until the updater wrote a Plan for it.
func reconcileUntilPlan(c *harvesterCluster, nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Eventually(func() []sucv1.Plan {
		_, _ = c.updater.Reconcile(ctx, nu) // retryable errors while the repository comes up
		Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
		return plansOf(nu)
	}, 30*time.Second, 20*time.Millisecond).ShouldNot(BeEmpty())
}

var _ = Describe("Two NodeUpdates of the same node", func() {
	It("never write the same Plan, so the second cannot take over the first's running Job", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.ImagePreload.Concurrency = ptr.To[int32](-1) // each node preloads in its turn, with its own Plan
		}, func(s *sim.SUC) { s.JobDuration = 5 * time.Second })
		node := c.nodes[0]
		first := c.nodeUpdate(node)
		reconcileUntilPlan(c, first)
		before := plansOf(first)
		Expect(before).To(HaveLen(1))

		second := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Name: "again-" + node, Namespace: c.ns}, Spec: first.Spec}
		Expect(env.Client.Create(ctx, second)).To(Succeed())
		reconcileUntilPlan(c, second)

		after := plansOf(first)
		Expect(after).To(HaveLen(1), "the first NodeUpdate's Plan is still its own")
		Expect(after[0].Name).To(Equal(before[0].Name))
		Expect(after[0].Spec).To(Equal(before[0].Spec))
		Expect(after[0].Generation).To(Equal(before[0].Generation), "nobody rewrote the first NodeUpdate's Plan")
		for _, p := range plansOf(second) {
			Expect(p.Name).NotTo(Equal(before[0].Name))
			Expect(p.Name).To(HavePrefix("capi-inplace-preload-"), "the kind stays readable in the name")
		}
	})
})
