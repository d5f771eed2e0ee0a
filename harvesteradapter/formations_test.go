package harvesteradapter_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// A formation is a Harvester cluster's shape: its management nodes (control plane and
// etcd), an etcd-only witness, and workers.
type formation struct {
	management int
	witness    bool
	workers    int
}

func (f formation) controlPlane() int {
	if f.witness {
		return f.management + 1
	}
	return f.management
}

// Each formation on a workload API server of its own, upgraded whole by UpgradeTasks as
// the annotation cascade orders them (the control plane, then the workers), through the
// UpgradePlan the first node creates: its cluster phase, the nodes, image cleanup and
// cleanup. Whole runs (25 to 36 s each on 2 cores): make test-e2e runs them.
var _ = Describe("Every Harvester cluster formation", testsuite.E2E, func() {
	DescribeTable("upgrades through the cluster phase, the nodes in Harvester's order, image cleanup and cleanup",
		func(f formation) {
			wl, err := testenv.Start()
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(wl.Stop)
			startRancher(wl)

			c := newClusterWith(wl, false, 0, "Harvester v1.7.1", nil)
			// Longhorn's replica-replenishment-wait-interval at its default, and every value
			// it takes during the run.
			Expect(sim.SetLonghornSetting(ctx, wl.Client, longhorn.Namespace, "replica-replenishment-wait-interval", "600")).To(Succeed())
			replenishment := watchSetting(wl, "replica-replenishment-wait-interval")
			_, err = fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
			Expect(err).NotTo(HaveOccurred())
			_, cpMachines, err := fixtures.ControlPlane(ctx, env.Client, c.ns, c.name, "cp", "v1.34.3+rke2r3", f.controlPlane(), true)
			Expect(err).NotTo(HaveOccurred())
			role := map[string]harvesterv1.NodeRole{}
			for i, m := range cpMachines {
				labels := map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"}
				role[m.Status.NodeRef.Name] = harvesterv1.NodeRoleManagement
				if f.witness && i == 0 {
					// The oldest machine, which a control plane upgrades first: the witness
					// must still go after the management nodes.
					labels = map[string]string{"node-role.kubernetes.io/etcd": "true", kubevirt.LabelWitnessNode: "true"}
					role[m.Status.NodeRef.Name] = harvesterv1.NodeRoleWitness
				}
				_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, "v1.34.3+rke2r3", labels)
				Expect(err).NotTo(HaveOccurred())
				c.nodes = append(c.nodes, m.Status.NodeRef.Name)
			}
			var workerMachines []*clusterv1.Machine
			if f.workers > 0 {
				_, workerMachines, err = fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", "v1.34.3+rke2r3", f.workers)
				Expect(err).NotTo(HaveOccurred())
				for _, m := range workerMachines {
					_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, "v1.34.3+rke2r3", nil)
					Expect(err).NotTo(HaveOccurred())
					role[m.Status.NodeRef.Name] = harvesterv1.NodeRoleWorker
					c.nodes = append(c.nodes, m.Status.NodeRef.Name)
				}
			}
			single := f.controlPlane()+f.workers == 1
			var vmKey string
			var kv *sim.KubeVirt
			if single {
				kv = &sim.KubeVirt{Client: wl.Client, Cache: simCache(wl), Namespace: c.ns, MigrationDelay: 100 * time.Millisecond, Interval: 20 * time.Millisecond}
				Expect(wl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})).To(Succeed())
				go kv.Run(ctx)
				always := kubevirtv1.RunStrategyAlways
				vm := &kubevirtv1.VirtualMachine{
					ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: c.ns},
					Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
				}
				kv.PlaceOn(c.ns, "vm-1", c.nodes[0])
				Expect(wl.Client.Create(ctx, vm)).To(Succeed())
				vmKey = c.ns + "/vm-1"
				Eventually(kv.NodeOf).WithArguments(vmKey).WithTimeout(5 * time.Second).Should(Equal(c.nodes[0]))
			}
			startLifecycle(c, true)

			task := func(name string, ref func(*inplacev1.UpgradeTaskSpec)) *inplacev1.UpgradeTask {
				t := &inplacev1.UpgradeTask{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
					Spec: inplacev1.UpgradeTaskSpec{
						ClusterName: c.name, Version: "v1.35.6+rke2r1",
						UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
					},
				}
				ref(&t.Spec)
				Expect(env.Client.Create(ctx, t)).To(Succeed())
				Eventually(func(g Gomega) inplacev1.TaskPhase {
					g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(t), t)).To(Succeed())
					return t.Status.Phase
					// A whole task (three control plane nodes after the cluster step) took over
					// 120 s on a loaded 2-core machine (the clean-clone CI of 2026-11-28).
				}, 240*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted), "task %s", name)
				return t
			}
			task("cp", func(s *inplacev1.UpgradeTaskSpec) {
				s.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
			})
			if f.workers > 0 {
				task("workers", func(s *inplacev1.UpgradeTaskSpec) {
					s.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "workers"}
				})
			}

			By("the UpgradePlan ran every phase in order and ended with nothing left on the cluster")
			plan := &harvesterv1.UpgradePlan{}
			key := client.ObjectKey{Namespace: c.ns, Name: upgradeplan.Name(c.name, "v1.8.1")}
			Eventually(func(g Gomega) harvesterv1.UpgradePlanPhase {
				g.Expect(env.Client.Get(ctx, key, plan)).To(Succeed())
				return plan.Status.Phase
			}, 60*time.Second, 100*time.Millisecond).Should(Equal(harvesterv1.UpgradePlanSucceeded), "plan message: %s", plan.Status.Message)
			var phases []harvesterv1.UpgradePlanPhase
			for _, t := range plan.Status.PhaseTransitionTimestamps {
				phases = append(phases, t.Phase)
			}
			Expect(phases).To(Equal([]harvesterv1.UpgradePlanPhase{
				harvesterv1.UpgradePlanInitializing, harvesterv1.UpgradePlanRepoCreating, harvesterv1.UpgradePlanMetadataPopulating,
				harvesterv1.UpgradePlanImagePreloading, harvesterv1.UpgradePlanClusterUpgrading, harvesterv1.UpgradePlanNodeUpgrading,
				harvesterv1.UpgradePlanImageCleaning, harvesterv1.UpgradePlanCleaningUp, harvesterv1.UpgradePlanSucceeded,
			}))
			Expect(meta.IsStatusConditionTrue(plan.Status.Conditions, harvesterv1.UpgradePlanAvailable)).To(BeTrue())
			Expect(meta.IsStatusConditionTrue(plan.Status.Conditions, harvesterv1.UpgradePlanDegraded)).To(BeFalse())
			Expect(plan.Status.PreviousVersion).To(Equal("v1.7.1"))
			Expect(plan.Status.SingleNode).To(Equal(single))
			Expect(plan.Status.Upgraded).To(Equal(fmt.Sprintf("%d/%d", len(c.nodes), len(c.nodes))))
			By("status.clusterUpgrade lists the plan's own sub-steps around the Job's, in the order they run, each with what it did")
			var names []string
			for _, s := range plan.Status.ClusterUpgrade {
				names = append(names, s.Name)
			}
			Expect(names).To(Equal(slices.Concat(
				[]string{upgradeplan.PlanStepFreeV2Volumes, upgradeplan.PlanStepPlaceRestartGuard},
				clusterupgrade.StepNames(),
				[]string{upgradeplan.PlanStepStartStoppedVMs, upgradeplan.PlanStepRaiseReplicaReplenishment, upgradeplan.PlanStepDisableDescheduler, upgradeplan.PlanStepSkipMultusManifest})))
			for _, s := range plan.Status.ClusterUpgrade {
				switch s.Name {
				case upgradeplan.PlanStepFreeV2Volumes, upgradeplan.PlanStepStartStoppedVMs:
					Expect(s.State).To(Equal("Skipped"), s.Name)
					Expect(s.Message).To(Or(Equal("no Longhorn v2 volume is attached"), Equal("no virtual machine was stopped for the cluster upgrade")), s.Name)
				case upgradeplan.PlanStepPlaceRestartGuard:
					// Rancher provisions no node of these clusters (the Rancher path has its
					// own spec, rancher_rke2_test.go).
					Expect(s.State).To(Equal("Skipped"), s.Name)
					Expect(s.Message).To(ContainSubstring("Rancher provisions no node of this cluster"), s.Name)
				case upgradeplan.PlanStepDisableDescheduler:
					// The simulated cluster has no descheduler add-on.
					Expect(s.State).To(Equal("Skipped"), s.Name)
					Expect(s.Message).To(ContainSubstring("nothing to turn off"), s.Name)
				case upgradeplan.PlanStepRaiseReplicaReplenishment:
					if single {
						Expect(s.State).To(Equal("Skipped"), s.Name)
					} else {
						Expect(s.State).To(Equal("Done"), s.Name)
						Expect(s.Message).To(Equal("Longhorn's replica-replenishment-wait-interval raised from 600 to 1800 for the nodes"), s.Name)
					}
				case upgradeplan.PlanStepSkipMultusManifest:
					if single {
						Expect(s.State).To(Equal("Skipped"), s.Name)
						Expect(s.Message).To(ContainSubstring("single-node"), s.Name)
					} else {
						Expect(s.State).To(Equal("Done"), s.Name)
						Expect(s.Message).To(ContainSubstring("rke2-multus.yaml.skip placed"), s.Name)
					}
				case clusterupgrade.StepPreserveOvercommitConfig, clusterupgrade.StepCleanCAPILegacyWebhooks, clusterupgrade.StepMigrateLonghornV1beta1CRDs:
					// Keyed on the hop (facts 1, 2, 57): Skipped for another hop (its
					// target's script does not hold it, or its guard does not match the
					// previous version), or when the cluster has nothing of it (no legacy
					// CAPI webhooks, no v1beta1 Longhorn storage).
					if s.State != "Done" {
						Expect(s.State).To(Equal("Skipped"), "the cluster upgrade's %s", s.Name)
						Expect(s.Message).To(Or(ContainSubstring("which does not match"), ContainSubstring(", not a hop v1."), ContainSubstring("not on the cluster"), ContainSubstring("lists v1beta1")), s.Name)
					}
				case clusterupgrade.StepUpdateLocalRKEStateSecret:
					// The simulated cluster's Secret has Rancher's type already (fact 18).
					Expect(s.State).To(Equal("Skipped"), s.Name)
					Expect(s.Message).To(ContainSubstring("is of type "+rancher.RKEClusterStateType), s.Name)
				default:
					Expect(s.State).To(Equal("Done"), "the cluster upgrade's %s on a cluster of its own", s.Name)
				}
			}
			Expect(plan.Status.ClusterUpgrade).NotTo(BeEmpty())
			chart := &managementv3.ManagedChart{}
			Expect(wl.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.HarvesterChart}, chart)).To(Succeed())
			Expect(chart.Spec.Version).To(Equal("1.8.1"))
			By("Longhorn waited 1800 s for a rebooting node's replicas while the nodes went, on a multi-node cluster, and then its own value again (fact 35)")
			if single {
				Expect(replenishment()).To(Equal([]string{"600"}))
			} else {
				Expect(replenishment()).To(Equal([]string{"600", "1800", "600"}))
			}
			By("what the cluster upgrade turned off for the roll is back (facts 11, 13, 37)")
			Expect(string(chart.Spec.Values.Raw)).To(MatchJSON(`{"kubevirt":{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":["LiveMigrate"]}}}}`))
			for _, name := range []string{rancher.HarvesterChart, rancher.HarvesterCRDChart, rancher.MonitoringCRDChart, rancher.LoggingCRDChart} {
				mc := &managementv3.ManagedChart{}
				Expect(wl.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: name}, mc)).To(Succeed())
				Expect(mc.Spec.Paused).To(BeFalse(), "%s un-paused at the end", name)
				if v := map[string]string{rancher.MonitoringCRDChart: "106.1.0+up66.0.0", rancher.LoggingCRDChart: "106.0.1+up4.10.1"}[name]; v != "" {
					Expect(mc.Spec.Version).To(Equal(v), "%s at the release metadata's version (fact 27)", name)
				}
			}
			for _, list := range []client.ObjectList{&sucv1.PlanList{}, &batchv1.JobList{}} {
				Expect(wl.Client.List(ctx, list, client.MatchingLabels{upgradeplan.LabelUpgradePlan: plan.Name})).To(Succeed())
				Expect(meta.LenList(list)).To(BeZero(), "%T of the plan left behind", list)
			}

			By("every node was preloaded and cleaned once, by the plan, and upgraded once")
			for _, node := range c.nodes {
				Expect(c.rec.RunsOf(upgradeplan.ObjectName("preload", plan))).To(HaveKeyWithValue(node, 1), node)
				Expect(c.rec.RunsOf(upgradeplan.ObjectName("image-cleanup", plan))).To(HaveKeyWithValue(node, 1), node)
			}
			nus := &inplacev1.NodeUpdateList{}
			Expect(env.Client.List(ctx, nus, client.InNamespace(c.ns))).To(Succeed())
			Expect(nus.Items).To(HaveLen(len(c.nodes)))
			Expect(c.rec.MaxDown()).To(Equal(1), "one node down at a time")

			By("no node left its cluster phase before the cluster upgrade was done, and the roles went in Harvester's order")
			var nodeUpgrading time.Time
			for _, t := range plan.Status.PhaseTransitionTimestamps {
				if t.Phase == harvesterv1.UpgradePlanNodeUpgrading {
					nodeUpgrading = t.Time.Time
				}
			}
			starts := map[string]time.Time{}
			for i := range nus.Items {
				nu := &nus.Items[i]
				Expect(nu.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSucceeded))
				st := nodeupdaterStep(nu, harvesteradapter.StepRepository)
				Expect(st.StartTime).NotTo(BeNil())
				Expect(st.StartTime.Time.Before(nodeUpgrading)).To(BeFalse(), "node %s went on before the plan let the nodes go", nu.Spec.NodeName)
				for _, d := range c.rec.Drains(nu.Spec.NodeName) {
					Expect(d.At.Before(nodeUpgrading)).To(BeFalse(), "node %s drained before the cluster upgrade was done", nu.Spec.NodeName)
				}
				starts[nu.Spec.NodeName] = st.StartTime.Time
			}
			order := append([]string(nil), c.nodes...)
			sort.SliceStable(order, func(i, j int) bool { return starts[order[i]].Before(starts[order[j]]) })
			for i := 1; i < len(order); i++ {
				Expect(upgradeplan.RoleRank(role[order[i-1]])).To(BeNumerically("<=", upgradeplan.RoleRank(role[order[i]])),
					"%s (%s) went before %s (%s)", order[i-1], role[order[i-1]], order[i], role[order[i]])
			}

			if single {
				By("the only node was neither cordoned nor drained; its VM was shut down and started again")
				Expect(c.rec.Drains(c.nodes[0])).To(BeEmpty())
				nu := &nus.Items[0]
				Expect(nodeupdaterStep(nu, harvesteradapter.StepCordon).State).To(Equal(inplacev1.StepStateSkipped))
				Expect(nodeupdaterStep(nu, harvesteradapter.StepDrain).State).To(Equal(inplacev1.StepStateSkipped))
				Expect(kv.Migrations(vmKey)).To(BeZero())
				Eventually(kv.Starts).WithArguments(vmKey).WithTimeout(5*time.Second).Should(Equal(2), "stopped once, started again")
			} else {
				for _, node := range c.nodes {
					Expect(c.rec.Drains(node)).To(HaveLen(1), "node %s drained once", node)
				}
			}
		},
		Entry("a single node", formation{management: 1}),
		Entry("one management node and one worker", formation{management: 1, workers: 1}),
		Entry("three management nodes", formation{management: 3}),
		Entry("two management nodes and a witness", formation{management: 2, witness: true}),
		Entry("three management nodes and a worker", formation{management: 3, workers: 1}),
	)
})

// nodeupdaterStep is a step of a NodeUpdate, failing the spec when it has none.
func nodeupdaterStep(nu *inplacev1.NodeUpdate, name string) inplacev1.NodeUpdateStep {
	GinkgoHelper()
	for _, s := range nu.Status.Steps {
		if s.Name == name {
			return s
		}
	}
	Fail(fmt.Sprintf("NodeUpdate %s has no step %s", nu.Name, name))
	return inplacev1.NodeUpdateStep{}
}

// watchSetting records every value the Longhorn setting name takes on wl from now on,
// looking every 10 ms until the spec ends; the func returns them in order, each change
// once.
func watchSetting(wl *testenv.Environment, name string) func() []string {
	var mu sync.Mutex
	var values []string
	watchCtx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	go func() {
		for watchCtx.Err() == nil {
			s := &longhornv1.Setting{}
			if err := wl.Client.Get(watchCtx, client.ObjectKey{Namespace: longhorn.Namespace, Name: name}, s); err == nil {
				mu.Lock()
				if len(values) == 0 || values[len(values)-1] != s.Value {
					values = append(values, s.Value)
				}
				mu.Unlock()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), values...)
	}
}
