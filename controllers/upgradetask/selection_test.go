package upgradetask

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/nodeorder"
)

func testMember(name, node string, created time.Time) *member {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
	return &member{name: name, nodeName: node, machine: m, state: inplacev1.MachineStateWaiting}
}

var _ = Describe("selection order", func() {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	names := func(ms []*member) []string {
		out := []string{}
		for _, m := range ms {
			out = append(out, m.name)
		}
		return out
	}

	DescribeTable("orders the members stably",
		func(controlPlane bool, nodeOrder []string, want []string) {
			members := []*member{
				testMember("c", "node-c", t0.Add(1*time.Hour)),
				testMember("a", "node-a", t0.Add(3*time.Hour)),
				testMember("d", "node-d", t0),
				testMember("b", "node-b", t0.Add(1*time.Hour)),
			}
			orderMembers(members, nodeOrder, controlPlane)
			Expect(names(members)).To(Equal(want))
		},
		Entry("workers: by name", false, nil, []string{"a", "b", "c", "d"}),
		Entry("control plane: oldest first, then by name", true, nil, []string{"d", "b", "c", "a"}),
		Entry("nodeOrder first, in its order, by node or machine name", false, []string{"node-c", "a"}, []string{"c", "a", "b", "d"}),
		Entry("nodeOrder first on a control plane too", true, []string{"node-a"}, []string{"a", "d", "b", "c"}),
		Entry("unknown names in nodeOrder are ignored", false, []string{"ghost"}, []string{"a", "b", "c", "d"}),
	)

	It("puts a Harvester witness node after the management nodes, unless nodeOrder names it", func() {
		members := []*member{
			testMember("w", "node-w", t0),
			testMember("m1", "node-m1", t0.Add(time.Hour)),
			testMember("m2", "node-m2", t0.Add(2*time.Hour)),
		}
		members[0].node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-w", Labels: map[string]string{nodeorder.LabelWitnessNode: "true"}}}
		orderMembers(members, nil, true)
		Expect(names(members)).To(Equal([]string{"m1", "m2", "w"}), "the oldest machine is the witness, yet it goes last")
		orderMembers(members, []string{"node-w"}, true)
		Expect(names(members)).To(Equal([]string{"w", "m1", "m2"}))
	})
})

var _ = Describe("task phase", func() {
	scope := func(dryRun bool, pending int, states ...inplacev1.MachineState) *taskScope {
		s := &taskScope{task: &inplacev1.UpgradeTask{Spec: inplacev1.UpgradeTaskSpec{DryRun: dryRun}}, pendingHandover: pending}
		for _, st := range states {
			m := &member{state: st}
			if st != inplacev1.MachineStateWaiting {
				m.nu = &inplacev1.NodeUpdate{}
			}
			s.members = append(s.members, m)
		}
		return s
	}
	const (
		W = inplacev1.MachineStateWaiting
		P = inplacev1.MachineStateInProgress
		U = inplacev1.MachineStateUpgraded
		F = inplacev1.MachineStateFailed
		A = inplacev1.MachineStateAborted
	)
	DescribeTable("is derived from the members",
		func(s *taskScope, aborting bool, want inplacev1.TaskPhase) {
			Expect(computePhase(s, aborting)).To(Equal(want))
		},
		Entry("nothing started", scope(false, 0, W, W), false, inplacev1.TaskPhasePending),
		Entry("one running", scope(false, 0, U, P, W), false, inplacev1.TaskPhaseInProgress),
		Entry("all upgraded", scope(false, 0, U, U), false, inplacev1.TaskPhaseCompleted),
		Entry("no machine to upgrade", scope(false, 0), false, inplacev1.TaskPhaseCompleted),
		Entry("a failure while another runs: not over yet", scope(false, 0, F, P, W), false, inplacev1.TaskPhaseInProgress),
		Entry("a failure, nothing running", scope(false, 0, U, F, W), false, inplacev1.TaskPhaseFailed),
		Entry("an abort from outside the task stops it as a failure", scope(false, 0, A, W), false, inplacev1.TaskPhaseFailed),
		Entry("aborting while a node runs", scope(false, 0, P, W), true, inplacev1.TaskPhaseAborting),
		Entry("aborted", scope(false, 0, U, A, W), true, inplacev1.TaskPhaseAborted),
		Entry("dry run", scope(true, 0, W, W), false, inplacev1.TaskPhasePlanned),
		Entry("external pacing: every handed machine done, more to come", scope(false, 2, U), false, inplacev1.TaskPhaseInProgress),
		Entry("external pacing: nothing handed yet", scope(false, 2), false, inplacev1.TaskPhasePending),
	)
})
