package kubeadmupdater_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/kubeadmupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

const (
	wait    = 15 * time.Second
	from    = "v1.35.4"
	to      = "v1.36.3"
	cluster = "kubeadm-cluster"
)

var jobSteps = []string{kubeadmupdater.StepFetch, kubeadmupdater.StepUpgrade, kubeadmupdater.StepKubelet}

var _ = Describe("KubeadmUpdater", func() {
	var (
		ns      string // the management namespace of the Cluster, its NodeUpdates and the KubeadmUpdater
		jobNS   string // the namespace of the workload cluster the Jobs run in
		podNS   string // the namespace of the workload's own pods
		updater *inplacev1.KubeadmUpdater
		// policy is the drain policy newNodeUpdate gives, as the task's would.
		policy *inplacev1.DrainPolicy
	)

	BeforeEach(func() {
		ns = newNamespace("mgmt")
		policy = nil
		jobNS = newNamespace("workload")
		podNS = newNamespace("apps")
		updater = &inplacev1.KubeadmUpdater{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm", Namespace: ns},
			Spec: inplacev1.KubeadmUpdaterSpec{
				Source:    inplacev1.KubeadmBinarySource{Packages: &inplacev1.KubeadmPackagesSource{}},
				Namespace: jobNS,
			},
		}
	})

	// newNode creates a Ready Node of the workload cluster at version, a control plane
	// node when cp.
	newNode := func(cp bool, version string) string {
		GinkgoHelper()
		name := fmt.Sprintf("node-%d", seq.Add(1))
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if cp {
			n.Labels[kubeadmupdater.ControlPlaneLabel] = ""
		}
		Expect(k8s.Create(ctx, n)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, n) })
		n.Status.NodeInfo.KubeletVersion = version
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		Expect(k8s.Status().Update(ctx, n)).To(Succeed())
		return name
	}

	getNode := func(name string) *corev1.Node {
		GinkgoHelper()
		n := &corev1.Node{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
		return n
	}

	newNodeUpdate := func(node string) *inplacev1.NodeUpdate {
		GinkgoHelper()
		nu := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-nu", Namespace: ns},
			Spec: inplacev1.NodeUpdateSpec{
				ClusterName: cluster,
				MachineName: node + "-machine",
				NodeName:    node,
				Version:     to,
				UpdaterRef:  inplacev1.UpdaterReference{Kind: inplacev1.KubeadmUpdaterKind, Name: updater.Name},
				DrainPolicy: policy,
			},
		}
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		return nu
	}

	start := func() {
		GinkgoHelper()
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, cluster)
		startManager(ns, nil)
	}

	getNU := func(nu *inplacev1.NodeUpdate) *inplacev1.NodeUpdate {
		GinkgoHelper()
		got := &inplacev1.NodeUpdate{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
		return got
	}
	phaseOf := func(nu *inplacev1.NodeUpdate) func() inplacev1.NodeUpdatePhase {
		return func() inplacev1.NodeUpdatePhase { return getNU(nu).Status.Phase }
	}
	stepOf := func(nu *inplacev1.NodeUpdate, step string) func() inplacev1.NodeUpdateStep {
		return func() inplacev1.NodeUpdateStep {
			if s := nodeupdater.Step(getNU(nu), step); s != nil {
				return *s
			}
			return inplacev1.NodeUpdateStep{}
		}
	}

	// askAbort asks for the NodeUpdate's abort, as the task does (spec.phase Abort).
	askAbort := func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		Expect(fixtures.AskAbort(ctx, k8s, client.ObjectKeyFromObject(nu))).To(Succeed())
	}

	// jobKey is the Job of a step; it needs the NodeUpdate's UID.
	jobKey := func(nu *inplacev1.NodeUpdate, step string) client.ObjectKey {
		return client.ObjectKey{Namespace: jobNS, Name: kubeadmupdater.JobName(getNU(nu), step)}
	}
	jobExists := func(nu *inplacev1.NodeUpdate, step string) func() bool {
		return func() bool {
			err := k8s.Get(ctx, jobKey(nu, step), &batchv1.Job{})
			Expect(client.IgnoreNotFound(err)).To(Succeed())
			return err == nil
		}
	}
	waitForJob := func(nu *inplacev1.NodeUpdate, step string) *batchv1.Job {
		GinkgoHelper()
		job := &batchv1.Job{}
		Eventually(func() error { return k8s.Get(ctx, jobKey(nu, step), job) }, wait).Should(Succeed())
		return job
	}
	ourJobs := func(nu *inplacev1.NodeUpdate) []string {
		GinkgoHelper()
		jobs := &batchv1.JobList{}
		Expect(k8s.List(ctx, jobs, client.MatchingLabels{kubeadmupdater.NodeUpdateUIDLabel: string(getNU(nu).UID)})).To(Succeed())
		var steps []string
		for _, j := range jobs.Items {
			steps = append(steps, j.Labels[kubeadmupdater.StepLabel])
		}
		return steps
	}

	// finishJob plays the Job controller and the kubelet for the step's Job: its pod, with
	// the node program's termination message when it fails, and the Job's end in its
	// status (kubeletReports plays the restarted kubelet). envtest runs neither controller
	// nor kubelet.
	finishJob := func(nu *inplacev1.NodeUpdate, step string, succeed bool, words string) {
		GinkgoHelper()
		job := waitForJob(nu, step)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: jobNS, Name: job.Name + "-x1", Labels: job.Spec.Template.Labels},
			Spec:       *job.Spec.Template.Spec.DeepCopy(),
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		exit := int32(0)
		pod.Status.Phase = corev1.PodSucceeded
		if !succeed {
			exit = int32(nodeprogram.ExitFailed)
			pod.Status.Phase = corev1.PodFailed
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: kubeadmupdater.ContainerName, Image: pod.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error", Message: words}}}}
		Expect(k8s.Status().Update(ctx, pod)).To(Succeed())

		now := metav1.Now()
		job.Status.StartTime = &now
		if succeed {
			job.Status.Succeeded = 1
			job.Status.CompletionTime = &now
			job.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastTransitionTime: now, LastProbeTime: now},
				{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastTransitionTime: now, LastProbeTime: now},
			}
		} else {
			job.Status.Failed = 1
			msg := "Container kubeadm for pod " + jobNS + "/" + pod.Name + " failed with exit code 1 matching FailJob rule at index 0"
			job.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "PodFailurePolicy", Message: msg, LastTransitionTime: now, LastProbeTime: now},
				{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "PodFailurePolicy", Message: msg, LastTransitionTime: now, LastProbeTime: now},
			}
		}
		Expect(k8s.Status().Update(ctx, job)).To(Succeed())
	}

	// kubeletReports writes what the node's kubelet reports: its version and Ready.
	kubeletReports := func(node, version string, ready bool) {
		GinkgoHelper()
		Eventually(func() error {
			n := getNode(node)
			n.Status.NodeInfo.KubeletVersion = version
			n.Status.Conditions[0].Status = map[bool]corev1.ConditionStatus{true: corev1.ConditionTrue, false: corev1.ConditionFalse}[ready]
			return k8s.Status().Update(ctx, n)
		}, wait).Should(Succeed())
	}

	// workloadPod creates a pod of a ReplicaSet on node, as the scheduler would have placed it.
	workloadPod := func(node, name string, labels map[string]string) *corev1.Pod {
		GinkgoHelper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: name, Labels: labels, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f", UID: types.UID("rs-" + name), Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "web", Image: "nginx:1.29"}}},
		}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		// Running and Ready, as its kubelet reports it: the Eviction API lets a Pending
		// pod go whatever its budget says (kubernetes pkg/registry/core/pod/storage
		// eviction.go, canIgnorePDB).
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		Expect(k8s.Status().Update(ctx, p)).To(Succeed())
		return p
	}

	// kubeletConfirms deletes a pod that is terminating, as its kubelet would once its
	// containers stopped.
	kubeletConfirms := func(p *corev1.Pod) {
		GinkgoHelper()
		Eventually(func() bool {
			got := &corev1.Pod{}
			return k8s.Get(ctx, client.ObjectKeyFromObject(p), got) == nil && !got.DeletionTimestamp.IsZero()
		}, wait).Should(BeTrue(), "the pod is evicted")
		Expect(k8s.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
	}

	cordoned := func(node string) bool { return getNode(node).Spec.Unschedulable }

	// theSequence runs a node through every step, checking at each Job's end which Jobs
	// exist and whether the node is cordoned, and returns the NodeUpdate at the end.
	theSequence := func(cp bool) {
		start()
		node := newNode(cp, from)
		pod := workloadPod(node, "web-1", nil)
		stays := []*corev1.Pod{
			{ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "proxy-x1", OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: "proxy", UID: "ds-proxy", Controller: ptr.To(true)}}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "etcd-" + node, Annotations: map[string]string{"kubernetes.io/config.mirror": "abc"}}},
		}
		for _, p := range stays {
			p.Spec = corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}
			Expect(k8s.Create(ctx, p)).To(Succeed())
		}
		nu := newNodeUpdate(node)

		job := waitForJob(nu, kubeadmupdater.StepFetch)
		Expect(ourJobs(nu)).To(ConsistOf(kubeadmupdater.StepFetch), "one step at a time")
		Expect(cordoned(node)).To(BeFalse())
		spec := job.Spec.Template.Spec
		Expect(spec.NodeName).To(Equal(node))
		Expect(spec.HostPID).To(BeTrue())
		Expect(spec.Tolerations).To(Equal([]corev1.Toleration{{Operator: corev1.TolerationOpExists}}))
		Expect(spec.Volumes[0].HostPath.Path).To(Equal("/"))
		c := spec.Containers[0]
		Expect(c.Image).To(Equal("ghcr.io/capi-inplace/capi-inplace:v0.0.0-test"), "the manager's node image by default")
		Expect(c.Command).To(Equal([]string{nodeprogram.Binary}))
		Expect(c.Args).To(Equal([]string{"node", "kubeadm", "fetch", "--version", to, "--source", "packages"}))
		Expect(*c.SecurityContext.Privileged).To(BeTrue())
		Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "host-root", MountPath: "/host"}))
		Consistently(jobExists(nu, kubeadmupdater.StepUpgrade), 300*time.Millisecond).Should(BeFalse(), "Upgrade waits for Fetch")
		finishJob(nu, kubeadmupdater.StepFetch, true, "")

		job = waitForJob(nu, kubeadmupdater.StepUpgrade)
		role := "worker"
		if cp {
			role = "control-plane"
			// Asked the ledger before kubeadm restarted the static pods.
			lease := &coordinationv1.Lease{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: disruption.LedgerName(cluster)}, lease)).To(Succeed())
			Expect(lease.Annotations[disruption.LedgerAnnotation]).To(ContainSubstring(`"node":"` + node + `"`))
		}
		Expect(job.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"node", "kubeadm", "upgrade", "--version", to, "--role", role}))
		Expect(cordoned(node)).To(BeFalse(), "not cordoned before kubeadm's upgrade")
		Consistently(jobExists(nu, kubeadmupdater.StepKubelet), 300*time.Millisecond).Should(BeFalse())
		Expect(cordoned(node)).To(BeFalse(), "not cordoned while kubeadm's upgrade runs")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")

		Eventually(func() bool { return cordoned(node) }, wait).Should(BeTrue(), "Drain cordons")
		Expect(getNode(node).Annotations).To(HaveKeyWithValue(nodedrain.CordonedByAnnotation, string(getNU(nu).UID)))
		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepDrain)().Message }, wait).Should(ContainSubstring("leaving: " + podNS + "/web-1"))
		Expect(jobExists(nu, kubeadmupdater.StepKubelet)()).To(BeFalse(), "the kubelet waits for the drain")
		kubeletConfirms(pod)

		job = waitForJob(nu, kubeadmupdater.StepKubelet)
		for _, p := range stays {
			got := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			Expect(got.DeletionTimestamp).To(BeNil(), "DaemonSet and mirror pods stay: %s", p.Name)
		}
		// The Kubelet Job is created in the reconcile that ends the drain; its status is
		// written right after.
		Eventually(stepOf(nu, kubeadmupdater.StepDrain), wait).Should(HaveField("State", inplacev1.StepStateSucceeded))
		Expect(job.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"node", "kubeadm", "kubelet", "--version", to, "--source", "packages", "--unit", "kubelet"}))
		Expect(cordoned(node)).To(BeTrue(), "cordoned while the kubelet restarts")
		finishJob(nu, kubeadmupdater.StepKubelet, true, "")

		// Still cordoned while the node does not report the target kubelet, then while
		// it is not Ready.
		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepUncordon)().Message }, wait).Should(
			Equal("waiting for node " + node + " to report kubelet " + to + " and Ready (it reports kubelet " + from + ", Ready true)"))
		Consistently(func() bool { return cordoned(node) }, 300*time.Millisecond).Should(BeTrue())
		kubeletReports(node, to, false)
		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepUncordon)().Message }, wait).Should(HaveSuffix("(it reports kubelet " + to + ", Ready false)"))
		Consistently(func() bool { return cordoned(node) }, 300*time.Millisecond).Should(BeTrue())
		kubeletReports(node, to, true)

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		n := getNode(node)
		Expect(n.Spec.Unschedulable).To(BeFalse(), "uncordoned at the end")
		Expect(n.Annotations).NotTo(HaveKey(nodedrain.CordonedByAnnotation))
		got := getNU(nu)
		var names []string
		for _, s := range got.Status.Steps {
			names = append(names, s.Name)
			Expect(s.State).To(Equal(inplacev1.StepStateSucceeded), "step %s", s.Name)
			Expect(s.Message).NotTo(BeEmpty())
		}
		Expect(names).To(Equal([]string{"Fetch", "Upgrade", "Drain", "Kubelet", "Uncordon"}))
		for i := 1; i < len(got.Status.Steps); i++ {
			Expect(got.Status.Steps[i].StartTime.Before(got.Status.Steps[i-1].CompletionTime)).To(BeFalse(),
				"step %s starts after %s ended", got.Status.Steps[i].Name, got.Status.Steps[i-1].Name)
		}
		Expect(nodeupdater.Step(got, kubeadmupdater.StepUncordon).Message).To(Equal("node " + node + " runs kubelet " + to + " and is Ready; uncordoned"))
	}

	It("takes a worker through Fetch, Upgrade, Drain, Kubelet and Uncordon, cordoned only from Drain to Uncordon", func() {
		theSequence(false)
	})

	It("takes a control plane node through the same steps, asking the ledger before kubeadm's upgrade", func() {
		theSequence(true)
	})

	DescribeTable("a failed Job ends the node Failed with the tool's own words, starts nothing after it and lifts our cordon",
		func(failAt string) {
			start()
			node := newNode(false, from)
			nu := newNodeUpdate(node)
			words := "kubeadm upgrade node: exit status 1: [ERROR CoreDNSUnsupportedPlugins]: there are unsupported plugins in the CoreDNS Corefile"
			for _, step := range jobSteps {
				if step != failAt {
					finishJob(nu, step, true, "")
					continue
				}
				finishJob(nu, step, false, words)
				break
			}
			Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
			got := getNU(nu)
			Expect(got.Status.FailureReason).To(Equal(failAt + "Failed"))
			Expect(got.Status.FailureMessage).To(ContainSubstring(words))
			Expect(got.Status.FailureMessage).To(ContainSubstring("container kubeadm of pod"))
			Expect(got.Status.CurrentStep).To(Equal(failAt))
			Expect(nodeupdater.Step(got, failAt).State).To(Equal(inplacev1.StepStateFailed))
			after := false
			for _, s := range got.Status.Steps {
				if after {
					Expect(s.State).To(Equal(inplacev1.StepStatePending), "step %s after the failed one", s.Name)
				}
				after = after || s.Name == failAt
			}
			Consistently(func() []string { return ourJobs(nu) }, 500*time.Millisecond).Should(ConsistOf(failAt),
				"no Job after the failed one; the failed one stays for its logs, the ones that succeeded are deleted")
			n := getNode(node)
			Expect(n.Spec.Unschedulable).To(BeFalse())
			Expect(n.Annotations).NotTo(HaveKey(nodedrain.CordonedByAnnotation))
		},
		Entry("at Fetch", kubeadmupdater.StepFetch),
		Entry("at Upgrade", kubeadmupdater.StepUpgrade),
		Entry("at Kubelet, after the cordon", kubeadmupdater.StepKubelet),
	)

	It("on abort during the kubelet Job waits for it to end, then deletes the Jobs and uncordons", func() {
		start()
		node := newNode(false, from)
		nu := newNodeUpdate(node)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")
		waitForJob(nu, kubeadmupdater.StepKubelet)
		Eventually(stepOf(nu, kubeadmupdater.StepKubelet), wait).Should(HaveField("State", inplacev1.StepStateRunning))
		Expect(cordoned(node)).To(BeTrue())

		askAbort(nu)
		Eventually(func() *metav1.MicroTime { return getNU(nu).Status.AbortStartTime }, wait).ShouldNot(BeNil())
		Consistently(func(g Gomega) {
			g.Expect(jobExists(nu, kubeadmupdater.StepKubelet)()).To(BeTrue(), "a running Job is not killed half-way")
			g.Expect(getNU(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
			g.Expect(cordoned(node)).To(BeTrue(), "the kubelet is still being replaced")
		}, time.Second, 50*time.Millisecond).Should(Succeed())
		Expect(stepOf(nu, kubeadmupdater.StepKubelet)().Message).To(ContainSubstring("aborting: waiting for Job " + jobKey(nu, kubeadmupdater.StepKubelet).String() + " to end"))

		finishJob(nu, kubeadmupdater.StepKubelet, true, "")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(ourJobs(nu)).To(BeEmpty(), "every Job of the node deleted")
		Expect(cordoned(node)).To(BeFalse(), "our cordon lifted")
		got := getNU(nu)
		Expect(nodeupdater.Step(got, kubeadmupdater.StepKubelet).State).To(Equal(inplacev1.StepStateAborted))
		Expect(nodeupdater.Step(got, kubeadmupdater.StepUncordon).State).To(Equal(inplacev1.StepStatePending))
	})

	It("on abort during Fetch waits for its Job, then starts no other", func() {
		updater.Spec.Source = inplacev1.KubeadmBinarySource{URL: &inplacev1.KubeadmURLSource{
			SHA256: inplacev1.KubeadmChecksums{Kubeadm: strings.Repeat("a", 64), Kubelet: strings.Repeat("b", 64), Kubectl: strings.Repeat("c", 64)}}}
		start()
		node := newNode(false, from)
		nu := newNodeUpdate(node)
		job := waitForJob(nu, kubeadmupdater.StepFetch)
		Expect(job.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"node", "kubeadm", "fetch", "--version", to,
			"--source", "url", "--url-template", inplacev1.DefaultKubeadmURLTemplate,
			"--sha256", "kubeadm=" + strings.Repeat("a", 64), "--sha256", "kubelet=" + strings.Repeat("b", 64), "--sha256", "kubectl=" + strings.Repeat("c", 64)}))
		askAbort(nu)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Consistently(func() []string { return ourJobs(nu) }, 500*time.Millisecond).Should(BeEmpty(), "no Upgrade Job after the abort")
	})

	It("holds the drain on a PodDisruptionBudget, naming the pod, and goes on once the budget allows it", func() {
		start()
		node := newNode(false, from)
		pod := workloadPod(node, "db-0", map[string]string{"app": "db"})
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "db"},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
		}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		// What the disruption controller would write: the pod is the only healthy one.
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, DisruptionsAllowed: 0}
		Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
		nu := newNodeUpdate(node)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")

		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepDrain)().Message }, wait).Should(And(
			ContainSubstring("held by a PodDisruptionBudget: "+podNS+"/db-0"),
			ContainSubstring("disruption budget db"),
		))
		Consistently(jobExists(nu, kubeadmupdater.StepKubelet), 500*time.Millisecond).Should(BeFalse(), "the kubelet is not touched while pods are held")
		Expect(getNU(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))

		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb)).To(Succeed())
		pdb.Status.DisruptionsAllowed = 1
		Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
		kubeletConfirms(pod)
		waitForJob(nu, kubeadmupdater.StepKubelet)
	})

	// heldPod creates a Running pod on node that a PodDisruptionBudget of its own keeps
	// there (no disruption allowed, as the disruption controller would write for its only
	// healthy pod), and returns the pod and its budget.
	heldPod := func(node, name string, labels map[string]string) (*corev1.Pod, *policyv1.PodDisruptionBudget) {
		GinkgoHelper()
		labels["app"] = name
		pod := workloadPod(node, name, labels)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: name},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}},
		}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
		return pod, pdb
	}

	// The task's drain policy (its spec.drainPolicy or the Cluster's annotation), which the
	// Harvester updater follows too (nodedrain.ApplyPolicy).
	It("under drainPolicy Skip puts a node whose drain stays blocked back: uncordoned, its Jobs deleted, Skipped, the kubelet untouched", func() {
		policy = &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeSkip, GracePeriod: &metav1.Duration{Duration: time.Second}}
		start()
		node := newNode(false, from)
		heldPod(node, "db-0", map[string]string{})
		nu := newNodeUpdate(node)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")

		Eventually(func() string {
			c := meta.FindStatusCondition(getNU(nu).Status.Conditions, inplacev1.DrainBlockedCondition)
			if c == nil {
				return ""
			}
			return c.Reason
		}, wait).Should(Equal(inplacev1.SkipPendingReason), "the block is seen and the skip announced")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSkipped))
		got := getNU(nu)
		c := meta.FindStatusCondition(got.Status.Conditions, inplacev1.DrainBlockedCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Reason).To(Equal(inplacev1.NodeSkippedReason))
		Expect(c.Message).To(And(ContainSubstring("drainPolicy Skip: the drain of node "+node+" was blocked for more than 1s by "+podNS+"/db-0"),
			ContainSubstring("kubeadm's upgrade of the node ran before the drain and stays")))
		Expect(cordoned(node)).To(BeFalse(), "put back: our cordon lifted")
		Expect(ourJobs(nu)).To(BeEmpty(), "the Jobs of the node are deleted")
		Consistently(jobExists(nu, kubeadmupdater.StepKubelet), 500*time.Millisecond).Should(BeFalse(), "the kubelet is never touched")
	})

	It("under drainPolicy Evict deletes the pods that keep the drain blocked after the grace period, never Longhorn's, and goes on", func() {
		policy = &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeEvict, GracePeriod: &metav1.Duration{Duration: time.Second}}
		start()
		node := newNode(false, from)
		db, _ := heldPod(node, "db-0", map[string]string{})
		im, imBudget := heldPod(node, "instance-manager-x", map[string]string{"longhorn.io/component": "instance-manager"})
		nu := newNodeUpdate(node)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")

		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepDrain)().Message }, wait).Should(
			ContainSubstring("drainPolicy Evict: the pods other than Longhorn's are deleted"), "announced before the grace period ends")
		kubeletConfirms(db)
		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepDrain)().Message }, wait).Should(
			ContainSubstring("drainPolicy Evict never deletes Longhorn's pods (" + podNS + "/instance-manager-x)"))
		Consistently(func() bool {
			got := &corev1.Pod{}
			return k8s.Get(ctx, client.ObjectKeyFromObject(im), got) == nil && got.DeletionTimestamp.IsZero()
		}, time.Second, 100*time.Millisecond).Should(BeTrue(), "Longhorn's pod is neither deleted nor evicted while its budget keeps it")
		Expect(jobExists(nu, kubeadmupdater.StepKubelet)()).To(BeFalse(), "the node still holds for Longhorn's pod")

		By("Longhorn lets its budget go: the drain evicts the pod and the node goes on")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(imBudget), imBudget)).To(Succeed())
		imBudget.Status.DisruptionsAllowed = 1
		Expect(k8s.Status().Update(ctx, imBudget)).To(Succeed())
		kubeletConfirms(im)
		waitForJob(nu, kubeadmupdater.StepKubelet)
	})

	// An abort while the drain is held by a budget, under each drain policy: the node is
	// put back at once (nothing of the node's runs: kubeadm's Jobs ended before the
	// drain), and what the policy would have done after its grace period (delete the held
	// pods, or skip the node) is never done.
	DescribeTable("on abort while its drain is held, ends at once: uncordoned, its Jobs deleted, the held pod left, the kubelet untouched",
		func(mode inplacev1.DrainMode, held func(nu *inplacev1.NodeUpdate) bool) {
			grace := 2 * time.Second
			if mode != "" {
				policy = &inplacev1.DrainPolicy{Mode: mode, GracePeriod: &metav1.Duration{Duration: grace}}
			}
			start()
			node := newNode(false, from)
			db, _ := heldPod(node, "db-0", map[string]string{})
			nu := newNodeUpdate(node)
			finishJob(nu, kubeadmupdater.StepFetch, true, "")
			finishJob(nu, kubeadmupdater.StepUpgrade, true, "")
			Eventually(func() bool { return held(getNU(nu)) }, wait).Should(BeTrue(), "the drain is held")
			Expect(cordoned(node)).To(BeTrue())

			askAbort(nu)
			Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
			Expect(cordoned(node)).To(BeFalse(), "our cordon lifted")
			Expect(getNode(node).Annotations).NotTo(HaveKey(nodedrain.CordonedByAnnotation))
			Expect(ourJobs(nu)).To(BeEmpty(), "every Job of the node deleted")
			got := getNU(nu)
			Expect(nodeupdater.Step(got, kubeadmupdater.StepDrain).State).To(Equal(inplacev1.StepStateAborted))
			Expect(nodeupdater.Step(got, kubeadmupdater.StepKubelet).State).To(Equal(inplacev1.StepStatePending))
			Consistently(func(g Gomega) {
				pod := &corev1.Pod{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(db), pod)).To(Succeed())
				g.Expect(pod.DeletionTimestamp.IsZero()).To(BeTrue(), "the held pod was deleted after the abort")
				g.Expect(cordoned(node)).To(BeFalse(), "cordoned again after the abort")
				g.Expect(jobExists(nu, kubeadmupdater.StepKubelet)()).To(BeFalse(), "the kubelet touched after the abort")
				g.Expect(getNU(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseAborted))
			}, grace+time.Second, 100*time.Millisecond).Should(Succeed(), "past the policy's grace period")
		},
		Entry("the default policy (Hold)", inplacev1.DrainMode(""), func(nu *inplacev1.NodeUpdate) bool {
			return strings.Contains(stepMessage(nu, kubeadmupdater.StepDrain), "held by a PodDisruptionBudget: "+podNS+"/db-0")
		}),
		Entry("drainPolicy Evict, inside its grace period", inplacev1.DrainModeEvict, func(nu *inplacev1.NodeUpdate) bool {
			return strings.Contains(stepMessage(nu, kubeadmupdater.StepDrain), "they are deleted, their budgets ignored")
		}),
		Entry("drainPolicy Skip, the skip announced", inplacev1.DrainModeSkip, func(nu *inplacev1.NodeUpdate) bool {
			c := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition)
			return c != nil && c.Reason == inplacev1.SkipPendingReason
		}),
	)

	// UpgradePreview asks the updater what a node's upgrade would disrupt now: the drain's
	// own rules, and the API server's eviction code in a dry run for the budgets.
	It("previews the pods its drain could not empty now, evicting nothing", func() {
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, cluster)
		u := newUpdater(k8s, k8s)
		node := newNode(false, from)
		held, _ := heldPod(node, "db-0", map[string]string{})
		free := workloadPod(node, "web-1", nil)
		orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "orphan"},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "nginx:1.29"}}}}
		Expect(k8s.Create(ctx, orphan)).To(Succeed())

		d, err := u.PreviewDisruption(ctx, nodeupdater.PreflightTarget{Namespace: ns, ClusterName: cluster, NodeName: node, Version: to,
			UpdaterRef: inplacev1.UpdaterReference{Kind: inplacev1.KubeadmUpdaterKind, Name: updater.Name}})
		Expect(err).NotTo(HaveOccurred())
		Expect(d.BlockingPods).To(ConsistOf(
			And(HaveField("Name", "db-0"), HaveField("Reason", ContainSubstring("disruption budget db-0"))),
			And(HaveField("Name", "orphan"), HaveField("Reason", "the drain refuses it: no controller would recreate it; delete it or give it one")),
		))
		for _, p := range []*corev1.Pod{held, free, orphan} {
			got := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			Expect(got.DeletionTimestamp.IsZero()).To(BeTrue(), "pod %s is not evicted by a preview", p.Name)
		}
	})

	It("fails the drain after drain.timeout, naming the held pods, and lifts our cordon", func() {
		updater.Spec.Drain.Timeout = &metav1.Duration{Duration: time.Second}
		start()
		node := newNode(false, from)
		workloadPod(node, "db-0", map[string]string{"app": "db"})
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "db"},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
		}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())
		nu := newNodeUpdate(node)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := getNU(nu)
		Expect(got.Status.FailureReason).To(Equal("DrainTimedOut"))
		Expect(got.Status.FailureMessage).To(ContainSubstring("was not drained within drain.timeout 1s; held by a PodDisruptionBudget: " + podNS + "/db-0"))
		Expect(jobExists(nu, kubeadmupdater.StepKubelet)()).To(BeFalse())
		Expect(cordoned(node)).To(BeFalse())
	})

	It("skips to Uncordon for a node whose kubelet runs the target already, and leaves a cordon that is not ours", func() {
		start()
		node := newNode(false, to)
		n := getNode(node)
		n.Spec.Unschedulable = true
		Expect(k8s.Update(ctx, n)).To(Succeed())
		nu := newNodeUpdate(node)
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		got := getNU(nu)
		for _, s := range got.Status.Steps[:4] {
			Expect(s.State).To(Equal(inplacev1.StepStateSkipped), "step %s", s.Name)
			Expect(s.Message).To(Equal("node " + node + " already runs kubelet " + to))
		}
		Expect(ourJobs(nu)).To(BeEmpty())
		Expect(cordoned(node)).To(BeTrue(), "someone else's cordon stays")
	})

	It("holds the drain while someone else's cordon is on the node, and takes the node once it is lifted", func() {
		start()
		node := newNode(false, from)
		n := getNode(node)
		n.Spec.Unschedulable = true
		Expect(k8s.Update(ctx, n)).To(Succeed())
		nu := newNodeUpdate(node)
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")
		Eventually(func() string { return stepOf(nu, kubeadmupdater.StepDrain)().Message }, wait).Should(
			Equal("holding: node " + node + " is cordoned by someone else; uncordon it to let it be upgraded"))
		Consistently(jobExists(nu, kubeadmupdater.StepKubelet), 300*time.Millisecond).Should(BeFalse())
		Expect(getNode(node).Annotations).NotTo(HaveKey(nodedrain.CordonedByAnnotation), "someone else's cordon is not taken as ours")

		n = getNode(node)
		n.Spec.Unschedulable = false
		Expect(k8s.Update(ctx, n)).To(Succeed())
		waitForJob(nu, kubeadmupdater.StepKubelet)
		Expect(getNode(node).Annotations).To(HaveKeyWithValue(nodedrain.CordonedByAnnotation, string(getNU(nu).UID)))
	})

	It("starts no Job when called for a NodeUpdate whose abort was asked", func() {
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, cluster)
		node := newNode(false, from)
		nu := newNodeUpdate(node) // no manager runs: the updater is called directly
		got := getNU(nu)
		got.Spec.Phase = inplacev1.TaskActionAbort
		_, err := newUpdater(k8s, k8s).Reconcile(ctx, got)
		Expect(err).NotTo(HaveOccurred())
		Expect(ourJobs(nu)).To(BeEmpty())
		Expect(nodeupdater.StepState(got, kubeadmupdater.StepFetch)).To(Equal(inplacev1.StepStatePending))
	})

	It("runs the image source's binaries through two init containers and --source dir", func() {
		updater.Spec.Image = "registry.example.com/capi-inplace:v0.9.0"
		updater.Spec.KubeletUnit = "kubelet.service"
		updater.Spec.Source = inplacev1.KubeadmBinarySource{Image: &inplacev1.KubeadmImageSource{Image: "registry.example.com/k8s-binaries:v1.36.3", Path: "/usr/bin"}}
		start()
		node := newNode(false, from)
		nu := newNodeUpdate(node)
		spec := waitForJob(nu, kubeadmupdater.StepFetch).Spec.Template.Spec
		Expect(spec.Containers[0].Image).To(Equal("registry.example.com/capi-inplace:v0.9.0"))
		Expect(spec.Containers[0].Args).To(Equal([]string{"node", "kubeadm", "fetch", "--version", to, "--source", "dir", "--dir", "/kubeadm-binaries"}))
		Expect(spec.InitContainers).To(HaveLen(2))
		Expect(spec.InitContainers[0].Image).To(Equal("registry.example.com/capi-inplace:v0.9.0"))
		Expect(spec.InitContainers[1].Image).To(Equal("registry.example.com/k8s-binaries:v1.36.3"))
		Expect(spec.InitContainers[1].Command).To(Equal([]string{"/kubeadm-binaries" + nodeprogram.Binary}))
		Expect(spec.InitContainers[1].Args).To(Equal([]string{"node", "copy-files", "--to=/kubeadm-binaries",
			"--file=/usr/bin/kubeadm", "--file=/usr/bin/kubelet", "--file=/usr/bin/kubectl"}))
		finishJob(nu, kubeadmupdater.StepFetch, true, "")
		Expect(waitForJob(nu, kubeadmupdater.StepUpgrade).Spec.Template.Spec.InitContainers).To(BeEmpty(), "kubeadm upgrade takes the installed kubeadm")
		finishJob(nu, kubeadmupdater.StepUpgrade, true, "")
		args := waitForJob(nu, kubeadmupdater.StepKubelet).Spec.Template.Spec.Containers[0].Args
		Expect(args).To(HaveExactElements("node", "kubeadm", "kubelet", "--version", to, "--source", "dir", "--dir", "/kubeadm-binaries", "--unit", "kubelet.service"))
	})

	It("validates its configuration and fills in defaults", func() {
		none := updater.DeepCopy()
		none.Name = "none"
		none.Spec.Source = inplacev1.KubeadmBinarySource{}
		err := k8s.Create(ctx, none)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("set exactly one of packages, url and image"))

		two := updater.DeepCopy()
		two.Name = "two"
		two.Spec.Source.Image = &inplacev1.KubeadmImageSource{Image: "registry.example.com/bins:v1"}
		err = k8s.Create(ctx, two)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("set exactly one of packages, url and image"))

		untagged := updater.DeepCopy()
		untagged.Name = "untagged"
		untagged.Spec.Image = "registry.example.com:5000/capi-inplace"
		err = k8s.Create(ctx, untagged)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("the image needs a tag or a digest"))

		badSum := updater.DeepCopy()
		badSum.Name = "bad-sum"
		badSum.Spec.Source = inplacev1.KubeadmBinarySource{URL: &inplacev1.KubeadmURLSource{
			SHA256: inplacev1.KubeadmChecksums{Kubeadm: "abc", Kubelet: strings.Repeat("b", 64), Kubectl: strings.Repeat("c", 64)}}}
		Expect(apierrors.IsInvalid(k8s.Create(ctx, badSum))).To(BeTrue())

		defaulted := &inplacev1.KubeadmUpdater{
			ObjectMeta: metav1.ObjectMeta{Name: "defaults", Namespace: ns},
			Spec: inplacev1.KubeadmUpdaterSpec{Source: inplacev1.KubeadmBinarySource{URL: &inplacev1.KubeadmURLSource{
				SHA256: inplacev1.KubeadmChecksums{Kubeadm: strings.Repeat("a", 64), Kubelet: strings.Repeat("b", 64), Kubectl: strings.Repeat("c", 64)}}}},
		}
		Expect(k8s.Create(ctx, defaulted)).To(Succeed())
		Expect(defaulted.Spec.Namespace).To(Equal("kube-system"))
		Expect(defaulted.Spec.KubeletUnit).To(Equal("kubelet"))
		Expect(defaulted.Spec.Source.URL.Template).To(Equal(inplacev1.DefaultKubeadmURLTemplate))
		Expect(defaulted.Spec.Drain.IgnoreDaemonSets).To(Equal(ptr.To(true)))
		Expect(defaulted.Spec.Drain.Timeout).To(Equal(&metav1.Duration{Duration: 15 * time.Minute}))
	})

	Describe("Preflight", func() {
		var u *kubeadmupdater.Updater
		BeforeEach(func() {
			createKubeconfigSecret(ns, cluster)
			u = newUpdater(k8s, k8s)
		})
		// result runs the preflight of a node, a control plane machine's when cp, and
		// returns the check named name.
		result := func(node, version string, cp bool, name string) nodeupdater.CheckResult {
			GinkgoHelper()
			results := u.Preflight(ctx, nodeupdater.PreflightTarget{Namespace: ns, ClusterName: cluster, NodeName: node, Version: version,
				ControlPlane: cp, UpdaterRef: inplacev1.UpdaterReference{Kind: inplacev1.KubeadmUpdaterKind, Name: "kubeadm"}})
			Expect(results).To(HaveLen(2))
			Expect(results).To(ContainElement(HaveField("Name", name)))
			for _, r := range results {
				if r.Name == name {
					return r
				}
			}
			return nodeupdater.CheckResult{}
		}
		check := func(node, version string) nodeupdater.CheckResult {
			GinkgoHelper()
			return result(node, version, false, kubeadmupdater.KubeadmVersionSkewCheck)
		}

		It("refuses what kubeadm refuses: two minors at once, a downgrade, a worker newer than the control plane", func() {
			// Other specs' nodes share the API server: the control plane is judged on
			// every control plane node, so this one is at the oldest version of them all.
			cp := newNode(true, "v1.34.2")
			worker := newNode(false, "v1.34.2")

			Expect(check(cp, "v1.35.0")).To(HaveField("Passed", true), "one minor up on a control plane node")
			Expect(check(cp, "v1.36.0").Message).To(Equal("node " + cp + ` runs kubelet 1.34.2, more than one minor below v1.36.0: kubeadm upgrades one minor version at a time; kubeadm v1.36.0 would refuse with: this version of kubeadm only supports deploying clusters with the control plane version >= 1.35.0. Current version: v1.34.2`))
			Expect(check(cp, "v1.34.1").Message).To(Equal("node " + cp + " runs kubelet 1.34.2: v1.34.1 would be a downgrade, which capi-inplace never does in place"))
			Expect(check(cp, "v1.35.0-rc.1").Message).To(ContainSubstring("not a released Kubernetes version"))
			Expect(check(worker, "v1.34.3").Message).To(ContainSubstring(`the kubelet version is higher than the control plane version. This is not a supported version skew and may lead to a malfunctional cluster. Kubelet version: "1.34.3" Control plane version: "1.34.2"`))
			Expect(check(worker, "v1.34.2")).To(HaveField("Passed", true), "at the control plane's version")
			Expect(check("no-such-node", "v1.34.2").Message).To(ContainSubstring("cannot read node no-such-node"))
		})

		// The in-place-upgrade-to annotation and ExternalUpgradeRequest never write
		// spec.version: kubeadm upgrade apply would move kube-proxy to the target and
		// KubeadmControlPlane would put it back at its own version. Through the hooks the
		// KubeadmControlPlane is at the target already.
		It("holds a control plane node whose KubeadmControlPlane is below the target, unless it leaves kube-proxy alone", func() {
			kcpCheck := func(cp bool) nodeupdater.CheckResult {
				GinkgoHelper()
				return result(newNode(cp, "v1.34.2"), "v1.35.0", cp, kubeadmupdater.KubeadmControlPlaneVersionCheck)
			}
			By("a Cluster without a control plane of Cluster API: nothing to undo the upgrade")
			_, err := fixtures.Cluster(ctx, k8s, ns, cluster, "", nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(kcpCheck(true)).To(HaveField("Passed", true))

			By("a KubeadmControlPlane at the version the node runs: the annotation's or a request's path")
			c := &clusterv1.Cluster{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster}, c)).To(Succeed())
			c.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: "cp"}
			Expect(k8s.Update(ctx, c)).To(Succeed())
			kcp, _, err := fixtures.ControlPlane(ctx, k8s, ns, cluster, "cp", "v1.34.2", 0, false)
			Expect(err).NotTo(HaveOccurred())
			held := kcpCheck(true)
			Expect(held.Passed).To(BeFalse())
			Expect(held.Message).To(Equal("KubeadmControlPlane cp is at v1.34.2, below v1.35.0: Cluster API keeps the kube-proxy DaemonSet at the KubeadmControlPlane's spec.version " +
				"and would put back the kube-proxy that kubeadm upgrade apply moves to v1.35.0. Upgrade through Cluster API's in-place hooks (set the Cluster's " +
				"spec.topology.version or the KubeadmControlPlane's spec.version to v1.35.0; docs/capi-hooks.md), or annotate the KubeadmControlPlane with " +
				"controlplane.cluster.x-k8s.io/skip-kube-proxy to keep kube-proxy yourself"))
			Expect(kcpCheck(false)).To(HaveField("Passed", true), "a worker does not run kubeadm upgrade apply")

			By("the KubeadmControlPlane leaves kube-proxy alone")
			orig := kcp.DeepCopy()
			kcp.Annotations = map[string]string{controlplanev1.SkipKubeProxyAnnotation: ""}
			Expect(k8s.Patch(ctx, kcp, client.MergeFrom(orig))).To(Succeed())
			Expect(kcpCheck(true)).To(HaveField("Passed", true))

			By("the KubeadmControlPlane at the target: Cluster API's in-place hooks")
			orig = kcp.DeepCopy()
			kcp.Annotations = nil
			kcp.Spec.Version = "v1.35.0"
			Expect(k8s.Patch(ctx, kcp, client.MergeFrom(orig))).To(Succeed())
			Expect(kcpCheck(true)).To(HaveField("Passed", true))
		})
	})
})

// stepMessage is the message of the NodeUpdate's step, "" when it has no such step.
func stepMessage(nu *inplacev1.NodeUpdate, step string) string {
	if s := nodeupdater.Step(nu, step); s != nil {
		return s.Message
	}
	return ""
}
