package harvesteradapter_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// writeRecorder records every write asked of the clients it wraps: the preview must ask
// none.
type writeRecorder struct {
	mu     sync.Mutex
	writes []string
}

func (w *writeRecorder) record(verb string, obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, fmt.Sprintf("%s %T %s/%s", verb, obj, obj.GetNamespace(), obj.GetName()))
}

func (w *writeRecorder) Writes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes...)
}

// recordingClient passes reads through and records writes before passing them on too (a
// write asked is a write made: the spec fails on either).
type recordingClient struct {
	client.Client
	rec *writeRecorder
}

func (c *recordingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.rec.record("create", obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *recordingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.rec.record("update", obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *recordingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.rec.record("patch", obj)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *recordingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.rec.record("delete", obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *recordingClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	c.rec.record("deleteAllOf", obj)
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *recordingClient) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c *recordingClient) SubResource(name string) client.SubResourceClient {
	return &recordingSubResource{SubResourceClient: c.Client.SubResource(name), name: name, rec: c.rec}
}

type recordingSubResource struct {
	client.SubResourceClient
	name string
	rec  *writeRecorder
}

func (s *recordingSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	s.rec.record("create "+s.name+" of", obj)
	return s.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (s *recordingSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.rec.record("update "+s.name+" of", obj)
	return s.SubResourceClient.Update(ctx, obj, opts...)
}

func (s *recordingSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.rec.record("patch "+s.name+" of", obj)
	return s.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

type workloadsClient interface {
	Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error)
}

type recordingWorkloads struct {
	inner workloadsClient
	rec   *writeRecorder
}

func (w recordingWorkloads) Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error) {
	c, err := w.inner.Client(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return &recordingClient{Client: c, rec: w.rec}, nil
}

// previewer is the cluster's updater with both its clients recording writes.
func (c *vmCluster) previewer() (*harvesteradapter.Updater, *writeRecorder) {
	rec := &writeRecorder{}
	u := *c.updater
	u.Client = &recordingClient{Client: c.updater.Client, rec: rec}
	u.Workloads = recordingWorkloads{inner: c.updater.Workloads, rec: rec}
	return &u, rec
}

func (c *vmCluster) preview(u *harvesteradapter.Updater, node string, disrupted ...string) inplacev1.NodeDisruption {
	GinkgoHelper()
	return c.previewIn(ctx, u, node, disrupted...)
}

// previewIn previews under callCtx: with nodeupdater.WithReadSnapshot, as one
// UpgradePreview computation asks.
func (c *vmCluster) previewIn(callCtx context.Context, u *harvesteradapter.Updater, node string, disrupted ...string) inplacev1.NodeDisruption {
	GinkgoHelper()
	d, err := u.PreviewDisruption(callCtx, nodeupdater.PreflightTarget{
		Namespace: c.ns, ClusterName: c.name, MachineName: "m-" + node, NodeName: node, Version: "v1.35.6+rke2r1",
		UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
		Disrupted:  disrupted,
	})
	Expect(err).NotTo(HaveOccurred())
	return d
}

// setAllocatable reports a node's allocatable CPU and memory, as its kubelet does.
func setAllocatable(node, cpu, memory string) {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
	Expect(workload.Client.Status().Update(ctx, n)).To(Succeed())
}

// requesting gives a VM's domain resource requests.
func requesting(cpu, memory string, more ...func(*kubevirtv1.VirtualMachine)) func(*kubevirtv1.VirtualMachine) {
	return func(vm *kubevirtv1.VirtualMachine) {
		vm.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
		for _, m := range more {
			m(vm)
		}
	}
}

// pdbPod runs a ReplicaSet's pod on node, Running and Ready, under a PodDisruptionBudget
// of minAvailable 1 whose status is written as Kubernetes' disruption controller would
// (envtest runs none): one pod healthy, one desired, no disruption allowed.
// With a component, the pod is labelled as a Longhorn component (an instance manager's
// pod: longhorn.io/component instance-manager) and owned by its Longhorn object, as
// Longhorn runs it, with the budget Longhorn gives it (fact 31).
func (c *vmCluster) pdbPod(name, node, memory string, component ...string) {
	GinkgoHelper()
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs", UID: types.UID(name + "-rs-uid"), Controller: ptr.To(true)}
	podLabels := map[string]string{"app": name}
	if len(component) > 0 {
		owner = metav1.OwnerReference{APIVersion: "longhorn.io/v1beta2", Kind: "InstanceManager", Name: name, UID: types.UID(name + "-uid"), Controller: ptr.To(true)}
		podLabels["longhorn.io/component"] = component[0]
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: podLabels, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}}}}},
	}
	Expect(workload.Client.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	Expect(workload.Client.Status().Update(ctx, pod)).To(Succeed())
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}},
	}
	Expect(workload.Client.Create(ctx, pdb)).To(Succeed())
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, DisruptionsAllowed: 0}
	Expect(workload.Client.Status().Update(ctx, pdb)).To(Succeed())
}

// deleteLonghornVolume removes a volume createLonghornVolume made, with its replicas:
// the specs share the workload cluster's Longhorn.
func deleteLonghornVolume(name string, nodes ...string) {
	GinkgoHelper()
	del := func(kind, n string) {
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("longhorn.io/v1beta2")
		o.SetKind(kind)
		o.SetNamespace(longhorn.Namespace)
		o.SetName(n)
		Expect(client.IgnoreNotFound(workload.Client.Delete(ctx, o))).To(Succeed())
	}
	for _, n := range nodes {
		del("Replica", name+"-r-"+n)
	}
	del("Volume", name)
}

func vmNames(vms []inplacev1.PreviewVM) []string {
	out := make([]string, 0, len(vms))
	for _, v := range vms {
		out = append(out, v.Namespace+"/"+v.Name)
	}
	return out
}

var _ = Describe("A node's disruption previewed without acting", func() {
	It("names what each node's upgrade would migrate, stop and be held by, writes nothing, and the run then does just that", func() {
		c := newVMCluster(3, nil)
		n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
		for _, n := range c.nodes {
			setAllocatable(n, "4", "8Gi")
		}
		mig := c.vm("vm-mig", n1, requesting("1", "2Gi"))
		pin := c.vm("vm-pinned", n1, requesting("1", "1Gi", pinned(n1)))
		c.pdbPod("web", n2, "1Gi")
		single, shared := "pvc-prev1-"+c.name, "pvc-prev2-"+c.name
		createLonghornVolume(single, "v1", n3)
		c.pdbPod("instance-manager-"+c.name, n3, "100Mi", "instance-manager")
		createLonghornVolume(shared, "v1", n1, n2)
		DeferCleanup(func() { deleteLonghornVolume(single, n3); deleteLonghornVolume(shared, n1, n2) })

		u, rec := c.previewer()
		p1, p2, p3 := c.preview(u, n1), c.preview(u, n2), c.preview(u, n3)
		withN2Down := c.preview(u, n1, n2)
		// An UpgradePreview asks every node under one read snapshot of the workload cluster:
		// each read is made once and shared, and the answers must be the same.
		snapshot := nodeupdater.WithReadSnapshot(ctx)
		Expect([]inplacev1.NodeDisruption{c.previewIn(snapshot, u, n1), c.previewIn(snapshot, u, n2), c.previewIn(snapshot, u, n3), c.previewIn(snapshot, u, n1, n2)}).
			To(Equal([]inplacev1.NodeDisruption{p1, p2, p3, withN2Down}), "the previews under one read snapshot are the previews read afresh")
		Expect(rec.Writes()).To(BeEmpty(), "the preview writes nothing to either cluster")
		wc, err := u.Workloads.Client(ctx, types.NamespacedName{Namespace: c.ns, Name: c.name})
		Expect(err).NotTo(HaveOccurred())
		Expect(wc.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: c.ns}}, client.DryRunAll)).To(Succeed())
		Expect(rec.Writes()).To(ConsistOf(ContainSubstring("create *v1.ConfigMap")), "the recorder sees a write: the assertion above can fail")

		By("what the previews say")
		Expect(vmNames(p1.MigratingVMs)).To(Equal([]string{mig}))
		Expect(p1.MigratingVMs[0].Reason).To(And(HavePrefix("live-migrated: room on"), ContainSubstring("memory 2Gi")))
		Expect(vmNames(p1.StoppedVMs)).To(Equal([]string{pin}))
		Expect(p1.StoppedVMs[0].Reason).To(And(HavePrefix("stopped:"), ContainSubstring("nodeSelector"), ContainSubstring("started again")))
		Expect(p1.Capacity).To(And(HavePrefix("room:"), ContainSubstring(n2), ContainSubstring(n3)))
		Expect(p1.BlockingPods).To(BeEmpty())
		Expect(p1.DegradedVolumes).To(BeEmpty(), "each volume keeps a healthy replica on a node that stays up")
		Expect(vmNames(withN2Down.MigratingVMs)).To(Equal([]string{mig}))
		Expect(withN2Down.MigratingVMs[0].Reason).To(ContainSubstring("room on "+n3), "a node down together takes nothing")
		Expect(withN2Down.DegradedVolumes).To(ConsistOf(HaveField("Name", shared)))
		Expect(withN2Down.DegradedVolumes[0].Reason).To(ContainSubstring(n1 + ", " + n2))

		Expect(p2.MigratingVMs).To(BeEmpty())
		Expect(p2.StoppedVMs).To(BeEmpty())
		Expect(p2.BlockingPods).To(ConsistOf(And(HaveField("Namespace", c.ns), HaveField("Name", "web"), HaveField("PodDisruptionBudget", "web"),
			HaveField("Reason", ContainSubstring("disruptionsAllowed 0")))))
		Expect(p2.DegradedVolumes).To(BeEmpty())

		Expect(p3.BlockingPods).To(ConsistOf(And(HaveField("Name", "instance-manager-"+c.name),
			HaveField("Reason", And(ContainSubstring("disruptionsAllowed 0"), ContainSubstring("Longhorn keeps this instance manager's budget"), ContainSubstring(single))))))
		Expect(p3.DegradedVolumes).To(ConsistOf(HaveField("Name", single)))
		Expect(p3.DegradedVolumes[0].Reason).To(ContainSubstring("0 healthy replicas would be left"))

		By("node 1, predicted to go: it goes, its migrating VM migrated, its stopped VM stopped and started again")
		nu1 := c.nodeUpdate(n1)
		Expect(drive(c.updater, nu1, 60*time.Second)).To(Succeed())
		Expect(c.kubevirt.Migrations(mig)).To(Equal(1))
		Expect(c.kubevirt.Starts(mig)).To(Equal(1), "never stopped")
		Expect(c.kubevirt.Migrations(pin)).To(BeZero())
		Eventually(c.kubevirt.Starts).WithArguments(pin).WithTimeout(5*time.Second).Should(Equal(2), "stopped, then started again")
		Expect(c.rec.Drains(n1)).To(HaveLen(1))

		By("node 2, predicted to hold on its PodDisruptionBudget: its drain runs and the pod is never evicted")
		nu2 := c.nodeUpdate(n2)
		Expect(driveUntil(c.updater, nu2, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			return nodeupdater.StepState(nu, harvesteradapter.StepDrain) == inplacev1.StepStateRunning && len(c.rec.Drains(n2)) > 0
		})).To(Succeed())
		Expect(driveUntil(c.updater, nu2, 3*time.Second, nil)).To(MatchError(ContainSubstring("not done within")), "held, not done and not failed")
		Expect(nodeupdater.StepState(nu2, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateRunning))
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: "web"}, &corev1.Pod{})).To(Succeed(), "the budget keeps the pod")

		By("node 3, predicted to hold on its volume: held at its cordon, never cordoned")
		nu3 := c.nodeUpdate(n3)
		Expect(driveUntil(c.updater, nu3, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			st := nodeupdater.Step(nu, harvesteradapter.StepCordon)
			return st != nil && st.State == inplacev1.StepStateRunning && strings.Contains(st.Message, "holding node "+n3)
		})).To(Succeed())
		Expect(nodeupdater.Step(nu3, harvesteradapter.StepCordon).Message).To(And(ContainSubstring(longhorn.CheckLonghornV1ReplicaElsewhere), ContainSubstring(single)))
		Expect(unschedulable(n3)).To(BeFalse())
	})

	It("names a capacity shortfall, and the VMs the run would hold the node for", func() {
		c := newVMCluster(3, nil)
		n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
		setAllocatable(n1, "8", "16Gi")
		setAllocatable(n2, "2", "4Gi")
		setAllocatable(n3, "2", "4Gi")
		c.pdbPod("busy", n2, "3Gi") // n2 has 1Gi left
		small := c.vm("vm-small", n1, requesting("500m", "2Gi"))
		big := c.vm("vm-big", n1, requesting("1", "6Gi"))
		manual := c.vm("vm-manual", n1, pinned(n1))
		vm := c.getVM("vm-manual")
		patch := client.MergeFrom(vm.DeepCopy())
		vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyManual) // a Manual VM that runs keeps running (KubeVirt starts or stops it only on request)
		Expect(workload.Client.Patch(ctx, vm, patch)).To(Succeed())

		u, rec := c.previewer()
		d := c.preview(u, n1)
		Expect(d.Capacity).To(And(HavePrefix("short:"), ContainSubstring(big+" (CPU 1, memory 6Gi)"), Not(ContainSubstring(small+" ("))))
		Expect(d.MigratingVMs).To(ConsistOf(
			And(HaveField("Name", "vm-big"), HaveField("Reason", HavePrefix("would hold the node: no node that stays up has room"))),
			And(HaveField("Name", "vm-small"), HaveField("Reason", HavePrefix("live-migrated: room on "+n3))),
		))
		Expect(d.StoppedVMs).To(ConsistOf(And(HaveField("Name", "vm-manual"), HaveField("Reason", And(HavePrefix("would hold the node"), ContainSubstring("runStrategy Manual"))))))

		none := c.preview(u, n1, n2, n3)
		Expect(none.Capacity).To(HavePrefix("short: no node stays up"))
		Expect(rec.Writes()).To(BeEmpty())
		Expect(c.kubevirt.NodeOf(manual)).To(Equal(n1))

		By("the run holds the node on the shortfall the preview named, and migrates no VM while it lasts")
		nu := c.nodeUpdate(n1)
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			st := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs)
			return st != nil && strings.Contains(st.Message, "have no room for the VMs")
		})).To(Succeed())
		Expect(nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message).To(And(HavePrefix("holding:"), ContainSubstring(big+" (CPU 1, memory 6Gi)"), Not(ContainSubstring(small+" ("))))
		Expect(c.kubevirt.Migrations(small)).To(BeZero(), "nothing is migrated until every VM has room")
		Expect(c.kubevirt.NodeOf(small)).To(Equal(n1))

		By("with room on a node that stays up, the run holds the node on the Manual VM, as predicted, and leaves it running")
		setAllocatable(n3, "4", "16Gi")
		Expect(driveUntil(c.updater, nu, 60*time.Second, func(nu *inplacev1.NodeUpdate) bool {
			st := nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs)
			return st != nil && strings.Contains(st.Message, "runStrategy Manual")
		})).To(Succeed())
		Expect(nodeupdater.Step(nu, harvesteradapter.StepEvacuateVMs).Message).To(And(HavePrefix("holding:"), ContainSubstring(manual)))
		Expect(runStrategy(c.getVM("vm-manual"))).To(Equal(kubevirtv1.RunStrategyManual))
		Expect(c.kubevirt.NodeOf(manual)).To(Equal(n1))
	})
})
