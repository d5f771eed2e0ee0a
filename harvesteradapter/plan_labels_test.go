package harvesteradapter_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter"
)

var _ = Describe("A node's SUC Plan brought back to what the updater wants", func() {
	It("keeps the labels another writer put on it", func() {
		c := newHarvesterCluster(1, "Harvester v1.5.0", nil)
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
		plan.Labels["team.example.com/watched-by"] = "ops"
		plan.Labels[harvesteradapter.LabelNodeUpdate] = "stale"
		Expect(workload.Client.Update(ctx, &plan)).To(Succeed())

		_, err := c.updater.Reconcile(ctx, nu)
		Expect(err).NotTo(HaveOccurred())
		got := &sucv1.Plan{}
		Expect(workload.Client.Get(ctx, client.ObjectKeyFromObject(&plan), got)).To(Succeed())
		Expect(got.Labels).To(HaveKeyWithValue(harvesteradapter.LabelNodeUpdate, string(nu.UID)), "the updater's own label is restored")
		Expect(got.Labels).To(HaveKeyWithValue("team.example.com/watched-by", "ops"), "the other writer's label stays")
	})
})
