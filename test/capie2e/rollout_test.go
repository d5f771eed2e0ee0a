package capie2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/capisim"
)

var _ = Describe("A version bump on a ClusterClass Cluster, rolled out by Cluster API's own controllers", Ordered, func() {
	var inPlace, replaced, closed, restarted, failing, single, five *workloadCluster
	var kubeadm *kubeadmCluster

	BeforeAll(func() {
		// Every cluster is created first, so that Cluster API provisions them together.
		inPlace = newWorkloadCluster("inplace", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 3, Workers: 3})
		replaced = newWorkloadCluster("replaced", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 1, Workers: 2})
		closed = newWorkloadClusterWith("closed", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 1, Workers: 2},
			map[string]string{inplacev1.FailClosedAnnotation: "true"})
		restarted = newWorkloadCluster("restarted", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 3, Workers: 2})
		failing = newWorkloadCluster("failing", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 3, Workers: 2})
		single = newWorkloadCluster("single", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 1, Workers: 1})
		five = newWorkloadCluster("five", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 5})
		kubeadm = newKubeadmCluster("kubeadm", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 3, Workers: 3})
	})

	It("upgrades 3 control plane and 3 worker machines in place across a minor with the KubeadmUpdater, kubeadm's sequence run on each node", func() {
		kubeadm.upgradeWithKubeadm()
	})

	It("updates 3 control plane and 3 worker machines in place across a minor (v1.35 to v1.36, where KCP also changes the KubeadmConfig)", func() {
		inPlace.waitProvisioned()
		inPlace.countRunning()
		start := time.Now()
		inPlace.bump("v1.36.3")
		after := inPlace.waitAt("v1.36.3", 6*time.Minute)
		GinkgoWriter.Printf("6 machines upgraded in place in %s\n", time.Since(start))
		inPlace.expectAllInPlace(after, "v1.36.3")

		By("test/capisim reads every answer Cluster API acted on as Cluster API did: in place")
		expectVerdicts(inPlace.ns, true)

		By("the KubeadmConfig change KCP makes across the minor was answered by a patch, not left to a replacement")
		patched := 0
		for _, e := range exchangesOf(inPlace.ns, "canupdatemachine") {
			resp := &runtimehooksv1.CanUpdateMachineResponse{}
			Expect(json.Unmarshal(e.Response, resp)).To(Succeed())
			if p := string(resp.BootstrapConfigPatch.Patch); p != "" && p != "[]" && p != "{}" {
				patched++
			}
		}
		Expect(patched).To(BeNumerically(">", 0))

		By("Cluster API's core and KubeadmControlPlane each called the hooks with their own client certificate (the manager requires one)")
		expectCallers(inPlace.ns, "canupdatemachine", "capi-kubeadm-control-plane")
		expectCallers(inPlace.ns, "canupdatemachineset", "capi-core")
		expectCallers(inPlace.ns, "updatemachine", "capi-core")
	})

	It("answers a change it cannot do in place without a patch, and Cluster API replaces the machines", func() {
		replaced.waitProvisioned()
		_, oldWorkers, _, _ := names(replaced.before)

		By("the workers' class now names a DevMachineTemplate with another spec, which no updater declares")
		replaced.changeWorkerTemplate()

		By("Cluster API asks, is answered without a patch, and replaces both workers")
		Eventually(func(g Gomega) {
			machines, err := capienv.Machines(ctx, env.Client, replaced.ns, replaced.name)
			g.Expect(err).NotTo(HaveOccurred())
			_, workers, _, _ := names(provisioned(machines))
			g.Expect(workers).To(HaveLen(2))
			for _, w := range oldWorkers {
				g.Expect(workers).NotTo(ContainElement(w))
			}
		}, 5*time.Minute, time.Second).Should(Succeed())
		Expect(replaced.machines.Deleted()).To(ContainElements(oldWorkers))
		asked := exchangesOf(replaced.ns, "canupdatemachineset")
		Expect(asked).NotTo(BeEmpty(), "Cluster API asked CanUpdateMachineSet")
		for _, e := range asked {
			resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
			Expect(json.Unmarshal(e.Response, resp)).To(Succeed())
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			Expect(resp.MachineSetPatch.Patch).To(Or(BeEmpty(), Equal([]byte("[]"))), "no in-place claim capi-inplace cannot keep")
			Expect(resp.InfrastructureMachineTemplatePatch.Patch).To(Or(BeEmpty(), Equal([]byte("[]"))))
		}
		expectVerdicts(replaced.ns, false)
		list := &inplacev1.NodeUpdateList{}
		Expect(env.Client.List(ctx, list, client.InNamespace(replaced.ns))).To(Succeed())
		Expect(list.Items).To(BeEmpty(), "no node was upgraded in place")
	})

	It("refuses, on a fail-closed Cluster, a change it cannot do in place: Cluster API replaces no machine and the Cluster shows why", func() {
		closed.waitProvisioned()
		_, oldWorkers, _, _ := names(closed.before)
		field := "DevMachineTemplate spec.template.spec.backend.inMemory.vm.provisioning.startupDuration"

		By("before the change: an UpgradePreview of it shows the workers refused, naming the field, and the control plane untouched")
		v2 := closed.createWorkerTemplateV2()
		mds := &clusterv1.MachineDeploymentList{}
		Expect(env.Client.List(ctx, mds, client.InNamespace(closed.ns))).To(Succeed())
		Expect(mds.Items).To(HaveLen(1))
		preview := &inplacev1.UpgradePreview{
			ObjectMeta: metav1.ObjectMeta{Namespace: closed.ns, Name: "template-v2"},
			Spec: inplacev1.UpgradePreviewSpec{ClusterName: closed.name, Version: closed.shape.Version,
				TemplateChanges: []inplacev1.PreviewTemplateChange{{MachineDeployment: mds.Items[0].Name, InfrastructureTemplate: &v2}}},
		}
		Expect(env.Client.Create(ctx, preview)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(preview), preview)).To(Succeed())
			g.Expect(preview.Status.Phase).To(Equal(inplacev1.PreviewPhaseReady), preview.Status.Message)
		}, time.Minute, time.Second).Should(Succeed())
		Expect(preview.Status.FailClosed).To(BeTrue())
		outcomes := map[string]inplacev1.MachineOutcome{}
		for _, m := range preview.Status.Machines {
			outcomes[m.Name] = m.Outcome
			if slices.Contains(oldWorkers, m.Name) {
				Expect(m.Reason).To(ContainSubstring(field), "machine %s", m.Name)
			}
		}
		cp, _, _, _ := names(closed.before)
		Expect(outcomes).To(Equal(map[string]inplacev1.MachineOutcome{
			cp[0]: inplacev1.MachineOutcomeAtTarget, oldWorkers[0]: inplacev1.MachineOutcomeRefused, oldWorkers[1]: inplacev1.MachineOutcomeRefused,
		}))

		By("the change made, on a Cluster annotated " + inplacev1.FailClosedAnnotation + "=true")
		closed.pointWorkersAt(v2)

		By("Cluster API asks CanUpdateMachineSet and is answered Failure, naming the field")
		Eventually(func(g Gomega) {
			var refused []string
			for _, e := range exchangesOf(closed.ns, "canupdatemachineset") {
				resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
				g.Expect(json.Unmarshal(e.Response, resp)).To(Succeed())
				g.Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), "every answer on a fail-closed Cluster refuses this change: %s", resp.Message)
				refused = append(refused, resp.Message)
			}
			g.Expect(refused).NotTo(BeEmpty())
			g.Expect(refused[0]).To(ContainSubstring("Not covered: " + field))
		}, 3*time.Minute, time.Second).Should(Succeed())

		By("the Cluster shows the reason: a Warning event (kubectl describe cluster)")
		Eventually(func(g Gomega) {
			events := &eventsv1.EventList{}
			g.Expect(env.Client.List(ctx, events, client.InNamespace(closed.ns))).To(Succeed())
			var notes []string
			for _, e := range events.Items {
				if e.Regarding.Kind == "Cluster" && e.Regarding.Name == closed.name && e.Reason == extension.EventReasonInPlaceRefused {
					g.Expect(e.Type).To(Equal(corev1.EventTypeWarning))
					notes = append(notes, e.Note)
				}
			}
			g.Expect(notes).To(ContainElement(ContainSubstring(field)))
		}, time.Minute, time.Second).Should(Succeed())

		By("Cluster API stops the rollout and asks again with back-off: no machine is created or deleted")
		Consistently(func(g Gomega) {
			machines, err := capienv.Machines(ctx, env.Client, closed.ns, closed.name)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(machines).To(HaveLen(closed.size()), "no new machine")
			_, workers, _, _ := names(provisioned(machines))
			g.Expect(workers).To(Equal(oldWorkers), "the workers are kept")
			g.Expect(closed.machines.Deleted()).To(BeEmpty(), "no machine deleted")
		}, 30*time.Second, time.Second).Should(Succeed())
		Expect(len(exchangesOf(closed.ns, "canupdatemachineset"))).To(BeNumerically(">=", 2), "Cluster API asked again")
		list := &inplacev1.NodeUpdateList{}
		Expect(env.Client.List(ctx, list, client.InNamespace(closed.ns))).To(Succeed())
		Expect(list.Items).To(BeEmpty(), "no node was touched")
	})

	It("completes the rollout when the manager is killed in the middle of it, with one NodeUpdate per machine", func() {
		restarted.waitProvisioned()
		restarted.countRunning()
		restarted.bump("v1.36.3")

		By("killing the manager once the second machine's NodeUpdate runs")
		Eventually(func() int {
			list := &inplacev1.NodeUpdateList{}
			Expect(env.Client.List(ctx, list, client.InNamespace(restarted.ns))).To(Succeed())
			return len(list.Items)
		}, 4*time.Minute, 200*time.Millisecond).Should(BeNumerically(">=", 2))
		Expect(mgr.Kill()).To(Succeed())
		time.Sleep(3 * time.Second)
		startManager()

		after := restarted.waitAt("v1.36.3", 6*time.Minute)
		restarted.expectAllInPlace(after, "v1.36.3")
	})

	It("shows a node's own error on its Machine when the node fails its upgrade, and starts no other node", func() {
		failing.waitProvisioned()
		failing.countRunning()
		_, workers, _, _ := names(failing.before)
		failing.updater.FailMachine(workers[0], "rke2-server did not start: kubelet exited with status 1")
		failing.bump("v1.36.3")

		By("the failing worker's Machine carries Cluster API's Updating condition and capi-inplace's with the node's error")
		Eventually(func(g Gomega) {
			m := &clusterv1.Machine{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: failing.ns, Name: workers[0]}, m)).To(Succeed())
			updating := condition(m.Status.Conditions, clusterv1.MachineUpdatingCondition)
			g.Expect(updating).NotTo(BeNil())
			g.Expect(updating.Reason).To(Equal(clusterv1.MachineInPlaceUpdateFailedReason))
			ours := condition(m.Status.Conditions, inplacev1.InPlaceUpgradeFailedCondition)
			g.Expect(ours).NotTo(BeNil())
			g.Expect(ours.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(ours.Message).To(ContainSubstring("rke2-server did not start: kubelet exited with status 1"))
		}, 5*time.Minute, time.Second).Should(Succeed())
		GinkgoWriter.Println(operatorView(failing))

		By("the node's error in the events of the Machine and of the Cluster (kubectl describe), and on the UpgradeTask")
		Eventually(func(g Gomega) {
			events := &eventsv1.EventList{}
			g.Expect(env.Client.List(ctx, events, client.InNamespace(failing.ns))).To(Succeed())
			on := map[string]bool{}
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "rke2-server did not start: kubelet exited with status 1") {
					on[e.Regarding.Kind+"/"+e.Regarding.Name] = true
				}
			}
			g.Expect(on).To(HaveKey("Machine/" + workers[0]))
			g.Expect(on).To(HaveKey("Cluster/" + failing.name))
		}, time.Minute, time.Second).Should(Succeed())
		tasks := &inplacev1.UpgradeTaskList{}
		Expect(env.Client.List(ctx, tasks, client.InNamespace(failing.ns))).To(Succeed())
		var failed []string
		for _, t := range tasks.Items {
			for _, ms := range t.Status.Machines {
				if ms.State == inplacev1.MachineStateFailed {
					failed = append(failed, ms.Name+": "+ms.Message)
				}
			}
		}
		Expect(failed).To(ConsistOf(ContainSubstring(workers[0] + ": ")))
		Expect(failed[0]).To(ContainSubstring("rke2-server did not start"))

		By("Cluster API, for its part, shows the MachineDeployment still rolling out")
		md := &clusterv1.MachineDeploymentList{}
		Expect(env.Client.List(ctx, md, client.InNamespace(failing.ns))).To(Succeed())
		Expect(md.Items).To(HaveLen(1))
		rolling := condition(md.Items[0].Status.Conditions, clusterv1.MachineDeploymentRollingOutCondition)
		Expect(rolling).NotTo(BeNil())
		Expect(rolling.Status).To(Equal(metav1.ConditionTrue))

		By("no other worker is taken down while the failed one holds the MachineDeployment's one unavailable place")
		Consistently(func() map[string]int { return failing.nus.Creations() }, 10*time.Second, time.Second).
			ShouldNot(HaveKey(workers[1]))
		Expect(failing.nus.MaxRunningOf("workers")).To(BeNumerically("<=", 1))
		Expect(failing.nus.MaxRunningOf("control-plane")).To(BeNumerically("<=", 1))
		Expect(failing.machines.Deleted()).To(BeEmpty())
	})

	It("lets KCP replace a control plane of 1 machine (its rules allow in place from 3) and updates the worker in place", func() {
		single.waitProvisioned()
		oldCP, workers, _, _ := names(single.before)
		single.countRunning()
		single.bump("v1.36.3")
		Eventually(func(g Gomega) {
			machines, err := capienv.WaitProvisioned(ctx, env.Client, single.ns, single.name, single.size(), "v1.36.3", time.Second)
			g.Expect(err).NotTo(HaveOccurred())
			cp, w, _, _ := names(machines)
			g.Expect(cp).NotTo(ContainElement(oldCP[0]), "KCP replaced its one machine")
			g.Expect(w).To(Equal(workers), "the worker is kept")
		}, 6*time.Minute, time.Second).Should(Succeed())
		Expect(single.machines.Deleted()).To(Equal(oldCP))
		Expect(single.nus.Creations()).To(Equal(map[string]int{workers[0]: 1}), "only the worker was upgraded in place")
	})

	It("updates a control plane of 5 machines in place, one at a time", func() {
		five.waitProvisioned()
		five.countRunning()
		five.bump("v1.36.3")
		after := five.waitAt("v1.36.3", 6*time.Minute)
		five.expectAllInPlace(after, "v1.36.3")
	})
})

// provisioned keeps the machines that have a node and are not being deleted.
func provisioned(machines []clusterv1.Machine) []clusterv1.Machine {
	var out []clusterv1.Machine
	for _, m := range machines {
		if m.DeletionTimestamp.IsZero() && m.Status.NodeRef.IsDefined() {
			out = append(out, m)
		}
	}
	return out
}

func condition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// exchangesOf returns the recorded calls of hook whose objects are in namespace.
// expectCallers checks that some calls of hook for the namespace's clusters came with
// the client certificate of controller (test/capienv's names).
func expectCallers(namespace, hook, controller string) {
	GinkgoHelper()
	var callers []string
	for _, e := range exchangesOf(namespace, hook) {
		callers = append(callers, e.ClientCommonName)
	}
	Expect(callers).To(ContainElement(capi.ClientCerts[controller].CommonName), "callers of %s", hook)
}

func exchangesOf(namespace, hook string) []capienv.Exchange {
	var out []capienv.Exchange
	for _, e := range recorder.Exchanges(hook) {
		if strings.Contains(string(e.Request), fmt.Sprintf(`"namespace":%q`, namespace)) {
			out = append(out, e)
		}
	}
	return out
}

// expectVerdicts checks that test/capisim reads each CanUpdateMachineSet and
// CanUpdateMachine answer of the namespace as Cluster API acted on it: in place or not.
func expectVerdicts(namespace string, inPlace bool) {
	GinkgoHelper()
	n := 0
	for _, e := range exchangesOf(namespace, "canupdatemachineset") {
		req, resp := &runtimehooksv1.CanUpdateMachineSetRequest{}, &runtimehooksv1.CanUpdateMachineSetResponse{}
		Expect(json.Unmarshal(e.Request, req)).To(Succeed())
		Expect(json.Unmarshal(e.Response, resp)).To(Succeed())
		got, left, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(inPlace), "capisim's verdict on CanUpdateMachineSet for %s (left: %v)", req.Desired.MachineSet.Name, left)
		n++
	}
	for _, e := range exchangesOf(namespace, "canupdatemachine") {
		req, resp := &runtimehooksv1.CanUpdateMachineRequest{}, &runtimehooksv1.CanUpdateMachineResponse{}
		Expect(json.Unmarshal(e.Request, req)).To(Succeed())
		Expect(json.Unmarshal(e.Response, resp)).To(Succeed())
		got, left, err := capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(inPlace), "capisim's verdict on CanUpdateMachine for %s (left: %v)", req.Desired.Machine.Name, left)
		n++
	}
	Expect(n).To(BeNumerically(">", 0), "Cluster API asked the extension")
}

// operatorView renders what an operator sees of a cluster's rollout: the conditions of
// the Cluster, its MachineDeployment and its Machines that are not True-and-fine.
func operatorView(c *workloadCluster) string {
	var b strings.Builder
	cluster := &clusterv1.Cluster{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.name}, cluster)).To(Succeed())
	fmt.Fprintf(&b, "Cluster %s:\n", c.name)
	for _, cond := range cluster.Status.Conditions {
		fmt.Fprintf(&b, "  %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	mds := &clusterv1.MachineDeploymentList{}
	Expect(env.Client.List(ctx, mds, client.InNamespace(c.ns))).To(Succeed())
	for _, md := range mds.Items {
		fmt.Fprintf(&b, "MachineDeployment %s:\n", md.Name)
		for _, cond := range md.Status.Conditions {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	machines, err := capienv.Machines(ctx, env.Client, c.ns, c.name)
	Expect(err).NotTo(HaveOccurred())
	for _, m := range machines {
		fmt.Fprintf(&b, "Machine %s:\n", m.Name)
		for _, cond := range m.Status.Conditions {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	return b.String()
}
