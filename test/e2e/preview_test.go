package e2e

import (
	"slices"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// An UpgradePreview is a claim about the run; this spec makes the claim and then runs the
// upgrade it previews on the simulated Harvester cluster (three control plane nodes, three
// workers, a live-migratable VM on the first two workers, a VM with a PCI device on the
// last, Longhorn volumes), and holds the run to every prediction.
var _ = Describe("An UpgradePreview checked against the run it previews", func() {
	It("predicts the order nodes go in, the VMs that live-migrate and those stopped, and the node a PodDisruptionBudget holds", func() {
		s := startScenario("preview", scenario.Options{Namespace: "preview"})
		nu := watchNodeUpdates(s)
		var workers []string
		for _, n := range s.Nodes {
			if !n.ControlPlane {
				workers = append(workers, n.Name)
			}
		}
		Expect(workers).To(HaveLen(3))
		guarded := workers[1]

		By("a pod on " + guarded + " under a PodDisruptionBudget that allows no disruption now")
		pdb := guardedPod(s, guarded)

		By("previewing the upgrade to " + scenario.ToVersion)
		preview := &inplacev1.UpgradePreview{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Cluster.Namespace, Name: "to-target"},
			Spec:       inplacev1.UpgradePreviewSpec{ClusterName: s.Cluster.Name, Version: scenario.ToVersion},
		}
		Expect(s.Management.Client.Create(ctx, preview)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(s.Management.Client.Get(ctx, client.ObjectKeyFromObject(preview), preview)).To(Succeed())
			g.Expect(preview.Status.Phase).To(Equal(inplacev1.PreviewPhaseReady), preview.Status.Message)
		}, time.Minute, scenarioPoll).Should(Succeed())
		GinkgoWriter.Printf("preview: %s\n", preview.Status.Summary)
		Expect(preview.Status.InPlace).To(BeEquivalentTo(len(s.Nodes)), "every machine in place")

		predictedOrder, migrate, stop, held := predictions(preview)
		Expect(predictedOrder).To(HaveLen(len(s.Nodes)))
		Expect(held).To(Equal([]string{guarded}), "only the guarded node is predicted to hold, on its budget; the VMs have room")
		vm := func(name string) string { return scenario.VMNamespace + "/" + name }
		Expect(migrate).To(Equal(map[string]string{vm("web-1"): workers[0], vm("web-2"): workers[1]}))
		Expect(stop).To(Equal(map[string]string{vm("gpu-1"): workers[2]}))

		By("running it: the guarded node holds at its drain, its pod not evicted, while the budget allows nothing")
		annotateCluster(s)
		guardedMachine := machineOfNode(s, guarded)
		Eventually(func() inplacev1.StepState {
			return stepOf(s, guardedMachine, harvesteradapter.StepDrain)
		}, upgradeTimeout, scenarioPoll).Should(Equal(inplacev1.StepStateRunning))
		Consistently(func(g Gomega) {
			g.Expect(stepOf(s, guardedMachine, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateRunning))
			g.Expect(s.Workload.Client.Get(ctx, client.ObjectKey{Namespace: pdb.Namespace, Name: pdb.Name}, &corev1.Pod{})).To(Succeed(), "the pod is not evicted")
		}, 5*time.Second, scenarioPoll).Should(Succeed())

		By("the budget lets one pod go: the drain goes on and the upgrade completes")
		pdb.Status.DisruptionsAllowed = 1
		Expect(s.Workload.Client.Status().Update(ctx, pdb)).To(Succeed())
		status, message := waitClusterStatus(s, upgradeTimeout)
		Expect(status).To(Equal(inplacev1.UpgradeStatusDone), message)
		expectAllUpgraded(s, nu)

		By("the nodes went in the predicted order")
		Expect(actualOrder(s, nu)).To(Equal(predictedOrder))

		By("every VM predicted to migrate migrated once and was never restarted; every VM predicted to stop was stopped and started again, never migrated")
		for name := range migrate {
			Expect(s.KubeVirt.Migrations(name)).To(Equal(1), "%s: %v", name, s.VMJourneys())
			Expect(s.KubeVirt.Starts(name)).To(Equal(1), "%s: %v", name, s.VMJourneys())
		}
		for name := range stop {
			Expect(s.KubeVirt.Migrations(name)).To(BeZero(), "%s: %v", name, s.VMJourneys())
			Expect(s.KubeVirt.Starts(name)).To(Equal(2), "%s: %v", name, s.VMJourneys())
		}
	})
})

// guardedPod runs a ReplicaSet's pod on node, Running and Ready, under a budget of
// minAvailable 1 whose status is written as Kubernetes' disruption controller would
// (envtest runs none): no disruption allowed. The API server's eviction refuses it.
func guardedPod(s *scenario.Scenario, node string) *policyv1.PodDisruptionBudget {
	GinkgoHelper()
	wc := s.Workload.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}
	Expect(client.IgnoreAlreadyExists(wc.Create(ctx, ns))).To(Succeed())
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "guarded-rs", UID: types.UID("guarded-rs-uid"), Controller: ptr.To(true)}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: ns.Name, Labels: map[string]string{"app": "guarded"}, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}}}},
	}
	Expect(wc.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	Expect(wc.Status().Update(ctx, pod)).To(Succeed())
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: ns.Name},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}
	Expect(wc.Create(ctx, pdb)).To(Succeed())
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, DisruptionsAllowed: 0}
	Expect(wc.Status().Update(ctx, pdb)).To(Succeed())
	return pdb
}

// predictions reads a preview: the nodes in the order they would go; the VMs that would
// live-migrate and those that would be stopped, each with its node; the nodes a pod's
// budget, or a lack of room for their VMs on the nodes that stay up, would hold.
func predictions(p *inplacev1.UpgradePreview) (order []string, migrate, stop map[string]string, held []string) {
	machines := slices.Clone(p.Status.Machines)
	sort.SliceStable(machines, func(i, j int) bool { return machines[i].Order < machines[j].Order })
	migrate, stop = map[string]string{}, map[string]string{}
	for _, m := range machines {
		if m.Order == 0 {
			continue
		}
		order = append(order, m.NodeName)
		if m.Disruption == nil {
			continue
		}
		for _, vm := range m.Disruption.MigratingVMs {
			migrate[vm.Namespace+"/"+vm.Name] = m.NodeName
		}
		for _, vm := range m.Disruption.StoppedVMs {
			stop[vm.Namespace+"/"+vm.Name] = m.NodeName
		}
		if len(m.Disruption.BlockingPods) > 0 || strings.HasPrefix(m.Disruption.Capacity, "short:") {
			held = append(held, m.NodeName)
		}
	}
	return order, migrate, stop, held
}

func machineOfNode(s *scenario.Scenario, node string) string {
	for _, n := range s.Nodes {
		if n.Name == node {
			return n.Machine
		}
	}
	Fail("no machine for node " + node)
	return ""
}

// stepOf is the state of a step of the machine's NodeUpdate; Pending while it has none.
func stepOf(s *scenario.Scenario, machine, step string) inplacev1.StepState {
	list := &inplacev1.NodeUpdateList{}
	Expect(s.Management.Client.List(ctx, list, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
	for i := range list.Items {
		if list.Items[i].Spec.MachineName == machine {
			return nodeupdater.StepState(&list.Items[i], step)
		}
	}
	return inplacev1.StepStatePending
}

// actualOrder is the nodes in the order their first NodeUpdates were created, as the
// watch saw them.
func actualOrder(s *scenario.Scenario, nu *nodeUpdateWatch) []string {
	var out []string
	for _, machine := range nu.firstOrder() {
		for _, n := range s.Nodes {
			if n.Machine == machine {
				out = append(out, n.Name)
			}
		}
	}
	return out
}
