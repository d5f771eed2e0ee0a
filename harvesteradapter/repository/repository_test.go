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
	dep, svc, err := Objects(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 2 {
		t.Fatalf("init containers %d, containers %d; want a downloader, a mounter and nginx", len(pod.InitContainers), len(pod.Containers))
	}
	download, mount, nginx := pod.InitContainers[0], pod.Containers[0], pod.Containers[1]

	wantDownload := "node repository download --dir=/repository --iso-url=https://releases.example/harvester-v1.6.0-amd64.iso --sha512=" + strings.Repeat("ab", 64) +
		" --file=harvester.iso --peer-url=http://capi-inplace-repo-v1-6-0.harvester-system.svc:8080/harvester.iso"
	if download.Image != fixtures.NodeImage || strings.Join(download.Command, " ") != "/capi-inplace" || strings.Join(download.Args, " ") != wantDownload {
		t.Errorf("downloader runs %s %v %v, want %s /capi-inplace %s", download.Image, download.Command, download.Args, fixtures.NodeImage, wantDownload)
	}
	if sc := download.SecurityContext; sc == nil || sc.RunAsUser != nil || sc.Privileged != nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("downloader securityContext %+v: the image's own user writes the pod's own volume, no privilege", sc)
	}
	if len(download.Env) != 1 || download.Env[0].Name != "POD_NAME" || download.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("downloader env %+v: the pod's name identifies the downloader", download.Env)
	}
	// No shared volume (harvester#9597, longhorn#12226): each pod's own copy, as large as
	// repositoryStorage.size allows.
	for _, v := range pod.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("volume %s is a PVC %s: a drain of the node its engine runs on can take it from every pod", v.Name, v.PersistentVolumeClaim.ClaimName)
		}
		if v.Name == "repository" && (v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != "30Gi") {
			t.Errorf("repository volume %+v, want the pod's own emptyDir of 30Gi", v.VolumeSource)
		}
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas %v at creation, want 1: the first pod downloads, the others copy from it", dep.Spec.Replicas)
	}

	wantMount := "node repository mount --image=/repository/harvester.iso --target=/iso --hold --serve=:8080"
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
	if len(mount.Ports) != 1 || mount.Ports[0].Name != "peer" || mount.Ports[0].ContainerPort != 8080 {
		t.Errorf("mounter ports %+v, want peer 8080", mount.Ports)
	}
	if len(svc.Spec.Ports) != 2 || svc.Spec.Ports[1].Name != "peer" || svc.Spec.Ports[1].Port != 8080 || svc.Spec.Ports[1].TargetPort.StrVal != "peer" {
		t.Errorf("Service ports %+v, want http and peer (8080)", svc.Spec.Ports)
	}
	if claim := LegacyClaim(cfg); claim == nil || claim.Name != dep.Name || claim.Namespace != Namespace {
		t.Errorf("legacy claim %+v, want %s/%s for the clean-up", claim, Namespace, dep.Name)
	}
}

func TestRepositoryServesAVirtualMachineImage(t *testing.T) {
	cfg := fixtures.Upgrader()
	cfg.Spec.Release = harvesterv1.Release{Version: "v1.6.0", Image: "harvester-system/harvester-v1.6.0"}
	cfg.Spec.Images.Nginx = "rancher/mirrored-library-nginx:1.27-alpine"
	dep, svc, err := Objects(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pvc := LegacyClaim(cfg); pvc != nil {
		t.Errorf("a PVC %s of the repository's own to clean up: the image's volume is the image's", pvc.Name)
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
	if _, _, err := Objects(cfg); err == nil || !strings.Contains(err.Error(), "is not in harvester-system") {
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
