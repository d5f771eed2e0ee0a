package repository

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// RepositoryNamespace is where the upgrade repository runs on the workload cluster.
const Namespace = "harvester-system"

// Labels of the repository's objects.
const (
	// LabelRepository names the repository (one per release) an object belongs to.
	LabelRepository = "harvester.inplace.cluster.x-k8s.io/repository"
	// repositoryPort is the port nginx serves the release on.
	repositoryPort = 80
	// releaseMetadataPath is where the repository serves the release metadata.
	MetadataPath = "/harvester-release.yaml"
	// downloaderContainer is the init container of every repository pod that runs
	// `capi-inplace node repository download`: the leader downloads the ISO and checks
	// its checksum, the others wait for it.
	downloaderContainer = "download"
	// mounterContainer runs `capi-inplace node repository mount --hold`.
	mounterContainer = "mount"
	// repositoryVolumePath is where the ISO's volume is mounted in the repository pods.
	repositoryVolumePath = "/repository"
	// repositoryISOFile is the ISO's name in that volume, and the path its mounter serves
	// it at for the pods that copy it from a peer.
	repositoryISOFile = "harvester.iso"
	// peerPort is the port the mounter serves the checked ISO on, for the peers.
	peerPort = 8080
	// Replicas is how many pods serve the release once the first has it: one per node of
	// a three-node control plane, so that a drain takes one copy away, never all.
	Replicas = 3
	// repositoryMountPath is where the mounter mounts the ISO, in the emptyDir nginx serves.
	repositoryMountPath = "/iso"
	// imageDiskFile is the ISO on the volume of a VirtualMachineImage imported with the
	// cdi backend, which Harvester's repository loop-mounts (facts, fact 15).
	imageDiskFile = "disk.img"
)

// releaseImage is the namespace and name of release.image, ok false when it is not set.
func releaseImage(release harvesterv1.Release) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(release.Image, "/")
	return namespace, name, ok && namespace != "" && name != ""
}

// repositoryName is the name of the repository of a release: one per workload cluster
// and release, shared by every node.
func Name(release string) string {
	name := "capi-inplace-repo-" + strings.NewReplacer(".", "-", "+", "-").Replace(strings.ToLower(release))
	if len(name) > 52 {
		sum := sha256.Sum256([]byte(release))
		name = name[:41] + "-" + hex.EncodeToString(sum[:])[:10]
	}
	return strings.TrimRight(name, "-")
}

// repositoryServiceURL is the in-cluster URL nodes reach the repository at.
func ServiceURL(release string) string {
	return fmt.Sprintf("http://%s.%s.svc", Name(release), Namespace)
}

// PeerURL is where a repository pod copies the checked ISO from a ready peer: the
// Service's peer port, which only ready pods (those serving the release) stand behind.
func PeerURL(release string) string {
	return fmt.Sprintf("%s:%d/%s", ServiceURL(release), peerPort, repositoryISOFile)
}

// Objects are the Deployment and Service of the pod-based upgrade repository of the
// Harvester upgrade enhancement, run by the node program of the node image. Each pod keeps
// its own copy of the ISO, in an emptyDir of repositoryStorage.size: no volume is shared,
// so a drain takes away the copy of the pod on that node and nothing else (a shared
// ReadWriteMany volume whose engine runs on the drained node can stay attaching for good,
// and with it every pod: harvester/harvester#9597, longhorn/longhorn#12226). The
// Deployment starts with one pod, which downloads the ISO and checks its SHA-512; once it
// serves, Ensure scales it to Replicas, and each new pod (or one rescheduled after a
// drain) copies the ISO from a ready peer through the Service and checks it, falling back
// to the release's URL when no peer answers. A privileged sidecar loop-mounts the ISO
// with bidirectional mount propagation, and serves the ISO file itself to peers; nginx
// serves the mounted tree; the pods are ready once /harvester-release.yaml is served, and
// spread across nodes.
//
// With release.image there is no downloader: the pods mount, read-only, the PVC that
// backs the VirtualMachineImage (named as the image, in its namespace), and the sidecar
// loop-mounts its disk.img, as Harvester's own repository does (facts, facts 15 and 48).
// The image must be in the repository's namespace, harvester-system (the API refuses
// another): a pod mounts PVCs of its own namespace only, and the repository stays where
// Harvester's is and where the nodes reach it (repositoryServiceURL), whatever the image.
// That volume is ReadWriteMany, as Harvester makes it, and shares its failure under a
// drain (docs/harvester.md says so).
func Objects(cfg *harvesterv1.HarvesterUpgrader) (*appsv1.Deployment, *corev1.Service, error) {
	spec := cfg.Spec
	name := Name(spec.Release.Version)
	labels := map[string]string{LabelRepository: name, "app.kubernetes.io/name": "capi-inplace-upgrade-repository"}
	if imageNS, image, ok := releaseImage(spec.Release); ok {
		if imageNS != Namespace {
			return nil, nil, nodeupdater.Permanentf("InvalidReleaseImage", "HarvesterUpgrader %s: release.image %s is not in %s, where the upgrade repository runs and mounts its volume", cfg.Name, spec.Release.Image, Namespace)
		}
		dep, svc := repositoryDeployment(cfg, name, labels, image, resource.Quantity{})
		return dep, svc, nil
	}
	size, err := resource.ParseQuantity(spec.RepositoryStorage.Size)
	if err != nil {
		return nil, nil, nodeupdater.Permanentf("InvalidRepositoryStorage", "HarvesterUpgrader %s: repositoryStorage.size %q is not a quantity: %v", cfg.Name, spec.RepositoryStorage.Size, err)
	}
	dep, svc := repositoryDeployment(cfg, name, labels, "", size)
	return dep, svc, nil
}

// LegacyClaim is the ReadWriteMany PVC that capi-inplace's repository shared before each
// pod kept its own copy, named as the repository: a plan's clean-up deletes it when an
// earlier version left it. nil with release.image, whose PVC is the image's own.
func LegacyClaim(cfg *harvesterv1.HarvesterUpgrader) *corev1.PersistentVolumeClaim {
	if _, _, ok := releaseImage(cfg.Spec.Release); ok {
		return nil
	}
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: Name(cfg.Spec.Release.Version), Namespace: Namespace}}
}

// repositoryDeployment is the repository's Deployment and Service: with image empty,
// each pod provides the ISO in its own emptyDir of size (from a peer, else from the
// release's URL) and serves it to the peers; else they serve the disk.img of the
// VirtualMachineImage image's PVC, mounted read-only.
func repositoryDeployment(cfg *harvesterv1.HarvesterUpgrader, name string, labels map[string]string, image string, size resource.Quantity) (*appsv1.Deployment, *corev1.Service) {
	spec := cfg.Spec
	node := spec.Images.Node
	// The node program's repository subcommands (nodeprogram/repository.go): the
	// downloader copies the ISO from a ready peer, or downloads it, into the pod's own
	// volume and checks the SHA-512; the mounter loop-mounts the checked ISO where nginx
	// serves it, and serves the ISO file on the peer port. The pod name identifies the
	// downloader in its messages.
	mount := []string{"node", "repository", "mount", "--image=" + repositoryVolumePath + "/" + repositoryISOFile,
		"--target=" + repositoryMountPath, "--hold", fmt.Sprintf("--serve=:%d", peerPort)}
	volume := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}
	initContainers := []corev1.Container{{
		Name: downloaderContainer, Image: node, Command: []string{nodeprogram.Binary},
		Args: []string{"node", "repository", "download", "--dir=" + repositoryVolumePath,
			"--iso-url=" + spec.Release.ISOURL, "--sha512=" + spec.Release.ISOChecksum, "--file=" + repositoryISOFile,
			"--peer-url=" + PeerURL(spec.Release.Version)},
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
		// The pod's own emptyDir is writable by the image's user (65532): no privilege.
		SecurityContext:          &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		VolumeMounts:             []corev1.VolumeMount{{Name: "repository", MountPath: repositoryVolumePath}},
	}}
	replicas := int32(1) // the first pod downloads; Ensure scales to Replicas once it serves
	mounterPorts := []corev1.ContainerPort{{Name: "peer", ContainerPort: peerPort}}
	servicePorts := []corev1.ServicePort{
		{Name: "http", Port: repositoryPort, TargetPort: intstr.FromString("http")},
		{Name: "peer", Port: peerPort, TargetPort: intstr.FromString("peer")},
	}
	if image != "" {
		// The image's volume, read-only, holds the complete ISO once a pod can mount it:
		// nothing to download, no ready flag to wait for, no peer to copy from.
		initContainers, mounterPorts, servicePorts = nil, nil, servicePorts[:1]
		replicas = Replicas
		volume = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: image, ReadOnly: true}}
		mount = []string{"node", "repository", "mount", "--image=" + repositoryVolumePath + "/" + imageDiskFile,
			"--ready-flag=false", "--target=" + repositoryMountPath, "--hold"}
	}
	bidirectional := corev1.MountPropagationBidirectional
	hostToContainer := corev1.MountPropagationHostToContainer
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
								TopologyKey:   corev1.LabelHostname,
							},
						}},
					}},
					Tolerations:    []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					InitContainers: initContainers,
					Containers: []corev1.Container{
						{
							Name: mounterContainer, Image: node, Command: []string{nodeprogram.Binary}, Args: mount, Ports: mounterPorts,
							// A loop device and mount(2), propagated to nginx through the
							// shared emptyDir: privileged (which Bidirectional requires) and root.
							SecurityContext:          &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)},
							TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
							VolumeMounts: []corev1.VolumeMount{
								{Name: "repository", MountPath: repositoryVolumePath, ReadOnly: true},
								{Name: "iso-mount", MountPath: repositoryMountPath, MountPropagation: &bidirectional},
							},
						},
						{
							Name: "nginx", Image: spec.Images.Nginx,
							Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: repositoryPort}},
							ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
								HTTPGet: &corev1.HTTPGetAction{Path: MetadataPath, Port: intstr.FromString("http")},
							}, PeriodSeconds: 5},
							VolumeMounts: []corev1.VolumeMount{{Name: "iso-mount", MountPath: "/usr/share/nginx/html", ReadOnly: true, MountPropagation: &hostToContainer}},
						},
					},
					Volumes: []corev1.Volume{
						{Name: "repository", VolumeSource: volume},
						{Name: "iso-mount", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    servicePorts,
		},
	}
	return dep, svc
}

// ensureRepository creates the repository's objects that do not exist yet and reports
// whether it serves the release. A downloader that failed (a wrong checksum, an ISO URL
// that does not answer) is a permanent error with its own message.
func Ensure(ctx context.Context, c client.Client, cfg *harvesterv1.HarvesterUpgrader) (ready bool, message string, err error) {
	dep, svc, err := Objects(cfg)
	if err != nil {
		return false, "", err
	}
	// The Deployment is created last, so once it exists the repository is in place and a
	// poll is one read, not three refused creates.
	current := &appsv1.Deployment{}
	err = c.Get(ctx, client.ObjectKeyFromObject(dep), current)
	if apierrors.IsNotFound(err) {
		if _, image, ok := releaseImage(cfg.Spec.Release); ok {
			if ready, message, err := imageVolumeReady(ctx, c, cfg.Spec.Release.Image, image); err != nil || !ready {
				return false, message, err
			}
		}
		for _, obj := range []client.Object{svc, dep} {
			if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
				return false, "", fmt.Errorf("create upgrade repository %T %s: %w", obj, obj.GetName(), err)
			}
		}
		return false, fmt.Sprintf("created the upgrade repository %s/%s for Harvester %s", Namespace, dep.Name, cfg.Spec.Release.Version), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get upgrade repository %s: %w", dep.Name, err)
	}
	if msg, failed, err := downloaderFailure(ctx, c, current); err != nil || failed {
		if err != nil {
			return false, "", err
		}
		return false, "", nodeupdater.Permanentf("RepositoryDownloadFailed", "the upgrade repository %s could not provide Harvester %s: %s", dep.Name, cfg.Spec.Release.Version, msg)
	}
	if current.Status.AvailableReplicas < 1 {
		return false, fmt.Sprintf("waiting for the upgrade repository %s/%s to download Harvester %s and serve it", Namespace, dep.Name, cfg.Spec.Release.Version), nil
	}
	// The first pod serves: the others copy the ISO from it, inside the cluster.
	if ptr.Deref(current.Spec.Replicas, 1) < Replicas {
		patch := client.MergeFrom(current.DeepCopy())
		current.Spec.Replicas = ptr.To[int32](Replicas)
		if err := c.Patch(ctx, current, patch); err != nil {
			return false, "", fmt.Errorf("scale the upgrade repository %s to %d pods: %w", dep.Name, Replicas, err)
		}
	}
	return true, fmt.Sprintf("the upgrade repository %s/%s serves Harvester %s", Namespace, dep.Name, cfg.Spec.Release.Version), nil
}

// imageVolumeReady tells whether the PVC of the VirtualMachineImage ref (named image, in
// the repository's namespace) is one the repository's pods can serve: bound, which CDI
// does once the import is done, and a ReadWriteMany file system volume, which Harvester
// gives an image annotated harvesterhci.io/os-upgrade-image: "True" (pkg/image/cdi
// generateDVTargetStorage) and which the pods on several nodes mount to read disk.img.
func imageVolumeReady(ctx context.Context, c client.Client, ref, image string) (bool, string, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: image}, pvc)
	if apierrors.IsNotFound(err) {
		return false, fmt.Sprintf("waiting for the volume %s/%s of the VirtualMachineImage %s: it appears when the image is imported with the cdi backend", Namespace, image, ref), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get the volume of the VirtualMachineImage %s: %w", ref, err)
	}
	if (pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem) || !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
		return false, "", nodeupdater.Permanentf("InvalidReleaseImage", "the volume %s/%s of the VirtualMachineImage %s is not a ReadWriteMany file system volume holding %s: import the ISO with the cdi backend and the annotation harvesterhci.io/os-upgrade-image: \"True\", as Harvester's own upgrade image", Namespace, image, ref, imageDiskFile)
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		return false, fmt.Sprintf("waiting for the import of the VirtualMachineImage %s: its volume is %s", ref, pvc.Status.Phase), nil
	}
	return true, "", nil
}

// downloaderFailure looks for a repository pod whose downloader failed for good: exit
// code 1 (a checksum mismatch, a 4xx answer) or 2 (a command line the node program
// refuses). Exit code 3 is the node program's "not done yet" (a follower still waiting
// for the leader, a repository that did not answer): the kubelet runs the init container
// again, and the Repository step's timeout bounds the wait.
func downloaderFailure(ctx context.Context, c client.Client, dep *appsv1.Deployment) (string, bool, error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(dep.Namespace), client.MatchingLabels(dep.Spec.Selector.MatchLabels)); err != nil {
		return "", false, fmt.Errorf("list upgrade repository pods: %w", err)
	}
	for _, pod := range pods.Items {
		for _, st := range pod.Status.InitContainerStatuses {
			if st.Name != downloaderContainer {
				continue
			}
			for _, t := range []*corev1.ContainerStateTerminated{st.State.Terminated, st.LastTerminationState.Terminated} {
				if t == nil || t.ExitCode == nodeprogram.ExitOK || t.ExitCode == nodeprogram.ExitRetry {
					continue
				}
				msg := strings.TrimSpace(t.Message)
				if msg == "" {
					msg = fmt.Sprintf("the downloader exited with code %d (%s)", t.ExitCode, t.Reason)
				}
				return fmt.Sprintf("pod %s: %s", pod.Name, msg), true, nil
			}
		}
	}
	return "", false, nil
}
