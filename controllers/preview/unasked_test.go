package preview

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// Cluster API replaces or deletes some machines without asking the CanUpdate hooks, or
// on an answer it cached: the preview names each, with the path, never InPlace.
var _ = Describe("UpgradePreview names the machines Cluster API replaces without asking", func() {
	var stop func()
	BeforeEach(func() { stop = startManager(registryWith(&fakeUpdater{hold: map[string]string{}})) })
	AfterEach(func() { stop() })

	editKCP := func(w *world, edit func(*controlplanev1.KubeadmControlPlane)) {
		GinkgoHelper()
		kcp := &controlplanev1.KubeadmControlPlane{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "cp"}, kcp)).To(Succeed())
		edit(kcp)
		Expect(k8s.Update(ctx, kcp)).To(Succeed())
	}
	editMD := func(w *world, edit func(*clusterv1.MachineDeployment)) {
		GinkgoHelper()
		md := &clusterv1.MachineDeployment{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "workers"}, md)).To(Succeed())
		edit(md)
		Expect(k8s.Update(ctx, md)).To(Succeed())
	}
	editMachineStatus := func(w *world, name string, edit func(*clusterv1.Machine)) {
		GinkgoHelper()
		m := &clusterv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, m)).To(Succeed())
		edit(m)
		Expect(k8s.Status().Update(ctx, m)).To(Succeed())
	}
	expectUnasked := func(p *inplacev1.UpgradePreview, machine string, path inplacev1.UnaskedPath, words string) {
		GinkgoHelper()
		m := machineOf(p, machine)
		Expect(m.Outcome).To(Equal(inplacev1.MachineOutcomeReplaced), "%s: %s", machine, m.Reason)
		Expect(m.UnaskedPath).To(Equal(path), m.Reason)
		Expect(m.Reason).To(ContainSubstring(words))
		Expect(m.Order).To(BeZero(), "a machine Cluster API replaces has no place in the in-place order")
	}
	expectInPlace := func(p *inplacev1.UpgradePreview, machines ...string) {
		GinkgoHelper()
		for _, name := range machines {
			m := machineOf(p, name)
			Expect(m.Outcome).To(Equal(inplacev1.MachineOutcomeInPlace), "%s: %s", name, m.Reason)
			Expect(m.UnaskedPath).To(BeEmpty())
		}
	}

	It("names a control plane machine whose certificates expire within KubeadmControlPlane's rollout.before (RolloutBefore)", func() {
		w := newWorld(false)
		editKCP(w, func(kcp *controlplanev1.KubeadmControlPlane) { kcp.Spec.Rollout.Before.CertificatesExpiryDays = 30 })
		editMachineStatus(w, "cp-2", func(m *clusterv1.Machine) {
			m.Status.CertificatesExpiryDate = metav1.NewTime(time.Now().Add(10 * 24 * time.Hour))
		})
		editMachineStatus(w, "cp-3", func(m *clusterv1.Machine) {
			m.Status.CertificatesExpiryDate = metav1.NewTime(time.Now().Add(300 * 24 * time.Hour))
		})
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		expectUnasked(p, "cp-2", inplacev1.UnaskedPathRolloutBefore, "within the 30 days of KubeadmControlPlane cp's spec.rollout.before.certificatesExpiryDays")
		expectInPlace(p, "cp-1", "cp-3", "workers-1", "workers-2", "workers-3")
		Expect(p.Status.Replaced).To(Equal(int32(1)))
	})

	It("names the machines older than a passed rollout.after of the KubeadmControlPlane and the MachineDeployment (RolloutAfter)", func() {
		w := newWorld(false)
		time.Sleep(1100 * time.Millisecond) // rollout.after falls after the machines' and MachineSet's creation second
		after := metav1.NewTime(time.Now().Truncate(time.Second))
		editKCP(w, func(kcp *controlplanev1.KubeadmControlPlane) { kcp.Spec.Rollout.After = after })
		editMD(w, func(md *clusterv1.MachineDeployment) { md.Spec.Rollout.After = after })
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		for _, m := range []string{"cp-1", "cp-2", "cp-3"} {
			expectUnasked(p, m, inplacev1.UnaskedPathRolloutAfter, "KubeadmControlPlane cp's spec.rollout.after")
		}
		for _, m := range []string{"workers-1", "workers-2", "workers-3"} {
			expectUnasked(p, m, inplacev1.UnaskedPathRolloutAfter, "MachineDeployment workers's spec.rollout.after")
		}
		Expect(p.Status.InPlace).To(BeZero())
	})

	It("names the control plane machine KubeadmControlPlane's preflight fallback deletes: picked next, and alone unhealthy (PreflightFallback)", func() {
		w := newWorld(false)
		for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
			editMachineStatus(w, name, func(m *clusterv1.Machine) {
				for _, c := range kcpHealthConditions(true) {
					status, reason := metav1.ConditionTrue, "Healthy"
					if name == "cp-2" && c == controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition {
						status, reason = metav1.ConditionFalse, "Unhealthy"
					}
					m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: c, Status: status, Reason: reason, LastTransitionTime: metav1.Now()})
				}
			})
		}
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		expectUnasked(p, "cp-2", inplacev1.UnaskedPathPreflightFallback, "it alone fails KubeadmControlPlane's preflight checks (EtcdMemberHealthy False)")
		expectInPlace(p, "cp-1", "cp-3")
	})

	It("names the machine a surging rollout deletes rather than update: the newest control plane machine, and the MachineDeployment's last in deletion order (MaxSurge)", func() {
		w := newWorld(true)
		editKCP(w, func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.Rollout.Strategy.Type = controlplanev1.RollingUpdateStrategyType
			kcp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(1))
		})
		editMD(w, func(md *clusterv1.MachineDeployment) {
			md.Spec.Rollout.Strategy.Type = clusterv1.RollingUpdateMachineDeploymentStrategyType
			md.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(1))
			md.Spec.Rollout.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(0))
		})
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		expectUnasked(p, "cp-3", inplacev1.UnaskedPathMaxSurge, "rollout.strategy.rollingUpdate.maxSurge is 1")
		expectUnasked(p, "workers-3", inplacev1.UnaskedPathMaxSurge, "surges (maxSurge 1, maxUnavailable 0)")
		expectInPlace(p, "cp-1", "cp-2", "workers-1", "workers-2")
		Expect(orderOf(p, workersTarget)).To(Equal([]string{"workers-1", "workers-2"}))

		By("with maxUnavailable 1 the planner moves every machine: none is deleted")
		editMD(w, func(md *clusterv1.MachineDeployment) {
			md.Spec.Rollout.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		})
		Expect(fixturesRefresh(w, "2")).To(Succeed())
		p = w.computed(inplacev1.PreviewPhaseReady)
		expectInPlace(p, "workers-1", "workers-2", "workers-3")
	})

	It("names the machines of a MachineSet whose \"not in place\" answer Cluster API keeps for 24 hours (CachedRefusal)", func() {
		w := newWorld(false)
		md := &clusterv1.MachineDeployment{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "workers"}, md)).To(Succeed())
		old := &clusterv1.MachineSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "workers-ms"}, old)).To(Succeed())
		// The new MachineSet Cluster API created for the version, and asked about.
		newMS := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "workers-ms-new", Labels: old.Labels}, Spec: *old.Spec.DeepCopy()}
		newMS.Spec.Template.Spec.Version = targetVersion
		newMS.Spec.Replicas = ptr.To(int32(0))
		Expect(controllerutil.SetControllerReference(md, newMS, k8s.Scheme())).To(Succeed())
		Expect(k8s.Create(ctx, newMS)).To(Succeed())

		// Cluster API asked before the ExtensionConfig named an updater: "not in place".
		req := &runtimehooksv1.CanUpdateMachineSetRequest{}
		req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("CanUpdateMachineSetRequest"))
		req.Current.MachineSet = clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: old.Name, Labels: old.Labels}, Spec: old.Spec}
		req.Desired.MachineSet = clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: newMS.Name, Labels: newMS.Labels}, Spec: newMS.Spec}
		resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
		managerHooks.CanUpdateMachineSet(ctx, req, resp)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.MachineSetPatch.IsDefined()).To(BeFalse(), "not in place: %s", resp.Message)

		// Today the hooks, with the updater, would answer in place; Cluster API does not ask.
		w.createPreview(targetVersion)
		p := w.computed(inplacev1.PreviewPhaseReady)
		for _, m := range []string{"workers-1", "workers-2", "workers-3"} {
			expectUnasked(p, m, inplacev1.UnaskedPathCachedRefusal, "capi-inplace answered CanUpdateMachineSet for MachineSet workers-ms to workers-ms-new at ")
			Expect(machineOf(p, m).Reason).To(ContainSubstring("(the hooks' answer, which does not decide it: InPlace"))
		}
		expectInPlace(p, "cp-1", "cp-2", "cp-3")
	})
})

// fixturesRefresh asks the preview to be computed again.
func fixturesRefresh(w *world, token string) error {
	p := &inplacev1.UpgradePreview{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "preview"}, p); err != nil {
		return err
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[inplacev1.RefreshAnnotation] = token
	return k8s.Update(ctx, p)
}
