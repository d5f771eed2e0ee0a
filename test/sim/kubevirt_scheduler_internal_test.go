package sim

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// schedNode is a Ready node as the simulated kubelet registers it (DefaultNodeResources:
// 16 CPU, 64Gi), with its hostname label, extra labels and taints.
func schedNode(name string, labels map[string]string, taints ...corev1.Taint) corev1.Node {
	all := map[string]string{corev1.LabelHostname: name}
	for k, v := range labels {
		all[k] = v
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Allocatable: DefaultNodeResources(),
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

// upgradePending is the taint an UpgradeTask puts on the nodes it has still to upgrade
// (api/v1alpha1 UpgradePendingTaint; controllers/upgradetask pendingtaint.go).
var upgradePending = corev1.Taint{Key: "inplace.cluster.x-k8s.io/upgrade-pending", Value: "default.workers", Effect: corev1.TaintEffectPreferNoSchedule}

// harvesterAntiAffinity is the default of Harvester's VM builder (harvester v1.8.2
// pkg/builder/vm.go DefaultPodAntiAffinity): prefer, with weight 100, a node that runs no
// other VM (a pod labelled harvesterhci.io/creator).
func harvesterAntiAffinity(a *corev1.Affinity) {
	a.PodAntiAffinity = &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
		Weight: 100,
		PodAffinityTerm: corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "harvesterhci.io/creator", Operator: metav1.LabelSelectorOpExists}}},
			TopologyKey:   corev1.LabelHostname,
		},
	}}}
}

func preferSSD(a *corev1.Affinity) {
	a.NodeAffinity = &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
		Weight:     50,
		Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "disk", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}},
	}}}
}

func requireApart(a *corev1.Affinity) {
	a.PodAntiAffinity = &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		TopologyKey:   corev1.LabelHostname,
	}}}
}

// schedVMI is a VMI of namespace vms on node ("" while not placed), labelled as
// Harvester labels its VMs, asking KubeVirt's defaults (one vCPU: 100m) and no memory.
func schedVMI(name, node string, affinity ...func(*corev1.Affinity)) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: name, UID: types.UID("uid-" + name),
			Labels: map[string]string{"harvesterhci.io/creator": "harvester", "app": name}},
		Status: kubevirtv1.VirtualMachineInstanceStatus{NodeName: node, Phase: kubevirtv1.Running},
	}
	if len(affinity) > 0 {
		vmi.Spec.Affinity = &corev1.Affinity{}
		for _, f := range affinity {
			f(vmi.Spec.Affinity)
		}
	}
	if node == "" {
		vmi.Status.Phase = kubevirtv1.Scheduling
	}
	return vmi
}

// roll is the vmonce spec's cluster (harvesteradapter/vmonce_test.go) while the first
// worker is evacuated: worker-0 is the source, worker-1 and worker-2 are still to be
// upgraded and carry the pending taint, spare is in no task and runs three VMs; each
// worker runs one. mutate adjusts the nodes and VMIs; moving is the VMI evacuated.
func roll(mutate func(nodes []corev1.Node, vmis map[string]*kubevirtv1.VirtualMachineInstance), affinity ...func(*corev1.Affinity)) ([]corev1.Node, map[string]*kubevirtv1.VirtualMachineInstance, *kubevirtv1.VirtualMachineInstance) {
	nodes := []corev1.Node{
		schedNode("worker-0", nil, upgradePending),
		schedNode("worker-1", nil, upgradePending),
		schedNode("worker-2", nil, upgradePending),
		schedNode("zz-spare", nil),
	}
	vmis := map[string]*kubevirtv1.VirtualMachineInstance{}
	for i, node := range []string{"worker-0", "worker-1", "worker-2", "zz-spare", "zz-spare", "zz-spare"} {
		var v *kubevirtv1.VirtualMachineInstance
		if i == 0 {
			v = schedVMI("vm-a", node, affinity...)
		} else {
			v = schedVMI(fmt.Sprintf("vm-%d", i), node, affinity...)
		}
		vmis["vms/"+v.Name] = v
	}
	if mutate != nil {
		mutate(nodes, vmis)
	}
	return nodes, vmis, vmis["vms/vm-a"]
}

func TestScheduleAsKubeScheduler(t *testing.T) {
	for _, tc := range []struct {
		name     string
		affinity []func(*corev1.Affinity)
		mutate   func([]corev1.Node, map[string]*kubevirtv1.VirtualMachineInstance)
		added    map[string]string
		want     string
		// scores, best first, as NodeScore.String prints them; none when one node was feasible.
		scores []string
	}{
		{
			// TaintToleration 0 or 100 (one taint at most) × 3 = 300 against at most 100 + 50
			// from the two resource scores: the spare wins however busy it is.
			name: "plain VMs: the pending taint outweighs the resource scores",
			want: "zz-spare",
			scores: []string{
				// spare: CPU 400m of 16 → 97, memory 4 × 200Mi (the defaults for a pod asking
				// none) of 64Gi → 98, LeastAllocated (97+98)/2 = 97; balance 98 with the pod,
				// 99 without: 50 + (50+98-99)/2 = 74.
				"zz-spare 471 (TaintToleration 300, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 97, NodeResourcesBalancedAllocation 74)",
				"worker-1 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"worker-2 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
			},
		},
		{
			// Every VM keeps away from the others (-100 per VM on a node, both ways: the
			// incoming pod's terms and the bound pods'): worker-1 -200, spare -600,
			// normalized to 100 and 0, × 2. 200 + 1 + 1 is short of 300.
			name:     "Harvester's default anti-affinity alone: the taint still wins",
			affinity: []func(*corev1.Affinity){harvesterAntiAffinity},
			want:     "zz-spare",
			scores: []string{
				"zz-spare 471 (TaintToleration 300, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 97, NodeResourcesBalancedAllocation 74)",
				"worker-1 373 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 200, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"worker-2 373 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 200, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
			},
		},
		{
			// A preferred node affinity that only a node still to go matches, with the
			// anti-affinity: 200 + 200 + 98 + 75 = 573 against the spare's 471. The VM lands
			// on worker-1 and moves again when worker-1's turn comes.
			name:     "a preferred node affinity with the anti-affinity: the VM lands on a node still to go",
			affinity: []func(*corev1.Affinity){harvesterAntiAffinity, preferSSD},
			mutate: func(nodes []corev1.Node, _ map[string]*kubevirtv1.VirtualMachineInstance) {
				nodes[1].Labels["disk"] = "ssd"
			},
			want: "worker-1",
			scores: []string{
				"worker-1 573 (TaintToleration 0, NodeAffinity 200, InterPodAffinity 200, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"zz-spare 471 (TaintToleration 300, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 97, NodeResourcesBalancedAllocation 74)",
				"worker-2 373 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 200, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
			},
		},
		{
			// Any other PreferNoSchedule taint on the spare: every feasible node has one, so
			// TaintToleration scores them all 0, and the emptier workers win on resources
			// (worker-1 and worker-2 tie; the real scheduler picks either).
			name: "a PreferNoSchedule taint of someone else's on the spare: the taint tells nothing",
			mutate: func(nodes []corev1.Node, _ map[string]*kubevirtv1.VirtualMachineInstance) {
				nodes[3].Spec.Taints = []corev1.Taint{{Key: "example.com/reserved", Effect: corev1.TaintEffectPreferNoSchedule}}
			},
			want: "worker-1",
			scores: []string{
				"worker-1 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"worker-2 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"zz-spare 171 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 97, NodeResourcesBalancedAllocation 74)",
			},
		},
		{
			// KubeVirt merges a migration's addedNodeSelector into the target pod's
			// nodeSelector: a filter, which no score outweighs.
			name:     "the migration's addedNodeSelector is a filter: the spare, whatever the scores",
			affinity: []func(*corev1.Affinity){harvesterAntiAffinity, preferSSD},
			mutate: func(nodes []corev1.Node, _ map[string]*kubevirtv1.VirtualMachineInstance) {
				nodes[1].Labels["disk"] = "ssd"
				nodes[3].Labels["example.com/landing"] = "true"
			},
			added: map[string]string{"example.com/landing": "true"},
			want:  "zz-spare",
		},
		{
			// The test API server taints every node it creates not-ready (admission plugin
			// TaintNodesByCondition) and runs no controller to take it off: the Ready
			// condition says instead.
			name: "the node lifecycle controller's taints are read from the node's condition",
			mutate: func(nodes []corev1.Node, _ map[string]*kubevirtv1.VirtualMachineInstance) {
				for i := range nodes {
					nodes[i].Spec.Taints = append(nodes[i].Spec.Taints, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule})
				}
			},
			want: "zz-spare",
			scores: []string{
				"zz-spare 471 (TaintToleration 300, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 97, NodeResourcesBalancedAllocation 74)",
				"worker-1 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"worker-2 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
			},
		},
		{
			name: "NoSchedule taints, a cordon and a NotReady node are filtered out",
			mutate: func(nodes []corev1.Node, _ map[string]*kubevirtv1.VirtualMachineInstance) {
				nodes[1].Spec.Taints = append(nodes[1].Spec.Taints, corev1.Taint{Key: "kubevirt.io/drain", Value: "draining", Effect: corev1.TaintEffectNoSchedule})
				nodes[2].Spec.Unschedulable = true
				nodes[3].Status.Conditions[0].Status = corev1.ConditionFalse
			},
			want: "",
		},
		{
			// The spare runs a VM labelled app=db; the moving VM requires to be apart from
			// such VMs.
			name: "a required pod anti-affinity filters the node that runs a matching VM",
			mutate: func(_ []corev1.Node, vmis map[string]*kubevirtv1.VirtualMachineInstance) {
				vmis["vms/vm-a"].Spec.Affinity = &corev1.Affinity{}
				requireApart(vmis["vms/vm-a"].Spec.Affinity)
				vmis["vms/vm-4"].Labels["app"] = "db"
			},
			want: "worker-1",
			scores: []string{
				"worker-1 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
				"worker-2 173 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 98, NodeResourcesBalancedAllocation 75)",
			},
		},
		{
			// The spare has 24Gi left for a 40Gi VM. On a worker: LeastAllocated CPU 200m
			// → 98, memory 200Mi + 40Gi of 64Gi → 37, (98+37)/2 = 67; balance 69 with the
			// pod (|0.0125 - 0.625| / 2 off), 99 without: 50 + (50+69-99)/2 = 60.
			name: "no room on the spare: filtered by NodeResourcesFit",
			mutate: func(_ []corev1.Node, vmis map[string]*kubevirtv1.VirtualMachineInstance) {
				vmis["vms/vm-a"].Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("40Gi")}
				vmis["vms/vm-4"].Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("40Gi")}
			},
			want: "worker-1",
			scores: []string{
				"worker-1 127 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 67, NodeResourcesBalancedAllocation 60)",
				"worker-2 127 (TaintToleration 0, NodeAffinity 0, InterPodAffinity 0, NodeResourcesFit 67, NodeResourcesBalancedAllocation 60)",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes, vmis, moving := roll(tc.mutate, tc.affinity...)
			got := schedule(launcherOf(moving, tc.added), nodes, boundLaunchers(vmis), moving.Status.NodeName)
			if got.Node != tc.want {
				t.Errorf("placed on %q, want %q; scores: %s", got.Node, tc.want, describeScores(got.Scores))
			}
			if len(got.Scores) != len(tc.scores) {
				t.Fatalf("scores %s, want %d of them", describeScores(got.Scores), len(tc.scores))
			}
			for i := range tc.scores {
				if got.Scores[i].String() != tc.scores[i] {
					t.Errorf("score %d:\n got %s\nwant %s", i, got.Scores[i], tc.scores[i])
				}
			}
		})
	}
}

func TestDefaultNormalize(t *testing.T) {
	for _, tc := range []struct {
		in      []int64
		reverse bool
		want    []int64
	}{
		{[]int64{0, 0, 0}, true, []int64{100, 100, 100}},
		{[]int64{0, 0, 0}, false, []int64{0, 0, 0}},
		{[]int64{1, 0, 1}, true, []int64{0, 100, 0}},
		// A node with two intolerable PreferNoSchedule taints halves what one is worth.
		{[]int64{1, 0, 2}, true, []int64{50, 100, 0}},
		{[]int64{50, 100, 0}, false, []int64{50, 100, 0}},
		{[]int64{3, 7}, false, []int64{42, 100}},
	} {
		got := append([]int64(nil), tc.in...)
		defaultNormalize(got, tc.reverse)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("defaultNormalize(%v, %v) = %v, want %v", tc.in, tc.reverse, got, tc.want)
		}
	}
}
