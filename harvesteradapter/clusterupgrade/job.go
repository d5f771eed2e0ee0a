package clusterupgrade

import (
	"fmt"
	"maps"
	"time"

	"github.com/rancher/wrangler/v3/pkg/name"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels of the cluster upgrade's Job and progress ConfigMap.
const (
	// LabelUpgradePlan is the upgrade plan the Job belongs to.
	LabelUpgradePlan = "harvester.inplace.cluster.x-k8s.io/upgrade-plan"
	// LabelComponent says which part of the upgrade the object is: ComponentClusterUpgrade.
	LabelComponent = "harvester.inplace.cluster.x-k8s.io/upgrade-component"
	// ComponentClusterUpgrade is LabelComponent's value for the cluster upgrade.
	ComponentClusterUpgrade = "cluster-upgrade"
)

// Defaults of JobInput.
const (
	// DefaultNamespace is where Harvester runs its cluster upgrade Job (facts 40, 51).
	DefaultNamespace = "harvester-system"
	// DefaultServiceAccount is the account Harvester runs it with (facts 40, 51): in
	// Harvester it holds the rights on Rancher's objects and the Deployments this needs.
	DefaultServiceAccount = "harvester"
	// DefaultActiveDeadline bounds the Job: a Rancher upgrade and two chart upgrades take
	// minutes to tens of minutes on a real cluster.
	DefaultActiveDeadline = 2 * time.Hour
	// DefaultBackoffLimit is how many times a failed pod is retried; each retry resumes.
	DefaultBackoffLimit = int32(3)
	// ttlAfterFinished keeps the finished Job 7 days, as Harvester does (facts 40, 51).
	ttlAfterFinished = int32(7 * 24 * 3600)
	// nonRootUser is the image's user (the Dockerfile's USER 65532): the program only
	// talks to the API server.
	nonRootUser = int64(65532)
)

// JobInput is what the cluster upgrade's Job is built from.
type JobInput struct {
	// Plan is the upgrade plan's name: the Job is SafeConcatName(Plan, "cluster-upgrade").
	Plan string
	// Image is the capi-inplace image whose node program runs the upgrade.
	Image string
	// UpgradeImage is the release's upgrade image, with its tag
	// (rancher/harvester-upgrade:<release>, harvester-node-upgrade.md fact 3): when set,
	// an init container copies its addons/ and extra_manifests/ into ReleaseFilesDir,
	// which the upgrade reads (Input.ReleaseFiles); nothing else of it runs. Empty leaves
	// the add-ons and extra manifests out.
	UpgradeImage string
	// RancherInstallerImage is Rancher's installer image with its tag
	// (rancher/system-agent-installer-rancher:<Rancher version>): init containers copy
	// its helm and Rancher chart into RancherInstallerDir (Input.RancherInstaller) for
	// UpgradeRancher. Default DefaultRancherInstallerImage tagged with
	// Input.RancherVersion.
	RancherInstallerImage string
	// Namespace of the Job. Default DefaultNamespace.
	Namespace string
	// ServiceAccount the Job runs as. Default DefaultServiceAccount.
	ServiceAccount string
	// Input is what the upgrade does; its Plan defaults to Plan. Clock is not carried.
	Input Input
	// Progress is the progress ConfigMap. Default ProgressKey(Namespace, Plan).
	Progress client.ObjectKey
	// ActiveDeadline bounds the Job. Default DefaultActiveDeadline.
	ActiveDeadline time.Duration
	// BackoffLimit is how many failed pods are retried. Default DefaultBackoffLimit.
	BackoffLimit *int32
	// Labels are added to the Job and its pod.
	Labels map[string]string
}

// JobName is the name of the cluster upgrade's Job of plan, as the upgrade-toolkit names
// it (fact 51).
func JobName(plan string) string { return name.SafeConcatName(plan, "cluster-upgrade") }

// ProgressKey is the default progress ConfigMap of plan's cluster upgrade.
func ProgressKey(namespace, plan string) client.ObjectKey {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return client.ObjectKey{Namespace: namespace, Name: name.SafeConcatName(plan, "cluster-upgrade", "progress")}
}

// Job builds the Job that runs `capi-inplace node cluster-upgrade` with every input as a
// flag, so that it needs nothing else to run (or to run again). Its shape follows
// Harvester's apply-manifests Job (fact 40) and the upgrade-toolkit's cluster-upgrade Job
// (fact 51): container apply, service account harvester, TTL 7 days; unlike them it
// tolerates nothing special (it needs no particular node) and runs as the image's
// non-root user.
func Job(in JobInput) *batchv1.Job {
	ns := in.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	sa := in.ServiceAccount
	if sa == "" {
		sa = DefaultServiceAccount
	}
	deadline := in.ActiveDeadline
	if deadline <= 0 {
		deadline = DefaultActiveDeadline
	}
	backoff := ptr.Deref(in.BackoffLimit, DefaultBackoffLimit)
	progress := in.Progress
	if progress.Name == "" {
		progress = ProgressKey(ns, in.Plan)
	}
	if progress.Namespace == "" {
		progress.Namespace = ns
	}
	upgrade := in.Input
	if upgrade.Plan == "" {
		upgrade.Plan = in.Plan
	}
	if upgrade.ClusterRepoImage == "" && upgrade.HarvesterVersion != "" {
		upgrade.ClusterRepoImage = DefaultClusterRepoImage(upgrade.HarvesterVersion)
	}
	if upgrade.Timeout <= 0 {
		// The run ends a little before the Job's deadline, so that it writes why.
		upgrade.Timeout = deadline - time.Minute
		if upgrade.Timeout <= 0 {
			upgrade.Timeout = deadline
		}
	}
	// helm writes its cache and the values file under /tmp: the root is read-only.
	volumes := []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}}
	var initContainers []corev1.Container
	if in.UpgradeImage != "" {
		if upgrade.ReleaseFiles == "" {
			upgrade.ReleaseFiles = ReleaseFilesDir
		}
		c, v, m := releaseFilesCopy(in.UpgradeImage, upgrade.ReleaseFiles)
		initContainers, volumes, mounts = append(initContainers, c...), append(volumes, v...), append(mounts, m...)
	}
	installer := in.RancherInstallerImage
	if installer == "" && upgrade.RancherVersion != "" {
		installer = DefaultRancherInstallerImage + ":" + upgrade.RancherVersion
	}
	if installer != "" {
		if upgrade.RancherInstaller == "" {
			upgrade.RancherInstaller = RancherInstallerDir
		}
		c, v, m := rancherInstallerCopy(in.Image, installer, upgrade.RancherInstaller)
		initContainers, volumes, mounts = append(initContainers, c...), append(volumes, v...), append(mounts, m...)
	}
	labels := map[string]string{}
	maps.Copy(labels, in.Labels)
	labels[LabelUpgradePlan] = in.Plan
	labels[LabelComponent] = ComponentClusterUpgrade

	args := append([]string{"node", "cluster-upgrade"}, Args(upgrade, Progress{ConfigMap: progress})...)
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: JobName(in.Plan), Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To(backoff),
			ActiveDeadlineSeconds:   ptr.To(int64(deadline / time.Second)),
			TTLSecondsAfterFinished: ptr.To(ttlAfterFinished),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: sa,
					RestartPolicy:      corev1.RestartPolicyNever,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To(nonRootUser),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					InitContainers: initContainers,
					Volumes:        volumes,
					Containers: []corev1.Container{{
						Name:                     "apply",
						VolumeMounts:             mounts,
						Image:                    in.Image,
						Command:                  []string{"/capi-inplace"},
						Args:                     args,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
				},
			},
		},
	}
}

// ReleaseFilesDir is where the cluster upgrade Job's init container puts the release
// upgrade image's files, and where its program reads them.
const ReleaseFilesDir = "/release-files"

// ReleaseFilesContainer is the name of the init container that copies them.
const ReleaseFilesContainer = "release-files"

// releaseShare is where Harvester's upgrade image keeps the files its scripts apply
// (package/upgrade/Dockerfile: COPY extra_manifests, migrations, addons into it).
const releaseShare = "/usr/local/share"

// releaseFilesCopy is the init container that copies the release image's addons/ and
// extra_manifests/ into an emptyDir at dir (each only if the image has it), with the
// volume and the program's read-only mount of it. The image is Harvester's, so only
// its shell and cp run; they run as the pod's non-root user, reading files the image
// keeps world-readable.
func releaseFilesCopy(image, dir string) ([]corev1.Container, []corev1.Volume, []corev1.VolumeMount) {
	script := fmt.Sprintf(`set -e; for d in addons extra_manifests; do if [ -d %[1]s/$d ]; then cp -R %[1]s/$d %[2]s/; fi; done; ls -R %[2]s`, releaseShare, dir)
	init := corev1.Container{
		Name:                     ReleaseFilesContainer,
		Image:                    image,
		Command:                  []string{"/bin/sh", "-c", script},
		VolumeMounts:             []corev1.VolumeMount{{Name: ReleaseFilesContainer, MountPath: dir}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
	volume := corev1.Volume{Name: ReleaseFilesContainer, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	mount := corev1.VolumeMount{Name: ReleaseFilesContainer, MountPath: dir, ReadOnly: true}
	return []corev1.Container{init}, []corev1.Volume{volume}, []corev1.VolumeMount{mount}
}

// DefaultRancherInstallerImage is Rancher's installer image, untagged: the release takes
// Rancher's chart and helm from it (fact 16.1).
const DefaultRancherInstallerImage = "rancher/system-agent-installer-rancher"

// Names of the init containers that take helm and the Rancher chart out of Rancher's
// installer image.
const (
	// ProgramCopyContainer copies this image's static binary into the shared emptyDir.
	ProgramCopyContainer = "program"
	// RancherInstallerContainer runs that copy in Rancher's installer image, which has no
	// shell (FROM scratch: /helm, /rancher-<version>.tgz and /run.sh; rancher
	// package/Dockerfile.installer), to copy its helm and chart next to it.
	RancherInstallerContainer = "rancher-installer"
)

// rancherInstallerCopy are the two init containers that put the helm and the Rancher
// chart of Rancher's installer image into an emptyDir at dir, with the volume and the
// program's read-only mount of it. Both run as the pod's non-root user with a read-only
// root filesystem; the files they read are world-readable in both images.
func rancherInstallerCopy(image, installer, dir string) ([]corev1.Container, []corev1.Volume, []corev1.VolumeMount) {
	restricted := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	copyProgram := corev1.Container{
		Name:                     ProgramCopyContainer,
		Image:                    image,
		Command:                  []string{"/capi-inplace"},
		Args:                     []string{"node", "copy-files", "--to=" + dir, "--file=/capi-inplace"},
		VolumeMounts:             []corev1.VolumeMount{{Name: RancherInstallerContainer, MountPath: dir}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          restricted,
	}
	copyInstaller := corev1.Container{
		Name:                     RancherInstallerContainer,
		Image:                    installer,
		Command:                  []string{dir + "/capi-inplace"},
		Args:                     []string{"node", "copy-files", "--to=" + dir, "--file=/helm", "--file=/rancher-*.tgz"},
		VolumeMounts:             []corev1.VolumeMount{{Name: RancherInstallerContainer, MountPath: dir}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          restricted.DeepCopy(),
	}
	volume := corev1.Volume{Name: RancherInstallerContainer, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	mount := corev1.VolumeMount{Name: RancherInstallerContainer, MountPath: dir, ReadOnly: true}
	return []corev1.Container{copyProgram, copyInstaller}, []corev1.Volume{volume}, []corev1.VolumeMount{mount}
}

// JobState reads a cluster upgrade Job: done when it completed, failed (with the Job
// controller's reason and message) when it failed; neither while it runs or has not
// started. A failed Job's condition says only what the Job controller says
// (BackoffLimitExceeded, "Job has reached the specified backoff limit"; DeadlineExceeded,
// "Job was active longer than specified deadline": kubernetes
// pkg/controller/job/job_controller.go): what failed is in its pod, the apply container's
// termination message (the node program's outcome, nodeprogram Main) and log, which
// suc.FailedContainers reads.
func JobState(job *batchv1.Job) (done bool, failed bool, message string) {
	if job == nil {
		return false, false, "the cluster upgrade Job does not exist yet"
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, false, fmt.Sprintf("Job %s/%s completed", job.Namespace, job.Name)
		case batchv1.JobFailed:
			return false, true, fmt.Sprintf("Job %s/%s failed (%s): %s", job.Namespace, job.Name, c.Reason, c.Message)
		}
	}
	switch {
	case job.Status.Active > 0:
		return false, false, fmt.Sprintf("Job %s/%s is running (%d failed pods so far)", job.Namespace, job.Name, job.Status.Failed)
	case job.Spec.Suspend != nil && *job.Spec.Suspend:
		return false, false, fmt.Sprintf("Job %s/%s is suspended", job.Namespace, job.Name)
	}
	return false, false, fmt.Sprintf("Job %s/%s has not started", job.Namespace, job.Name)
}
