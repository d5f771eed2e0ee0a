package nodeupdater_test

import (
	"errors"
	"fmt"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

var configRef = inplacev1.UpdaterReference{Kind: "ConfigMap", Name: "updater"}

const wait = 10 * time.Second

func conditionOf(nu *inplacev1.NodeUpdate, t string) metav1.Condition {
	GinkgoHelper()
	c := meta.FindStatusCondition(nu.Status.Conditions, t)
	Expect(c).NotTo(BeNil(), "condition %s", t)
	return *c
}

var _ = Describe("NodeUpdate reconciler with an updater the manager runs", func() {
	var (
		ns string
		u  *scriptedUpdater
		r  *nodeupdater.Reconciler
	)

	BeforeEach(func() {
		ns = newNamespace()
		createUpdaterConfig(ns, configRef.Name)
		u = newScriptedUpdater("Prepare", "Upgrade", "Finish")
		r = fastReconciler(u)
	})

	It("walks every step transition, records it in status and events, and succeeds", func() {
		startManager(ns, r)
		succeededBefore := metricValue("capi_inplace_nodeupdate_duration_seconds", map[string]string{"updater": "ConfigMap", "result": "Succeeded"})
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Running", "Upgrade=Pending", "Finish=Pending"}))
		got := get(nu)
		Expect(got.Finalizers).To(ContainElement(inplacev1.NodeUpdateFinalizer))
		Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
		Expect(got.Status.CurrentStep).To(Equal("Prepare"))
		Expect(got.Status.Attempts).To(Equal(int32(1)))
		Expect(got.Status.StartTime).NotTo(BeNil())
		Expect(got.Status.Steps[0].StartTime).NotTo(BeNil())
		Expect(got.Status.Steps[0].Message).To(Equal("working on Prepare"))
		Expect(conditionOf(got, inplacev1.UpdaterAvailableCondition).Status).To(Equal(metav1.ConditionTrue))
		Expect(conditionOf(got, inplacev1.ReadyCondition).Reason).To(Equal(inplacev1.InProgressReason))
		Expect(conditionOf(got, inplacev1.ProgressingCondition).Status).To(Equal(metav1.ConditionTrue))
		Eventually(func() float64 {
			return metricValue("capi_inplace_nodeupdates_in_progress", map[string]string{"updater": "ConfigMap"})
		}, wait).Should(BeNumerically(">=", 1))

		u.openGate("Prepare")
		Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Succeeded", "Upgrade=Running", "Finish=Pending"}))
		got = get(nu)
		Expect(got.Status.CurrentStep).To(Equal("Upgrade"))
		Expect(got.Status.Steps[0].CompletionTime).NotTo(BeNil())
		Expect(got.Status.Steps[0].Message).To(Equal("Prepare done"))

		u.openGate("Upgrade")
		Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Succeeded", "Upgrade=Succeeded", "Finish=Running"}))
		Expect(get(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))

		u.openGate("Finish")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		got = get(nu)
		Expect(stepStates(nu)(Default)).To(Equal([]string{"Prepare=Succeeded", "Upgrade=Succeeded", "Finish=Succeeded"}))
		Expect(got.Status.CurrentStep).To(BeEmpty())
		Expect(got.Status.CompletionTime).NotTo(BeNil())
		Expect(got.Status.FailureReason).To(BeEmpty())
		Expect(conditionOf(got, inplacev1.ReadyCondition).Status).To(Equal(metav1.ConditionTrue))
		Expect(conditionOf(got, inplacev1.ReadyCondition).Reason).To(Equal(inplacev1.DoneReason))
		Expect(conditionOf(got, inplacev1.ProgressingCondition).Status).To(Equal(metav1.ConditionFalse))

		for _, step := range u.steps {
			Expect(u.count("run", step)).To(Equal(1), "step %s ran more than once", step)
		}
		Consistently(func() int { return u.count("done", "") }, 300*time.Millisecond).Should(Equal(1),
			"the updater is called again after the NodeUpdate succeeded")

		Eventually(eventsOf(nu), wait).Should(ContainElements(
			HavePrefix("Normal Started: updating node "+nu.Spec.NodeName+" to v1.36.3 with ConfigMap/updater"),
			"Normal StepStarted: step Prepare Running: working on Prepare",
			"Normal StepSucceeded: step Prepare Succeeded: Prepare done",
			"Normal StepStarted: step Upgrade Running: working on Upgrade",
			"Normal StepSucceeded: step Upgrade Succeeded: Upgrade done",
			"Normal StepStarted: step Finish Running: working on Finish",
			"Normal StepSucceeded: step Finish Succeeded: Finish done",
			HavePrefix("Normal Succeeded: node "+nu.Spec.NodeName+" reached v1.36.3"),
		))
		Expect(metricValue("capi_inplace_nodeupdate_duration_seconds", map[string]string{"updater": "ConfigMap", "result": "Succeeded"})).
			To(Equal(succeededBefore + 1))
	})

	It("reads a NodeUpdate that ended from the cache only: its later reconciles ask the API server nothing", func() {
		reads := &countingReader{Reader: k8s}
		r.APIReader = reads
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		for _, step := range u.steps {
			u.openGate(step)
		}
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		readsAtEnd := reads.gets(nu.Name)
		Expect(readsAtEnd).To(BeNumerically(">=", 1), "the NodeUpdate was read from the API server while it ran")
		reconciles := func() float64 {
			return metricValue("controller_runtime_reconcile_total", map[string]string{"controller": "nodeupdate", "result": "success"})
		}
		// A person's change of the metadata starts a reconcile (as the reconciler's own
		// write of the final phase did): it finds the NodeUpdate ended in the cache.
		before := reconciles()
		Expect(fixtures.Annotate(ctx, k8s, nu, "example.com/looked-at", "yes")).To(Succeed())
		Eventually(reconciles, wait).Should(BeNumerically(">", before))
		Consistently(func() int { return reads.gets(nu.Name) }, 300*time.Millisecond).Should(Equal(readsAtEnd),
			"a NodeUpdate that ended was read from the API server again")
		Expect(u.count("done", "")).To(Equal(1), "the updater was called again after the NodeUpdate succeeded")

		// Its deletion is still seen: the finalizer comes off and it is gone.
		Expect(k8s.Delete(ctx, nu)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{}))
		}, wait).Should(BeTrue())
	})

	It("calls the updater at once when its node changed (Wake), not only at its next poll", func() {
		u.pollAfter = time.Hour
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Running", "Upgrade=Pending", "Finish=Pending"}))
		// The reconciles the NodeUpdate's own first writes start (its phase) are over.
		Eventually(func() int {
			before := u.count("poll", "Prepare")
			time.Sleep(300 * time.Millisecond)
			return u.count("poll", "Prepare") - before
		}, wait).Should(BeZero())

		u.openGate("Prepare")
		// Another node of the Cluster, or the node of another Cluster, is not this one's.
		r.Wake(types.NamespacedName{Namespace: ns, Name: nu.Spec.ClusterName}, "another-node")
		r.Wake(types.NamespacedName{Namespace: ns, Name: "another-cluster"}, nu.Spec.NodeName)
		r.Wake(types.NamespacedName{Namespace: "another-namespace", Name: nu.Spec.ClusterName}, nu.Spec.NodeName)
		Consistently(stepStates(nu), 500*time.Millisecond).Should(Equal([]string{"Prepare=Running", "Upgrade=Pending", "Finish=Pending"}),
			"the updater is called before its poll for a change of another node")

		r.Wake(types.NamespacedName{Namespace: ns, Name: nu.Spec.ClusterName}, nu.Spec.NodeName)
		Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Succeeded", "Upgrade=Running", "Finish=Pending"}))
		Expect(u.count("poll", "Upgrade")).To(Equal(1))
	})

	It("reads the NodeUpdate from the API server before it calls the updater, so that an abort its cache has not seen stops the next step", func() {
		cache := &frozenNodeUpdates{Client: k8s}
		r.Client = cache
		startManager(ns, r)
		nu := startedNodeUpdate(ns)

		// The task's abort lands on the API server; the cache, as one whose watch lags,
		// still holds the copy the reconciler last wrote (issue #34): the step waits, and
		// nothing writes the NodeUpdate meanwhile.
		Consistently(func() string { return get(nu).ResourceVersion }, 300*time.Millisecond).Should(Equal(get(nu).ResourceVersion))
		Expect(cache.freeze(ctx, nu)).To(Succeed())
		got := get(nu)
		before := got.DeepCopy()
		got.Spec.Phase = inplacev1.TaskActionAbort
		Expect(k8s.Patch(ctx, got, client.MergeFrom(before))).To(Succeed())
		// A reconcile that read before the abort landed has called the updater by now.
		time.Sleep(200 * time.Millisecond)
		completed := u.count("complete", "Prepare")
		// The node's work is done: the updater would end the step and go on.
		u.openGate("Prepare")
		Eventually(func() inplacev1.NodeUpdatePhase { return get(nu).Status.Phase }, wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(u.count("complete", "Prepare")).To(Equal(completed), "the updater went on with an aborted NodeUpdate")
		Expect(u.count("run", "Upgrade")).To(BeZero(), "the step after Prepare was started on an aborted NodeUpdate")
	})

	It("reads the NodeUpdate from the API server after a status write failed, which may have landed all the same", func() {
		failing := &failingStatusWrites{Client: k8s}
		r.Client = failing
		// The first status write, the one that starts Prepare, lands and its answer is lost.
		failing.failNext.Store(true)
		startManager(ns, r)
		nu := startedNodeUpdate(ns)
		Expect(failing.failNext.Load()).To(BeFalse(), "the write was made")
		finishOnce(u, nu, ": the reconcile after the lost answer did not see it Pending")
	})

	It("reads the NodeUpdate from the API server while its client holds an older copy than the last write", func() {
		api := &nodeUpdateGets{Reader: k8s}
		r.Client, r.APIReader = &staleNodeUpdates{Client: k8s}, api
		startManager(ns, r)
		nu := startedNodeUpdate(ns)
		finishOnce(u, nu, ": the updater never saw it Pending again")
		Expect(api.count()).To(BeNumerically(">=", len(u.steps)), "every reconcile after a write read the API server")
	})

	It("retries a retryable error with a growing backoff, counting the attempts", func() {
		r.RetryBaseDelay = 200 * time.Millisecond
		r.RetryMaxDelay = 2 * time.Second
		startManager(ns, r)
		u.queueErrors("Upgrade", errors.New("apiserver hiccup 1"), errors.New("apiserver hiccup 2"), errors.New("apiserver hiccup 3"))
		u.openGate("Prepare")
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			g.Expect(got.Status.Attempts).To(Equal(int32(3)))
			g.Expect(got.Status.LastError).To(Equal("apiserver hiccup 2"))
			g.Expect(got.Status.NextRetryTime).NotTo(BeNil())
			g.Expect(got.Status.CurrentStep).To(Equal("Upgrade"))
			g.Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
			c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ProgressingCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(inplacev1.RetryingReason))
			g.Expect(c.Message).To(ContainSubstring("apiserver hiccup 2"))
		}, wait, 5*time.Millisecond).Should(Succeed())

		u.openGate("Upgrade")
		u.openGate("Finish")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))

		var tries []time.Time
		for _, c := range u.snapshot() {
			if c.step == "Upgrade" && (c.op == "error" || c.op == "complete") {
				tries = append(tries, c.at)
			}
		}
		Expect(tries).To(HaveLen(4), "three failed tries and the one that completed")
		var gaps []time.Duration
		for i := 1; i < len(tries); i++ {
			gaps = append(gaps, tries[i].Sub(tries[i-1]))
		}
		Expect(gaps[0]).To(BeNumerically(">=", 200*time.Millisecond))
		Expect(gaps[1]).To(BeNumerically(">=", 400*time.Millisecond))
		Expect(gaps[2]).To(BeNumerically(">=", 800*time.Millisecond))
		Expect(gaps[1]).To(BeNumerically(">", gaps[0]), "backoff must grow")
		Expect(gaps[2]).To(BeNumerically(">", gaps[1]), "backoff must grow")
		Expect(u.count("run", "Upgrade")).To(Equal(1), "a retry must not start the step's work again")

		got := get(nu)
		Expect(got.Status.Attempts).To(Equal(int32(1)), "attempts start again at 1 on the next step")
		Expect(got.Status.LastError).To(BeEmpty())
		Eventually(eventsOf(nu), wait).Should(ContainElements(
			MatchRegexp(`^Warning RetryScheduled: step Upgrade failed \(attempt 1 of 4\), trying again at .*: apiserver hiccup 1$`),
			MatchRegexp(`^Warning RetryScheduled: step Upgrade failed \(attempt 2 of 4\), trying again at .*: apiserver hiccup 2$`),
			MatchRegexp(`^Warning RetryScheduled: step Upgrade failed \(attempt 3 of 4\), trying again at .*: apiserver hiccup 3$`),
		))
	})

	It("waits out an unreachable workload API server until it answers, without using up the step's attempts", func() {
		r.RetryMaxDelay = 100 * time.Millisecond
		startManager(ns, r)
		// The errors a step really gets from an API server that is down: a List against
		// a port nothing listens on.
		closed, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		addr := closed.Addr().String()
		Expect(closed.Close()).To(Succeed())
		down, err := client.New(&rest.Config{Host: "https://" + addr, Timeout: time.Second}, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		var unreachable []error
		for range 8 {
			unreachable = append(unreachable, down.List(ctx, &corev1.NodeList{}))
		}
		Expect(unreachable[0]).To(MatchError(ContainSubstring("connection refused")))
		Expect(nodeupdater.IsUnreachable(unreachable[0])).To(BeTrue())
		u.queueErrors("Upgrade", unreachable...)
		u.openGate("Prepare")
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(func() int { return u.count("error", "Upgrade") }, wait).Should(Equal(8), "twice the bound of attempts")
		got := get(nu)
		Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
		Expect(got.Status.Attempts).To(BeNumerically("<=", 1), "an unreachable cluster uses up no attempt")
		Expect(got.Status.LastError).To(ContainSubstring("connection refused"))
		u.openGate("Upgrade")
		u.openGate("Finish")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		Expect(u.count("run", "Upgrade")).To(Equal(1), "waiting must not start the step's work again")
		Eventually(eventsOf(nu), wait).Should(ContainElement(
			MatchRegexp(`^Warning RetryScheduled: step Upgrade cannot reach its cluster, trying again at .* until the node's timeout: .*connection refused`)))
	})

	It("fails with RetriesExhausted when a step keeps failing", func() {
		startManager(ns, r)
		for i := 1; i <= 10; i++ {
			u.queueErrors("Prepare", fmt.Errorf("registry unreachable %d", i))
		}
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := get(nu)
		Expect(got.Status.FailureReason).To(Equal(inplacev1.RetriesExhaustedReason))
		Expect(got.Status.FailureMessage).To(Equal("step Prepare failed 4 times, last with: registry unreachable 4"))
		Expect(got.Status.Attempts).To(Equal(int32(4)))
		Expect(got.Status.CurrentStep).To(Equal("Prepare"))
		Expect(got.Status.NextRetryTime).To(BeNil())
		Expect(stepStates(nu)(Default)).To(Equal([]string{"Prepare=Failed", "Upgrade=Pending", "Finish=Pending"}))
		Expect(got.Status.AbortStartTime).NotTo(BeNil(), "the updater was asked to clean up")
		Consistently(func() int { return u.count("error", "Prepare") }, 400*time.Millisecond).Should(Equal(4))
		calls := u.snapshot()
		Expect(calls).NotTo(BeEmpty())
		last := calls[len(calls)-1]
		Expect(last.op).To(Equal("abort"), "Abort is the updater's last call, after the fourth error")
		Expect(u.count("abort", "")).To(Equal(1), "Abort is called until it reports done, and not after")
	})

	It("fails on a permanent error without retrying, and shows which step failed and why", func() {
		startManager(ns, r)
		failuresBefore := metricValue("capi_inplace_nodeupdate_step_failures_total", map[string]string{"updater": "ConfigMap", "step": "Upgrade"})
		u.openGate("Prepare")
		u.queueErrors("Upgrade", nodeupdater.Permanentf("IneligibleVersion", "cannot upgrade from v1.34.1 to v1.36.3: more than one minor version"))
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := get(nu)
		Expect(got.Status.FailureReason).To(Equal("IneligibleVersion"))
		Expect(got.Status.FailureMessage).To(Equal("cannot upgrade from v1.34.1 to v1.36.3: more than one minor version"))
		Expect(got.Status.Attempts).To(Equal(int32(1)))
		Expect(got.Status.CurrentStep).To(Equal("Upgrade"))
		Expect(got.Status.CompletionTime).NotTo(BeNil())
		Expect(stepStates(nu)(Default)).To(Equal([]string{"Prepare=Succeeded", "Upgrade=Failed", "Finish=Pending"}))
		Expect(got.Status.Steps[1].Message).To(Equal(got.Status.FailureMessage))
		ready := conditionOf(got, inplacev1.ReadyCondition)
		Expect(ready.Reason).To(Equal(inplacev1.FailedReason))
		Expect(ready.Message).To(Equal("step Upgrade failed (IneligibleVersion): cannot upgrade from v1.34.1 to v1.36.3: more than one minor version"))
		Expect(u.count("error", "Upgrade")).To(Equal(1))

		columns := kubectlGet(nu)
		Expect(columns).To(HaveKeyWithValue("Phase", "Failed"))
		Expect(columns).To(HaveKeyWithValue("Step", "Upgrade"))
		Expect(columns).To(HaveKeyWithValue("Reason", "IneligibleVersion"))
		Expect(columns).To(HaveKeyWithValue("Message", got.Status.FailureMessage))

		Eventually(eventsOf(nu), wait).Should(ContainElements(
			"Warning StepFailed: step Upgrade Failed: cannot upgrade from v1.34.1 to v1.36.3: more than one minor version",
			"Warning IneligibleVersion: step Upgrade failed (IneligibleVersion): cannot upgrade from v1.34.1 to v1.36.3: more than one minor version",
		))
		Expect(metricValue("capi_inplace_nodeupdate_step_failures_total", map[string]string{"updater": "ConfigMap", "step": "Upgrade"})).
			To(Equal(failuresBefore + 1))
		Eventually(func() float64 {
			return metricValue("capi_inplace_nodeupdates_failed", map[string]string{"updater": "ConfigMap"})
		}, wait).Should(BeNumerically(">=", 1))
		Consistently(func() int { return u.count("error", "Upgrade") + u.count("run", "Finish") }, 300*time.Millisecond).Should(Equal(1))
	})

	DescribeTable("times out, lets the updater clean up, and fails with TimedOut",
		func(updaterTimeout, defaultTimeout, expected time.Duration) {
			u.timeout = updaterTimeout
			u.abortAfter = 2
			r.DefaultTimeout = defaultTimeout
			startManager(ns, r)
			u.openGate("Prepare")
			nu := newNodeUpdate(ns, configRef)
			Expect(k8s.Create(ctx, nu)).To(Succeed())

			Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
			got := get(nu)
			Expect(got.Status.FailureReason).To(Equal(inplacev1.TimedOutReason))
			Expect(got.Status.FailureMessage).To(HavePrefix(fmt.Sprintf("node update did not finish within %s", expected.Round(time.Second))))
			Expect(got.Status.FailureMessage).To(ContainSubstring("step Upgrade was still running"))
			Expect(got.Status.CompletionTime.Sub(got.Status.StartTime.Time)).To(BeNumerically(">=", expected-time.Second),
				"timestamps are second-precise")
			Expect(got.Status.CurrentStep).To(Equal("Upgrade"))
			Expect(stepStates(nu)(Default)).To(Equal([]string{"Prepare=Succeeded", "Upgrade=Failed", "Finish=Pending"}))
			Expect(got.Status.Steps[1].Message).To(HavePrefix("timed out: node update did not finish within"))
			Expect(u.count("abort", "")).To(Equal(2), "Abort is called until it reports done, and not after")

			var firstAbort time.Time
			for _, c := range u.snapshot() {
				if c.op == "abort" {
					firstAbort = c.at
					break
				}
			}
			Expect(firstAbort).To(BeTemporally(">=", got.Status.StartTime.Add(expected)),
				"the updater was stopped before its time was up")
			Eventually(eventsOf(nu), wait).Should(ContainElements(
				HavePrefix("Warning TimedOut: node update did not finish within"),
				HavePrefix("Warning TimedOut: step Upgrade failed (TimedOut)"),
			))
		},
		Entry("the updater's own timeout", 1500*time.Millisecond, time.Hour, 1500*time.Millisecond),
		Entry("the reconciler's default when the updater sets none", time.Duration(0), 1200*time.Millisecond, 1200*time.Millisecond),
	)

	It("times out after the default of two hours, on the reconciler's clock", func() {
		fakeClock := clocktesting.NewFakeClock(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))
		r.Clock = fakeClock
		r.DefaultTimeout = 0 // the package default, 2h
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(stepStates(nu), wait).Should(ContainElement("Prepare=Running"))
		Expect(get(nu).Status.StartTime.Time).To(BeTemporally("==", fakeClock.Now()))

		fakeClock.Step(2*time.Hour - time.Minute)
		poke(nu)
		Consistently(phaseOf(nu), 300*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseInProgress))

		fakeClock.Step(time.Minute)
		poke(nu)
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := get(nu)
		Expect(got.Status.FailureReason).To(Equal(inplacev1.TimedOutReason))
		Expect(got.Status.FailureMessage).To(Equal("node update did not finish within 2h0m0s (started 2026-03-01T10:00:00Z); step Prepare was still running"))
		Expect(got.Status.CompletionTime.Time).To(BeTemporally("==", fakeClock.Now()))
	})

	DescribeTable("aborts at each step: the updater stops and cleans up, and no step runs after",
		func(completed int) {
			u.abortAfter = 2
			startManager(ns, r)
			for _, step := range u.steps[:completed] {
				u.openGate(step)
			}
			nu := newNodeUpdate(ns, configRef)
			Expect(k8s.Create(ctx, nu)).To(Succeed())
			abortedStep := u.steps[completed]
			Eventually(func(g Gomega) inplacev1.StepState {
				got := &inplacev1.NodeUpdate{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
				return nodeupdater.StepState(got, abortedStep)
			}, wait).Should(Equal(inplacev1.StepStateRunning))

			requestAbort(nu)

			Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
			var want []string
			for i, step := range u.steps {
				switch {
				case i < completed:
					want = append(want, step+"=Succeeded")
				case i == completed:
					want = append(want, step+"=Aborted")
				default:
					want = append(want, step+"=Pending")
				}
			}
			Expect(stepStates(nu)(Default)).To(Equal(want))
			got := get(nu)
			Expect(got.Status.CurrentStep).To(Equal(abortedStep))
			Expect(got.Status.FailureReason).To(BeEmpty())
			Expect(got.Status.AbortStartTime).NotTo(BeNil())
			Expect(conditionOf(got, inplacev1.ReadyCondition).Reason).To(Equal(inplacev1.AbortedReason))
			Expect(u.count("abort", abortedStep)).To(Equal(2))

			// Nothing of the update runs once the abort started.
			calls := u.snapshot()
			aborting := false
			for _, c := range calls {
				if c.op == "abort" {
					aborting = true
					continue
				}
				Expect(aborting).To(BeFalse(), "the updater's %s of step %s ran after the abort started", c.op, c.step)
			}
			for _, step := range u.steps {
				u.openGate(step)
			}
			Consistently(func() int { return len(u.snapshot()) }, 300*time.Millisecond).Should(Equal(len(calls)))
			Eventually(eventsOf(nu), wait).Should(ContainElements(
				"Normal Aborting: abort requested; stopping at a safe point and cleaning up",
				"Normal StepAborted: step "+abortedStep+" Aborted: aborted",
				"Normal Aborted: node update of "+nu.Spec.NodeName+" aborted",
			))
		},
		Entry("at the first step", 0),
		Entry("at the second step", 1),
		Entry("at the last step", 2),
	)

	// A NodeUpdate with no start time may still be held by the updater: the manager can
	// stop between the updater's first call and the status write (soak seed 510 left a
	// node held that way while a later task started a second NodeUpdate on it). So the
	// abort asks the updater, and never runs a step.
	It("asks the updater to clean up a NodeUpdate aborted before a start time was recorded, without running a step", func() {
		u.abortAfter = 2
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		nu.Spec.Phase = inplacev1.TaskActionAbort
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(get(nu).Status.StartTime).To(BeNil())
		Expect(u.count("abort", "")).To(Equal(2), "the phase went final only once Abort reported done")
		Consistently(func() int { return u.count("run", "") + u.count("poll", "") }, 300*time.Millisecond).Should(BeZero())
	})

	It("lets the updater clean up before a deleted NodeUpdate goes away", func() {
		u.abortAfter = 2
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(stepStates(nu), wait).Should(ContainElement("Prepare=Running"))
		Expect(k8s.Delete(ctx, nu)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{}))
		}, wait).Should(BeTrue())
		Expect(u.count("abort", "")).To(Equal(2))
	})

	It("says plainly when the updater's configuration object does not exist, and starts once it does", func() {
		startManager(ns, r)
		ref := inplacev1.UpdaterReference{Kind: "ConfigMap", Name: "not-yet"}
		nu := newNodeUpdate(ns, ref)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		want := "ConfigMap not-yet does not exist in namespace " + ns + ": create it, or name an existing ConfigMap in spec.updaterRef"
		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.UpdaterAvailableCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(inplacev1.UpdaterNotFoundReason))
			g.Expect(c.Message).To(Equal(want))
			g.Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhasePending))
			ready := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ReadyCondition)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Message).To(Equal(want))
		}, wait).Should(Succeed())
		Eventually(eventsOf(nu), wait).Should(ContainElement("Warning UpdaterNotFound: " + want))
		Consistently(func() int { return len(u.snapshot()) }, 300*time.Millisecond).Should(BeZero(),
			"the updater must not be called without its configuration")

		createUpdaterConfig(ns, "not-yet")
		Eventually(stepStates(nu), wait).Should(ContainElement("Prepare=Running"))
		Expect(conditionOf(get(nu), inplacev1.UpdaterAvailableCondition).Status).To(Equal(metav1.ConditionTrue))
		Eventually(eventsOf(nu), wait).Should(ContainElement("Normal UpdaterFound: ConfigMap not-yet is served by the manager"))
	})

	It("says plainly when no updater serves the kind", func() {
		startManager(ns, r)
		nu := newNodeUpdate(ns, inplacev1.UpdaterReference{Kind: "NoSuchUpgrader", Name: "default"})
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		want := "no updater serves kind NoSuchUpgrader: the manager runs ConfigMap, and no CRD labelled " +
			"inplace.cluster.x-k8s.io/node-updater=v1alpha1 (exactly one, or set updaterRef.apiGroup) serves it"
		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.UpdaterAvailableCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(inplacev1.UpdaterNotFoundReason))
			g.Expect(c.Message).To(Equal(want))
		}, wait).Should(Succeed())
		Eventually(eventsOf(nu), wait).Should(ContainElement("Warning UpdaterNotFound: " + want))
		Consistently(phaseOf(nu), 300*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhasePending))
		// One event for the condition, not one per recheck.
		Expect(eventsOf(nu)(Default)).To(HaveLen(1))
	})
})

var _ = Describe("NodeUpdate reconciler cleaning up after a failure", func() {
	var (
		ns string
		u  *scriptedUpdater
		r  *nodeupdater.Reconciler
	)
	const failure = "cannot upgrade from v1.34.1 to v1.36.3: more than one minor version"

	BeforeEach(func() {
		ns = newNamespace()
		createUpdaterConfig(ns, configRef.Name)
		u = newScriptedUpdater("Prepare", "Upgrade", "Finish")
		r = fastReconciler(u)
	})

	It("calls Abort after a permanent error and fails only once Abort reports done", func() {
		u.holdAbort()
		startManager(ns, r)
		u.openGate("Prepare")
		u.queueErrors("Upgrade", nodeupdater.Permanentf("IneligibleVersion", failure))
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
			g.Expect(got.Status.FailureReason).To(Equal("IneligibleVersion"))
			g.Expect(got.Status.FailureMessage).To(Equal(failure))
			g.Expect(got.Status.AbortStartTime).NotTo(BeNil())
			g.Expect(got.Status.CompletionTime).To(BeNil())
			progressing := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ProgressingCondition)
			g.Expect(progressing).NotTo(BeNil())
			g.Expect(progressing.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(progressing.Reason).To(Equal(inplacev1.AbortingReason))
			g.Expect(progressing.Message).To(Equal("IneligibleVersion: " + failure + "; waiting for the updater to clean up"))
			ready := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ReadyCondition)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(ready.Message).To(Equal(progressing.Message), "Ready says it is cleaning up after the failure too")
		}, wait).Should(Succeed())
		Expect(stepStates(nu)(Default)).To(Equal([]string{"Prepare=Succeeded", "Upgrade=Failed", "Finish=Pending"}))
		Consistently(phaseOf(nu), 300*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseInProgress),
			"the NodeUpdate is final only once Abort reports done")
		Expect(u.count("abort", "")).To(BeNumerically(">", 1), "Abort is called again until it reports done")

		u.releaseAbort()
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := get(nu)
		Expect(got.Status.FailureReason).To(Equal("IneligibleVersion"))
		Expect(got.Status.FailureMessage).To(Equal(failure))
		Expect(got.Status.CompletionTime).NotTo(BeNil())
		Expect(got.Status.CurrentStep).To(Equal("Upgrade"))
		Expect(conditionOf(got, inplacev1.ReadyCondition).Reason).To(Equal(inplacev1.FailedReason))
		aborts := u.count("abort", "")
		Consistently(func() int { return u.count("abort", "") }, 300*time.Millisecond).Should(Equal(aborts),
			"Abort is not called after it reported done")

		// Nothing of the update runs once the failure began its cleanup.
		aborting := false
		for _, c := range u.snapshot() {
			if c.op == "abort" {
				aborting = true
				continue
			}
			Expect(aborting).To(BeFalse(), "the updater's %s of step %s ran after the cleanup started", c.op, c.step)
		}
		Expect(u.count("error", "Upgrade")).To(Equal(1))
		Expect(u.count("run", "Finish")).To(BeZero())
		Eventually(eventsOf(nu), wait).Should(ContainElements(
			"Warning IneligibleVersion: "+failure+"; stopping the updater and cleaning up",
			"Warning IneligibleVersion: step Upgrade failed (IneligibleVersion): "+failure,
		))
	})

	It("tries a failing Abort again, showing its error, and stays not final until Abort goes through", func() {
		r.RetryBaseDelay = 300 * time.Millisecond
		u.queueAbortErrors(errors.New("delete SUC plan: connection reset"), errors.New("delete SUC plan: connection reset"))
		startManager(ns, r)
		u.openGate("Prepare")
		u.queueErrors("Upgrade", nodeupdater.Permanentf("IneligibleVersion", failure))
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
			g.Expect(got.Status.LastError).To(Equal("delete SUC plan: connection reset"))
			c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ProgressingCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(inplacev1.AbortingReason))
			g.Expect(c.Message).To(HaveSuffix("; the last attempt failed, trying again: delete SUC plan: connection reset"))
		}, wait).Should(Succeed())

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		Expect(u.count("abort", "")).To(Equal(3), "two failed calls of Abort and the one that went through")
		got := get(nu)
		Expect(got.Status.LastError).To(BeEmpty(), "the abort's error is forgotten once Abort went through")
		Expect(got.Status.FailureReason).To(Equal("IneligibleVersion"))
		Expect(got.Status.FailureMessage).To(Equal(failure))
		Eventually(eventsOf(nu), wait).Should(ContainElement(
			"Warning AbortFailed: abort on node " + nu.Spec.NodeName + " failed, trying again: delete SUC plan: connection reset"))
	})

	// abortWithConfigGone starts a NodeUpdate, deletes its updater's configuration once
	// its first step runs, waits until UpdaterAvailable says so, and asks for the abort.
	abortWithConfigGone := func() *inplacev1.NodeUpdate {
		GinkgoHelper()
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(stepStates(nu), wait).Should(ContainElement("Prepare=Running"))
		Expect(k8s.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: configRef.Name, Namespace: ns}})).To(Succeed())
		Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(get(nu).Status.Conditions, inplacev1.UpdaterAvailableCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		}, wait).Should(Succeed())
		got := get(nu)
		got.Spec.Phase = inplacev1.TaskActionAbort
		Expect(k8s.Update(ctx, got)).To(Succeed())
		return nu
	}

	It("asks the updater to clean up when its configuration was deleted after the node started, and ends only once Abort reports done", func() {
		// The updater works from what it recorded when the node started (the Harvester
		// updater's configuration snapshot): its Abort can still stop what runs on the
		// node, such as an armed reboot, which must not happen once the NodeUpdate ended.
		u.holdAbort()
		nu := abortWithConfigGone()

		Eventually(func() int { return u.count("abort", "") }, wait).Should(BeNumerically(">", 0), "the updater's Abort is called")
		Consistently(phaseOf(nu), 300*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseInProgress),
			"not final while the updater has not cleaned up")
		u.releaseAbort()
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
	})

	It("ends a NodeUpdate whose updater configuration is gone when its Abort fails, saying nothing was cleaned up", func() {
		u.queueAbortErrors(errors.New("no configuration recorded"))
		nu := abortWithConfigGone()
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(u.count("abort", "")).To(Equal(1))
		Eventually(eventsOf(nu), wait).Should(ContainElement(ContainSubstring("no configuration recorded")))
	})

	It("carries on cleaning up after a failure across a restart of the manager", func() {
		u.holdAbort()
		u.queueErrors("Prepare", nodeupdater.Permanentf("BadConfig", "the JobUpdater names no image"))
		first := startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
			g.Expect(got.Status.FailureReason).To(Equal("BadConfig"))
			g.Expect(got.Status.AbortStartTime).NotTo(BeNil())
		}, wait).Should(Succeed())
		Eventually(func() int { return u.count("abort", "") }, wait).Should(BeNumerically(">=", 1))
		const cleanupEvent = "Warning BadConfig: the JobUpdater names no image; stopping the updater and cleaning up"
		// Events are sent in the background: let the first manager's go out before it stops.
		Eventually(eventsOf(nu), wait).Should(ContainElement(cleanupEvent))
		first.stop()
		abortStarted := get(nu).Status.AbortStartTime
		abortsBefore := u.count("abort", "")

		startManager(ns, fastReconciler(u))
		Eventually(func() int { return u.count("abort", "") }, wait).Should(BeNumerically(">", abortsBefore),
			"the new manager goes on asking the updater to clean up")
		Expect(phaseOf(nu)(Default)).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
		u.releaseAbort()
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))

		got := get(nu)
		Expect(got.Status.FailureReason).To(Equal("BadConfig"))
		Expect(got.Status.FailureMessage).To(Equal("the JobUpdater names no image"))
		Expect(got.Status.AbortStartTime.Equal(abortStarted)).To(BeTrue(), "the cleanup's start survives the restart")
		Expect(stepStates(nu)(Default)).To(Equal([]string{"Prepare=Failed", "Upgrade=Pending", "Finish=Pending"}))
		Expect(u.count("error", "Prepare")).To(Equal(1), "the failed step is not tried again after the restart")
		Expect(u.count("run", "Upgrade")).To(BeZero())
		Eventually(eventsOf(nu), wait).Should(ContainElement(HavePrefix("Warning BadConfig: step Prepare failed")))
		cleanupEvents := 0
		for _, e := range eventsOf(nu)(Default) {
			if e == cleanupEvent {
				cleanupEvents++
			}
		}
		Expect(cleanupEvents).To(Equal(1), "the restart does not tell the start of the cleanup twice")
	})

	It("says why a NodeUpdate was aborted when spec.abortReason says it", func() {
		u.holdAbort()
		startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(stepStates(nu), wait).Should(ContainElement("Prepare=Running"))

		requestAbortFor(nu, inplacev1.MachineDeletedReason)
		const why = "the machine is being deleted (MachineDeleted)"
		Eventually(func(g Gomega) {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ProgressingCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(inplacev1.AbortingReason))
			g.Expect(c.Message).To(Equal("aborting: " + why + "; waiting for the updater to stop at a safe point and clean up"))
		}, wait).Should(Succeed())

		u.releaseAbort()
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		got := get(nu)
		Expect(got.Status.Steps[0].State).To(Equal(inplacev1.StepStateAborted))
		Expect(got.Status.Steps[0].Message).To(Equal("aborted: " + why))
		Expect(conditionOf(got, inplacev1.ReadyCondition).Message).To(Equal("the node update was aborted: " + why))
		Expect(conditionOf(got, inplacev1.ProgressingCondition).Message).To(Equal("the node update was aborted: " + why))
		Eventually(eventsOf(nu), wait).Should(ContainElements(
			"Normal Aborting: abort requested: "+why+"; stopping at a safe point and cleaning up",
			"Normal StepAborted: step Prepare Aborted: aborted: "+why,
			"Normal Aborted: node update of "+nu.Spec.NodeName+" aborted: "+why,
		))
	})
})

var _ = Describe("NodeUpdate reconciler across a restart of the manager", func() {
	It("carries on between steps without running any step twice", func() {
		ns := newNamespace()
		createUpdaterConfig(ns, configRef.Name)
		u := newScriptedUpdater("Prepare", "Upgrade", "Finish")
		first := startManager(ns, fastReconciler(u))
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		u.openGate("Prepare")
		Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Succeeded", "Upgrade=Running", "Finish=Pending"}))
		first.stop()
		callsWhileStopped := len(u.snapshot())
		startedAt := get(nu).Status.StartTime

		Consistently(func() int { return len(u.snapshot()) }, 200*time.Millisecond).Should(Equal(callsWhileStopped))
		startManager(ns, fastReconciler(u))
		u.openGate("Upgrade")
		u.openGate("Finish")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))

		for _, step := range u.steps {
			Expect(u.count("run", step)).To(Equal(1), "step %s ran %d times", step, u.count("run", step))
		}
		Expect(get(nu).Status.StartTime).To(Equal(startedAt), "the start time survives the restart")
		Eventually(eventsOf(nu), wait).Should(ContainElement(HavePrefix("Normal Succeeded:")))
		started := 0
		for _, e := range eventsOf(nu)(Default) {
			if len(e) > len("Normal Started:") && e[:len("Normal Started:")] == "Normal Started:" {
				started++
			}
		}
		Expect(started).To(Equal(1))
	})

	It("keeps the backoff of a retry across a restart", func() {
		ns := newNamespace()
		createUpdaterConfig(ns, configRef.Name)
		u := newScriptedUpdater("Upgrade")
		u.queueErrors("Upgrade", errors.New("transient"))
		u.openGate("Upgrade")
		r := fastReconciler(u)
		r.RetryBaseDelay = 1500 * time.Millisecond
		first := startManager(ns, r)
		nu := newNodeUpdate(ns, configRef)
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Eventually(func(g Gomega) *metav1.MicroTime {
			got := &inplacev1.NodeUpdate{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
			return got.Status.NextRetryTime
		}, wait).ShouldNot(BeNil())
		first.stop()
		next := get(nu).Status.NextRetryTime.Time

		r2 := fastReconciler(u)
		r2.RetryBaseDelay = 1500 * time.Millisecond
		startManager(ns, r2)
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		var completed time.Time
		for _, c := range u.snapshot() {
			if c.op == "complete" {
				completed = c.at
			}
		}
		Expect(completed).To(BeTemporally(">=", next), "the retry came before the backoff stored before the restart")
		Expect(u.count("error", "Upgrade")).To(Equal(1))
		Expect(u.count("run", "Upgrade")).To(Equal(1))
	})
})

// startedNodeUpdate creates a NodeUpdate of the test updater in ns and waits until its
// first step runs.
func startedNodeUpdate(ns string) *inplacev1.NodeUpdate {
	GinkgoHelper()
	nu := newNodeUpdate(ns, configRef)
	Expect(k8s.Create(ctx, nu)).To(Succeed())
	Eventually(stepStates(nu), wait).Should(Equal([]string{"Prepare=Running", "Upgrade=Pending", "Finish=Pending"}))
	return nu
}

// finishOnce opens every step of u, waits for nu to succeed and checks that each step's
// one-time work ran once; why says what that shows.
func finishOnce(u *scriptedUpdater, nu *inplacev1.NodeUpdate, why string) {
	GinkgoHelper()
	for _, step := range u.steps {
		u.openGate(step)
	}
	Eventually(func() inplacev1.NodeUpdatePhase { return get(nu).Status.Phase }, wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
	for _, step := range u.steps {
		Expect(u.count("run", step)).To(Equal(1), "step %s ran once%s", step, why)
	}
}
