package harvesteradapter_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The RKE2 versions of the specs whose RKE2 Rancher provisions: Harvester v1.7.1's and
// v1.8.1's (harvester-release-steps.md fact 5).
const rancherOldRKE2, rancherNewRKE2 = "v1.34.3+rke2r3", "v1.35.6+rke2r1"

// serverRoles are the labels of a Harvester management node: control plane and etcd.
var serverRoles = map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"}

// startRancherWorkload starts a workload API server of the spec's own (fleet-local/local
// is one per cluster) seeded as a Harvester v1.7.1 cluster whose RKE2 Rancher provisions,
// with Rancher and Fleet (sim.Rancher, leaving the provisioning Cluster's status to the
// planner) and the cluster upgrade Job (sim.ClusterUpgradeJobs) simulated.
func startRancherWorkload() *testenv.Environment {
	GinkgoHelper()
	wl, err := testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(wl.Stop)
	startRancherAt(wl, sim.HarvesterRelease{Version: "v1.7.1", Rancher: "v2.13.1", Kubernetes: rancherOldRKE2}, func(r *sim.Rancher) { r.PlannerOwnsLocalCluster = true })
	return wl
}

// newRancherCluster is newClusterWith on wl, without nodes, with Longhorn's replica
// replenishment wait at its default.
func newRancherCluster(wl *testenv.Environment, simOptions ...func(*sim.SUC)) *harvesterCluster {
	GinkgoHelper()
	return newRancherClusterWith(wl, nil, simOptions...)
}

// newRancherClusterWith is newRancherCluster with the HarvesterUpgrader changed by mutate
// (when set) first.
func newRancherClusterWith(wl *testenv.Environment, mutate func(*harvesterv1.HarvesterUpgrader), simOptions ...func(*sim.SUC)) *harvesterCluster {
	GinkgoHelper()
	c := newClusterWith(wl, false, 0, "Harvester v1.7.1", mutate, simOptions...)
	Expect(sim.SetLonghornSetting(ctx, wl.Client, longhorn.Namespace, "replica-replenishment-wait-interval", "600")).To(Succeed())
	return c
}

// rancherMachines gives c a CAPI Cluster whose updater is the HarvesterUpgrader, a
// KubeadmControlPlane "cp" of cps management nodes and a MachineDeployment "workers" of
// workers nodes, with their Nodes at rancherOldRKE2; it returns the management nodes.
func rancherMachines(c *harvesterCluster, cps, workers int) []string {
	GinkgoHelper()
	_, err := fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
	Expect(err).NotTo(HaveOccurred())
	_, cpMachines, err := fixtures.ControlPlane(ctx, env.Client, c.ns, c.name, "cp", rancherOldRKE2, cps, true)
	Expect(err).NotTo(HaveOccurred())
	var servers []string
	for _, m := range cpMachines {
		_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, rancherOldRKE2, serverRoles)
		Expect(err).NotTo(HaveOccurred())
		c.nodes = append(c.nodes, m.Status.NodeRef.Name)
		servers = append(servers, m.Status.NodeRef.Name)
	}
	_, workerMachines, err := fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", rancherOldRKE2, workers)
	Expect(err).NotTo(HaveOccurred())
	for _, m := range workerMachines {
		_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, rancherOldRKE2, nil)
		Expect(err).NotTo(HaveOccurred())
		c.nodes = append(c.nodes, m.Status.NodeRef.Name)
	}
	return servers
}

// startPlanner runs Rancher's planner (sim.RancherPlanner) over c's nodes, their machines
// seeded, the restart guard read from c's SUC; multus, when set, hears of each server's
// RKE2 restart.
func startPlanner(wl *testenv.Environment, c *harvesterCluster, multus *sim.Multus) *sim.RancherPlanner {
	GinkgoHelper()
	return startPlannerWith(wl, c, multus, nil)
}

// startPlannerWith is startPlanner with the simulator configured first.
func startPlannerWith(wl *testenv.Environment, c *harvesterCluster, multus *sim.Multus, configure func(*sim.RancherPlanner)) *sim.RancherPlanner {
	GinkgoHelper()
	planner := &sim.RancherPlanner{Client: wl.Client, Cache: simCache(wl), Kubelet: c.kubelet, NodeSelector: map[string]string{labelTestCluster: c.name},
		RestartDuration: 150 * time.Millisecond, RetryDelay: 100 * time.Millisecond, Guarded: c.suc.Guarded, Multus: multus}
	if configure != nil {
		configure(planner)
	}
	Expect(planner.SeedMachines(ctx)).To(Succeed())
	pctx, pcancel := context.WithCancel(ctx)
	pdone := make(chan struct{})
	go func() { defer close(pdone); _ = planner.Run(pctx) }()
	DeferCleanup(func() { pcancel(); <-pdone })
	return planner
}

// runRancherTasks upgrades c's control plane, then its workers, to rancherNewRKE2 with an
// UpgradeTask each, and waits for each task to complete and for the cluster's UpgradePlan
// to succeed, which it returns.
func runRancherTasks(c *harvesterCluster) *harvesterv1.UpgradePlan {
	GinkgoHelper()
	for _, t := range []struct {
		name string
		ref  func(*inplacev1.UpgradeTaskSpec)
	}{
		{"cp", func(s *inplacev1.UpgradeTaskSpec) {
			s.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
		}},
		{"workers", func(s *inplacev1.UpgradeTaskSpec) {
			s.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "workers"}
		}},
	} {
		task := &inplacev1.UpgradeTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: t.name},
			Spec: inplacev1.UpgradeTaskSpec{ClusterName: c.name, Version: rancherNewRKE2,
				UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"}},
		}
		t.ref(&task.Spec)
		Expect(env.Client.Create(ctx, task)).To(Succeed())
		Eventually(func(g Gomega) inplacev1.TaskPhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(task), task)).To(Succeed())
			return task.Status.Phase
		}, 180*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted), "task %s: %+v", t.name, task.Status.Conditions)
	}
	plan := &harvesterv1.UpgradePlan{}
	Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}, plan)).To(Succeed())
		return plan.Status.Phase
	}, 60*time.Second, 100*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanSucceeded), "plan message: %s", plan.Status.Message)
	return plan
}
