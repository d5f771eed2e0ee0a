package jobupdater_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater/jobupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

const wait = 15 * time.Second

var _ = Describe("JobUpdater", func() {
	var (
		ns      string // the management namespace of the Cluster, its NodeUpdates and the JobUpdater
		jobNS   string // the namespace of the workload cluster the Jobs run in
		updater *inplacev1.JobUpdater
	)

	BeforeEach(func() {
		ns = newNamespace("mgmt")
		jobNS = newNamespace("workload")
		updater = &inplacev1.JobUpdater{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm", Namespace: ns},
			Spec: inplacev1.JobUpdaterSpec{
				Image:     "registry.example.com/kubeadm-upgrade:v1",
				Command:   []string{"/upgrade.sh"},
				Args:      []string{"--drain"},
				Env:       []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "debug"}},
				Namespace: jobNS,
			},
		}
	})

	newNodeUpdate := func(cluster string) *inplacev1.NodeUpdate {
		n := seq.Add(1)
		return &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Name: "worker-" + string(rune('a'+n%26)) + "-nu", Namespace: ns},
			Spec: inplacev1.NodeUpdateSpec{
				ClusterName: cluster,
				MachineName: "worker-machine",
				NodeName:    "worker-node-1",
				Version:     "v1.36.3",
				UpdaterRef:  inplacev1.UpdaterReference{Kind: inplacev1.JobUpdaterKind, Name: updater.Name},
			},
		}
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

	// waitForJob waits for the NodeUpdate's Job on the workload cluster.
	waitForJob := func(nu *inplacev1.NodeUpdate) *batchv1.Job {
		GinkgoHelper()
		job := &batchv1.Job{}
		key := client.ObjectKey{Namespace: jobNS, Name: jobupdater.JobName(nu)}
		Eventually(func() error { return k8s.Get(ctx, key, job) }, wait).Should(Succeed())
		return job
	}

	// finishJob does what the job controller would: it records the Job's end in its status.
	finishJob := func(job *batchv1.Job, succeeded bool, reason, message string) {
		GinkgoHelper()
		now := metav1.Now()
		job.Status.StartTime = &now
		if succeeded {
			job.Status.Succeeded = 1
			job.Status.CompletionTime = &now
			job.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastTransitionTime: now, LastProbeTime: now},
				{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastTransitionTime: now, LastProbeTime: now},
			}
		} else {
			job.Status.Failed = 1
			job.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastTransitionTime: now, LastProbeTime: now},
				{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastTransitionTime: now, LastProbeTime: now},
			}
		}
		Expect(k8s.Status().Update(ctx, job)).To(Succeed())
	}

	// jobOf reads the NodeUpdate's Job as it is now, to finish it with its latest version.
	jobOf := func(nu *inplacev1.NodeUpdate) *batchv1.Job {
		GinkgoHelper()
		job := &batchv1.Job{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: jobNS, Name: jobupdater.JobName(nu)}, job)).To(Succeed())
		return job
	}

	// stepRunning waits until the NodeUpdate's Job step runs.
	stepRunning := func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		Eventually(func() inplacev1.StepState {
			got := getNU(nu)
			if len(got.Status.Steps) == 0 {
				return ""
			}
			return got.Status.Steps[0].State
		}, wait).Should(Equal(inplacev1.StepStateRunning))
	}

	// aborting waits until the reconciler has started to abort the NodeUpdate.
	aborting := func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		Eventually(func() *metav1.MicroTime { return getNU(nu).Status.AbortStartTime }, wait).ShouldNot(BeNil())
	}

	requestAbort := func(nu *inplacev1.NodeUpdate) {
		GinkgoHelper()
		Expect(fixtures.AskAbort(ctx, k8s, client.ObjectKeyFromObject(nu))).To(Succeed())
	}

	jobGone := func(nu *inplacev1.NodeUpdate) func() bool {
		return func() bool {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: jobNS, Name: jobupdater.JobName(nu)}, &batchv1.Job{})
			return apierrors.IsNotFound(err)
		}
	}

	It("runs a Job pinned to the node with the target version, and succeeds when the Job succeeds", func() {
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, "kubeadm-cluster")
		startManager(ns, nil)
		nu := newNodeUpdate("kubeadm-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		job := waitForJob(nu)
		nuUID := getNU(nu).UID
		Expect(job.Labels).To(HaveKeyWithValue(jobupdater.NodeUpdateUIDLabel, string(nuUID)))
		Expect(job.Annotations).To(HaveKeyWithValue(jobupdater.NodeUpdateAnnotation, ns+"/"+nu.Name))
		Expect(job.Annotations).To(HaveKeyWithValue(jobupdater.NodeAnnotation, "worker-node-1"))
		Expect(*job.Spec.BackoffLimit).To(Equal(int32(0)), "the JobUpdater's default")
		pod := job.Spec.Template.Spec
		Expect(pod.NodeName).To(Equal("worker-node-1"))
		Expect(pod.RestartPolicy).To(Equal(corev1.RestartPolicyNever))
		Expect(pod.Tolerations).To(Equal([]corev1.Toleration{{Operator: corev1.TolerationOpExists}}))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Image).To(Equal("registry.example.com/kubeadm-upgrade:v1"))
		Expect(c.Command).To(Equal([]string{"/upgrade.sh"}))
		Expect(c.Args).To(Equal([]string{"--drain"}))
		Expect(c.Env).To(ContainElements(
			corev1.EnvVar{Name: "TARGET_VERSION", Value: "v1.36.3"},
			corev1.EnvVar{Name: "NODE_NAME", Value: "worker-node-1"},
			corev1.EnvVar{Name: "CLUSTER_NAME", Value: "kubeadm-cluster"},
			corev1.EnvVar{Name: "LOG_LEVEL", Value: "debug"},
		))
		Expect(c.SecurityContext).To(BeNil(), "not privileged unless asked")

		Eventually(func() inplacev1.StepState {
			got := getNU(nu)
			if len(got.Status.Steps) == 0 {
				return ""
			}
			return got.Status.Steps[0].State
		}, wait).Should(Equal(inplacev1.StepStateRunning))
		Consistently(phaseOf(nu), 300*time.Millisecond).Should(Equal(inplacev1.NodeUpdatePhaseInProgress))

		finishJob(job, true, "", "")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
		got := getNU(nu)
		Expect(got.Status.Steps).To(HaveLen(1))
		Expect(got.Status.Steps[0].Name).To(Equal(jobupdater.StepName))
		Expect(got.Status.Steps[0].State).To(Equal(inplacev1.StepStateSucceeded))
		Expect(got.Status.Steps[0].Message).To(Equal("Job " + jobNS + "/" + job.Name + " succeeded"))

		By("cleaning up the Job when the NodeUpdate is deleted")
		Expect(k8s.Delete(ctx, nu)).To(Succeed())
		Eventually(jobGone(nu), wait).Should(BeTrue())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{}))
		}, wait).Should(BeTrue())
	})

	It("fails with the Job's reason and message when the Job fails", func() {
		updater.Spec.BackoffLimit = ptr.To[int32](2)
		updater.Spec.Privileged = true
		updater.Spec.HostRootMountPath = "/host"
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, "kubeadm-cluster")
		startManager(ns, nil)
		nu := newNodeUpdate("kubeadm-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		job := waitForJob(nu)
		Expect(*job.Spec.BackoffLimit).To(Equal(int32(2)))
		Expect(job.Spec.Template.Spec.HostPID).To(BeTrue())
		Expect(*job.Spec.Template.Spec.Containers[0].SecurityContext.Privileged).To(BeTrue())
		Expect(job.Spec.Template.Spec.Containers[0].VolumeMounts).To(ConsistOf(corev1.VolumeMount{Name: "host-root", MountPath: "/host"}))
		finishJob(job, false, "BackoffLimitExceeded", "Job has reached the specified backoff limit")

		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := getNU(nu)
		want := "Job " + jobNS + "/" + job.Name + " failed: Job has reached the specified backoff limit"
		Expect(got.Status.FailureReason).To(Equal("BackoffLimitExceeded"))
		Expect(got.Status.FailureMessage).To(Equal(want))
		Expect(got.Status.CurrentStep).To(Equal(jobupdater.StepName))
		Expect(got.Status.Steps[0].State).To(Equal(inplacev1.StepStateFailed))
		Expect(got.Status.Steps[0].Message).To(Equal(want))
		Expect(got.Status.Attempts).To(Equal(int32(1)), "a failed Job is not retried by the reconciler")
		ready := meta.FindStatusCondition(got.Status.Conditions, inplacev1.ReadyCondition)
		Expect(ready).NotTo(BeNil())
		Expect(ready.Message).To(Equal("step Job failed (BackoffLimitExceeded): " + want))
		Expect(jobGone(nu)()).To(BeFalse(), "the failed Job stays for its logs until the NodeUpdate is deleted")
	})

	It("on abort waits for the running Job to end, then deletes it and ends Aborted", func() {
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, "kubeadm-cluster")
		startManager(ns, nil)
		nu := newNodeUpdate("kubeadm-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		waitForJob(nu)
		stepRunning(nu)

		requestAbort(nu)
		aborting(nu)
		Consistently(func(g Gomega) {
			g.Expect(jobGone(nu)()).To(BeFalse(), "a running Job is not killed half-way")
			g.Expect(getNU(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
		}, time.Second, 50*time.Millisecond).Should(Succeed())
		Expect(getNU(nu).Status.Steps[0].Message).To(ContainSubstring("waiting for Job " + jobNS + "/" + jobupdater.JobName(nu) + " to end"))

		finishJob(jobOf(nu), true, "", "")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(jobGone(nu)()).To(BeTrue(), "the Job is deleted once it has ended")
		Expect(getNU(nu).Status.Steps[0].State).To(Equal(inplacev1.StepStateAborted))
	})

	It("with force deletes the running Job at once on abort", func() {
		updater.Spec.Force = true
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, "kubeadm-cluster")
		startManager(ns, nil)
		nu := newNodeUpdate("kubeadm-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		waitForJob(nu)
		stepRunning(nu)

		requestAbort(nu)
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseAborted))
		Expect(jobGone(nu)()).To(BeTrue())
		Expect(getNU(nu).Status.Steps[0].State).To(Equal(inplacev1.StepStateAborted))
	})

	It("times out after the JobUpdater's nodeTimeout, waits for the Job to end and deletes it", func() {
		updater.Spec.NodeTimeout = &metav1.Duration{Duration: 2 * time.Second}
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, "kubeadm-cluster")
		startManager(ns, nil)
		nu := newNodeUpdate("kubeadm-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		waitForJob(nu)

		Eventually(func() string { return getNU(nu).Status.FailureReason }, wait).Should(Equal(inplacev1.TimedOutReason))
		Consistently(func(g Gomega) {
			g.Expect(jobGone(nu)()).To(BeFalse(), "a running Job is not killed half-way")
			g.Expect(getNU(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))
		}, time.Second, 50*time.Millisecond).Should(Succeed())

		// The upgrade finished after the node's time was up.
		finishJob(jobOf(nu), true, "", "")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseFailed))
		got := getNU(nu)
		Expect(got.Status.FailureReason).To(Equal(inplacev1.TimedOutReason))
		Expect(got.Status.FailureMessage).To(HavePrefix("node update did not finish within 2s"))
		Expect(jobGone(nu)()).To(BeTrue())
	})

	It("keeps a deleted NodeUpdate until its running Job has ended, then deletes both", func() {
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		createKubeconfigSecret(ns, "kubeadm-cluster")
		startManager(ns, nil)
		nu := newNodeUpdate("kubeadm-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		waitForJob(nu)
		stepRunning(nu)

		Expect(k8s.Delete(ctx, getNU(nu))).To(Succeed())
		aborting(nu)
		Consistently(func(g Gomega) {
			g.Expect(jobGone(nu)()).To(BeFalse(), "a running Job is not killed half-way")
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{})).To(Succeed())
		}, time.Second, 50*time.Millisecond).Should(Succeed())

		finishJob(jobOf(nu), false, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
		Eventually(jobGone(nu), wait).Should(BeTrue())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(nu), &inplacev1.NodeUpdate{}))
		}, wait).Should(BeTrue())
	})

	It("retries, saying why, while the workload cluster's kubeconfig Secret is missing", func() {
		Expect(k8s.Create(ctx, updater)).To(Succeed())
		startManager(ns, nil)
		nu := newNodeUpdate("late-cluster")
		Expect(k8s.Create(ctx, nu)).To(Succeed())

		Eventually(func() string { return getNU(nu).Status.LastError }, wait).Should(Equal(
			"reach workload cluster late-cluster: kubeconfig Secret " + ns + "/late-cluster-kubeconfig of the workload cluster does not exist"))
		Expect(getNU(nu).Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseInProgress))

		createKubeconfigSecret(ns, "late-cluster")
		job := waitForJob(nu)
		finishJob(job, true, "", "")
		Eventually(phaseOf(nu), wait).Should(Equal(inplacev1.NodeUpdatePhaseSucceeded))
	})

	It("validates its configuration and fills in defaults", func() {
		bad := updater.DeepCopy()
		bad.Name = "bad"
		bad.Spec.Env = []corev1.EnvVar{{Name: "TARGET_VERSION", Value: "v0.0.1"}}
		err := k8s.Create(ctx, bad)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("TARGET_VERSION, NODE_NAME, CLUSTER_NAME and MACHINE_NAME are set by capi-inplace"))

		noImage := updater.DeepCopy()
		noImage.Name = "no-image"
		noImage.Spec.Image = ""
		Expect(apierrors.IsInvalid(k8s.Create(ctx, noImage))).To(BeTrue())

		defaulted := &inplacev1.JobUpdater{
			ObjectMeta: metav1.ObjectMeta{Name: "defaults", Namespace: ns},
			Spec:       inplacev1.JobUpdaterSpec{Image: "busybox"},
		}
		Expect(k8s.Create(ctx, defaulted)).To(Succeed())
		Expect(defaulted.Spec.Namespace).To(Equal("kube-system"))
		Expect(defaulted.Spec.BackoffLimit).To(Equal(ptr.To[int32](0)))
	})

	It("names Jobs the same way every time and apart for each NodeUpdate", func() {
		a := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "cp.node-1"}}
		b := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns2", Name: "cp.node-1"}}
		long := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "a-very-long-machine-deployment-name-with-a-suffix-0123456789-abcdef"}}
		Expect(jobupdater.JobName(a)).To(Equal(jobupdater.JobName(a.DeepCopy())))
		Expect(jobupdater.JobName(a)).NotTo(Equal(jobupdater.JobName(b)))
		Expect(jobupdater.JobName(a)).To(HavePrefix("nu-cp-node-1-"))
		Expect(len(jobupdater.JobName(long))).To(BeNumerically("<=", 63))
		Expect(jobupdater.JobName(long)).To(MatchRegexp(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`))
	})
})
