package upgradetask

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
)

// gateMaxObjects is the bound of the CEL gates of the specs' managers.
const gateMaxObjects = 2

// startGateManager runs the controller with the real clock and health gates evaluated
// again every 200 ms, gate Jobs in namespace jobNamespace and CEL gates reading at most
// gateMaxObjects objects; its log lines go to logs as well.
func startGateManager(jobNamespace string, logs *logLines, annotationJobGates bool) (stop func()) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Logger:                 logs.logger(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	policy := healthgate.DefaultPolicy()
	policy.JobNamespace = jobNamespace
	policy.CELMaxObjects = gateMaxObjects
	policy.AnnotationJobGates = annotationJobGates
	// The specs' Prometheus servers listen on 127.0.0.1, which the default fence refuses
	// (controllers/healthgate/prometheus_test.go proves the refusal); everything else of
	// the default fence (https, the Secret's CA) stays.
	policy.Fetch.AllowLoopback = true
	return startReconciler(mgr, &Reconciler{Workload: SameCluster{Management: k8s}, PollInterval: 100 * time.Millisecond, GateInterval: 200 * time.Millisecond, GatePolicy: policy})
}

// logLines keeps a manager's log lines (up to V(4), where the gates' results are logged),
// and writes them to GinkgoWriter.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
		GinkgoWriter.Println(prefix, args)
	}, funcr.Options{Verbosity: 4})
}

func (l *logLines) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// gateJobs returns a function that lists the gate Jobs of the tasks of namespace ns,
// anywhere on the (workload) API server.
func gateJobs(ns string) func() []batchv1.Job {
	return func() []batchv1.Job {
		GinkgoHelper()
		jobs := &batchv1.JobList{}
		Expect(k8s.List(ctx, jobs, client.MatchingLabels{healthgate.JobTaskNamespaceLabel: ns})).To(Succeed())
		return jobs.Items
	}
}

func jobGate(name string, mutate func(*inplacev1.JobGate)) inplacev1.HealthGate {
	g := inplacev1.HealthGate{Name: name, Job: &inplacev1.JobGate{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "check", Image: "busybox", Command: []string{"sh", "-c", "exit 1"}}}}}}}
	if mutate != nil {
		mutate(g.Job)
	}
	return g
}

// healthConfigMap creates ConfigMap "health" (label gate=health) with data.healthy.
func healthConfigMap(ns, healthy string) {
	GinkgoHelper()
	Expect(k8s.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "health", Labels: map[string]string{"gate": "health"}},
		Data:       map[string]string{"healthy": healthy},
	})).To(Succeed())
}

func setHealthy(ns, healthy string) {
	GinkgoHelper()
	cm := &corev1.ConfigMap{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "health"}, cm)).To(Succeed())
	cm.Data["healthy"] = healthy
	Expect(k8s.Update(ctx, cm)).To(Succeed())
}

func celGate(ns, name, expression string) inplacev1.HealthGate {
	return inplacev1.HealthGate{Name: name, CEL: &inplacev1.CELGate{
		Resource:   inplacev1.GateResource{APIVersion: "v1", Kind: "ConfigMap", Namespace: ns, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"gate": "health"}}},
		Expression: expression,
	}}
}

func (w *world) gateStatus(task, gate string) inplacev1.HealthGateStatus {
	for _, g := range w.task(task).Status.Gates {
		if g.Name == gate {
			return g
		}
	}
	return inplacev1.HealthGateStatus{}
}

// printedColumns returns the task's row as the API server prints it for kubectl get:
// column name to cell.
func (w *world) printedColumns(task string) map[string]string {
	GinkgoHelper()
	hc, err := rest.HTTPClientFor(env.Config)
	Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		strings.TrimRight(env.Config.Host, "/")+fmt.Sprintf("/apis/inplace.cluster.x-k8s.io/v1alpha1/namespaces/%s/upgradetasks/%s", w.ns, task), nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	var table metav1.Table
	Expect(json.NewDecoder(resp.Body).Decode(&table)).To(Succeed())
	Expect(table.Rows).To(HaveLen(1))
	out := map[string]string{}
	for i, c := range table.ColumnDefinitions {
		out[c.Name] = fmt.Sprint(table.Rows[0].Cells[i])
	}
	return out
}

var _ = Describe("Health gates", func() {
	var stop func()
	// gateNS is where the spec's manager runs gate Jobs: the test API server is every
	// world's workload cluster, so each spec has its own.
	var gateNS string
	var logs *logLines
	BeforeEach(func() {
		gateNS = "gates-" + utilrand.String(6)
		logs = &logLines{}
		stop = startGateManager(gateNS, logs, false)
	})
	AfterEach(func() { stop() })

	It("pauses the task when a CEL gate turns red mid-roll, starts no further node, and resumes when it is green", func() {
		w := newMDWorld(2)
		healthConfigMap(w.ns, "true")
		rec := watchNodeUpdates(w.ns)
		simulate(w.ns, 2*time.Second)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{celGate(w.ns, "config-healthy", `objects.all(o, o.data.healthy == "true")`)}
		}))).To(Succeed())
		Eventually(func() int { return len(w.nodeUpdates()) }, timeout, poll).Should(Equal(1))
		Eventually(func() inplacev1.GateState { return w.gateStatus("md", "config-healthy").State }, timeout, poll).Should(Equal(inplacev1.GateGreen))

		// Red while the first node is in progress: that node goes on, the next does not start.
		setHealthy(w.ns, "false")
		Eventually(func() int32 { return w.task("md").Status.Upgraded }, timeout, poll).Should(Equal(int32(1)))
		Eventually(func() metav1.Condition { return condition(w.task("md").Status.Conditions, inplacev1.PausedCondition) }, timeout, poll).
			Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", inplacev1.GateRedReason),
				HaveField("Message", ContainSubstring(`gate config-healthy is red: objects.all(o, o.data.healthy == "true") is false over 1 ConfigMap object(s)`))))
		Expect(w.gateStatus("md", "config-healthy").State).To(Equal(inplacev1.GateRed))
		Eventually(func() []string { return w.events(inplacev1.GateRedReason) }, timeout, poll).
			Should(ContainElement(ContainSubstring("health gate config-healthy is red")))
		Eventually(func() map[string]string { return w.printedColumns("md") }, timeout, poll).
			Should(And(HaveKeyWithValue("Paused", inplacev1.GateRedReason), HaveKeyWithValue("Red Gates", "config-healthy")))
		Consistently(func() int { return len(w.nodeUpdates()) }, 2*time.Second, poll).Should(Equal(1))
		Expect(w.task("md").Status.Phase).To(Equal(inplacev1.TaskPhaseInProgress))

		setHealthy(w.ns, "true")
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Eventually(func() []string { return w.events(inplacev1.GateGreenReason) }, timeout, poll).
			Should(ContainElement(ContainSubstring("health gate config-healthy is green")))
		expectUpgraded(w, "md", rec, targetVersion)
	})

	It("holds a task whose Job gate failed, with the container's last log lines, starts nodes once a Job gate succeeded, and deletes the Job when the task ended", func() {
		w := newMDWorld(1)
		simulate(w.ns, 100*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Gates = []inplacev1.HealthGate{jobGate("smoke", nil)} }))).To(Succeed())

		// The Job runs in the operator's namespace, which capi-inplace created restricted,
		// under the ServiceAccount of its own, with what the restricted profile asks.
		name := healthgate.JobName("md", "smoke", 0)
		j := &batchv1.Job{}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKey{Namespace: gateNS, Name: name}, j) }, timeout, poll).Should(Succeed())
		Expect(j.Spec.Template.Spec.Containers[0].TerminationMessagePolicy).To(Equal(corev1.TerminationMessageFallbackToLogsOnError))
		Expect(j.Spec.Template.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))
		Expect(j.Spec.Template.Spec.ServiceAccountName).To(Equal(healthgate.JobServiceAccount))
		Expect(j.Spec.Template.Spec.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
		Expect(j.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation).To(Equal(ptr.To(false)))
		ns := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: gateNS}, ns)).To(Succeed())
		Expect(ns.Labels).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: gateNS, Name: healthgate.JobServiceAccount}, &corev1.ServiceAccount{})).To(Succeed())
		bindings := &rbacv1.RoleBindingList{}
		Expect(k8s.List(ctx, bindings, client.InNamespace(gateNS))).To(Succeed())
		Expect(bindings.Items).To(BeEmpty())
		Eventually(func() string { return w.gateStatus("md", "smoke").Message }, timeout, poll).Should(ContainSubstring("waiting for it to succeed"))

		// envtest runs no Job controller and no kubelet: the test writes what they would,
		// the Job's pod whose container failed with its log tail as termination message
		// (FallbackToLogsOnError), and the Job's failed count. The pod is the Job's
		// template, which the namespace's restricted profile admits.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: gateNS, Name: name + "-x1", Labels: map[string]string{batchv1.JobNameLabel: name}},
			Spec: *j.Spec.Template.Spec.DeepCopy()}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		pod.Status.Phase = corev1.PodFailed
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "check", Image: "busybox", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "volume pvc-1 degraded\ncheck failed"}}}}
		Expect(k8s.Status().Update(ctx, pod)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(j), j)).To(Succeed())
		j.Status.Failed = 1
		j.Status.StartTime = ptr.To(metav1.Now())
		Expect(k8s.Status().Update(ctx, j)).To(Succeed())

		Eventually(func() string { return w.gateStatus("md", "smoke").Message }, timeout, poll).
			Should(ContainSubstring("container check exited 1, last log lines:\nvolume pvc-1 degraded\ncheck failed"))
		Expect(condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Reason).To(Equal(inplacev1.GateRedReason))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())

		// An operator who fixed what the Job checks deletes it to run it now (the gate
		// also deletes a failed Job by itself after healthgate.JobRetryAfter): the gate
		// creates it again, and its success, as the Job controller writes it, is green.
		Expect(k8s.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground))).To(Succeed())
		Eventually(func() error {
			fresh := &batchv1.Job{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(j), fresh); err != nil {
				return err
			}
			if fresh.UID == j.UID {
				return fmt.Errorf("Job %s not created again yet", name)
			}
			fresh.Status.StartTime = ptr.To(metav1.Now())
			fresh.Status.Succeeded = 1
			return k8s.Status().Update(ctx, fresh)
		}, timeout, poll).Should(Succeed())
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
		Expect(w.gateStatus("md", "smoke").State).To(Equal(inplacev1.GateGreen))
		// The task ended: its last gate Job is not left on the workload cluster.
		Eventually(gateJobs(w.ns), timeout, poll).Should(BeEmpty())
	})

	It("refuses Job gates that would run outside the operator's namespace, as another ServiceAccount or with the node's privileges, creating nothing", func() {
		w := newMDWorld(1)
		simulate(w.ns, 100*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{
				jobGate("elsewhere", func(j *inplacev1.JobGate) { j.Namespace = "kube-system" }),
				jobGate("other-sa", func(j *inplacev1.JobGate) { j.Template.Spec.ServiceAccountName = "default" }),
				jobGate("host", func(j *inplacev1.JobGate) {
					j.Template.Spec.HostNetwork = true
					j.Template.Spec.HostPID = true
					j.Template.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
					j.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
				}),
				// Nothing of ours refuses root; the namespace's Pod Security admission does,
				// in the dry run before the Job would be created.
				jobGate("root", func(j *inplacev1.JobGate) {
					j.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(int64(0))}
				}),
			}
		}))).To(Succeed())

		Eventually(func() inplacev1.HealthGateStatus { return w.gateStatus("md", "elsewhere") }, timeout, poll).Should(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", Equal(fmt.Sprintf(`gate "elsewhere": job.namespace "kube-system" is not where gate Jobs run; leave job.namespace empty or set it to %q (the manager's --gate-job-namespace)`, gateNS)))))
		Expect(w.gateStatus("md", "other-sa")).To(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", ContainSubstring(`gate "other-sa": the Job's pod template asks for serviceAccountName "default"; gate Jobs run in namespace `+gateNS+` under Pod Security's restricted profile and the ServiceAccount capi-inplace-gate`))))
		Expect(w.gateStatus("md", "host")).To(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", ContainSubstring(`asks for hostNetwork, hostPID, the hostPath volume "root", a privileged container "check";`))))
		Eventually(func() inplacev1.HealthGateStatus { return w.gateStatus("md", "root") }, timeout, poll).Should(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", And(ContainSubstring("the workload cluster refuses the pod of Job "+gateNS+"/gate-md-root-0 (a dry run)"),
				ContainSubstring(`violates PodSecurity "restricted:latest"`), ContainSubstring("runAsUser=0"),
				ContainSubstring("make the template meet Pod Security's restricted profile")))))
		Consistently(gateJobs(w.ns), time.Second, poll).Should(BeEmpty())
		pods := &corev1.PodList{}
		Expect(k8s.List(ctx, pods, client.InNamespace(gateNS))).To(Succeed())
		Expect(pods.Items).To(BeEmpty())
		Expect(w.nodeUpdates()).To(BeEmpty())
	})

	It("restricts an existing gate namespace whose Pod Security was lowered, so that a privileged pod cannot start there, and deletes the gate Job of an aborted and of a deleted task", func() {
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gateNS,
			Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}})).To(Succeed())
		w := newMDWorld(1)
		simulate(w.ns, 100*time.Millisecond)
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Gates = []inplacev1.HealthGate{jobGate("smoke", nil)} }))).To(Succeed())
		Eventually(gateJobs(w.ns), timeout, poll).Should(HaveLen(1))
		ns := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: gateNS}, ns)).To(Succeed())
		Expect(ns.Labels).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))

		// The API server's Pod Security admission holds the namespace: a privileged,
		// host-mounting pod created there directly (as a Job controller would) is refused.
		privileged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: gateNS, Name: "privileged"}, Spec: corev1.PodSpec{
			HostPID:    true,
			Volumes:    []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}},
		}}
		err := k8s.Create(ctx, privileged)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create a privileged pod in %s: %v", gateNS, err)
		Expect(err.Error()).To(And(ContainSubstring(`violates PodSecurity "restricted:latest"`), ContainSubstring("privileged"), ContainSubstring("hostPath")))

		w.editTask("md", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionAbort })
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseAborted))
		Eventually(gateJobs(w.ns), timeout, poll).Should(BeEmpty())

		Expect(k8s.Create(ctx, w.mdTask("md-again", func(t *inplacev1.UpgradeTask) { t.Spec.Gates = []inplacev1.HealthGate{jobGate("smoke", nil)} }))).To(Succeed())
		Eventually(gateJobs(w.ns), timeout, poll).Should(ConsistOf(HaveField("Name", healthgate.JobName("md-again", "smoke", 0))))
		Expect(k8s.Delete(ctx, w.task("md-again"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "md-again"}, &inplacev1.UpgradeTask{}))
		}, timeout, poll).Should(BeTrue())
		Expect(gateJobs(w.ns)()).To(BeEmpty())
	})

	It("runs no Job gate of the Cluster's annotation unless the manager allows it", func() {
		w := newMDWorld(1)
		simulate(w.ns, 100*time.Millisecond)
		raw, err := json.Marshal([]inplacev1.HealthGate{jobGate("smoke", nil)})
		Expect(err).NotTo(HaveOccurred())
		setClusterGates(w.ns, string(raw))
		Expect(k8s.Create(ctx, w.mdTask("md"))).To(Succeed())
		Eventually(func() inplacev1.HealthGateStatus { return w.gateStatus("md", "smoke") }, timeout, poll).Should(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", Equal(`gate "smoke" is a Job gate of the Cluster's annotation inplace.cluster.x-k8s.io/gates, where the manager runs no Job gate unless started with --allow-annotation-job-gates; put the gate in the UpgradeTask's spec.gates, or make it a cel or prometheus gate`))))
		Consistently(gateJobs(w.ns), time.Second, poll).Should(BeEmpty())
		Expect(w.nodeUpdates()).To(BeEmpty())

		// A manager started with --allow-annotation-job-gates runs it.
		stop()
		stop = startGateManager(gateNS, logs, true)
		Eventually(gateJobs(w.ns), timeout, poll).Should(ConsistOf(HaveField("Name", healthgate.JobName("md", "smoke", 0))))
	})

	It("reads no value out through a CEL gate: a non-bool or a failure is named by its type, Secrets are denied and the objects read are bounded", func() {
		const secret = "s3cr3t-token-value"
		w := newMDWorld(1)
		healthConfigMap(w.ns, "true")
		Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "token", Labels: map[string]string{"gate": "health"}},
			Data: map[string]string{"healthy": "true", "token": secret}})).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "creds"}, StringData: map[string]string{"token": secret}})).To(Succeed())
		for i := range gateMaxObjects + 1 {
			Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: fmt.Sprintf("many-%d", i), Labels: map[string]string{"gate": "many"}}})).To(Succeed())
		}
		simulate(w.ns, 100*time.Millisecond)
		many := celGate(w.ns, "too-many", "true")
		many.CEL.Resource.Selector.MatchLabels = map[string]string{"gate": "many"}
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{
				celGate(w.ns, "as-value", `objects.filter(o, has(o.data.token))[0].data.token`),
				celGate(w.ns, "as-int", `objects.all(o, !has(o.data.token) || int(o.data.token) > 0)`),
				celGate(w.ns, "as-key", `objects.all(o, !has(o.data.token) || {"x": true}[o.data.token])`),
				{Name: "secrets", CEL: &inplacev1.CELGate{Resource: inplacev1.GateResource{APIVersion: "v1", Kind: "Secret", Namespace: w.ns}, Expression: `objects.all(s, s.data.token != "")`}},
				many,
				// Exactly the bound: read, and green.
				celGate(w.ns, "bounded", `objects.all(o, o.data.healthy == "true")`),
			}
		}))).To(Succeed())

		Eventually(func() []inplacev1.HealthGateStatus { return w.task("md").Status.Gates }, timeout, poll).Should(HaveLen(6))
		Expect(w.gateStatus("md", "as-value")).To(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", Equal("the CEL expression gave a string, not a bool; make it give true or false"))))
		for _, gate := range []string{"as-int", "as-key"} {
			Expect(w.gateStatus("md", gate)).To(And(HaveField("State", inplacev1.GateRed),
				HaveField("Message", And(ContainSubstring("the CEL expression failed on 2 ConfigMap object(s): "), ContainSubstring("the rest of the error is not shown")))), gate)
		}
		Expect(w.gateStatus("md", "secrets")).To(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", Equal("CEL gates may not read v1 Secret (the manager's --gate-cel-denied-kinds); read another kind that shows what the gate checks"))))
		Expect(w.gateStatus("md", "too-many")).To(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", Equal(fmt.Sprintf("the gate reads more than %d ConfigMap objects (the manager's --gate-cel-max-objects); narrow resource.namespace or resource.selector", gateMaxObjects)))))
		Expect(w.gateStatus("md", "bounded").State).To(Equal(inplacev1.GateGreen))

		// The value is nowhere an operator or a log reader sees it. (The events of one
		// task's gates with one reason are a series: the pause's event names every gate.)
		Eventually(func() []string { return w.events(inplacev1.GateRedReason) }, timeout, poll).
			Should(ContainElement(ContainSubstring("gate as-value is red: the CEL expression gave a string, not a bool")))
		Expect(w.events(inplacev1.GateRedReason)).NotTo(ContainElement(ContainSubstring(secret)))
		Expect(fmt.Sprint(w.task("md").Status)).NotTo(ContainSubstring(secret))
		Expect(logs.all()).To(ContainSubstring("health gate is red; no new node starts"))
		Expect(logs.all()).NotTo(ContainSubstring(secret))
		Expect(w.nodeUpdates()).To(BeEmpty())
	})

	It("adds the Cluster's gates to every task, the task's own gate winning, and names bad input as red gates", func() {
		w := newMDWorld(1)
		healthConfigMap(w.ns, "true")
		simulate(w.ns, 100*time.Millisecond)
		fromCluster := []inplacev1.HealthGate{
			celGate(w.ns, "shared", `objects.all(o, o.data.healthy == "false")`), // the task's own "shared" wins
			celGate(w.ns, "bad-cel", `objects.all(o, o.data.healthy ==`),
			{Name: "prom", Prometheus: &inplacev1.PrometheusGate{SecretRef: corev1.LocalObjectReference{Name: "no-such-secret"}, Alerts: []string{"NodeDown"}}},
		}
		raw, err := json.Marshal(fromCluster)
		Expect(err).NotTo(HaveOccurred())
		setClusterGates(w.ns, string(raw))
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{celGate(w.ns, "shared", `objects.all(o, o.data.healthy == "true")`)}
		}))).To(Succeed())

		Eventually(func() []inplacev1.HealthGateStatus { return w.task("md").Status.Gates }, timeout, poll).Should(HaveLen(3))
		Expect(w.gateStatus("md", "shared").State).To(Equal(inplacev1.GateGreen))
		Expect(w.gateStatus("md", "bad-cel")).To(And(HaveField("State", inplacev1.GateRed), HaveField("Message", ContainSubstring("the CEL expression does not compile: ERROR"))))
		Expect(w.gateStatus("md", "prom")).To(And(HaveField("State", inplacev1.GateRed),
			HaveField("Message", ContainSubstring(fmt.Sprintf("read Secret %s/no-such-secret of the Prometheus gate", w.ns)))))
		Expect(condition(w.task("md").Status.Conditions, inplacev1.PausedCondition).Message).To(And(ContainSubstring("gate bad-cel is red"), ContainSubstring("gate prom is red")))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())

		setClusterGates(w.ns, `[{"name": "x",`)
		Eventually(func() inplacev1.HealthGateStatus { return w.gateStatus("md", healthgate.AnnotationGateName) }, timeout, poll).
			Should(And(HaveField("State", inplacev1.GateRed), HaveField("Message", And(
				ContainSubstring("annotation inplace.cluster.x-k8s.io/gates of Cluster "+w.ns+"/harvester is not a JSON list of gates"),
				ContainSubstring("fix it (a JSON list of gates as in UpgradeTask spec.gates) or remove it")))))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())

		setClusterGates(w.ns, "")
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
	})

	It("reads alerts and instant queries from the Prometheus HTTP API", func() {
		// A small server that answers as Prometheus's documented HTTP API does
		// (https://prometheus.io/docs/prometheus/latest/querying/api/): recorded response
		// shapes of GET /api/v1/alerts and GET /api/v1/query, not a real Prometheus. `make
		// check-real-prometheus` (controllers/healthgate/realprometheus_test.go) checks
		// these shapes against Prometheus 3.16.0.
		var firing atomic.Bool
		firing.Store(true)
		var auth atomic.Value
		auth.Store("")
		// Over https with the server's CA in the Secrets, as the manager's default fence
		// (internal/fence) requires.
		srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			if user, password, basic := req.BasicAuth(); basic {
				if user != "alice" || password != "alice123" {
					// As a Prometheus with basic_auth_users in its --web.config.file answers a
					// wrong password: HTTP 401 with the text body "Unauthorized\n"
					// (exporter-toolkit@v0.20.0 web/handler.go; seen from Prometheus 3.16.0 by
					// make check-real-prometheus).
					http.Error(rw, http.StatusText(http.StatusUnauthorized), http.StatusUnauthorized)
					return
				}
			} else {
				auth.Store(req.Header.Get("Authorization"))
			}
			rw.Header().Set("Content-Type", "application/json")
			switch req.URL.Path {
			case "/api/v1/alerts":
				state := "firing"
				if !firing.Load() {
					state = "pending"
				}
				_, _ = io.WriteString(rw, `{"status":"success","data":{"alerts":[{"labels":{"alertname":"LonghornVolumeDegraded","severity":"warning"},"annotations":{"summary":"degraded"},"state":"`+state+`","activeAt":"2026-11-27T22:00:00Z","value":"1e+00"}]}}`)
			case "/api/v1/query":
				if req.URL.Query().Get("query") != `up{job="node"} == 0` {
					rw.WriteHeader(http.StatusBadRequest)
					_, _ = io.WriteString(rw, `{"status":"error","errorType":"bad_data","error":"unexpected query"}`)
					return
				}
				result := `[]`
				if firing.Load() {
					result = `[{"metric":{"__name__":"up","instance":"n1:9100","job":"node"},"value":[1764280800.123,"0"]}]`
				}
				_, _ = io.WriteString(rw, `{"status":"success","data":{"resultType":"vector","result":`+result+`}}`)
			default:
				rw.WriteHeader(http.StatusNotFound)
			}
		}))
		DeferCleanup(srv.Close)
		ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))

		w := newMDWorld(1)
		simulate(w.ns, 100*time.Millisecond)
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "prom"},
			StringData: map[string]string{"address": srv.URL, "token": "s3cret", "ca.crt": ca}})).To(Succeed())
		basicAuth := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "prom-basic"},
			StringData: map[string]string{"address": srv.URL, "username": "alice", "password": "wrong", "ca.crt": ca}}
		Expect(k8s.Create(ctx, basicAuth)).To(Succeed())
		ref := corev1.LocalObjectReference{Name: "prom"}
		Expect(k8s.Create(ctx, w.mdTask("md", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{
				{Name: "alerts", Prometheus: &inplacev1.PrometheusGate{SecretRef: ref, Alerts: []string{"LonghornVolumeDegraded"}}},
				{Name: "nodes-up", Prometheus: &inplacev1.PrometheusGate{SecretRef: ref, Query: `up{job="node"} == 0`}},
				{Name: "basic-auth", Prometheus: &inplacev1.PrometheusGate{SecretRef: corev1.LocalObjectReference{Name: "prom-basic"}, Alerts: []string{"LonghornVolumeDegraded"}}},
			}
		}))).To(Succeed())
		Eventually(func() string { return w.gateStatus("md", "alerts").Message }, timeout, poll).Should(Equal("alert(s) firing: LonghornVolumeDegraded"))
		Eventually(func() string { return w.gateStatus("md", "nodes-up").Message }, timeout, poll).
			Should(Equal(`query "up{job=\"node\"} == 0" returns 1 series, for example {__name__="up",instance="n1:9100",job="node"}`))
		Eventually(func() string { return w.gateStatus("md", "basic-auth").Message }, timeout, poll).
			Should(Equal("GET " + srv.URL + "/api/v1/alerts: HTTP 401, not a Prometheus API response: Unauthorized"))
		Expect(auth.Load()).To(Equal("Bearer s3cret"))
		Consistently(func() int { return len(w.nodeUpdates()) }, time.Second, poll).Should(BeZero())

		// The right password: the gate reads the alerts.
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(basicAuth), basicAuth)).To(Succeed())
		basicAuth.Data["password"] = []byte("alice123")
		Expect(k8s.Update(ctx, basicAuth)).To(Succeed())
		Eventually(func() string { return w.gateStatus("md", "basic-auth").Message }, timeout, poll).Should(Equal("alert(s) firing: LonghornVolumeDegraded"))
		firing.Store(false)
		Eventually(w.phaseOf("md"), timeout, poll).Should(Equal(inplacev1.TaskPhaseCompleted))
	})
})

// setClusterGates sets (or, with "", removes) the Cluster's gates annotation.
func setClusterGates(ns, value string) {
	GinkgoHelper()
	c := &clusterv1.Cluster{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "harvester"}, c)).To(Succeed())
	patch := client.MergeFrom(c.DeepCopy())
	if value == "" {
		delete(c.Annotations, inplacev1.GatesAnnotation)
	} else {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[inplacev1.GatesAnnotation] = value
	}
	Expect(k8s.Patch(ctx, c, patch)).To(Succeed())
}
