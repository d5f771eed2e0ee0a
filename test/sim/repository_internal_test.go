package sim

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// imageRepositoryPod is the repository pod of release.image as the Harvester updater
// builds it (harvesteradapter/repository): no downloader, the image's PVC read-only.
func imageRepositoryPod(mountArgs ...string) corev1.PodSpec {
	bidirectional, hostToContainer := corev1.MountPropagationBidirectional, corev1.MountPropagationHostToContainer
	return corev1.PodSpec{
		Containers: []corev1.Container{
			{
				Name: "mount", Image: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Args: append([]string{"node", "repository", "mount"}, mountArgs...),
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "repository", MountPath: "/repository", ReadOnly: true},
					{Name: "iso-mount", MountPath: "/iso", MountPropagation: &bidirectional},
				},
			},
			{Name: "nginx", Image: "nginx:1", VolumeMounts: []corev1.VolumeMount{{Name: "iso-mount", MountPath: "/usr/share/nginx/html", MountPropagation: &hostToContainer}}},
		},
		Volumes: []corev1.Volume{
			{Name: "repository", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "harvester-v1.6.0", ReadOnly: true}}},
			{Name: "iso-mount", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
	}
}

func TestPodProblemOfAVirtualMachineImageRepository(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"as the updater builds it", []string{"--image=/repository/disk.img", "--ready-flag=false", "--target=/iso", "--hold"}, ""},
		{"waiting for a ready flag no download writes", []string{"--image=/repository/disk.img", "--target=/iso", "--hold"}, "has no ready flag yet"},
		{"the downloaded ISO's name", []string{"--image=/repository/harvester.iso", "--ready-flag=false", "--target=/iso", "--hold"}, "/repository/harvester.iso is not there"},
		{"no --hold", []string{"--image=/repository/disk.img", "--ready-flag=false", "--target=/iso"}, "no container runs `capi-inplace node repository mount --hold`"},
	} {
		got, code := podProblem(imageRepositoryPod(tc.args...))
		if code != 0 || (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: podProblem = %q, %d; want %q", tc.name, got, code, tc.want)
		}
	}
	// A read-write PVC without a downloader is no image's: the downloader is missing.
	spec := imageRepositoryPod("--image=/repository/disk.img", "--ready-flag=false", "--target=/iso", "--hold")
	spec.Volumes[0].PersistentVolumeClaim.ReadOnly = false
	if got, _ := podProblem(spec); got != "no init container runs `capi-inplace node repository download`" {
		t.Errorf("podProblem = %q", got)
	}
}
