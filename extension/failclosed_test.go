package extension_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/tools/events"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capisim"
)

var _ = Describe("A fail-closed Cluster", func() {
	var (
		w        *world
		hooks    *extension.InPlaceHooks
		recorder *events.FakeRecorder
	)
	BeforeEach(func() {
		w = newWorld(map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation, inplacev1.FailClosedAnnotation: "true"})
		hooks = newInPlaceHooks("")
		recorder = events.NewFakeRecorder(10)
		hooks.Recorder = recorder
	})
	newFile := func(_ *clusterv1.MachineSet, bootstrap, _ map[string]any) {
		bootstrap["files"] = append(bootstrap["files"].([]any), map[string]any{"path": "/etc/new", "content": "x"})
	}

	It("answers Failure naming the fields no updater covers, with no patch, and shows it on the Cluster", func() {
		before := snapshot(w.ns)
		resp := askSet(hooks, canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, newFile))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(ContainSubstring("Cluster " + w.ns + "/harvester is fail-closed (" + inplacev1.FailClosedAnnotation + "=true)"))
		Expect(resp.Message).To(ContainSubstring("MachineSet " + w.ns + "/workers-ms cannot be updated in place"))
		Expect(resp.Message).To(ContainSubstring("Not covered: KubeadmConfigTemplate spec.template.spec.files"))
		Expect(resp.Message).To(ContainSubstring("revert the change, or remove the annotation"))
		Expect(resp.MachineSetPatch.IsDefined()).To(BeFalse(), "no partial claim")
		Expect(recorder.Events).To(Receive(And(
			ContainSubstring("Warning "+extension.EventReasonInPlaceRefused),
			ContainSubstring("KubeadmConfigTemplate spec.template.spec.files"))))
		Expect(snapshot(w.ns)).To(Equal(before), "the hook writes no object")
	})

	It("answers Failure for a version change it must not do in place, with the reason", func() {
		resp := askSet(hooks, canUpdateMachineSetRequest(w.ns, toVersion, fromVersion, nil, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(ContainSubstring("Not covered: MachineSet spec.template.spec.version"))
		Expect(resp.Message).To(ContainSubstring("is a downgrade"))
	})

	It("answers Failure when the Cluster has no updater at all", func() {
		w2 := newWorld(map[string]string{inplacev1.FailClosedAnnotation: "true"})
		resp := askSet(hooks, canUpdateMachineSetRequest(w2.ns, fromVersion, toVersion, nil, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(ContainSubstring("no updater configured"))
	})

	It("still answers a change it covers, which Cluster API then does in place", func() {
		w.controlPlaneRuns(toVersion)
		req := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
		resp := askSet(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		inPlace, left, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left: %v", left)
		Expect(recorder.Events).NotTo(Receive(), "nothing refused")
	})

	It("does as before once the annotation is removed: Success, the uncovered fields named, Cluster API replaces", func() {
		w.annotateCluster(inplacev1.FailClosedAnnotation, "")
		req := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, newFile)
		resp := askSet(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.Message).To(HaveSuffix("not covered, so Cluster API replaces the machines: KubeadmConfigTemplate spec.template.spec.files"))
		inPlace, _, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
	})
})

var _ = Describe("RemainingMachineSet and RemainingMachine", func() {
	var (
		w     *world
		hooks *extension.InPlaceHooks
	)
	BeforeEach(func() {
		w = newWorld(map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation})
		hooks = newInPlaceHooks("")
		w.controlPlaneRuns(toVersion) // the workers may follow (no VersionSkew refusal)
	})

	// Cluster API's own verdict (test/capisim follows its v1.14 code) and the product's
	// list of what is left must agree: nothing left exactly when it updates in place.
	DescribeTable("agree with Cluster API's verdict on the hook's answer",
		func(from, to string, mutate func(ms *clusterv1.MachineSet, bootstrap, infra map[string]any), want []string) {
			req := canUpdateMachineSetRequest(w.ns, from, to, nil, mutate)
			resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
			hooks.CanUpdateMachineSet(ctx, req, resp)
			resp = viaWire(resp)
			left, err := extension.RemainingMachineSet(req, resp)
			Expect(err).NotTo(HaveOccurred())
			Expect(left).To(Equal(want))
			inPlace, _, err := capisim.VerdictMachineSet(req, resp)
			Expect(err).NotTo(HaveOccurred())
			Expect(inPlace).To(Equal(len(want) == 0))
		},
		Entry("a covered version bump", fromVersion, toVersion, nil, nil),
		Entry("a downgrade", toVersion, fromVersion, nil, []string{"MachineSet spec.template.spec.version"}),
		Entry("a new failure domain", fromVersion, toVersion, func(ms *clusterv1.MachineSet, _, _ map[string]any) {
			ms.Spec.Template.Spec.FailureDomain = "zone-b"
		}, []string{"MachineSet spec.template.spec.failureDomain"}),
		Entry("a change Cluster API leaves out (taints, drain timeout)", fromVersion, toVersion, func(ms *clusterv1.MachineSet, _, _ map[string]any) {
			ms.Spec.Template.Spec.Taints = []clusterv1.MachineTaint{{Key: "k", Effect: "NoSchedule", Propagation: clusterv1.MachineTaintPropagationAlways}}
			ms.Spec.Template.Spec.Deletion.NodeDrainTimeoutSeconds = new(int32(60))
		}, nil),
		Entry("an infrastructure field", fromVersion, toVersion, func(_ *clusterv1.MachineSet, _, infra map[string]any) {
			infra["memory"] = "16Gi"
		}, []string{"HarvesterMachineTemplate spec.template.spec.memory"}),
	)

	It("lists what a control plane Machine keeps different", func() {
		req := canUpdateMachineRequest(w, fromVersion, toVersion, 33, 34, nil, func(_ *clusterv1.Machine, _, infra map[string]any) {
			infra["cpuCount"] = int64(16)
		})
		resp := &runtimehooksv1.CanUpdateMachineResponse{}
		hooks.CanUpdateMachine(ctx, req, resp)
		left, err := extension.RemainingMachine(req, viaWire(resp))
		Expect(err).NotTo(HaveOccurred())
		Expect(left).To(Equal([]string{"HarvesterMachine spec.cpuCount"}))
		inPlace, _, err := capisim.VerdictMachine(req, viaWire(resp))
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
	})
})
