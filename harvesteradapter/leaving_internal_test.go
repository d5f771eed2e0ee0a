package harvesteradapter

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// TestDrainEvicts checks the drain's rules as kubectl drain documents them, for the
// HarvesterUpgrader's drain settings.
func TestDrainEvicts(t *testing.T) {
	owned := func(kind string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "x", Controller: ptr.To(true)}}
		}
	}
	emptyDir := func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	tests := []struct {
		name   string
		pod    []func(*corev1.Pod)
		drain  harvesterv1.Drain
		evicts bool
		why    string
	}{
		{name: "a ReplicaSet's pod", pod: []func(*corev1.Pod){owned("ReplicaSet")}, evicts: true},
		{name: "a DaemonSet's pod stays", pod: []func(*corev1.Pod){owned("DaemonSet")}, why: "a DaemonSet's pod"},
		{name: "drain off", pod: []func(*corev1.Pod){owned("ReplicaSet")}, drain: harvesterv1.Drain{Enabled: ptr.To(false)}, why: "drain.enabled is false"},
		{name: "SUC's own pod", pod: []func(*corev1.Pod){owned("Job"), func(p *corev1.Pod) {
			p.Labels = map[string]string{"upgrade.cattle.io/controller": "system-upgrade-controller"}
		}}, why: "pod selector leaves out"},
		{name: "a mirror pod", pod: []func(*corev1.Pod){func(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "h"} }}, why: "static pod"},
		{name: "no controller", why: "declares no controller"},
		{name: "no controller with force", drain: harvesterv1.Drain{Force: true}, evicts: true},
		{name: "no controller, finished", pod: []func(*corev1.Pod){func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }}, evicts: true},
		{name: "emptyDir by default", pod: []func(*corev1.Pod){owned("ReplicaSet"), emptyDir}, evicts: true},
		{name: "emptyDir kept", pod: []func(*corev1.Pod){owned("ReplicaSet"), emptyDir}, drain: harvesterv1.Drain{DeleteEmptyDirData: ptr.To(false)}, why: "emptyDir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			for _, m := range tt.pod {
				m(pod)
			}
			evicts, why := drainEvicts(pod, tt.drain)
			if evicts != tt.evicts {
				t.Fatalf("drainEvicts = %v (%q), want %v", evicts, why, tt.evicts)
			}
			if !tt.evicts && (tt.why == "" || !strings.Contains(why, tt.why)) {
				t.Fatalf("why = %q, want it to say %q", why, tt.why)
			}
		})
	}
}
