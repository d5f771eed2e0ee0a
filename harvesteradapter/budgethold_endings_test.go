package harvesteradapter_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// A NodeUpdate the budget holds before a disruptive step (the disruption ledger before its
// cordon, the fresh control plane check before RKE2's restart, issue #54 point 8) can end
// there: an abort, its deletion, its node timeout. Each ending, under the NodeUpdate
// reconciler, leaves its node as the NodeUpdate found it (never cordoned, or uncordoned),
// starts nothing on the node after it ended, and takes its claim out of the ledger, so
// that the other nodes go on and a next NodeUpdate of its node finishes the job.
var _ = Describe("A NodeUpdate the budget holds, ended there", func() {
	type ending struct {
		name string
		end  func(nu *inplacev1.NodeUpdate)
		// phase is the NodeUpdate's final phase, "" when it is gone.
		phase inplacev1.NodeUpdatePhase
	}
	abort := ending{"aborted", func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		Eventually(func() error {
			cur := &inplacev1.NodeUpdate{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(nu), cur); err != nil {
				return err
			}
			patch := client.MergeFrom(cur.DeepCopy())
			cur.Spec.Phase, cur.Spec.AbortReason = inplacev1.TaskActionAbort, "TaskAborted"
			return env.Client.Patch(ctx, cur, patch)
		}).WithPolling(50 * time.Millisecond).Should(Succeed())
	}, inplacev1.NodeUpdatePhaseAborted}
	deleted := ending{"deleted", func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		Expect(env.Client.Delete(ctx, nu)).To(Succeed())
	}, ""}
	timedOut := ending{"timed out", func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		// The node timeout (4h, the HarvesterUpgrader's default) counts from the
		// NodeUpdate's start, held time included: the start moved back past it.
		Eventually(func() error {
			cur := &inplacev1.NodeUpdate{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(nu), cur); err != nil {
				return err
			}
			cur.Status.StartTime = &metav1.Time{Time: time.Now().Add(-harvesterv1.DefaultNodeTimeout - time.Minute)}
			return env.Client.Status().Update(ctx, cur)
		}).WithPolling(50 * time.Millisecond).Should(Succeed())
	}, inplacev1.NodeUpdatePhaseFailed}

	// endedAt ends nu with e and waits until the reconciler has ended it; it returns
	// when it saw it ended.
	endedAt := func(e ending, nu *inplacev1.NodeUpdate) time.Time {
		GinkgoHelper()
		e.end(nu)
		Eventually(func(g Gomega) {
			cur := &inplacev1.NodeUpdate{}
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(nu), cur)
			if e.phase == "" {
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the deleted NodeUpdate is gone once its node is settled: %v", err)
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cur.Status.Phase).To(Equal(e.phase))
			if e.phase == inplacev1.NodeUpdatePhaseFailed {
				g.Expect(cur.Status.FailureReason).To(Equal(inplacev1.TimedOutReason))
			}
		}, 60*time.Second, 50*time.Millisecond).Should(Succeed())
		return time.Now()
	}

	// settled asserts that nu's node is schedulable, no Plan of nu is left and none ran
	// after ended, and that this stays so.
	settled := func(c *harvesterCluster, nu *inplacev1.NodeUpdate, ended time.Time) {
		GinkgoHelper()
		Consistently(func(g Gomega) {
			node := &corev1.Node{}
			g.Expect(workload.Client.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, node)).To(Succeed())
			g.Expect(node.Spec.Unschedulable).To(BeFalse(), "node %s left cordoned by its ended NodeUpdate", nu.Spec.NodeName)
			g.Expect(node.Annotations).NotTo(HaveKey(harvesteradapter.AnnotationCordonedBy))
			g.Expect(plansOf(nu)).To(BeEmpty(), "a Plan of the ended NodeUpdate is left")
			for _, run := range c.rec.Runs() {
				for _, kind := range []string{"preload", "drain", "rke2", "os"} {
					if run.Plan == harvesteradapter.PlanName(kind, nu) {
						g.Expect(run.Start.Before(ended)).To(BeTrue(), "Plan %s started on %s after its NodeUpdate ended", run.Plan, run.Node)
					}
				}
			}
		}, 2*time.Second, 100*time.Millisecond).Should(Succeed())
	}

	// inTarget is a NodeUpdate of node as the UpgradeTask controller starts it: of the
	// MachineDeployment "md" with room for one node at a time.
	inTarget := func(c *harvesterCluster, node string) *inplacev1.NodeUpdate {
		GinkgoHelper()
		nu := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("nu-%s-%d", node, time.Now().UnixNano()%100000), Namespace: c.ns,
				Annotations: map[string]string{
					disruption.TargetAnnotation:         disruption.MachineDeploymentTargetPrefix + "md",
					disruption.MaxUnavailableAnnotation: "1",
				}},
			Spec: inplacev1.NodeUpdateSpec{
				ClusterName: c.name, MachineName: "m-" + node, NodeName: node, Version: "v1.35.6+rke2r1",
				UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
			},
		}
		Expect(env.Client.Create(ctx, nu)).To(Succeed())
		return nu
	}
	stepRunning := func(nu *inplacev1.NodeUpdate, step string) {
		GinkgoHelper()
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			g.Expect(nodeupdater.StepState(nu, step)).To(Equal(inplacev1.StepStateRunning))
		}, 90*time.Second, 50*time.Millisecond).Should(Succeed())
	}
	heldWith := func(nu *inplacev1.NodeUpdate, step string, want ...string) {
		GinkgoHelper()
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
			g.Expect(nu.Status.CurrentStep).To(Equal(step))
			for _, w := range want {
				g.Expect(stepMessage(nu, step)).To(ContainSubstring(w))
			}
		}, 90*time.Second, 50*time.Millisecond).Should(Succeed())
	}

	DescribeTable("held at its cordon by the ledger (another node of its target is past its first disruption): its node never cordoned, and the node it waited for goes on",
		func(e ending) {
			c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
			release := blockingPod(c.name, c.nodes[0])
			startLifecycle(c)
			first := inTarget(c, c.nodes[0])
			stepRunning(first, harvesteradapter.StepDrain)

			held := inTarget(c, c.nodes[1])
			heldWith(held, harvesteradapter.StepCordon, "holding node "+c.nodes[1]+" before it is allowed to be cordoned",
				"1 node(s) of MachineDeployment/md are past their first disruption ("+c.nodes[0]+" (NodeUpdate "+first.Name+"))")
			Expect(unschedulable(c.nodes[1])).To(BeFalse())

			By(e.name + " while held")
			ended := endedAt(e, held)
			settled(c, held, ended)

			By("the node it waited for goes on to the end")
			release()
			succeeded(first)
			By("a next NodeUpdate of the held node finishes the job")
			succeeded(inTarget(c, c.nodes[1]))
		},
		Entry("aborted", abort),
		Entry("deleted", deleted),
		Entry("timed out", timedOut),
	)

	DescribeTable("held cordoned before RKE2's restart by the fresh control plane check: its node uncordoned, no RKE2 restart after the end, its claim out of the ledger",
		func(e ending) {
			c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
			for _, n := range c.nodes {
				node := &corev1.Node{}
				Expect(workload.Client.Get(ctx, client.ObjectKey{Name: n}, node)).To(Succeed())
				patch := client.MergeFrom(node.DeepCopy())
				node.Labels["node-role.kubernetes.io/control-plane"], node.Labels["node-role.kubernetes.io/etcd"] = "true", "true"
				Expect(workload.Client.Patch(ctx, node, patch)).To(Succeed())
			}
			release := blockingPod(c.name, c.nodes[0])
			startLifecycle(c)
			nu := c.nodeUpdate(c.nodes[0])
			stepRunning(nu, harvesteradapter.StepDrain)
			Expect(unschedulable(c.nodes[0])).To(BeTrue(), "cordoned while the control plane was whole")

			By("the other control plane node goes NotReady after the cordon")
			Expect(c.kubelet.SetReady(ctx, c.nodes[1], false, "KubeletNotReady")).To(Succeed())
			release()
			heldWith(nu, harvesteradapter.StepKubernetesUpgrade, "holding control plane node "+c.nodes[0]+" before it is allowed to restart RKE2",
				"control plane node(s) "+c.nodes[1]+" are down")
			Expect(unschedulable(c.nodes[0])).To(BeTrue())

			By(e.name + " while held")
			ended := endedAt(e, nu)
			settled(c, nu, ended)
			err := workload.Client.Get(ctx, client.ObjectKey{Namespace: "cattle-system", Name: harvesteradapter.PlanName("rke2", nu)}, &sucv1.Plan{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "RKE2's Plan: %v", err)

			By("the other control plane node back: its NodeUpdate passes the ledger, which no longer counts the ended one")
			Expect(c.kubelet.SetReady(ctx, c.nodes[1], true, "")).To(Succeed())
			other := c.nodeUpdate(c.nodes[1])
			succeeded(other)
			By("a next NodeUpdate of the ended one's node finishes the job")
			Expect(env.Client.Delete(ctx, other)).To(Succeed())
			if e.phase != "" {
				Expect(env.Client.Delete(ctx, nu)).To(Succeed())
				Eventually(func() bool {
					return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{}))
				}).WithPolling(50 * time.Millisecond).Should(BeTrue())
			}
			succeeded(c.nodeUpdate(c.nodes[0]))
		},
		Entry("aborted", abort),
		Entry("deleted", deleted),
		Entry("timed out", timedOut),
	)
})
