package extension_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
)

// CanUpdateMachineSet and UpdateMachine share one judge: what UpdateMachine would
// decline, CanUpdateMachineSet refuses before Cluster API moves and marks a machine.
var _ = Describe("One judge for CanUpdateMachineSet and UpdateMachine", func() {
	var (
		w     *world
		hooks *extension.InPlaceHooks
	)
	BeforeEach(func() {
		w = newWorld(map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation})
		hooks = newInPlaceHooks("")
	})

	It("refuses workers newer than their control plane (VersionSkew) at CanUpdateMachineSet, in UpdateMachine's words, and writes nothing", func() {
		before := snapshot(w.ns)
		resp := askSet(hooks, canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), "a yes lets Cluster API move and mark the machines that UpdateMachine then declines: %s", resp.Message)
		Expect(resp.MachineSetPatch.IsDefined()).To(BeFalse())
		Expect(resp.Message).To(HavePrefix("capi-inplace refuses to update the machines of MachineDeployment workers in place (VersionSkew): "))

		Expect(snapshot(w.ns)).To(Equal(before), "CanUpdateMachineSet writes nothing")

		// UpdateMachine declines the same machines for the same reason, in the same words.
		marked := setDesiredVersion(w.workers[0], toVersion)
		before = snapshot(w.ns)
		update := askUpdate(hooks, updateMachineRequest(marked, nil))
		Expect(update.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		prefix := fmt.Sprintf("capi-inplace declines to update Machine %s/workers-1 in place (VersionSkew): ", w.ns)
		Expect(update.Message).To(HavePrefix(prefix))
		Expect(resp.Message).To(ContainSubstring(update.Message[len(prefix):]), "one judge, one message")
		Expect(snapshot(w.ns)).To(Equal(before), "UpdateMachine writes nothing for a declined skew")
	})

	It("answers in place once the control plane runs the version, as UpdateMachine then accepts", func() {
		w.controlPlaneRuns(toVersion)
		resp := askSet(hooks, canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.MachineSetPatch.IsDefined()).To(BeTrue())
	})

	It("refuses a control plane machine whose sibling already runs a newer version (Downgrade), as UpdateMachine would", func() {
		w.controlPlaneMachineRuns(1, "v1.35.0+rke2r1")
		resp := &runtimehooksv1.CanUpdateMachineResponse{}
		hooks.CanUpdateMachine(ctx, canUpdateMachineRequest(w, fromVersion, toVersion, 33, 34, nil, nil), resp)
		resp = viaWire(resp)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), resp.Message)
		Expect(resp.Message).To(HavePrefix("capi-inplace refuses to update the machines of KubeadmControlPlane cp in place (Downgrade): version " + toVersion + " is older than v1.35.0+rke2r1, which machine cp-2 already runs"))
	})
})

// controlPlaneMachineRuns records that control plane machine i (0-based) reached v.
func (w *world) controlPlaneMachineRuns(i int, v string) {
	GinkgoHelper()
	m := &clusterv1.Machine{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(w.cps[i]), m)).To(Succeed())
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[inplacev1.UpgradeReleaseAnnotation] = v
	Expect(k8s.Update(ctx, m)).To(Succeed())
}
