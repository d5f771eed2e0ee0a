package repository

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
)

func TestRepositoryRunsTheNodeProgram(t *testing.T) {
	cfg := fixtures.Upgrader()
	cfg.Spec.Release = harvesterv1.Release{Version: "v1.6.0", ISOURL: "https://releases.example/harvester-v1.6.0-amd64.iso", ISOChecksum: strings.Repeat("ab", 64)}
	cfg.Spec.Images.Nginx = "rancher/mirrored-library-nginx:1.27-alpine"
	cfg.Spec.RepositoryStorage = harvesterv1.RepositoryStorage{StorageClassName: "longhorn", Size: "30Gi"}
	_, dep, _, err := Objects(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 2 {
		t.Fatalf("init containers %d, containers %d; want a downloader, a mounter and nginx", len(pod.InitContainers), len(pod.Containers))
	}
	download, mount, nginx := pod.InitContainers[0], pod.Containers[0], pod.Containers[1]

	wantDownload := "node repository download --dir=/repository --iso-url=https://releases.example/harvester-v1.6.0-amd64.iso --sha512=" + strings.Repeat("ab", 64) + " --file=harvester.iso"
	if download.Image != fixtures.NodeImage || strings.Join(download.Command, " ") != "/capi-inplace" || strings.Join(download.Args, " ") != wantDownload {
		t.Errorf("downloader runs %s %v %v, want %s /capi-inplace %s", download.Image, download.Command, download.Args, fixtures.NodeImage, wantDownload)
	}
	if sc := download.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.Privileged != nil {
		t.Errorf("downloader securityContext %+v: root on the shared volume, nothing more", sc)
	}
	if len(download.Env) != 1 || download.Env[0].Name != "POD_NAME" || download.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("downloader env %+v: the pod's name identifies the leader in the lock", download.Env)
	}

	wantMount := "node repository mount --image=/repository/harvester.iso --target=/iso --hold"
	if mount.Image != fixtures.NodeImage || strings.Join(mount.Args, " ") != wantMount {
		t.Errorf("mounter runs %s %v, want %s", mount.Image, mount.Args, wantMount)
	}
	if sc := mount.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("mounter securityContext %+v: a loop mount needs privileged and root", sc)
	}
	propagation := func(c corev1.Container, path string) corev1.MountPropagationMode {
		for _, m := range c.VolumeMounts {
			if m.MountPath == path && m.MountPropagation != nil {
				return *m.MountPropagation
			}
		}
		return ""
	}
	if propagation(mount, "/iso") != corev1.MountPropagationBidirectional || propagation(nginx, "/usr/share/nginx/html") != corev1.MountPropagationHostToContainer {
		t.Errorf("the mount must reach nginx: mounter %v, nginx %v", mount.VolumeMounts, nginx.VolumeMounts)
	}
	if nginx.Image != "rancher/mirrored-library-nginx:1.27-alpine" || nginx.ReadinessProbe.HTTPGet.Path != "/harvester-release.yaml" {
		t.Errorf("nginx %s, readiness %s", nginx.Image, nginx.ReadinessProbe.HTTPGet.Path)
	}
}

func TestRepositoryServesAVirtualMachineImage(t *testing.T) {
	cfg := fixtures.Upgrader()
	cfg.Spec.Release = harvesterv1.Release{Version: "v1.6.0", Image: "harvester-system/harvester-v1.6.0"}
	cfg.Spec.Images.Nginx = "rancher/mirrored-library-nginx:1.27-alpine"
	pvc, dep, svc, err := Objects(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pvc != nil {
		t.Errorf("a PVC %s of the repository's own: the image's volume holds the ISO", pvc.Name)
	}
	if dep.Namespace != Namespace || svc.Namespace != Namespace || dep.Name != "capi-inplace-repo-v1-6-0" {
		t.Errorf("repository %s/%s, Service in %s: it stays where the nodes reach it", dep.Namespace, dep.Name, svc.Namespace)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.InitContainers) != 0 || len(pod.Containers) != 2 {
		t.Fatalf("init containers %v, containers %d; want no downloader, a mounter and nginx", pod.InitContainers, len(pod.Containers))
	}
	var volume *corev1.PersistentVolumeClaimVolumeSource
	for _, v := range pod.Volumes {
		if v.Name == "repository" {
			volume = v.PersistentVolumeClaim
		}
	}
	if volume == nil || volume.ClaimName != "harvester-v1.6.0" || !volume.ReadOnly {
		t.Errorf("repository volume %+v, want the image's PVC harvester-v1.6.0, read-only", volume)
	}
	mount := pod.Containers[0]
	wantMount := "node repository mount --image=/repository/disk.img --ready-flag=false --target=/iso --hold"
	if mount.Image != fixtures.NodeImage || strings.Join(mount.Args, " ") != wantMount {
		t.Errorf("mounter runs %s %v, want %s", mount.Image, mount.Args, wantMount)
	}
	for _, m := range mount.VolumeMounts {
		if m.Name == "repository" && (!m.ReadOnly || m.MountPath != "/repository") {
			t.Errorf("mounter mounts the image's volume %+v, want read-only at /repository", m)
		}
	}

	cfg.Spec.Release.Image = "default/harvester-v1.6.0"
	if _, _, _, err := Objects(cfg); err == nil || !strings.Contains(err.Error(), "is not in harvester-system") {
		t.Errorf("an image outside harvester-system: %v", err)
	}
}

func TestImageVolumeReady(t *testing.T) {
	ctx := context.Background()
	vol := func(mode corev1.PersistentVolumeMode, access corev1.PersistentVolumeAccessMode, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "harvester-v1.6.0", Namespace: Namespace},
			Spec:       corev1.PersistentVolumeClaimSpec{VolumeMode: &mode, AccessModes: []corev1.PersistentVolumeAccessMode{access}},
			Status:     corev1.PersistentVolumeClaimStatus{Phase: phase},
		}
	}
	for _, tc := range []struct {
		name         string
		pvc          *corev1.PersistentVolumeClaim
		ready        bool
		message, err string
	}{
		{"no volume yet", nil, false, "waiting for the volume harvester-system/harvester-v1.6.0", ""},
		{"importing", vol(corev1.PersistentVolumeFilesystem, corev1.ReadWriteMany, corev1.ClaimPending), false, "waiting for the import", ""},
		{"imported", vol(corev1.PersistentVolumeFilesystem, corev1.ReadWriteMany, corev1.ClaimBound), true, "", ""},
		{"a block volume", vol(corev1.PersistentVolumeBlock, corev1.ReadWriteMany, corev1.ClaimBound), false, "", "harvesterhci.io/os-upgrade-image"},
		{"one node only", vol(corev1.PersistentVolumeFilesystem, corev1.ReadWriteOnce, corev1.ClaimBound), false, "", "not a ReadWriteMany file system volume"},
	} {
		b := fake.NewClientBuilder()
		if tc.pvc != nil {
			b = b.WithObjects(tc.pvc)
		}
		ready, message, err := imageVolumeReady(ctx, b.Build(), "harvester-system/harvester-v1.6.0", "harvester-v1.6.0")
		if ready != tc.ready || !strings.Contains(message, tc.message) || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, %q, %v", tc.name, ready, message, err)
		}
	}
}
