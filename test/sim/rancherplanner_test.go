package sim_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/rkev1"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

const (
	oldRKE2 = "v1.32.5+rke2r1"
	newRKE2 = "v1.33.3+rke2r1"
	preHook = "harvesterhci.io/pre-hook"
	postHok = "harvesterhci.io/post-hook"
)

// plannerCluster is fleet-local/local with management nodes m-1.. (etcd, control plane)
// and workers w-1.., all at oldRKE2, and a running RancherPlanner.
type plannerCluster struct {
	pool    string
	rec     *sim.Record
	kubelet *sim.Kubelet
	planner *sim.RancherPlanner

	mu      sync.Mutex
	guarded map[string]bool
}

func newPlannerCluster(mgmt, workers int, configure func(*sim.RancherPlanner)) *plannerCluster {
	GinkgoHelper()
	seq++
	c := &plannerCluster{pool: fmt.Sprintf("planner-%d", seq), rec: sim.NewRecord(), guarded: map[string]bool{}}
	Expect(sim.Seed(ctx, env.Client, sim.HarvesterRelease{Version: "v1.5.1", Rancher: "v2.11.3", Kubernetes: oldRKE2})).To(Succeed())
	c.kubelet = &sim.Kubelet{Client: env.Client, Record: c.rec}
	for i := 1; i <= mgmt; i++ {
		_, err := c.kubelet.CreateNode(ctx, c.node("m", i), oldRKE2, map[string]string{"pool": c.pool,
			"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/etcd": "true"})
		Expect(err).NotTo(HaveOccurred())
	}
	for i := 1; i <= workers; i++ {
		_, err := c.kubelet.CreateNode(ctx, c.node("w", i), oldRKE2, map[string]string{"pool": c.pool})
		Expect(err).NotTo(HaveOccurred())
	}
	c.planner = &sim.RancherPlanner{
		Client: env.Client, Kubelet: c.kubelet, NodeSelector: map[string]string{"pool": c.pool},
		Interval: 20 * time.Millisecond, RestartDuration: 150 * time.Millisecond, RetryDelay: 100 * time.Millisecond,
		Guarded: func(node string) bool { c.mu.Lock(); defer c.mu.Unlock(); return c.guarded[node] },
	}
	if configure != nil {
		configure(c.planner)
	}
	Expect(c.planner.SeedMachines(ctx)).To(Succeed())
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.planner.Run(runCtx) }()
	DeferCleanup(func() { cancel(); <-done })
	Eventually(c.updated).WithPolling(20*time.Millisecond).Should(Equal("True"), "a seeded cluster is settled")
	return c
}

func (c *plannerCluster) node(kind string, i int) string {
	return fmt.Sprintf("%s-%s-%d", c.pool, kind, i)
}

func (c *plannerCluster) guard(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.guarded[node] = true
}

func (c *plannerCluster) secret(node string) *corev1.Secret {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: sim.MachineName(node) + "-machine-plan"}, s)).To(Succeed())
	return s
}

func (c *plannerCluster) getNode(node string) *corev1.Node {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	return n
}

func (c *plannerCluster) kubeletVersion(node string) string {
	GinkgoHelper()
	return c.getNode(node).Status.NodeInfo.KubeletVersion
}

// answer sets the hook annotation to the value of Rancher's request, as Harvester's
// secret and job controllers do once the hook Job completed (node sheet fact 39).
func (c *plannerCluster) answer(node, request, hook string) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := c.secret(node)
		s.Annotations[hook] = s.Annotations[request]
		return env.Client.Update(ctx, s)
	})).To(Succeed())
}

// updated is the status of fleet-local/local's Updated condition, message appended when
// not True.
func (c *plannerCluster) updated() string {
	cl := localCluster()
	for _, cond := range cl.Status.Conditions {
		if cond.Type == "Updated" {
			if cond.Status == corev1.ConditionTrue {
				return "True"
			}
			return string(cond.Status) + ": " + cond.Message
		}
	}
	return ""
}

func localCluster() *provisioningv1.Cluster {
	GinkgoHelper()
	cl := &provisioningv1.Cluster{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}, cl)).To(Succeed())
	return cl
}

// controlPlaneVersion is the kubernetesVersion the RKEControlPlane fleet-local/local carries.
func controlPlaneVersion() string {
	GinkgoHelper()
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}, cp)).To(Succeed())
	v, _, _ := unstructured.NestedString(cp.Object, "spec", "kubernetesVersion")
	return v
}

func updateLocalCluster(mutate func(*provisioningv1.Cluster)) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := localCluster()
		if cl.Spec.RKEConfig == nil {
			cl.Spec.RKEConfig = &provisioningv1.RKEConfig{}
		}
		mutate(cl)
		return env.Client.Update(ctx, cl)
	})).To(Succeed())
}

// harvesterStrategy is what Harvester's upgrade controller patches (node sheet fact 11).
func harvesterStrategy() provisioningv1.ClusterUpgradeStrategy {
	drain := provisioningv1.DrainOptions{Enabled: true,
		PreDrainHooks:  []provisioningv1.DrainHook{{Annotation: preHook}},
		PostDrainHooks: []provisioningv1.DrainHook{{Annotation: postHok}}}
	return provisioningv1.ClusterUpgradeStrategy{ControlPlaneConcurrency: "1", WorkerConcurrency: "1",
		ControlPlaneDrainOptions: drain, WorkerDrainOptions: drain}
}

func restartedNodes(applies []sim.PlanApply) []string {
	out := []string{}
	for _, a := range applies {
		out = append(out, a.Node)
	}
	return out
}

var _ = Describe("The Rancher planner simulator (fleet-local/local)", func() {
	It("rolls a new kubernetesVersion one node at a time, etcd tier first, waiting at each pre- and post-drain hook", func() {
		c := newPlannerCluster(2, 2, nil)
		order := []string{c.node("m", 1), c.node("m", 2), c.node("w", 1), c.node("w", 2)}
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.ProvisionGeneration++
			cl.Spec.RKEConfig.UpgradeStrategy = harvesterStrategy()
		})
		inDrain := func(node string) bool {
			a := c.secret(node).Annotations
			return a[sim.PreDrainAnnotation] != "" || a[sim.DrainOptionsAnnotation] != "" || a[sim.PostDrainAnnotation] != ""
		}
		for i, node := range order {
			By("pre-drain of " + node)
			Eventually(func() string { return c.secret(node).Annotations[sim.PreDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
			Expect(c.getNode(node).Spec.Unschedulable).To(BeTrue(), "Rancher cordons before it asks for the pre-drain hook (machinedrain.go drain)")
			for _, other := range order[i+1:] {
				Expect(inDrain(other)).To(BeFalse(), "only one node at a time: %s", other)
			}
			Consistently(func() string { return c.kubeletVersion(node) }, 300*time.Millisecond, 30*time.Millisecond).Should(Equal(oldRKE2), "nothing restarts before its pre-drain hook is answered")
			Expect(restartedNodes(c.planner.Restarts())).To(Equal(order[:i]))
			c.answer(node, sim.PreDrainAnnotation, preHook)

			By("post-drain of " + node)
			Eventually(func() string { return c.secret(node).Annotations[sim.PostDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
			Expect(c.kubeletVersion(node)).To(Equal(newRKE2))
			restarts := c.planner.Restarts()
			Expect(restartedNodes(restarts)).To(Equal(order[:i+1]))
			last := restarts[i]
			Expect(last.From).To(Equal(oldRKE2))
			Expect(last.Drained).To(BeTrue())
			Expect(last.InHooks).To(BeTrue())
			Consistently(func() bool { return c.getNode(node).Spec.Unschedulable }, 300*time.Millisecond, 30*time.Millisecond).Should(BeTrue(), "uncordon waits for the post-drain hook")
			for _, other := range order[i+1:] {
				Expect(inDrain(other)).To(BeFalse(), "the next node waits for this one's post-drain: %s", other)
			}
			c.answer(node, sim.PostDrainAnnotation, postHok)
			Eventually(func() bool { return c.getNode(node).Spec.Unschedulable }).WithPolling(20 * time.Millisecond).Should(BeFalse())
			Eventually(func() map[string]string { return c.secret(node).Annotations }).WithPolling(20*time.Millisecond).ShouldNot(
				Or(HaveKey(sim.PreDrainAnnotation), HaveKey(sim.PostDrainAnnotation), HaveKey(sim.DrainOptionsAnnotation), HaveKey(preHook), HaveKey(postHok)),
				"Rancher removes its drain annotations and the hooks' answers (machinedrain.go cleanSecretAnnotationsIfCheckTrue)")
		}
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		Expect(c.planner.MaxRestarting()).To(Equal(1))
		Expect(c.planner.MaxCordoned()).To(Equal(1))
		Expect(c.rec.MaxDown()).To(Equal(1))
		Expect(c.planner.UnguardedRestartsOutsideDrain()).To(BeEmpty())
		Expect(c.planner.Downgrades()).To(BeEmpty())
	})

	It("counts a node whose cordon someone else lifted before Rancher's uncordon as no longer held, as RunCordonOrUncordon then changes nothing", func() {
		c := newPlannerCluster(2, 0, nil)
		first, second := c.node("m", 1), c.node("m", 2)
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.ProvisionGeneration++
			cl.Spec.RKEConfig.UpgradeStrategy = harvesterStrategy()
		})
		for _, node := range []string{first, second} {
			Eventually(func() string { return c.secret(node).Annotations[sim.PreDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
			c.answer(node, sim.PreDrainAnnotation, preHook)
			Eventually(func() string { return c.secret(node).Annotations[sim.PostDrainAnnotation] }).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
			if node == first {
				// As a NodeUpdate's Finish does when it took Rancher's cordon as its own.
				Expect(c.kubelet.SetUnschedulable(ctx, node, false)).To(Succeed())
			}
			c.answer(node, sim.PostDrainAnnotation, postHok)
		}
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		var uncordons []string
		for _, e := range c.planner.HookEvents() {
			if e.Kind == "uncordon" {
				uncordons = append(uncordons, e.Node)
			}
		}
		Expect(uncordons).To(Equal([]string{second}), "Rancher's uncordon of a schedulable node changes nothing")
		Expect(c.planner.MaxCordoned()).To(Equal(1), "the first node was schedulable again before Rancher cordoned the second")
	})

	It("rolls a change of fleet-local/local only once Rancher wrote it into the RKEControlPlane, whose pause and strategy the planner reads together", func() {
		c := newPlannerCluster(1, 0, func(p *sim.RancherPlanner) { p.CopyDelay = time.Second })
		node := c.node("m", 1)
		changed := time.Now()
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.ProvisionGeneration++
		})
		Consistently(func() string { return c.kubeletVersion(node) }, 600*time.Millisecond, 30*time.Millisecond).Should(Equal(oldRKE2),
			"the planner rolled a version its RKEControlPlane does not carry yet")
		Eventually(func() string { return c.kubeletVersion(node) }).WithPolling(20 * time.Millisecond).Should(Equal(newRKE2))
		Expect(time.Since(changed)).To(BeNumerically(">=", time.Second))
		Expect(controlPlaneVersion()).To(Equal(newRKE2))
	})

	It("rolls nothing while the local-rke-state Secret is Opaque, and goes once it is of Rancher's type (fact 18)", func() {
		c := newPlannerCluster(1, 0, nil)
		state := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: rancher.FleetLocal, Name: rancher.LocalRKEStateSecret},
			Type:       corev1.SecretTypeOpaque, Data: map[string][]byte{"serverToken": []byte("t")},
		}
		// Replacing whatever an earlier spec's Seed left (a Secret of Rancher's type).
		Expect(client.IgnoreNotFound(env.Client.Delete(ctx, state.DeepCopy()))).To(Succeed())
		Expect(env.Client.Create(ctx, state)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, state))).To(Succeed()) })
		node := c.node("m", 1)
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.KubernetesVersion = newRKE2
			cl.Spec.RKEConfig.ProvisionGeneration++
		})
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(ContainSubstring("is of type Opaque"))
		Consistently(func() string { return c.kubeletVersion(node) }, 500*time.Millisecond, 50*time.Millisecond).Should(Equal(oldRKE2))

		Expect(env.Client.Delete(ctx, state)).To(Succeed())
		state.ResourceVersion, state.UID, state.Type = "", "", rancher.RKEClusterStateType
		Expect(env.Client.Create(ctx, state)).To(Succeed())
		Eventually(func() string { return c.kubeletVersion(node) }).WithPolling(20 * time.Millisecond).Should(Equal(newRKE2))
	})

	It("keeps a node upgraded behind Rancher's back unsettled, and downgrades it at the next plan change", func() {
		c := newPlannerCluster(2, 0, nil)
		ahead := c.node("m", 2)
		Expect(c.kubelet.SetVersion(ctx, ahead, newRKE2, "")).To(Succeed()) // as SUC's rke2-upgrade would
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(
			Equal(fmt.Sprintf("Unknown: configuring etcd node(s) %s: %s", sim.MachineName(ahead), sim.WaitingKubeletMessage)))
		Consistently(c.updated, 400*time.Millisecond, 40*time.Millisecond).Should(HavePrefix("Unknown"))
		cl := localCluster()
		Expect(cl.Status.Ready).To(BeTrue(), "Rancher never sets status.ready back to false")
		Expect(cl.Status.ObservedGeneration).To(Equal(cl.Generation))
		Expect(c.planner.Applies()).To(BeEmpty(), "a kubelet mismatch alone delivers no plan")

		updateLocalCluster(func(cl *provisioningv1.Cluster) { cl.Spec.RKEConfig.ProvisionGeneration++ })
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		Expect(c.kubeletVersion(ahead)).To(Equal(oldRKE2), "the plan installs the declared version")
		downgrades := c.planner.Downgrades()
		Expect(downgrades).To(HaveLen(1))
		Expect(downgrades[0].Node).To(Equal(ahead))
		Expect(downgrades[0].From).To(Equal(newRKE2))
		Expect(downgrades[0].To).To(Equal(oldRKE2))
		Expect(restartedNodes(c.planner.Restarts())).To(Equal([]string{c.node("m", 1), ahead}))
		Expect(c.planner.UnguardedRestartsOutsideDrain()).To(HaveLen(2), "no upgrade strategy: no drain, no hooks")
		Expect(c.planner.MaxRestarting()).To(Equal(1), "etcd nodes one at a time")
	})

	It("restarts every unguarded node without a drain when Rancher re-renders, and no guarded one", func() {
		c := newPlannerCluster(1, 2, nil)
		guarded := c.node("w", 1)
		c.guard(guarded)
		// A Rancher upgrade: the new Rancher writes its version (fact 41.8).
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s := &managementv3.Setting{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: rancher.ServerVersionSetting}, s); err != nil {
				return err
			}
			s.Value = "v2.12.1"
			return env.Client.Update(ctx, s)
		})).To(Succeed())
		Eventually(func() int { return len(c.planner.Applies()) }).WithPolling(20 * time.Millisecond).Should(Equal(3))
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))

		Expect(restartedNodes(c.planner.Restarts())).To(Equal([]string{c.node("m", 1), c.node("w", 2)}))
		Expect(restartedNodes(c.planner.UnguardedRestartsOutsideDrain())).To(Equal([]string{c.node("m", 1), c.node("w", 2)}))
		for _, a := range c.planner.Applies() {
			if a.Node == guarded {
				Expect(a.Guarded).To(BeTrue())
				Expect(a.Restarted).To(BeFalse())
			}
		}
		for _, e := range c.rec.DownLog() {
			Expect(e.Node).NotTo(Equal(guarded), "the guarded node never went NotReady")
		}
		s := c.secret(guarded)
		Expect(s.Annotations[sim.AppliedPlanAnnotation]).To(Equal(s.Annotations[sim.PlanAnnotation]), "the installer ran: the plan is applied")

		By("a second re-render (Rerender) restarts the unguarded nodes again")
		c.planner.Rerender()
		Eventually(func() int { return len(c.planner.Restarts()) }).WithPolling(20 * time.Millisecond).Should(Equal(4))
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		Consistently(func() int { return len(c.planner.Restarts()) }, 300*time.Millisecond, 30*time.Millisecond).Should(Equal(4))
	})

	It("leaves a node whose installer fails at its version, holds back every later node, and resumes once the install succeeds", func() {
		c := newPlannerCluster(2, 1, nil)
		failing, next := c.node("m", 1), c.node("m", 2)
		c.planner.FailInstall(failing, "failed to pull image rancher/system-agent-installer-rke2")
		updateLocalCluster(func(cl *provisioningv1.Cluster) { cl.Spec.KubernetesVersion = newRKE2 })
		// Two machines of the tier wait, so Rancher names them without a detail
		// (messages.go detailedMessage); "failure while applying plan" goes on the
		// failing Machine's Reconciled condition, which the simulator does not keep.
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(
			Equal(fmt.Sprintf("Unknown: configuring etcd node(s) %s,%s", sim.MachineName(failing), sim.MachineName(next))))
		Eventually(func() int {
			n, _ := strconv.Atoi(string(c.secret(failing).Data[sim.FailureCountKey]))
			return n
		}).WithPolling(20*time.Millisecond).Should(BeNumerically(">=", 2), "the agent retries")
		s := c.secret(failing)
		Expect(s.Annotations[sim.AppliedPlanAnnotation]).NotTo(Equal(s.Annotations[sim.PlanAnnotation]))
		Expect(c.kubeletVersion(failing)).To(Equal(oldRKE2))
		Expect(sim.NodeReady(c.getNode(failing))).To(BeTrue())
		planOfNext := c.secret(next).Annotations[sim.PlanAnnotation]
		Consistently(func() string { return c.secret(next).Annotations[sim.PlanAnnotation] }, 300*time.Millisecond, 30*time.Millisecond).Should(Equal(planOfNext), "the next node gets no plan")
		Expect(c.planner.Restarts()).To(BeEmpty())
		for _, a := range c.planner.Applies() {
			Expect(a.Node).To(Equal(failing))
			Expect(a.Failed).To(BeTrue())
		}

		c.planner.ClearInstallFailure(failing)
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		Expect(restartedNodes(c.planner.Restarts())).To(Equal([]string{failing, next, c.node("w", 1)}))
		for _, n := range []string{failing, next, c.node("w", 1)} {
			Expect(c.kubeletVersion(n)).To(Equal(newRKE2))
		}
	})

	It("restarts workers at workerConcurrency given as a percentage", func() {
		c := newPlannerCluster(1, 4, nil)
		updateLocalCluster(func(cl *provisioningv1.Cluster) {
			cl.Spec.RKEConfig.ProvisionGeneration++
			cl.Spec.RKEConfig.UpgradeStrategy = provisioningv1.ClusterUpgradeStrategy{WorkerConcurrency: "50%"}
		})
		Eventually(func() int { return len(c.planner.Restarts()) }).WithPolling(20 * time.Millisecond).Should(Equal(5))
		Eventually(c.updated).WithPolling(20 * time.Millisecond).Should(Equal("True"))
		Expect(c.planner.MaxRestarting()).To(Equal(2), "ceil(4 × 50 percent) workers at once")
		Expect(c.planner.Restarts()[0].Node).To(Equal(c.node("m", 1)), "the etcd tier first")
	})
})
