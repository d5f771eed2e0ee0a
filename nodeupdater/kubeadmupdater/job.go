package kubeadmupdater

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeprogram"

	"github.com/capi-inplace/capi-inplace/workloadcluster/jobpods"
)

// Labels and annotations of the node Jobs.
const (
	// NodeUpdateUIDLabel on a Job ties it to the NodeUpdate (by UID) it runs for; Abort
	// finds a NodeUpdate's Jobs by it, in any namespace.
	NodeUpdateUIDLabel = inplacev1.AnnotationPrefix + "nodeupdate-uid"
	// StepLabel on a Job names the NodeUpdate step it runs (Fetch, Upgrade, Kubelet).
	StepLabel = inplacev1.AnnotationPrefix + "kubeadm-step"
	// NodeUpdateAnnotation on a Job names its NodeUpdate as namespace/name on the
	// management cluster.
	NodeUpdateAnnotation = inplacev1.AnnotationPrefix + "nodeupdate"

	// ContainerName is the node program's container in each Job.
	ContainerName = "kubeadm"
	// programCopyContainer and binariesCopyContainer are the init containers of the image
	// source: the first copies the node program into the shared emptyDir, the second runs
	// that copy in the binaries' image (which needs no shell) to copy them next to it.
	programCopyContainer  = "program"
	binariesCopyContainer = "binaries"
	// binariesDir is the emptyDir the image source's binaries are copied into, passed to
	// the node program as --dir.
	binariesDir = "/kubeadm-binaries"
	// hostRoot is where the node's root is mounted, the node program's --host-root default.
	hostRoot = "/host"

	// jobBackoffLimit is how many times a Job runs its pod again after the node program
	// said "not done yet, run again" (exit 3: a download broken off, an API server that did
	// not answer). A refusal (exit 1) or bad usage (exit 2) fails the Job at once
	// (podFailurePolicy).
	jobBackoffLimit = 3
)

// JobName is the name of the Job of one step of a NodeUpdate: the same on every call, so
// a restart never creates a second Job, and apart for each NodeUpdate (its UID) and step.
// The node's name is in it for a person reading `kubectl get jobs`.
func JobName(nu *inplacev1.NodeUpdate, step string) string {
	sum := sha256.Sum256([]byte(string(nu.UID) + "/" + step))
	node := strings.ReplaceAll(strings.ToLower(nu.Spec.NodeName), ".", "-")
	if len(node) > 30 {
		node = node[:30]
	}
	node = strings.Trim(node, "-")
	name := "kubeadm-" + strings.ToLower(step) + "-"
	if node != "" {
		name += node + "-"
	}
	return name + hex.EncodeToString(sum[:])[:8]
}

// sourceArgs are the node program's flags for where the binaries come from (fetch and
// kubelet take the same ones).
func sourceArgs(src inplacev1.KubeadmBinarySource) []string {
	sums := func(c *inplacev1.KubeadmChecksums) []string {
		if c == nil {
			return nil
		}
		return []string{"--sha256", "kubeadm=" + c.Kubeadm, "--sha256", "kubelet=" + c.Kubelet, "--sha256", "kubectl=" + c.Kubectl}
	}
	switch {
	case src.URL != nil:
		tmpl := src.URL.Template
		if tmpl == "" {
			tmpl = inplacev1.DefaultKubeadmURLTemplate
		}
		return append([]string{"--source", "url", "--url-template", tmpl}, sums(&src.URL.SHA256)...)
	case src.Image != nil:
		return append([]string{"--source", "dir", "--dir", binariesDir}, sums(src.Image.SHA256)...)
	default:
		return []string{"--source", "packages"}
	}
}

// desiredJob is the Job that runs `capi-inplace node kubeadm <args>` on the node of r for
// step: pinned to the node by name (past the scheduler, also on a cordoned node),
// tolerating every taint, privileged in the host's PID namespace, with the host's root at
// /host. With the image source, two init containers copy the binaries into an emptyDir
// first.
func desiredJob(r *nodeRun, step string, key client.ObjectKey, args []string) *batchv1.Job {
	labels := map[string]string{
		NodeUpdateUIDLabel:             string(r.nu.UID),
		StepLabel:                      step,
		"app.kubernetes.io/managed-by": "capi-inplace",
		"app.kubernetes.io/component":  "kubeadm-node-update",
	}
	annotations := map[string]string{NodeUpdateAnnotation: r.nu.Namespace + "/" + r.nu.Name}
	container := corev1.Container{
		Name:                     ContainerName,
		Image:                    r.image,
		Command:                  []string{nodeprogram.Binary},
		Args:                     append([]string{"node", "kubeadm"}, args...),
		SecurityContext:          &corev1.SecurityContext{Privileged: ptr.To(true)},
		VolumeMounts:             []corev1.VolumeMount{{Name: "host-root", MountPath: hostRoot}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	pod := corev1.PodSpec{
		NodeName:      r.nu.Spec.NodeName,
		RestartPolicy: corev1.RestartPolicyNever,
		HostPID:       true,
		Tolerations:   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		// The node program talks to the cluster with the node's own kubeconfig (kubeadm's
		// admin.conf on a control plane node), never with a token of the namespace.
		AutomountServiceAccountToken: ptr.To(false),
		Volumes: []corev1.Volume{{Name: "host-root", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: ptr.To(corev1.HostPathDirectory)},
		}}},
	}
	if img := r.cfg.Spec.Source.Image; img != nil && step != StepUpgrade {
		pod.InitContainers = binariesCopy(r.image, img)
		pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "binaries", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "binaries", MountPath: binariesDir, ReadOnly: true})
	}
	pod.Containers = []corev1.Container{container}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: labels, Annotations: annotations},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](jobBackoffLimit),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
				Action: batchv1.PodFailurePolicyActionFailJob,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
					ContainerName: ptr.To(ContainerName),
					Operator:      batchv1.PodFailurePolicyOnExitCodesOpIn,
					Values:        []int32{nodeprogram.ExitFailed, nodeprogram.ExitUsage},
				},
			}}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
				Spec:       pod,
			},
		},
	}
}

// binariesCopy are the init containers of the image source: the node program copied out
// of the capi-inplace image into the emptyDir, then run in the binaries' image to copy
// kubeadm, kubelet and kubectl next to it (the cluster upgrade Job of the Harvester side
// takes Rancher's files out of a shell-less image the same way).
func binariesCopy(program string, src *inplacev1.KubeadmImageSource) []corev1.Container {
	dir := src.Path
	if dir == "" {
		dir = "/"
	}
	files := []string{"node", "copy-files", "--to=" + binariesDir}
	for _, b := range []string{"kubeadm", "kubelet", "kubectl"} {
		files = append(files, "--file="+strings.TrimSuffix(dir, "/")+"/"+b)
	}
	mount := []corev1.VolumeMount{{Name: "binaries", MountPath: binariesDir}}
	return []corev1.Container{{
		Name:                     programCopyContainer,
		Image:                    program,
		Command:                  []string{nodeprogram.Binary},
		Args:                     []string{"node", "copy-files", "--to=" + binariesDir, "--file=" + nodeprogram.Binary},
		VolumeMounts:             mount,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}, {
		Name:                     binariesCopyContainer,
		Image:                    src.Image,
		Command:                  []string{binariesDir + nodeprogram.Binary},
		Args:                     files,
		VolumeMounts:             mount,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}}
}

// jobEnded reads a Job's end: complete, or failed with the Job controller's reason.
func jobEnded(job *batchv1.Job) (complete bool, failed *batchv1.JobCondition) {
	for i := range job.Status.Conditions {
		c := &job.Status.Conditions[i]
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, nil
		case batchv1.JobFailed:
			return false, c
		}
	}
	return false, nil
}

// failureWords is what the failed Job's newest pod says about its failure: for each
// container that ended in error, its termination message (the node program writes the
// failing tool's own words there; a copy init container falls back to its log), with the
// container and its exit code. The Job's Failed condition only says that the backoff
// limit or the pod failure policy was reached. Empty when the pod is gone.
func failureWords(ctx context.Context, wc client.Client, job *batchv1.Job) (string, error) {
	failures, err := jobpods.FailedContainers(ctx, wc, job, nil)
	if err != nil {
		return "", err
	}
	return jobpods.FailedContainersWords(failures), nil
}
