package v1alpha1_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// kubectl runs the kubectl built with the test control plane against the test API server.
func kubectl(args ...string) string {
	GinkgoHelper()
	kubeconfig := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(env.WriteKubeconfig(kubeconfig)).To(Succeed())
	bin := filepath.Join(env.RepoRoot, "bin", "k8s", "kubectl")
	if assets := os.Getenv("KUBEBUILDER_ASSETS"); assets != "" {
		bin = filepath.Join(assets, "kubectl")
	}
	out, err := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "kubectl %s: %s", strings.Join(args, " "), out)
	return string(out)
}

var _ = Describe("What an operator sees with kubectl", func() {
	It("shows an UpgradeTask's progress in kubectl get, by its short name too", func() {
		task := validTask()
		Expect(k8s.Create(ctx, task)).To(Succeed())
		task.Status = inplacev1.UpgradeTaskStatus{
			Phase: inplacev1.TaskPhaseInProgress, Total: 5, Upgraded: 2, InProgress: 1, Waiting: 2,
			Progress: "2/5", CurrentNodes: "node-3",
			Conditions: []metav1.Condition{{Type: inplacev1.PausedCondition, Status: metav1.ConditionTrue, Reason: inplacev1.GateRedReason,
				Message: "gate longhorn-healthy is red", LastTransitionTime: metav1.Now()}},
			Gates: []inplacev1.HealthGateStatus{{Name: "longhorn-healthy", State: inplacev1.GateRed}, {Name: "alerts", State: inplacev1.GateGreen}},
		}
		Expect(k8s.Status().Update(ctx, task)).To(Succeed())

		out := kubectl("get", "ut", "-n", task.Namespace, task.Name)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2))
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "CLUSTER", "VERSION", "PHASE", "UPGRADED", "CURRENT", "PAUSED", "RED", "GATES", "AGE"}))
		Expect(strings.Fields(lines[1])[:8]).To(Equal([]string{task.Name, "harvester", "v1.33.3+rke2r1", "InProgress", "2/5", "node-3", "GateRed", "longhorn-healthy"}))

		wide := kubectl("get", "upgradetasks", "-o", "wide", "-n", task.Namespace, task.Name)
		Expect(strings.Fields(strings.Split(wide, "\n")[0])).To(ContainElements("TARGET", "UPDATER"))
	})

	It("shows a NodeUpdate's node, phase, step and failure reason in kubectl get", func() {
		nu := validNodeUpdate()
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		now := metav1.Now()
		nu.Status = inplacev1.NodeUpdateStatus{
			Phase: inplacev1.NodeUpdatePhaseFailed, CurrentStep: "KubernetesUpgrade", FailureReason: "StepFailed",
			Steps: []inplacev1.NodeUpdateStep{{Name: "KubernetesUpgrade", State: inplacev1.StepStateFailed, StartTime: &now, CompletionTime: &now, Message: "job failed"}},
		}
		Expect(k8s.Status().Update(ctx, nu)).To(Succeed())

		out := kubectl("get", "nu", "-n", nu.Namespace, nu.Name)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "CLUSTER", "NODE", "VERSION", "PHASE", "STEP", "REASON", "AGE"}))
		Expect(strings.Fields(lines[1])[:7]).To(Equal([]string{nu.Name, "harvester", "node-1", "v1.33.3+rke2r1", "Failed", "KubernetesUpgrade", "StepFailed"}))
	})

	It("documents the fields for kubectl explain", func() {
		out := kubectl("explain", "upgradetask.spec.maxUnavailable")
		Expect(out).To(ContainSubstring("how many nodes of the target may be unavailable at once"))
		out = kubectl("explain", "nodeupdate.status.failureMessage")
		Expect(out).To(ContainSubstring("the node's own error"))
	})
})
