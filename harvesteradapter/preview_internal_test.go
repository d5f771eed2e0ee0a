package harvesteradapter

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// TestEvictionRefusal checks the eviction API's budget rules as kubernetes v1.36.3
// pkg/registry/core/pod/storage/eviction.go applies them.
func TestEvictionRefusal(t *testing.T) {
	pod := func(phase corev1.PodPhase, ready bool) *corev1.Pod {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"app": "a"}},
			Status:     corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
		}
	}
	budget := func(name string, allowed, healthy, desired int32, mutate ...func(*policyv1.PodDisruptionBudget)) policyv1.PodDisruptionBudget {
		b := policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
			Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}},
			Status:     policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, DisruptionsAllowed: allowed, CurrentHealthy: healthy, DesiredHealthy: desired},
		}
		for _, m := range mutate {
			m(&b)
		}
		return b
	}
	other := func(b *policyv1.PodDisruptionBudget) { b.Spec.Selector.MatchLabels = map[string]string{"app": "b"} }
	stale := func(b *policyv1.PodDisruptionBudget) { b.Generation = 2 }
	alwaysAllow := func(b *policyv1.PodDisruptionBudget) {
		b.Spec.UnhealthyPodEvictionPolicy = ptr.To(policyv1.AlwaysAllow)
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		budgets []policyv1.PodDisruptionBudget
		want    string // "" when evicted
	}{
		{"no budget", pod(corev1.PodRunning, true), nil, ""},
		{"another app's budget", pod(corev1.PodRunning, true), []policyv1.PodDisruptionBudget{budget("b", 0, 1, 1, other)}, ""},
		{"allows one", pod(corev1.PodRunning, true), []policyv1.PodDisruptionBudget{budget("b", 1, 2, 1)}, ""},
		{"allows none", pod(corev1.PodRunning, true), []policyv1.PodDisruptionBudget{budget("b", 0, 1, 1)}, "disruptionsAllowed 0"},
		{"not observed yet", pod(corev1.PodRunning, true), []policyv1.PodDisruptionBudget{budget("b", 1, 2, 1, stale)}, "has not processed"},
		{"two budgets", pod(corev1.PodRunning, true), []policyv1.PodDisruptionBudget{budget("b", 1, 2, 1), budget("c", 1, 2, 1)}, "more than one"},
		{"pending pod", pod(corev1.PodPending, false), []policyv1.PodDisruptionBudget{budget("b", 0, 1, 1)}, ""},
		{"finished pod", pod(corev1.PodSucceeded, false), []policyv1.PodDisruptionBudget{budget("b", 0, 1, 1)}, ""},
		{"unready pod, budget met", pod(corev1.PodRunning, false), []policyv1.PodDisruptionBudget{budget("b", 0, 1, 1)}, ""},
		{"unready pod, budget short", pod(corev1.PodRunning, false), []policyv1.PodDisruptionBudget{budget("b", 0, 0, 1)}, "disruptionsAllowed 0"},
		{"unready pod, AlwaysAllow", pod(corev1.PodRunning, false), []policyv1.PodDisruptionBudget{budget("b", 0, 0, 1, alwaysAllow)}, ""},
	} {
		_, why := evictionRefusal(tc.pod, tc.budgets)
		if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: refusal %q, want one with %q", tc.name, why, tc.want)
		}
	}
}

// TestVMIRequests checks what a VMI is counted as asking: its launcher pod's requests,
// else its spec's, with KubeVirt's default CPU allocation ratio for the CPU.
func TestVMIRequests(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "u1"}}
	vmi.Spec.Domain.CPU = &kubevirtv1.CPU{Cores: 2, Sockets: 2}
	vmi.Spec.Domain.Memory = &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("4Gi"))}
	if r, exact := vmiRequests(vmi, nil, kubevirtCPUAllocationRatio); exact || r.cpu != 400 || r.mem != 4<<30 {
		t.Errorf("from the spec: %+v exact %v, want 400m (4 vCPUs / 10) and 4Gi, inexact", r, exact)
	}
	if r, _ := vmiRequests(vmi, nil, 4); r.cpu != 1000 {
		t.Errorf("with cpuAllocationRatio 4: %dm, want 1000m", r.cpu)
	}
	vmi.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3"), corev1.ResourceMemory: resource.MustParse("2Gi")}
	if r, _ := vmiRequests(vmi, nil, kubevirtCPUAllocationRatio); r.cpu != 3000 || r.mem != 2<<30 {
		t.Errorf("from the spec's requests: %+v, want 3 CPUs and 2Gi", r)
	}
	launcher := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "compute", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3"), corev1.ResourceMemory: resource.MustParse("2300Mi")}}},
		{Name: "hotplug", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("10Mi")}}},
	}}}
	if r, exact := vmiRequests(vmi, map[types.UID]*corev1.Pod{"u1": launcher}, kubevirtCPUAllocationRatio); !exact || r.cpu != 3010 || r.mem != 2310<<20 {
		t.Errorf("from the launcher pod: %+v exact %v, want 3010m and 2310Mi, exact", r, exact)
	}
}
