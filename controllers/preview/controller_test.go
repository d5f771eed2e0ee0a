package preview

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

const (
	cpTarget      = "KubeadmControlPlane/cp"
	workersTarget = "MachineDeployment/workers"
)

var _ = Describe("UpgradePreview", func() {
	var (
		stop    func()
		updater *fakeUpdater
	)
	BeforeEach(func() {
		updater = &fakeUpdater{hold: map[string]string{}}
	})
	JustBeforeEach(func() { stop = startManager(registryWith(updater)) })
	AfterEach(func() { stop() })

	It("shows the order an UpgradeTask dry run of the same options records, with nodeOrder, pauseNodes, a held node and the disruption", func() {
		w := newWorld(true)
		updater.mu.Lock()
		updater.hold[w.node("workers-1")] = "volume pvc-1 would lose its last healthy replica"
		updater.mu.Unlock()
		nodeOrder := []string{w.node("workers-3"), "cp-2"}
		pause := []string{w.node("workers-2")}
		w.createPreview(targetVersion, func(p *inplacev1.UpgradePreview) {
			p.Spec.NodeOrder, p.Spec.PauseNodes = nodeOrder, pause
		})
		// The run: an UpgradeTask dry run per target, with the same options.
		ref := inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}
		for name, spec := range map[string]inplacev1.UpgradeTaskSpec{
			"cp-dry":      {ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}},
			"workers-dry": {MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"}},
		} {
			spec.ClusterName, spec.Version, spec.UpdaterRef, spec.DryRun = "harvester", targetVersion, ref, true
			spec.NodeOrder, spec.PauseNodes = nodeOrder, pause
			Expect(k8s.Create(ctx, &inplacev1.UpgradeTask{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}, Spec: spec})).To(Succeed())
		}
		taskOrder := func(name string) []string {
			t := &inplacev1.UpgradeTask{}
			Eventually(func(g Gomega) {
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, t)).To(Succeed())
				g.Expect(t.Status.Phase).To(Equal(inplacev1.TaskPhasePlanned))
				g.Expect(t.Status.Machines).To(HaveLen(3))
			}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
			var out []string
			for _, m := range t.Status.Machines {
				out = append(out, m.Name)
			}
			return out
		}

		p := w.computed(inplacev1.PreviewPhaseReady)
		Expect(orderOf(p, cpTarget)).To(Equal(taskOrder("cp-dry")), "the control plane in the task's order")
		Expect(orderOf(p, workersTarget)).To(Equal(taskOrder("workers-dry")), "the workers in the task's order")
		Expect(orderOf(p, cpTarget)).To(Equal([]string{"cp-2", "cp-1", "cp-3"}))
		Expect(orderOf(p, workersTarget)).To(Equal([]string{"workers-3", "workers-1", "workers-2"}))
		Expect(machineOf(p, "cp-2").Order).To(Equal(int32(1)), "the control plane first")
		Expect(machineOf(p, "workers-3").Order).To(Equal(int32(4)), "the workers after the control plane")

		Expect(machineOf(p, "cp-2").OrderReason).To(Equal("control plane first; spec.nodeOrder position 2"))
		Expect(machineOf(p, "cp-1").OrderReason).To(Equal("control plane first; oldest machine first"))
		Expect(machineOf(p, "workers-3").OrderReason).To(Equal("workers of MachineDeployment/workers after the control plane; spec.nodeOrder position 1"))
		Expect(machineOf(p, "workers-1").OrderReason).To(Equal("workers of MachineDeployment/workers after the control plane; by name"))

		paused := machineOf(p, "workers-2")
		Expect(paused.Outcome).To(Equal(inplacev1.MachineOutcomeInPlace))
		Expect(paused.OrderReason).To(ContainSubstring("paused by spec.pauseNodes"))
		Expect(paused.EstimatedDuration).To(BeNil(), "a paused node is not counted in the estimate")
		Expect(paused.Preflight).To(BeEmpty(), "the run does not check a paused node")

		held := machineOf(p, "workers-1")
		Expect(held.WouldHold).To(BeTrue())
		Expect(held.Reason).To(ContainSubstring("would be held today by UpdaterChecks/FakeVolumes: volume pvc-1 would lose its last healthy replica"))
		Expect(held.Preflight).To(ContainElement(inplacev1.PreflightCheckStatus{Name: "UpdaterChecks/FakeVolumes", Passed: false, Message: "volume pvc-1 would lose its last healthy replica"}))
		Expect(held.Preflight).To(HaveLen(7), "every check ran, as in the dry run")
		Expect(machineOf(p, "workers-3").WouldHold).To(BeFalse())

		Expect(p.Status.InPlace).To(Equal(int32(6)))
		Expect(p.Status.Replaced).To(BeZero())
		Expect(p.Status.Refused).To(BeZero())
		Expect(p.Status.Held).To(Equal(int32(1)))
		for _, m := range p.Status.Machines {
			Expect(m.Reason).NotTo(ContainSubstring("replace"), m.Name)
		}

		// With maxUnavailable 1 nobody goes down together with a node.
		Expect(machineOf(p, "workers-1").Disruption).NotTo(BeNil())
		Expect(machineOf(p, "workers-1").Disruption.StoppedVMs).To(Equal([]inplacev1.PreviewVM{{Namespace: "vms", Name: "vm-on-" + w.node("workers-1"), Reason: "down with: "}}))

		// 5 nodes (one paused) one at a time, at capi-inplace's default.
		Expect(p.Status.EstimatedDuration.Duration).To(Equal(5 * DefaultNodeDuration))
		Expect(p.Status.EstimateSource).To(HavePrefix("capi-inplace's fixed default of 30m per node"))
		Expect(p.Status.Summary).To(Equal("6 machines: 6 in place, 0 replaced, 0 refused, 1 held today; about 2h30m (" + p.Status.EstimateSource + ")"))
		Expect(conditionOf(p, inplacev1.ReadyCondition).Status).To(Equal(metav1.ConditionTrue))
	})

	It("names the nodes down at once under maxUnavailable, and estimates in batches", func() {
		w := newWorld(false)
		w.createPreview(targetVersion, func(p *inplacev1.UpgradePreview) { p.Spec.MaxUnavailable = ptrTo(intstr.FromInt32(2)) })
		p := w.computed(inplacev1.PreviewPhaseReady)
		Expect(machineOf(p, "workers-1").Disruption.StoppedVMs[0].Reason).To(Equal("down with: "))
		Expect(machineOf(p, "workers-2").Disruption.StoppedVMs[0].Reason).To(Equal("down with: " + w.node("workers-1")))
		Expect(machineOf(p, "workers-3").Disruption.StoppedVMs[0].Reason).To(Equal("down with: "), "a new batch")
		Expect(machineOf(p, "cp-2").Disruption.StoppedVMs[0].Reason).To(Equal("down with: "), "a control plane goes one at a time")
		// The control plane 3 batches, the workers 2.
		Expect(p.Status.EstimatedDuration.Duration).To(Equal(5 * DefaultNodeDuration))
	})

	It("shows machines at the version as AtTarget, last and without an order", func() {
		w := newWorld(false)
		m := &clusterv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "workers-2"}, m)).To(Succeed())
		Expect(fixtures.Annotate(ctx, k8s, m, inplacev1.UpgradeReleaseAnnotation, targetVersion)).To(Succeed())
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		at := machineOf(p, "workers-2")
		Expect(at.Outcome).To(Equal(inplacev1.MachineOutcomeAtTarget))
		Expect(at.Order).To(BeZero())
		Expect(p.Status.Machines[len(p.Status.Machines)-1].Name).To(Equal("workers-2"))
		Expect(p.Status.AtTarget).To(Equal(int32(1)))
		Expect(p.Status.InPlace).To(Equal(int32(5)))
		Expect(orderOf(p, workersTarget)).To(Equal([]string{"workers-1", "workers-3"}))
	})

	It("shows the machines of a MachineDeployment whose template change no updater covers as Replaced, naming the fields", func() {
		w := newWorld(false)
		w.bootstrapTemplates()
		w.createPreview(targetVersion, func(p *inplacev1.UpgradePreview) { p.Spec.TemplateChanges = w.bootstrapChange() })
		p := w.computed(inplacev1.PreviewPhaseReady)
		for _, name := range []string{"workers-1", "workers-2", "workers-3"} {
			m := machineOf(p, name)
			Expect(m.Outcome).To(Equal(inplacev1.MachineOutcomeReplaced), name)
			Expect(m.Reason).To(HavePrefix("Cluster API would replace the machine: no updater covers KubeadmConfigTemplate spec.template.spec.preKubeadmCommands"), name)
			Expect(m.Order).To(BeZero())
		}
		Expect(machineOf(p, "cp-1").Outcome).To(Equal(inplacev1.MachineOutcomeInPlace), "the control plane has no template change")
		Expect(p.Status.Replaced).To(Equal(int32(3)))
		Expect(p.Status.FailClosed).To(BeFalse())
		Expect(p.Status.EstimatedDuration.Duration).To(Equal(3*DefaultNodeDuration), "replaced machines are not in the estimate")
	})

	It("shows them Refused on a fail-closed Cluster, with the hook's words, and records no event", func() {
		w := newWorld(false)
		w.bootstrapTemplates()
		cluster := &clusterv1.Cluster{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "harvester"}, cluster)).To(Succeed())
		Expect(fixtures.Annotate(ctx, k8s, cluster, inplacev1.FailClosedAnnotation, "true")).To(Succeed())
		w.createPreview(targetVersion, func(p *inplacev1.UpgradePreview) { p.Spec.TemplateChanges = w.bootstrapChange() })
		p := w.computed(inplacev1.PreviewPhaseReady)
		Expect(p.Status.FailClosed).To(BeTrue())
		Expect(p.Status.Refused).To(Equal(int32(3)))
		refused := machineOf(p, "workers-2")
		Expect(refused.Outcome).To(Equal(inplacev1.MachineOutcomeRefused))
		Expect(refused.Reason).To(ContainSubstring("is fail-closed"))
		Expect(refused.Reason).To(ContainSubstring("KubeadmConfigTemplate spec.template.spec.preKubeadmCommands"))
		Expect(machineOf(p, "cp-1").Outcome).To(Equal(inplacev1.MachineOutcomeInPlace), "the version alone is covered")
		Consistently(func(g Gomega) {
			events := &eventsv1.EventList{}
			g.Expect(k8s.List(ctx, events, client.InNamespace(w.ns))).To(Succeed())
			g.Expect(events.Items).To(BeEmpty(), "a preview records no event")
		}, 2*time.Second, 200*time.Millisecond).Should(Succeed())
	})

	DescribeTable("fails, with the run's words, on a version the run would refuse, and changes nothing",
		func(version, want string) {
			w := newWorld(false)
			before := &clusterv1.MachineList{}
			Expect(k8s.List(ctx, before, client.InNamespace(w.ns))).To(Succeed())
			w.createPreview(version)
			p := w.computed(inplacev1.PreviewPhaseFailed)
			Expect(p.Status.Message).To(ContainSubstring(want))
			Expect(p.Status.Machines).To(BeEmpty())
			Expect(conditionOf(p, inplacev1.ReadyCondition).Status).To(Equal(metav1.ConditionFalse))
			Expect(conditionOf(p, inplacev1.ReadyCondition).Message).To(Equal(p.Status.Message))
			after := &clusterv1.MachineList{}
			Expect(k8s.List(ctx, after, client.InNamespace(w.ns))).To(Succeed())
			for i := range before.Items {
				Expect(after.Items[i].ResourceVersion).To(Equal(before.Items[i].ResourceVersion), "machine %s untouched", after.Items[i].Name)
			}
			tasks := &inplacev1.UpgradeTaskList{}
			Expect(k8s.List(ctx, tasks, client.InNamespace(w.ns))).To(Succeed())
			Expect(tasks.Items).To(BeEmpty())
			nus := &inplacev1.NodeUpdateList{}
			Expect(k8s.List(ctx, nus, client.InNamespace(w.ns))).To(Succeed())
			Expect(nus.Items).To(BeEmpty())
		},
		Entry("not a semantic version", "latest", `spec.version: version "latest" is not a valid semantic version: give MAJOR.MINOR.PATCH`),
		Entry("a downgrade", "v1.32.4+rke2r1", "version v1.32.4+rke2r1 is older than "+fromVersion+", which machine cp-1 already runs: in-place downgrades are not supported"),
	)

	It("computes once per spec and again on a new refresh value", func() {
		w := newWorld(false)
		w.createPreview(targetVersion)
		first := w.computed(inplacev1.PreviewPhaseReady)
		Expect(first.Status.AtTarget).To(BeZero())

		// The world changes; the preview is a snapshot and stays as computed.
		m := &clusterv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "workers-1"}, m)).To(Succeed())
		Expect(fixtures.Annotate(ctx, k8s, m, inplacev1.UpgradeReleaseAnnotation, targetVersion)).To(Succeed())
		Consistently(func() *metav1.Time { return w.preview().Status.ComputedTime }, 2*time.Second, 200*time.Millisecond).Should(Equal(first.Status.ComputedTime))
		Expect(w.preview().Status.AtTarget).To(BeZero())

		Expect(fixtures.Annotate(ctx, k8s, w.preview(), inplacev1.RefreshAnnotation, "1")).To(Succeed())
		second := w.computed(inplacev1.PreviewPhaseReady)
		Expect(second.Status.ObservedRefresh).To(Equal("1"))
		Expect(second.Status.AtTarget).To(Equal(int32(1)), "recomputed on the refresh")
		Expect(machineOf(second, "workers-1").Outcome).To(Equal(inplacev1.MachineOutcomeAtTarget))
	})

	It("estimates from the cluster's past NodeUpdates, and says so", func() {
		w := newWorld(false)
		for i, minutes := range []int{10, 20} {
			w.pastNodeUpdate(i, time.Duration(minutes)*time.Minute)
		}
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		Expect(p.Status.EstimateSource).To(Equal("the cluster's 2 past NodeUpdates"))
		Expect(p.Status.EstimatedDuration.Duration).To(Equal(6 * 15 * time.Minute))
		Expect(machineOf(p, "cp-1").EstimatedDuration.Duration).To(Equal(15 * time.Minute))
		Expect(p.Status.Summary).To(HaveSuffix("; about 1h30m (the cluster's 2 past NodeUpdates)"))
	})
})

var _ = Describe("UpgradePreview with an updater that tells its typical node duration", func() {
	var stop func()
	JustBeforeEach(func() { stop = startManager(registryWith(&estimatingUpdater{fakeUpdater{hold: map[string]string{}}})) })
	AfterEach(func() { stop() })

	It("estimates from the updater's default when the cluster has no past NodeUpdates, and says so", func() {
		w := newWorld(false)
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		Expect(p.Status.EstimateSource).To(Equal("the updater's default (ExternalUpgrader, 7m per node)"))
		Expect(p.Status.EstimatedDuration.Duration).To(Equal(6 * 7 * time.Minute))
	})
})

// bootstrapTemplates creates the KubeadmConfigTemplates "old" (which the workers'
// MachineSet names) and "new", which differ in preKubeadmCommands.
func (w *world) bootstrapTemplates() {
	GinkgoHelper()
	for name, cmd := range map[string]string{"old": "echo old", "new": "echo new"} {
		t := &bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}
		t.Spec.Template.Spec.PreKubeadmCommands = []string{cmd}
		Expect(k8s.Create(ctx, t)).To(Succeed())
	}
	ms := &clusterv1.MachineSet{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "workers-ms"}, ms)).To(Succeed())
	ms.Spec.Template.Spec.Bootstrap.ConfigRef = clusterv1.ContractVersionedObjectReference{APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: "old"}
	Expect(k8s.Update(ctx, ms)).To(Succeed())
}

// bootstrapChange points the workers at the KubeadmConfigTemplate "new".
func (w *world) bootstrapChange() []inplacev1.PreviewTemplateChange {
	return []inplacev1.PreviewTemplateChange{{
		MachineDeployment: "workers",
		BootstrapTemplate: &inplacev1.PreviewTemplateRef{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfigTemplate", Name: "new"},
	}}
}

// pastNodeUpdate creates a Succeeded NodeUpdate of the cluster that took d.
func (w *world) pastNodeUpdate(i int, d time.Duration) {
	GinkgoHelper()
	nu := &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "past-" + string(rune('a'+i))},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName: "harvester", MachineName: "gone", NodeName: "gone", Version: fromVersion,
			UpdaterRef: inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}, Phase: inplacev1.TaskActionOngoing,
		},
	}
	Expect(k8s.Create(ctx, nu)).To(Succeed())
	start := time.Now().Add(-48 * time.Hour).Truncate(time.Second)
	nu.Status.Phase = inplacev1.NodeUpdatePhaseSucceeded
	nu.Status.StartTime = &metav1.Time{Time: start}
	nu.Status.CompletionTime = &metav1.Time{Time: start.Add(d)}
	Expect(k8s.Status().Update(ctx, nu)).To(Succeed())
}

func conditionOf(p *inplacev1.UpgradePreview, t string) metav1.Condition {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return metav1.Condition{}
}

func ptrTo[T any](v T) *T { return &v }
