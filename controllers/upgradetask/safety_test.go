package upgradetask

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// judgingUpdater stands in for the ExternalUpgrader kind in the manager's registry: it
// records the targets its preflight is asked about, and says the nodes in notAtTarget do
// not run the target whatever their kubelet says (an OS step that failed).
type judgingUpdater struct {
	mu          sync.Mutex
	notAtTarget map[string]string
	asked       []nodeupdater.PreflightTarget
}

func (u *judgingUpdater) Reconcile(context.Context, *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	return nodeupdater.Result{}, nil
}

func (u *judgingUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) {
	return true, nil
}

func (u *judgingUpdater) Preflight(_ context.Context, t nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.asked = append(u.asked, t)
	return nil
}

func (u *judgingUpdater) AtTarget(_ context.Context, t nodeupdater.PreflightTarget) (bool, string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	why, not := u.notAtTarget[t.MachineName]
	return !not, why, nil
}

func (u *judgingUpdater) askedAbout(machine string) []nodeupdater.PreflightTarget {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []nodeupdater.PreflightTarget
	for _, t := range u.asked {
		if t.MachineName == machine {
			out = append(out, t)
		}
	}
	return out
}

func registryWith(u nodeupdater.Updater) *nodeupdater.Registry {
	GinkgoHelper()
	reg := nodeupdater.NewRegistry()
	Expect(reg.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Group: "updaters.example.com", Kind: "ExternalUpgrader"},
		NewConfig: func() client.Object { return &metav1.PartialObjectMetadata{} },
		Updater:   u,
	})).To(Succeed())
	return reg
}

// cpTask is an UpgradeTask of the world's control plane "cp" to targetVersion.
func (w *world) cpTask(name string, mutate ...func(*inplacev1.UpgradeTask)) *inplacev1.UpgradeTask {
	t := &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName:     "harvester",
			ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"},
			Version:         targetVersion,
			UpdaterRef:      inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"},
		},
	}
	for _, m := range mutate {
		m(t)
	}
	return t
}

// One safety model per cluster (#18): each spec below failed on the controller before it.
var _ = Describe("One disruption budget per Cluster", func() {
	var stop func()
	var registry *nodeupdater.Registry
	BeforeEach(func() { registry = nil })
	JustBeforeEach(func() { stop = startManagerWith(nil, registry) })
	AfterEach(func() {
		if stop != nil {
			stop()
		}
	})

	It("upgrades a control plane one node at a time even when maxUnavailable resolves to more", func() {
		w := newCPWorld(3)
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 500*time.Millisecond)
		Expect(k8s.Create(ctx, w.cpTask("cp", func(t *inplacev1.UpgradeTask) {
			t.Spec.MaxUnavailable = ptr.To(intstr.FromString("67%")) // 2 of 3
		}))).To(Succeed())
		Eventually(w.phaseOf("cp"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(rec.MaxRunning()).To(Equal(1), "most control plane NodeUpdates running at once")
		expectUpgraded(w, "cp", rec, targetVersion)
	})

	It("starts no control plane node of an externally paced task while an aborted task's node still runs to its safe point", func() {
		w := newCPWorld(3)
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, time.Hour)
		sim.SetAbortDelay(3 * time.Second)
		// cp-1 is still in its first steps (its node Ready): only its NodeUpdate tells it is
		// being upgraded.
		sim.KeepNodesReady()
		Expect(k8s.Create(ctx, w.cpTask("by-annotation"))).To(Succeed())
		Eventually(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("cp-1") }, timeout, poll).ShouldNot(BeNil())
		w.editTask("by-annotation", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })
		Expect(k8s.Create(ctx, w.cpTask("by-capi", func(t *inplacev1.UpgradeTask) {
			t.Spec.Pacing = inplacev1.PacingExternal
			t.Spec.Machines = []string{"cp-2"}
			t.Spec.MaxUnavailable = ptr.To(intstr.FromString("100%"))
		}))).To(Succeed())

		Eventually(w.phaseOf("by-annotation"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Eventually(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("cp-2") }, timeout, poll).ShouldNot(BeNil())
		Expect(rec.MaxRunning()).To(Equal(1), "cp-2 started while cp-1 was still being aborted")
		Expect(w.nodeUpdateOf("cp-1").Spec.AbortReason).To(Equal(inplacev1.TaskAbortedReason))
	})

	It("never starts a machine another task's NodeUpdate is upgrading; a deleted task aborts its nodes and keeps its claims until they stop", func() {
		w := newMDWorld(3)
		rec := watchNodeUpdates(w.ns)
		sim := simulate(w.ns, time.Hour)
		sim.SetAbortDelay(2 * time.Second)
		Expect(k8s.Create(ctx, w.mdTask("first"))).To(Succeed())
		Eventually(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-1") }, timeout, poll).ShouldNot(BeNil())
		first := w.nodeUpdateOf("workers-1").Name

		Expect(k8s.Delete(ctx, w.task("first"))).To(Succeed())
		Eventually(func() inplacev1.TaskAction { return w.nodeUpdateOf("workers-1").Spec.Phase }, timeout, poll).Should(Equal(inplacev1.TaskActionAbort))
		Expect(w.nodeUpdateOf("workers-1").Spec.AbortReason).To(Equal(inplacev1.TaskDeletedReason))
		Expect(w.machine("workers-1").Labels).To(HaveKeyWithValue(inplacev1.UpgradeTaskLabel, "first"), "the claim is kept while the NodeUpdate runs")

		Expect(k8s.Create(ctx, w.mdTask("second", func(t *inplacev1.UpgradeTask) {
			t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(3))
		}))).To(Succeed())
		Eventually(func() []string {
			var names []string
			for _, nu := range w.nodeUpdates() {
				if nu.Spec.MachineName == "workers-1" {
					names = append(names, nu.Name)
				}
			}
			return names
		}, timeout, poll).Should(HaveLen(2), "the second task starts workers-1 once the first task's NodeUpdate stopped")
		Expect(rec.RunTwice()).To(BeEmpty(), "two NodeUpdates ran on one node at the same time")
		Expect(w.nodeUpdates()).To(ContainElement(HaveField("Name", first)), "the deleted task's NodeUpdate went only when it had stopped")
	})

	It("aborts the NodeUpdate of a machine deleted mid-update (MachineDeleted), and that does not fail the task", func() {
		w := newMDWorld(3)
		simulate(w.ns, 2*time.Second)
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-1") }, timeout, poll).ShouldNot(BeNil())
		Expect(w.setFinalizers("workers-1", []string{"machine.cluster.x-k8s.io"})).To(Succeed())
		Expect(k8s.Delete(ctx, w.machine("workers-1"))).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(w.setFinalizers("workers-1", nil))).To(Succeed()) })

		Eventually(func() string { return w.nodeUpdateOf("workers-1").Spec.AbortReason }, timeout, poll).Should(Equal(inplacev1.MachineDeletedReason))
		Eventually(func() inplacev1.NodeUpdatePhase { return w.nodeUpdateOf("workers-1").Status.Phase }, timeout, poll).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(w.phaseOf("md")()).To(Equal(inplacev1.TaskPhaseInProgress), "a machine deleted mid-update does not fail the task")
		// While it is being deleted the machine is down; once its node is drained Cluster
		// API removes its finalizer and it is gone.
		Expect(w.setFinalizers("workers-1", nil)).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		t := w.task("md")
		Expect(t.Status.Upgraded).To(Equal(int32(2)))
		Expect(t.Status.Failed).To(BeZero())
		Expect(t.Status.Total).To(Equal(int32(2)), "the deleted machine is no longer the task's")
	})

	It("holds a MachineDeployment's task on VersionSkew until its control plane runs the target", func() {
		w := newCPWorld(3)
		_, workers, err := fixtures.MachineDeployment(ctx, k8s, w.ns, "harvester", "workers", fromVersion, 2)
		Expect(err).NotTo(HaveOccurred())
		simulate(w.ns, 200*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(func() string {
			return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Reason
		}, timeout, poll).Should(Equal(inplacev1.VersionSkewReason))
		Consistently(func() []inplacev1.NodeUpdate { return w.nodeUpdates() }, time.Second, poll).Should(BeEmpty())
		Expect(condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Message).To(ContainSubstring("cp-1 (" + fromVersion + ")"))

		for _, m := range w.machines {
			Expect(fixtures.Annotate(ctx, k8s, m, inplacev1.UpgradeReleaseAnnotation, targetVersion)).To(Succeed())
		}
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(w.nodeUpdates()).To(HaveLen(len(workers)))
	})

	// Found by the randomized safety test (seed 9114): a control plane machine still on the
	// old version was being deleted, and a worker was upgraded past its API server.
	It("holds a MachineDeployment's task on VersionSkew while a control plane machine behind the target is being deleted", func() {
		w := newCPWorld(3)
		_, workers, err := fixtures.MachineDeployment(ctx, k8s, w.ns, "harvester", "workers", fromVersion, 2)
		Expect(err).NotTo(HaveOccurred())
		simulate(w.ns, 200*time.Millisecond)
		for _, m := range w.machines[:2] {
			Expect(fixtures.Annotate(ctx, k8s, m, inplacev1.UpgradeReleaseAnnotation, targetVersion)).To(Succeed())
		}
		last := w.machines[2].Name
		Expect(w.setFinalizers(last, []string{"machine.cluster.x-k8s.io"})).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(w.setFinalizers(last, nil))).To(Succeed()) })
		Expect(k8s.Delete(ctx, w.machine(last))).To(Succeed())

		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(func() string {
			return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Message
		}, timeout, poll).Should(ContainSubstring(last + " (" + fromVersion + ", being deleted)"))
		Consistently(func() []inplacev1.NodeUpdate { return w.nodeUpdates() }, time.Second, poll).Should(BeEmpty(),
			"no worker is upgraded while the control plane machine still serves the old version")

		// Once Cluster API has removed the machine, its API server is gone.
		Expect(w.setFinalizers(last, nil)).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(w.nodeUpdates()).To(HaveLen(len(workers)))
	})

	It("keeps a MachineHealthCheck off a node while it is upgraded and marks a failed one InPlaceUpgradeFailed", func() {
		w := newMDWorld(2)
		sim := simulate(w.ns, 1500*time.Millisecond)
		sim.FailMachine("workers-2", "rke2 upgrade: the node did not come back")
		// workers-1 carries the operator's own skip-remediation: it is never removed.
		Expect(fixtures.Annotate(ctx, k8s, w.machines[0], clusterv1.MachineSkipRemediationAnnotation, "operator")).To(Succeed())
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())

		// The machine is claimed (and skipped from remediation) before its NodeUpdate is
		// created: wait for the NodeUpdate, then look at both.
		Eventually(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-2") }, timeout, poll).ShouldNot(BeNil())
		Eventually(func() map[string]string { return w.machine("workers-2").Annotations }, timeout, poll).Should(And(
			HaveKey(clusterv1.MachineSkipRemediationAnnotation), HaveKeyWithValue(inplacev1.SkipRemediationSetByAnnotation, "md")),
			"skip-remediation while workers-2's NodeUpdate runs")
		Expect(w.nodeUpdateOf("workers-2").Status.Phase.IsFinal()).To(BeFalse())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))

		failed := w.machine("workers-2")
		Expect(failed.Annotations).NotTo(HaveKey(clusterv1.MachineSkipRemediationAnnotation), "removed once the NodeUpdate ended")
		Expect(failed.Annotations).NotTo(HaveKey(inplacev1.SkipRemediationSetByAnnotation))
		c := meta.FindStatusCondition(failed.Status.Conditions, inplacev1.InPlaceUpgradeFailedCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionTrue))
		Expect(c.Message).To(ContainSubstring("the node did not come back"))

		ok := w.machine("workers-1")
		Expect(ok.Annotations).To(HaveKeyWithValue(clusterv1.MachineSkipRemediationAnnotation, "operator"))
		Expect(ok.Annotations).NotTo(HaveKey(inplacev1.SkipRemediationSetByAnnotation))
		Expect(meta.FindStatusCondition(ok.Status.Conditions, inplacev1.InPlaceUpgradeFailedCondition)).To(BeNil(), "only a failed machine carries it")
	})

	Context("with an updater that judges", func() {
		var judge *judgingUpdater
		BeforeEach(func() {
			judge = &judgingUpdater{notAtTarget: map[string]string{}}
			registry = registryWith(judge)
		})

		It("upgrades again a node whose kubelet reached the target but whose updater says the rest did not", func() {
			w := newMDWorld(3)
			judge.mu.Lock()
			judge.notAtTarget["workers-2"] = "the OS is Harvester v1.5.0, the release wants Harvester v1.6.0"
			judge.mu.Unlock()
			m := w.machine("workers-2")
			m.Status.NodeInfo = &corev1.NodeSystemInfo{KubeletVersion: targetVersion}
			Expect(k8s.Status().Update(ctx, m)).To(Succeed())
			rec := watchNodeUpdates(w.ns)
			simulate(w.ns, 200*time.Millisecond)
			Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
			Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
			Expect(rec.Creations()).To(Equal(map[string]int{"workers-1": 1, "workers-2": 1, "workers-3": 1}))
		})

		It("never starts a machine whose live node runs a newer version than the target while its Machine lags, whatever the judge says of the target", func() {
			w := newMDWorld(3)
			// The soak's seed 20056: the node went to v1.34.1+rke2r2, the Machine still
			// showed the old kubelet, and a task for v1.34.1+rke2r1 asked the judge, which
			// answers for that exact target ("not there"), and downgraded the node.
			judge.mu.Lock()
			judge.notAtTarget["workers-2"] = "the node runs v1.34.1+rke2r2, not v1.34.1+rke2r1"
			judge.mu.Unlock()
			Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
				node := &corev1.Node{}
				if err := k8s.Get(ctx, client.ObjectKey{Name: w.node(1)}, node); err != nil {
					return err
				}
				node.Status.NodeInfo.KubeletVersion = "v1.34.1+rke2r2"
				return k8s.Status().Update(ctx, node)
			})).To(Succeed())
			lagging := w.machine("workers-2")
			Expect(lagging.Status.NodeInfo == nil || lagging.Status.NodeInfo.KubeletVersion != "v1.34.1+rke2r2").To(BeTrue(), "the Machine lags")
			rec := watchNodeUpdates(w.ns)
			simulate(w.ns, 200*time.Millisecond)
			Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
			Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
			Expect(rec.Creations()).To(Equal(map[string]int{"workers-1": 1, "workers-3": 1}), "no NodeUpdate downgrades workers-2")
		})

		It("gives the updater's preflight the Cluster's disrupted nodes and this round's picks", func() {
			w := newMDWorld(4)
			simulate(w.ns, time.Hour)
			// A hand-made NodeUpdate, without the cluster label, upgrades workers-4.
			Expect(k8s.Create(ctx, &inplacev1.NodeUpdate{
				ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "by-hand"},
				Spec: inplacev1.NodeUpdateSpec{ClusterName: "harvester", MachineName: "workers-4", NodeName: w.node(3),
					Version: targetVersion, UpdaterRef: inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}},
			})).To(Succeed())
			Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
				t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(3))
			}))).To(Succeed())
			Eventually(func() int { return len(judge.askedAbout("workers-2")) }, timeout, poll).Should(BeNumerically(">=", 1))
			asked := judge.askedAbout("workers-2")[0]
			Expect(asked.Disrupted).To(ContainElement(w.node(3)), "workers-4 is being upgraded by another NodeUpdate")
			Expect(asked.Picked).To(Equal([]string{w.node(0)}), "workers-1 starts in the same round")
			Consistently(func() *inplacev1.NodeUpdate { return w.nodeUpdateOf("workers-3") }, time.Second, poll).Should(BeNil(),
				"workers-3 waits: workers-4 and this round's two take the room of maxUnavailable 3")
		})
	})
})
