package releases

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNodeAtTarget(t *testing.T) {
	tests := []struct {
		name              string
		kubelet, osImage  string
		upgradeOS, wantAt bool
		wantWhy           string
	}{
		{name: "kubelet and OS at the target", kubelet: "v1.33.3+rke2r1", osImage: "Harvester v1.6.0", upgradeOS: true, wantAt: true},
		{name: "kubelet without the leading v", kubelet: "1.33.3+rke2r1", osImage: "Harvester v1.6.0", upgradeOS: true, wantAt: true},
		{name: "kubelet behind", kubelet: "v1.32.5+rke2r1", osImage: "Harvester v1.6.0", upgradeOS: true,
			wantWhy: "kubelet v1.32.5+rke2r1 is not at the target v1.33.3+rke2r1"},
		{name: "other build metadata", kubelet: "v1.33.3+rke2r2", osImage: "Harvester v1.6.0", upgradeOS: true,
			wantWhy: "kubelet v1.33.3+rke2r2 is not at the target v1.33.3+rke2r1"},
		{name: "OS behind", kubelet: "v1.33.3+rke2r1", osImage: "Harvester v1.5.0", upgradeOS: true,
			wantWhy: "kubelet v1.33.3+rke2r1 is at the target but the OS is Harvester v1.5.0; release v1.6.0 wants Harvester v1.6.0"},
		{name: "OS not Harvester's", kubelet: "v1.33.3+rke2r1", osImage: "SUSE Linux Enterprise Micro 6.1", upgradeOS: true,
			wantWhy: "kubelet v1.33.3+rke2r1 is at the target but the OS is SUSE Linux Enterprise Micro 6.1; release v1.6.0 wants Harvester v1.6.0"},
		{name: "OS behind, OS upgrade skipped", kubelet: "v1.33.3+rke2r1", osImage: "Harvester v1.5.0", wantAt: true},
		{name: "kubelet behind, OS upgrade skipped", kubelet: "v1.32.5+rke2r1", osImage: "Harvester v1.6.0",
			wantWhy: "kubelet v1.32.5+rke2r1 is not at the target v1.33.3+rke2r1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, why := NodeAtTarget(corev1.NodeSystemInfo{KubeletVersion: tt.kubelet, OSImage: tt.osImage}, "v1.33.3+rke2r1", "v1.6.0", tt.upgradeOS)
			if at != tt.wantAt || why != tt.wantWhy {
				t.Errorf("nodeAtTarget = %v, %q; want %v, %q", at, why, tt.wantAt, tt.wantWhy)
			}
		})
	}
}
