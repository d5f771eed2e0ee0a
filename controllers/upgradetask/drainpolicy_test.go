package upgradetask

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

var _ = Describe("The drain policy of a task", func() {
	var stop func()
	JustBeforeEach(func() { stop = startManager(nil) })
	AfterEach(func() {
		if stop != nil {
			stop()
		}
	})

	It("goes into every NodeUpdate: the task's own, else the Cluster's annotation; a bad annotation holds new nodes with a condition naming it", func() {
		w := newMDWorld(2)
		simulate(w.ns, 200*time.Millisecond)
		own := &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeEvict, GracePeriod: &metav1.Duration{Duration: 90 * time.Second}}
		w.annotateCluster(inplacev1.DrainPolicyAnnotation, `{"mode":"Evict","gracePeriod":"3m"}`)
		Expect(k8s.Create(ctx, w.mdTask("a", func(t *inplacev1.UpgradeTask) { t.Spec.DrainPolicy = own }))).To(Succeed())
		Eventually(w.phaseOf("a"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(w.nodeUpdates()).To(HaveLen(2))
		for _, nu := range w.nodeUpdates() {
			Expect(nu.Spec.DrainPolicy).To(Equal(own), "the task's own policy wins over the Cluster's")
		}

		By("a task without one takes the Cluster's, once it is usable")
		w = newMDWorld(2)
		simulate(w.ns, 200*time.Millisecond)
		w.annotateCluster(inplacev1.DrainPolicyAnnotation, `{"mode":"Sometimes"}`)
		Expect(k8s.Create(ctx, w.mdTask("b"))).To(Succeed())
		Eventually(func() metav1.Condition { return w.conditionOf("b", inplacev1.PausedCondition)() }, timeout, poll).
			Should(And(HaveField("Reason", inplacev1.InvalidDrainPolicyReason),
				HaveField("Message", And(ContainSubstring(inplacev1.DrainPolicyAnnotation), ContainSubstring(`mode "Sometimes" is not Hold, Skip or Evict`)))))
		Consistently(w.nodeUpdates, time.Second, poll).Should(BeEmpty(), "no node starts under a policy other than the one asked")

		w.annotateCluster(inplacev1.DrainPolicyAnnotation, `{"mode":"Evict","gracePeriod":"3m"}`)
		Eventually(w.phaseOf("b"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(w.nodeUpdates()).To(HaveLen(2))
		for _, nu := range w.nodeUpdates() {
			Expect(nu.Spec.DrainPolicy).To(Equal(&inplacev1.DrainPolicy{Mode: inplacev1.DrainModeEvict, GracePeriod: &metav1.Duration{Duration: 3 * time.Minute}}))
		}
	})
})
