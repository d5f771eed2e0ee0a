package harvesteradapter_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// startLifecycle runs the real NodeUpdate reconciler, with the Harvester updater
// registered, on the cluster's namespace, as the manager does; withTasks adds the
// UpgradeTask controller. It stops when the spec ends.
func startLifecycle(c *harvesterCluster, withTasks ...bool) {
	GinkgoHelper()
	DeferCleanup(runLifecycle(c, len(withTasks) > 0 && withTasks[0]))
}

// runLifecycle is startLifecycle that returns how to stop it (once; a manager restart
// stops one and runs another).
func runLifecycle(c *harvesterCluster, withTasks bool) (stop func()) {
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
	if withTasks {
		tasks := &upgradetask.Reconciler{Registry: registry, Workload: c.updater.Workloads.(*workloadcluster.Clients), PollInterval: 100 * time.Millisecond}
		Expect(tasks.SetupWithManager(ctx, mgr, controller.Options{})).To(Succeed())
	}
	return runManager(mgr)
}

// runManager starts mgr and returns how to stop it: once, waiting for it to end.
func runManager(mgr ctrl.Manager) (stop func()) {
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(mctx) }()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

var _ = Describe("The Harvester updater under the NodeUpdate lifecycle", func() {
	It("brings a node to Succeeded, and a failing node to Failed with the step and the SUC Job's reason", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", nil)
		startLifecycle(c)
		bad := c.nodes[1]
		c.suc.FailNodeLabelled(map[string]string{suc.LabelPlanKind: "os"}, bad, "elemental upgrade failed with return code: 33")

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
		for _, nu := range []*inplacev1.NodeUpdate{good, failed} {
			Expect(c.rec.RunsOf(harvesteradapter.PlanName("rke2", nu))).To(Equal(map[string]int{nu.Spec.NodeName: 1}), "no step runs twice under the reconciler")
		}
	})
})

var _ = Describe("An UpgradeTask carried out by the Harvester updater", func() {
	It("stops at a node whose OS upgrade fails and shows the node's own error on the NodeUpdate, the task and the Machine", func() {
		c := newHarvesterCluster(0, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.PreloadImages = ptr.To(false) })
		_, err := fixtures.Cluster(ctx, env.Client, c.ns, c.name, "cp", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"})
		Expect(err).NotTo(HaveOccurred())
		_, machines, err := fixtures.MachineDeployment(ctx, env.Client, c.ns, c.name, "workers", "v1.34.3+rke2r3", 3)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range machines {
			// The Machines' Nodes live in the workload cluster.
			_, err := c.kubelet.CreateNode(ctx, m.Status.NodeRef.Name, "v1.34.3+rke2r3", nil)
			Expect(err).NotTo(HaveOccurred())
		}
		second := machines[1].Status.NodeRef.Name
		c.suc.FailNodeLabelled(map[string]string{suc.LabelPlanKind: "os"}, second, "elemental upgrade failed with return code: 33")
		startLifecycle(c, true)

		task := &inplacev1.UpgradeTask{
			ObjectMeta: metav1.ObjectMeta{Name: "workers-v1-33-3", Namespace: c.ns},
			Spec: inplacev1.UpgradeTaskSpec{
				ClusterName: c.name, MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
				Version: "v1.35.6+rke2r1", UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
			},
		}
		Expect(env.Client.Create(ctx, task)).To(Succeed())
		Eventually(func(g Gomega) inplacev1.TaskPhase {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(task), task)).To(Succeed())
			return task.Status.Phase
		}, 90*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseFailed))

		states := map[string]inplacev1.MachineState{}
		for _, m := range task.Status.Machines {
			states[m.Name] = m.State
			if m.Name == machines[1].Name {
				Expect(m.Message).To(ContainSubstring("elemental upgrade failed with return code: 33"))
			}
		}
		Expect(states[machines[0].Name]).To(Equal(inplacev1.MachineStateUpgraded))
		Expect(states[machines[1].Name]).To(Equal(inplacev1.MachineStateFailed))
		Expect(states[machines[2].Name]).NotTo(BeElementOf(inplacev1.MachineStateInProgress, inplacev1.MachineStateUpgraded), "no node starts after a failure")
		Expect(nodeRunsOn(c.rec, machines[2].Status.NodeRef.Name)).To(BeEmpty(), "no Plan of a node's upgrade ran on the third node")

		m := &clusterv1.Machine{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(machines[1]), m)).To(Succeed())
		cond := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
		Expect(cond).NotTo(BeNil())
		Expect(cond.Reason).To(Equal(inplacev1.FailedReason))
		Expect(cond.Message).To(ContainSubstring("elemental upgrade failed with return code: 33"))

		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(machines[0]), m)).To(Succeed())
		Expect(m.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, "v1.35.6+rke2r1"))
		Expect(c.rec.MaxDown()).To(Equal(1))
	})
})
