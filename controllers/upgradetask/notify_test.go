package upgradetask

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/fence"
	"github.com/capi-inplace/capi-inplace/internal/notify"
)

// webhookReceiver is a notification webhook that records every call, and answers the
// first failFirst calls with 503.
type webhookReceiver struct {
	*httptest.Server
	mu        sync.Mutex
	failFirst int
	calls     []receivedCall
}

type receivedCall struct {
	status        int
	body          string
	authorization string
}

func newWebhookReceiver(failFirst int) *webhookReceiver {
	rc := &webhookReceiver{failFirst: failFirst}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		status := http.StatusOK
		if len(rc.calls) < rc.failFirst {
			status = http.StatusServiceUnavailable
		}
		rc.calls = append(rc.calls, receivedCall{status: status, body: string(body), authorization: r.Header.Get("Authorization")})
		w.WriteHeader(status)
	}))
	DeferCleanup(rc.Close)
	return rc
}

func (rc *webhookReceiver) recorded() []receivedCall {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]receivedCall(nil), rc.calls...)
}

// delivered returns the JSON events of the calls answered 200, in order.
func (rc *webhookReceiver) delivered() []notify.Event {
	GinkgoHelper()
	var out []notify.Event
	for _, c := range rc.recorded() {
		if c.status != http.StatusOK {
			continue
		}
		var ev notify.Event
		Expect(json.Unmarshal([]byte(c.body), &ev)).To(Succeed(), "body %s", c.body)
		out = append(out, ev)
	}
	return out
}

func eventTypes(evs []notify.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

// startManagerNotifying runs the UpgradeTask controller with a notification dispatcher
// that waits 10ms, doubled, between attempts, and lets webhooks be plain http on
// loopback (as --allow-http-fetch and --allow-loopback-fetch do): the receivers here are
// http servers on loopback.
func startManagerNotifying() (stop func()) {
	GinkgoHelper()
	mgr := newManager()
	notifier := notify.New(mgr.GetAPIReader(), mgr.GetEventRecorder("upgradetask-notify"), nil)
	notifier.BaseDelay = 10 * time.Millisecond
	notifier.Fetch = fence.Policy{AllowHTTP: true, AllowLoopback: true}
	Expect(mgr.Add(notifier)).To(Succeed())
	r := &Reconciler{
		Workload:     SameCluster{Management: k8s},
		PollInterval: 100 * time.Millisecond,
		Notifier:     notifier,
	}
	return startReconciler(mgr, r)
}

func webhookSecret(ns, name string, data map[string]string) {
	GinkgoHelper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: data}
	Expect(k8s.Create(ctx, s)).To(Succeed())
}

func counter(name string, labels map[string]string) float64 {
	GinkgoHelper()
	if m := metricSample(name, labels); m != nil {
		return m.GetCounter().GetValue()
	}
	return 0
}

var _ = Describe("UpgradeTask notifications", func() {
	BeforeEach(func() {
		DeferCleanup(startManagerNotifying())
	})

	It("tells the webhook, once each and in order, that the task started, paused, resumed, a node failed, and the task failed", func() {
		rc := newWebhookReceiver(0)
		w := newMDWorld(3)
		webhookSecret(w.ns, "hook", map[string]string{"url": rc.URL, "token": "s3cret"})
		sim := simulate(w.ns, 3*time.Second)
		sim.KeepNodesReady()
		sim.FailMachine("workers-2", "rke2 upgrade job failed: BackoffLimitExceeded")
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Notify = &inplacev1.NotifySpec{SecretRef: inplacev1.LocalSecretReference{Name: "hook"}}
		}))).To(Succeed())

		// Paused (as a red gate pauses it) while its first node runs, and resumed once
		// that node is done.
		Eventually(func() inplacev1.MachineState { return w.machineStatus("md", "workers-1").State }, timeout, poll).Should(Equal(inplacev1.MachineStateInProgress))
		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Paused = true })
		Eventually(func() string { return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Reason }, timeout, poll).Should(Equal(inplacev1.PausedByUserReason))
		Eventually(func() inplacev1.MachineState { return w.machineStatus("md", "workers-1").State }, timeout, poll).Should(Equal(inplacev1.MachineStateUpgraded))
		Expect(w.nodeUpdateOf("workers-2")).To(BeNil(), "no node starts while the task is paused")
		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Paused = false })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseFailed))

		want := []string{notify.TaskStarted, notify.TaskPaused, notify.TaskResumed, notify.NodeFailed, notify.TaskFailed}
		Eventually(func() []string { return eventTypes(rc.delivered()) }, timeout, poll).Should(Equal(want))
		Consistently(func() int { return len(rc.recorded()) }, time.Second, poll).Should(Equal(len(want)), "each change is told once, not once per reconcile")

		evs := rc.delivered()
		for _, ev := range evs {
			Expect(ev.Namespace).To(Equal(w.ns))
			Expect(ev.Cluster).To(Equal("harvester"))
			Expect(ev.Task).To(Equal("md"))
			Expect(ev.Version).To(Equal(targetVersion))
			Expect(ev.Time.IsZero()).To(BeFalse())
		}
		for _, c := range rc.recorded() {
			Expect(c.authorization).To(Equal("Bearer s3cret"))
		}
		Expect(evs[0].Phase).To(Equal(string(inplacev1.TaskPhaseInProgress)))
		Expect(evs[0].Progress).To(Equal("0/3"))
		Expect(evs[1].Reason).To(Equal(inplacev1.PausedByUserReason))
		Expect(evs[1].Message).To(ContainSubstring("spec.paused"))
		Expect(evs[2].Reason).To(Equal(inplacev1.PausedByUserReason))
		Expect(evs[3].Machine).To(Equal("workers-2"))
		Expect(evs[3].Node).To(Equal(w.node(1)))
		Expect(evs[3].Message).To(Equal("rke2 upgrade job failed: BackoffLimitExceeded"))
		Expect(evs[3].Progress).To(Equal("1/3"))
		Expect(evs[4].Phase).To(Equal(string(inplacev1.TaskPhaseFailed)))
		Expect(evs[4].Message).To(Equal("machine workers-2 (node " + w.node(1) + ") failed: rke2 upgrade job failed: BackoffLimitExceeded"))
		Expect(evs[4].Progress).To(Equal("1/3"))
	})

	It("sends Slack bodies to the webhook of the Cluster's annotation, retried until the webhook takes them, and counts the failures and the deliveries", func() {
		rc := newWebhookReceiver(2)
		w := newMDWorld(1)
		webhookSecret(w.ns, "slack", map[string]string{"url": rc.URL, "format": "Slack"})
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c := &clusterv1.Cluster{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "harvester"}, c); err != nil {
				return err
			}
			c.Annotations = map[string]string{inplacev1.NotifySecretAnnotation: "slack"}
			return k8s.Update(ctx, c)
		})).To(Succeed())
		startedFailed := counter("capi_inplace_notification_attempts_total", map[string]string{"event": notify.TaskStarted, "result": notify.AttemptFailed})
		startedDelivered := counter("capi_inplace_notifications_total", map[string]string{"event": notify.TaskStarted, "result": notify.ResultDelivered})
		completedDelivered := counter("capi_inplace_notifications_total", map[string]string{"event": notify.TaskCompleted, "result": notify.ResultDelivered})
		simulate(w.ns, 300*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))

		startedText := `{"text":"Cluster ` + w.ns + `/harvester, UpgradeTask md to ` + targetVersion + `: started (0/1 upgraded)"}`
		completedText := `{"text":"Cluster ` + w.ns + `/harvester, UpgradeTask md to ` + targetVersion + `: completed (1/1 upgraded)"}`
		Eventually(func() []receivedCall { return rc.recorded() }, timeout, poll).Should(Equal([]receivedCall{
			{status: http.StatusServiceUnavailable, body: startedText},
			{status: http.StatusServiceUnavailable, body: startedText},
			{status: http.StatusOK, body: startedText},
			{status: http.StatusOK, body: completedText},
		}))
		Expect(counter("capi_inplace_notification_attempts_total", map[string]string{"event": notify.TaskStarted, "result": notify.AttemptFailed}) - startedFailed).To(Equal(2.0))
		Expect(counter("capi_inplace_notifications_total", map[string]string{"event": notify.TaskStarted, "result": notify.ResultDelivered}) - startedDelivered).To(Equal(1.0))
		Expect(counter("capi_inplace_notifications_total", map[string]string{"event": notify.TaskCompleted, "result": notify.ResultDelivered}) - completedDelivered).To(Equal(1.0))
	})

	It("says with a Warning event which Secret to create when it is missing, and the upgrade goes on", func() {
		w := newMDWorld(1)
		simulate(w.ns, 300*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Notify = &inplacev1.NotifySpec{SecretRef: inplacev1.LocalSecretReference{Name: "absent"}}
		}))).To(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Eventually(func() []string { return w.events(inplacev1.NotificationNotConfiguredReason) }, timeout, poll).Should(ContainElement(
			`TaskStarted notification not sent: Secret ` + w.ns + `/absent not found; create it with the keys "url" (required), optionally "token", "headers", "ca.crt", "format"; the upgrade goes on`))
	})
})
