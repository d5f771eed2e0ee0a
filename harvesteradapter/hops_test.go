package harvesteradapter_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// release171 is the release metadata of Harvester v1.7.1 (fact 5; its upgrade matrix's
// minimum, fact 3), beside release181 that the other specs install.
const release171 = `harvester: v1.7.1
harvesterChart: 1.7.1
os: Harvester v1.7.1
kubernetes: v1.34.3+rke2r3
rancher: v2.13.1
minUpgradableVersion: v1.6.0
`

// workloadChanges watches, on the workload API server, what cluster c's UpgradePlan plan
// would create or change before it disrupts a node (the release's repository, SUC Plans,
// Jobs) and the cordon of c's nodes, from now on (the API server is shared with the other
// specs: their objects, and changes of objects being deleted, are not c's), and records
// each change it sees until the spec ends.
func workloadChanges(c *harvesterCluster, plan, release string) func() []string {
	GinkgoHelper()
	wc, err := client.NewWithWatch(workload.Config, client.Options{Scheme: workload.Scheme})
	Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	var seen []string
	repo := strings.ReplaceAll(release, ".", "-")
	ours := func(obj client.Object) bool {
		switch o := obj.(type) {
		case *corev1.Node:
			return slices.Contains(c.nodes, o.Name) && o.Spec.Unschedulable
		case *appsv1.Deployment, *corev1.Service, *corev1.PersistentVolumeClaim:
			return o.GetNamespace() == repository.Namespace && strings.HasSuffix(o.GetName(), repo)
		default: // SUC Plans and Jobs: the plan's own, or one of c's nodes
			return o.GetLabels()[upgradeplan.LabelUpgradePlan] == plan || strings.Contains(o.GetName(), c.name)
		}
	}
	for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.PersistentVolumeClaimList{}, &sucv1.PlanList{}, &batchv1.JobList{}, &corev1.NodeList{}} {
		// From the list's resource version: the watch sends what changes after it, not
		// what exists.
		Expect(wc.List(ctx, list)).To(Succeed())
		rv := list.(metav1.ListInterface).GetResourceVersion()
		w, err := wc.Watch(ctx, list, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(w.Stop)
		go func() {
			for ev := range w.ResultChan() {
				obj, ok := ev.Object.(client.Object)
				if !ok || ev.Type == watch.Deleted || ev.Type == watch.Bookmark || obj.GetDeletionTimestamp() != nil || !ours(obj) {
					continue
				}
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s %T %s/%s", ev.Type, obj, obj.GetNamespace(), obj.GetName()))
				mu.Unlock()
			}
		}()
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

var _ = Describe("An UpgradePlan for a hop capi-inplace does not support", func() {
	DescribeTable("fails with UnsupportedHop before creating anything on the workload cluster, even forced",
		func(running, kubelet, release, metadata string, upgradeOS bool, want []string) {
			c := newClusterWith(workload, false, 2, "Harvester "+running, func(h *harvesterv1.HarvesterUpgrader) {
				h.Spec.Release = harvesterv1.Release{Version: release, ISOURL: "https://releases.example/harvester-" + release + "-amd64.iso", ISOChecksum: fmt.Sprintf("%0128x", 7)}
				h.Spec.UpgradeOS = &upgradeOS
			})
			c.repository.Release = metadata
			for _, n := range c.nodes {
				Expect(c.kubelet.SetVersion(ctx, n, kubelet, "")).To(Succeed())
			}
			changes := workloadChanges(c, upgradeplan.Name(c.name, release), release)
			// Forced: spec.force lowers the release's minUpgradableVersion floor (v1.6.1 is
			// older than v1.8.1's v1.7.0), never the hop table.
			c.createPlan(func(s *harvesterv1.UpgradePlanSpec) { s.Force = true })

			Eventually(func(g Gomega) {
				g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), c.plan)).To(Succeed())
				g.Expect(c.plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanFailed), "message: %s", c.plan.Status.Message)
			}).Should(Succeed())
			Expect(c.plan.Status.Message).To(HavePrefix("UnsupportedHop: "))
			for _, w := range append(want, fmt.Sprintf("Harvester %s -> %s", running, release)) {
				Expect(c.plan.Status.Message).To(ContainSubstring(w))
			}
			var phases []harvesterv1.UpgradePlanPhase
			for _, t := range c.plan.Status.PhaseTransitionTimestamps {
				phases = append(phases, t.Phase)
			}
			Expect(phases).To(Equal([]harvesterv1.UpgradePlanPhase{harvesterv1.UpgradePlanInitializing, harvesterv1.UpgradePlanFailed}),
				"refused while initializing, before the repository, the preload or the cluster Job")

			// A node's NodeUpdate fails with the plan, before any step of its own.
			nu := &inplacev1.NodeUpdate{
				ObjectMeta: metav1.ObjectMeta{Name: "nu-" + c.nodes[0], Namespace: c.ns},
				Spec: inplacev1.NodeUpdateSpec{
					ClusterName: c.name, MachineName: "m-" + c.nodes[0], NodeName: c.nodes[0], Version: "v1.35.6+rke2r1",
					UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
				},
			}
			Expect(env.Client.Create(ctx, nu)).To(Succeed())
			err := drive(c.updater, nu, 90*time.Second)
			perm, ok := nodeupdater.AsPermanent(err)
			Expect(ok).To(BeTrue(), "%v", err)
			Expect(perm.Reason).To(Equal("UpgradePlanFailed"))
			Expect(err.Error()).To(ContainSubstring("UnsupportedHop"))
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepCordon)).To(Equal(inplacev1.StepStatePending))

			Consistently(changes, time.Second).Should(BeEmpty(), "no repository, SUC Plan or Job created, no node cordoned")
			for _, n := range c.nodes {
				Expect(runsOn(c.rec, n)).To(BeEmpty(), "no Plan ran on node %s", n)
				Expect(unschedulable(n)).To(BeFalse())
			}
			Expect(c.repository.MetadataRequests()).To(BeZero(), "not even the release metadata was read")
		},
		Entry("v1.6.1 -> v1.8.1 skips the minor v1.7 (facts 3, 4)", "v1.6.1", "v1.33.5+rke2r1", "v1.8.1", release181, true,
			[]string{"skips a minor", "capi-inplace supports v1.6.x -> v1.7.x, v1.7.x -> v1.8.x"}),
		Entry("v1.6.1 -> v1.7.1 without the OS upgrade, which its node migrations run with (fact 53)", "v1.6.1", "v1.33.5+rke2r1", "v1.7.1", release171, false,
			[]string{"GenerateNetworkManagerConfig, GenerateHostnameOverride, BindNewerLibrariesForElemental", "upgradeOS: false: set upgradeOS to true"}),
	)
})

var _ = Describe("An UpgradePlan for the v1.6 -> v1.7 hop", func() {
	It("upgrades the cluster and gives each node's OS upgrade the previous version its migrations are keyed on (fact 53)", func() {
		wl, err := testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(wl.Stop)
		// A Harvester v1.6.1 cluster: Rancher v2.12, charts 1.6.1, installed by Helm.
		startRancherAt(wl, sim.HarvesterRelease{Version: "v1.6.1", Rancher: "v2.12.3", Kubernetes: "v1.33.5+rke2r1"}, nil)

		c := newClusterWith(wl, false, 1, "Harvester v1.6.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.Release.Version = "v1.7.1" })
		c.repository.Release = release171
		node := c.nodes[0]
		Expect(c.kubelet.SetVersion(ctx, node, "v1.33.5+rke2r1", "")).To(Succeed())
		nu := c.nodeUpdateTo(node, "v1.34.3+rke2r3")
		Expect(drive(c.updater, nu, 2*time.Minute)).To(Succeed())

		plan := &harvesterv1.UpgradePlan{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.7.1")}, plan)).To(Succeed())
		Expect(plan.Status.PreviousVersion).To(Equal("v1.6.1"))
		Expect(plan.Status.Phase).NotTo(Equal(harvesterv1.UpgradePlanFailed), plan.Status.Message)
		// The os Plan in Harvester's shape for this hop (fact 54.4): the node image places
		// the node program on the host, the release's upgrade image runs it, so that the
		// libraries bound for the release's elemental are that image's.
		var osImages, osCommands []string
		for _, r := range nodeRunsOn(c.rec, node) {
			if strings.HasPrefix(r.Plan, "capi-inplace-"+string(suc.PlanOS)+"-") {
				osImages, osCommands = r.Images, r.Commands
			}
		}
		Expect(osImages).To(HaveLen(2))
		Expect(osImages[1]).To(Equal("rancher/harvester-upgrade:v1.7.1"), "os-upgrade runs in the release's upgrade image")
		Expect(osCommands).To(Equal([]string{
			"remove-archives --place-program=" + suc.ProgramOnHost,
			"os-upgrade --previous-version=v1.6.1 --glibc-libraries=container",
		}), "the node program runs the hop's node migrations before the OS, with the upgrade image's libraries for the release's elemental")
		n := &corev1.Node{}
		Expect(wl.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Status.NodeInfo.OSImage).To(Equal("Harvester v1.7.1"), "the node rebooted into the release's OS")
		rel, err := rancher.NewestHelmRelease(ctx, wl.Client, rancher.CattleSystem, "rancher")
		Expect(err).NotTo(HaveOccurred())
		Expect(rel.ChartRef()).To(Equal("rancher-2.13.1"), "Rancher upgraded by helm with the v1.7.1 release's chart")
	})
})
