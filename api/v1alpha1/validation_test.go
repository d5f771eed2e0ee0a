package v1alpha1_test

import (
	"fmt"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

var seq atomic.Int64

func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, seq.Add(1))
}

func validTask() *inplacev1.UpgradeTask {
	return &inplacev1.UpgradeTask{
		ObjectMeta: metav1.ObjectMeta{Name: uniqueName("task"), Namespace: "default"},
		Spec: inplacev1.UpgradeTaskSpec{
			ClusterName:          "harvester",
			MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
			Version:              "v1.33.3+rke2r1",
			UpdaterRef:           inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
		},
	}
}

func validNodeUpdate() *inplacev1.NodeUpdate {
	return &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Name: uniqueName("nu"), Namespace: "default"},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName: "harvester",
			MachineName: "workers-abc12",
			NodeName:    "node-1",
			Version:     "v1.33.3+rke2r1",
			UpdaterRef:  inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"},
		},
	}
}

// expectInvalid asserts that the API server refused the object as invalid with a message
// that contains want, so that a person reading the error knows what to fix.
func expectInvalid(err error, want string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the API server accepted an object it should have refused")
	Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected an Invalid error, got %v", err)
	Expect(err.Error()).To(ContainSubstring(want))
}

var _ = Describe("UpgradeTask validation", func() {
	DescribeTable("refuses a bad UpgradeTask with a message a person understands",
		func(mutate func(*inplacev1.UpgradeTask), want string) {
			task := validTask()
			mutate(task)
			expectInvalid(k8s.Create(ctx, task), want)
		},
		Entry("no target", func(t *inplacev1.UpgradeTask) { t.Spec.MachineDeploymentRef = nil },
			"exactly one of spec.controlPlaneRef or spec.machineDeploymentRef must be set"),
		Entry("two targets", func(t *inplacev1.UpgradeTask) {
			t.Spec.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
		}, "exactly one of spec.controlPlaneRef or spec.machineDeploymentRef must be set"),
		Entry("version without patch", func(t *inplacev1.UpgradeTask) { t.Spec.Version = "v1.33" },
			"version must be a semantic version such as v1.33.3 or v1.33.3+rke2r1"),
		Entry("version that is a word", func(t *inplacev1.UpgradeTask) { t.Spec.Version = "latest" },
			"version must be a semantic version such as v1.33.3 or v1.33.3+rke2r1"),
		Entry("version with a leading zero", func(t *inplacev1.UpgradeTask) { t.Spec.Version = "v1.033.3" },
			"version must be a semantic version such as v1.33.3 or v1.33.3+rke2r1"),
		Entry("empty version", func(t *inplacev1.UpgradeTask) { t.Spec.Version = "" },
			"spec.version"),
		Entry("maxUnavailable zero", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(0)) },
			"maxUnavailable must be a whole number of at least 1 or a percentage from 1% to 100%"),
		Entry("maxUnavailable negative", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(-2)) },
			"maxUnavailable must be a whole number of at least 1 or a percentage from 1% to 100%"),
		Entry("maxUnavailable over 100%", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromString("150%")) },
			"maxUnavailable must be a whole number of at least 1 or a percentage from 1% to 100%"),
		Entry("maxUnavailable 0%", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromString("0%")) },
			"maxUnavailable must be a whole number of at least 1 or a percentage from 1% to 100%"),
		Entry("maxUnavailable not a number", func(t *inplacev1.UpgradeTask) { t.Spec.MaxUnavailable = ptr.To(intstr.FromString("two")) },
			"maxUnavailable must be a whole number of at least 1 or a percentage from 1% to 100%"),
		Entry("window start out of range", func(t *inplacev1.UpgradeTask) {
			t.Spec.Window = &inplacev1.MaintenanceWindow{Start: "25:00", End: "04:00"}
		}, "start must be a time of day as HH:MM, from 00:00 to 23:59"),
		Entry("window end without minutes", func(t *inplacev1.UpgradeTask) {
			t.Spec.Window = &inplacev1.MaintenanceWindow{Start: "22:00", End: "4"}
		}, "end must be a time of day as HH:MM, from 00:00 to 23:59"),
		Entry("window of no length", func(t *inplacev1.UpgradeTask) {
			t.Spec.Window = &inplacev1.MaintenanceWindow{Start: "22:00", End: "22:00"}
		}, "window start and end must differ"),
		Entry("window on a day that does not exist", func(t *inplacev1.UpgradeTask) {
			t.Spec.Window = &inplacev1.MaintenanceWindow{Start: "22:00", End: "04:00", Days: []inplacev1.Weekday{"Funday"}}
		}, `Unsupported value: "Funday"`),
		Entry("updater without kind", func(t *inplacev1.UpgradeTask) { t.Spec.UpdaterRef.Kind = "" },
			"spec.updaterRef.kind"),
		Entry("updater name that is no object name", func(t *inplacev1.UpgradeTask) { t.Spec.UpdaterRef.Name = "Default_Upgrader" },
			"spec.updaterRef.name"),
		Entry("unknown phase", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = "Stop" },
			`Unsupported value: "Stop"`),
		Entry("unknown pacing", func(t *inplacev1.UpgradeTask) { t.Spec.Pacing = "Fast" },
			`Unsupported value: "Fast"`),
		Entry("no cluster", func(t *inplacev1.UpgradeTask) { t.Spec.ClusterName = "" },
			"spec.clusterName"),
		Entry("a control plane with maxUnavailable 2", func(t *inplacev1.UpgradeTask) {
			t.Spec.MachineDeploymentRef = nil
			t.Spec.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
			t.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2))
		}, "a control plane is upgraded one node at a time (etcd and API server quorum): maxUnavailable must be 1 when controlPlaneRef is set"),
		Entry("a health gate of no kind", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{{Name: "empty"}}
		}, "set exactly one of prometheus, cel and job"),
		Entry("a health gate of two kinds", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{{Name: "two",
				CEL: &inplacev1.CELGate{Resource: inplacev1.GateResource{APIVersion: "v1", Kind: "Pod"}, Expression: "true"},
				Job: &inplacev1.JobGate{Namespace: "default"}}}
		}, "set exactly one of prometheus, cel and job"),
		Entry("a Prometheus gate with alerts and a query", func(t *inplacev1.UpgradeTask) {
			t.Spec.Gates = []inplacev1.HealthGate{{Name: "prom", Prometheus: &inplacev1.PrometheusGate{
				SecretRef: corev1.LocalObjectReference{Name: "prom"}, Alerts: []string{"A"}, Query: "up == 0"}}}
		}, "set exactly one of alerts and query"),
		Entry("two health gates of one name", func(t *inplacev1.UpgradeTask) {
			g := inplacev1.HealthGate{Name: "same", CEL: &inplacev1.CELGate{Resource: inplacev1.GateResource{APIVersion: "v1", Kind: "Pod"}, Expression: "true"}}
			t.Spec.Gates = []inplacev1.HealthGate{g, g}
		}, "Duplicate value"),
	)

	It("accepts a control plane task at maxUnavailable 1 or a percentage, a worker task above 1, and refuses raising a control plane's to 2", func() {
		cp := func(mu intstr.IntOrString) *inplacev1.UpgradeTask {
			t := validTask()
			t.Spec.MachineDeploymentRef = nil
			t.Spec.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
			t.Spec.MaxUnavailable = ptr.To(mu)
			return t
		}
		Expect(k8s.Create(ctx, cp(intstr.FromString("100%")))).To(Succeed(), "a percentage depends on the machine count; the Requester judges it")
		task := cp(intstr.FromInt32(1))
		Expect(k8s.Create(ctx, task)).To(Succeed())
		workers := validTask()
		workers.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(5))
		Expect(k8s.Create(ctx, workers)).To(Succeed())

		task.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2))
		expectInvalid(k8s.Update(ctx, task), "maxUnavailable must be 1 when controlPlaneRef is set")
	})

	DescribeTable("refuses a change that would rewrite what a running task means",
		func(mutate func(*inplacev1.UpgradeTask), want string) {
			task := validTask()
			task.Spec.Phase = inplacev1.TaskActionAbort
			task.Spec.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: "workers"}
			Expect(k8s.Create(ctx, task)).To(Succeed())
			mutate(task)
			expectInvalid(k8s.Update(ctx, task), want)
		},
		Entry("another version", func(t *inplacev1.UpgradeTask) { t.Spec.Version = "v1.34.0" },
			"version is immutable; to change the target, abort this task and create a new one"),
		Entry("resuming an aborted task", func(t *inplacev1.UpgradeTask) { t.Spec.Phase = inplacev1.TaskActionOngoing },
			"an aborted UpgradeTask cannot be resumed; create a new one"),
		Entry("another MachineDeployment", func(t *inplacev1.UpgradeTask) { t.Spec.MachineDeploymentRef.Name = "other" },
			"machineDeploymentRef is immutable"),
		Entry("a control plane instead of a MachineDeployment", func(t *inplacev1.UpgradeTask) {
			t.Spec.MachineDeploymentRef = nil
			t.Spec.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
		}, "the target of an UpgradeTask is immutable"),
		Entry("another updater", func(t *inplacev1.UpgradeTask) { t.Spec.UpdaterRef.Name = "other" },
			"updaterRef is immutable"),
		Entry("another cluster", func(t *inplacev1.UpgradeTask) { t.Spec.ClusterName = "other" },
			"clusterName is immutable"),
	)

	It("accepts good UpgradeTasks and fills in the defaults", func() {
		for _, v := range []string{"v1.33.3", "1.33.3", "v1.33.3+rke2r1", "v1.34.0-rc.1+rke2r2"} {
			task := validTask()
			task.Spec.Version = v
			Expect(k8s.Create(ctx, task)).To(Succeed(), "version %s", v)
		}
		task := validTask()
		task.Spec.Window = &inplacev1.MaintenanceWindow{Start: "22:00", End: "04:00", Days: []inplacev1.Weekday{"Saturday", "Sunday"}}
		task.Spec.MaxUnavailable = ptr.To(intstr.FromString("25%"))
		Expect(k8s.Create(ctx, task)).To(Succeed())

		got := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(task), got)).To(Succeed())
		Expect(got.Spec.Phase).To(Equal(inplacev1.TaskActionOngoing))
		Expect(got.Spec.Pacing).To(Equal(inplacev1.PacingExtension))
		Expect(got.Spec.Window.TimeZone).To(Equal("UTC"))
		Expect(*got.Spec.MaxUnavailable).To(Equal(intstr.FromString("25%")))

		defaulted := validTask()
		Expect(k8s.Create(ctx, defaulted)).To(Succeed())
		Expect(*defaulted.Spec.MaxUnavailable).To(Equal(intstr.FromInt32(1)))
	})

	It("lets an ongoing task be aborted and its tuning be changed", func() {
		task := validTask()
		Expect(k8s.Create(ctx, task)).To(Succeed())
		task.Spec.Paused = true
		task.Spec.PauseNodes = []string{"node-2"}
		task.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2))
		Expect(k8s.Update(ctx, task)).To(Succeed())
		task.Spec.Phase = inplacev1.TaskActionAbort
		Expect(k8s.Update(ctx, task)).To(Succeed())
	})

	It("keeps status apart from spec (status subresource)", func() {
		task := validTask()
		Expect(k8s.Create(ctx, task)).To(Succeed())
		task.Status.Phase = inplacev1.TaskPhaseCompleted
		Expect(k8s.Update(ctx, task)).To(Succeed())
		got := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(task), got)).To(Succeed())
		Expect(got.Status.Phase).To(BeEmpty(), "an update of the main resource must not write status")

		got.Status.Phase = inplacev1.TaskPhaseInProgress
		got.Status.Total, got.Status.Upgraded = 5, 2
		got.Status.Progress = "2/5"
		Expect(k8s.Status().Update(ctx, got)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(task), got)).To(Succeed())
		Expect(got.Status.Phase).To(Equal(inplacev1.TaskPhaseInProgress))
		Expect(got.Status.Progress).To(Equal("2/5"))

		got.Status.Phase = "Exploded"
		expectInvalid(k8s.Status().Update(ctx, got), `Unsupported value: "Exploded"`)
	})
})

var _ = Describe("NodeUpdate validation", func() {
	DescribeTable("refuses a bad NodeUpdate with a message a person understands",
		func(mutate func(*inplacev1.NodeUpdate), want string) {
			nu := validNodeUpdate()
			mutate(nu)
			expectInvalid(k8s.Create(ctx, nu), want)
		},
		Entry("no node", func(n *inplacev1.NodeUpdate) { n.Spec.NodeName = "" }, "spec.nodeName"),
		Entry("no machine", func(n *inplacev1.NodeUpdate) { n.Spec.MachineName = "" }, "spec.machineName"),
		Entry("version that is not semver", func(n *inplacev1.NodeUpdate) { n.Spec.Version = "1.33" },
			"version must be a semantic version such as v1.33.3 or v1.33.3+rke2r1"),
		Entry("updater without name", func(n *inplacev1.NodeUpdate) { n.Spec.UpdaterRef.Name = "" }, "spec.updaterRef.name"),
		Entry("unknown phase", func(n *inplacev1.NodeUpdate) { n.Spec.Phase = "Pause" }, `Unsupported value: "Pause"`),
	)

	DescribeTable("refuses a change of what the NodeUpdate upgrades",
		func(mutate func(*inplacev1.NodeUpdate), want string) {
			nu := validNodeUpdate()
			nu.Spec.Phase = inplacev1.TaskActionAbort
			Expect(k8s.Create(ctx, nu)).To(Succeed())
			mutate(nu)
			expectInvalid(k8s.Update(ctx, nu), want)
		},
		Entry("another node", func(n *inplacev1.NodeUpdate) { n.Spec.NodeName = "node-2" }, "nodeName is immutable"),
		Entry("another machine", func(n *inplacev1.NodeUpdate) { n.Spec.MachineName = "other" }, "machineName is immutable"),
		Entry("another version", func(n *inplacev1.NodeUpdate) { n.Spec.Version = "v1.34.1" },
			"version is immutable; create a new NodeUpdate for another version"),
		Entry("resuming an aborted NodeUpdate", func(n *inplacev1.NodeUpdate) { n.Spec.Phase = inplacev1.TaskActionOngoing },
			"an aborted NodeUpdate cannot be resumed; create a new one"),
	)

	It("accepts a good NodeUpdate, defaults its phase, and records steps in status", func() {
		nu := validNodeUpdate()
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		Expect(nu.Spec.Phase).To(Equal(inplacev1.TaskActionOngoing))
		now := metav1.Now()
		nu.Status = inplacev1.NodeUpdateStatus{
			Phase:       inplacev1.NodeUpdatePhaseInProgress,
			CurrentStep: "KubernetesUpgrade",
			Steps: []inplacev1.NodeUpdateStep{
				{Name: "Repository", State: inplacev1.StepStateSucceeded, StartTime: &now, CompletionTime: &now},
				{Name: "KubernetesUpgrade", State: inplacev1.StepStateRunning, StartTime: &now, Message: "SUC plan applied"},
			},
		}
		Expect(k8s.Status().Update(ctx, nu)).To(Succeed())
		got := &inplacev1.NodeUpdate{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nu), got)).To(Succeed())
		Expect(got.Status.Steps).To(HaveLen(2))
		Expect(got.Status.Steps[1].State).To(Equal(inplacev1.StepStateRunning))

		got.Status.Steps = append(got.Status.Steps, inplacev1.NodeUpdateStep{Name: "Repository", State: inplacev1.StepStatePending})
		expectInvalid(k8s.Status().Update(ctx, got), "Duplicate value")
	})
})
