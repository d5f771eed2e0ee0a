package harvesteradapter_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// withDrainPolicy gives a NodeUpdate that has not started its drain policy, as the
// UpgradeTask copies it into the NodeUpdates it creates.
func withDrainPolicy(nu *inplacev1.NodeUpdate, mode inplacev1.DrainMode, grace time.Duration) {
	GinkgoHelper()
	nu.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: mode, GracePeriod: &metav1.Duration{Duration: grace}}
	Expect(env.Client.Update(ctx, nu)).To(Succeed())
}

func drainBlocked(nu *inplacev1.NodeUpdate) *metav1.Condition {
	return meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition)
}

// drainEvents are the events the updater recorded so far.
func drainEvents(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

var _ = Describe("A node whose drain a PodDisruptionBudget blocks", func() {
	It("Hold: waits on the pod, names it on the NodeUpdate, and fails at the drain's timeout with the pod still running", func() {
		c := newVMCluster(3, func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Drain.Timeout = ptr.To(intstr.FromString("3s"))
		})
		n2 := c.nodes[1]
		c.pdbPod("web", n2, "100Mi")
		rec := events.NewFakeRecorder(100)
		c.updater.Recorder = rec
		nu := c.nodeUpdate(n2)
		withDrainPolicy(nu, inplacev1.DrainModeHold, time.Second)

		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			cond := drainBlocked(nu)
			return cond != nil && cond.Status == metav1.ConditionTrue
		})).To(Succeed())
		cond := drainBlocked(nu)
		Expect(cond.Reason).To(Equal(inplacev1.DrainHeldReason))
		Expect(cond.Message).To(And(ContainSubstring("pod "+c.ns+"/web (PodDisruptionBudget web)"), ContainSubstring("drainPolicy Hold")))
		Expect(nodeupdater.Step(nu, harvesteradapter.StepDrain).Message).To(ContainSubstring("drainPolicy Hold"), "the drain step says why it waits")

		err := drive(c.updater, nu, 60*time.Second)
		Expect(err).To(HaveOccurred())
		_, permanent := nodeupdater.AsPermanent(err)
		Expect(permanent).To(BeTrue(), "the drain's timeout fails the node: %v", err)
		// kubectl's own words ("global timeout reached" naming the pod) are in its log,
		// which envtest's API server cannot serve (no kubelet): the Job's end says it.
		Expect(err.Error()).To(And(ContainSubstring("step Drain"), ContainSubstring("BackoffLimitExceeded"), ContainSubstring("exited with code 1")))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})).To(Succeed(), "held: the budget keeps the pod")
		Expect(drainBlocked(nu).Reason).To(Equal(inplacev1.DrainHeldReason), "well past the grace period, Hold never deletes")
		evs := drainEvents(rec)
		Expect(evs).To(ContainElement(And(HavePrefix("Warning DrainBlocked"), ContainSubstring(c.ns+"/web"))))
		Expect(evs).NotTo(ContainElement(ContainSubstring(inplacev1.BlockingPodsDeletedReason)))
	})

	It("Evict: deletes the blocking pod despite its budget once the grace period has passed, with an event naming it, and the node goes on", func() {
		c := newVMCluster(3, nil)
		n2 := c.nodes[1]
		c.pdbPod("web", n2, "100Mi")
		rec := events.NewFakeRecorder(100)
		c.updater.Recorder = rec
		nu := c.nodeUpdate(n2)
		const grace = 2 * time.Second
		withDrainPolicy(nu, inplacev1.DrainModeEvict, grace)

		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			cond := drainBlocked(nu)
			return cond != nil && cond.Status == metav1.ConditionTrue
		})).To(Succeed())
		blockedAt := time.Now()
		cond := drainBlocked(nu)
		Expect(cond.Reason).To(Equal(inplacev1.EvictionPendingReason))
		Expect(cond.Message).To(And(ContainSubstring("pod "+c.ns+"/web (PodDisruptionBudget web)"), ContainSubstring("drainPolicy Evict")))

		By("within the grace period the pod stays")
		Expect(driveUntil(c.updater, nu, grace/2, nil)).To(MatchError(ContainSubstring("not done within")))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})).To(Succeed())

		By("after it, the pod is deleted and the node's upgrade ends")
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateSucceeded))
		err := workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the pod is gone: %v", err)
		cond = drainBlocked(nu)
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Reason).To(Equal(inplacev1.BlockingPodsDeletedReason))
		Expect(cond.Message).To(ContainSubstring(c.ns + "/web"))
		var deleted []string
		for _, e := range drainEvents(rec) {
			if strings.HasPrefix(e, "Warning "+inplacev1.BlockingPodsDeletedReason) {
				deleted = append(deleted, e)
			}
		}
		Expect(deleted).To(ConsistOf(And(ContainSubstring("deleted pod "+c.ns+"/web"), ContainSubstring("ignoring PodDisruptionBudget web"))), "one event per deleted pod")
		Expect(c.rec.Drains(n2)).NotTo(BeEmpty())
		Expect(time.Since(blockedAt)).To(BeNumerically(">=", grace/2))
	})
})
