package sim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
)

// ClusterUpgradeJobs plays the Job controller and the pod for the Jobs that run the
// capi-inplace node program's `node cluster-upgrade` (harvesteradapter/clusterupgrade
// Job): it recognises them as the SUC Job runner recognises the node program
// (nodeSubcommand, jobrunner.go), parses the container's arguments with the subcommand's
// own flag parsing (clusterupgrade.ParseArgs) and runs the real clusterupgrade.Run
// in-process against Client, the workload cluster, within the Job's
// activeDeadlineSeconds (the Job of fact 51, harvester-node-upgrade.md, whose work is
// fact 41's script). Its init container that copies the release upgrade image's files
// (clusterupgrade.ReleaseFilesContainer) is played too (releaseFiles): the image is
// pulled from ReleaseImages, and one that cannot be pulled keeps the pod waiting until
// the Job's deadline. The Job then gets the conditions the Job controller sets, as the
// SUC simulator's Jobs do (jobrunner.go):
// Complete, or Failed with the error as its message (what the termination message
// carries on a real cluster). A Job whose arguments do not parse fails as the program
// would, with exit code 2's message. One pod is run per Job: backoffLimit retries are
// not played (a test runs the Job again by deleting and re-creating it).
type ClusterUpgradeJobs struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace is where the Jobs are looked for. Default harvester-system.
	Namespace string
	// Interval is how often Jobs are looked at: without Cache, default 20ms; with it, when
	// no event came, default 1s.
	Interval time.Duration
	// Cache, when set, is a started cache of the workload cluster whose Job events start
	// the simulator's passes, as they start the Job controller. Reads still go to Client.
	Cache ctrlcache.Cache
	// MinDuration, when set, is the least time a successful Job's pod runs: a run of
	// clusterupgrade.Run that succeeds sooner completes when MinDuration has passed since
	// the pod started, as on a cluster whose Rancher and Fleet take that long (the bench
	// plays a real cluster upgrade's duration with it). It only delays: a failed run ends
	// at once, and the Job's activeDeadlineSeconds still bounds the wait.
	MinDuration time.Duration
	// ReleaseImages is what the init container that copies the release upgrade image's
	// files (clusterupgrade.ReleaseFilesContainer) pulls: the files of an image, or false
	// when the image cannot be pulled. Default DefaultReleaseImages.
	ReleaseImages func(image string) (fs.FS, bool)
	// RancherInstallers is what the init containers that take helm and the Rancher chart
	// out of Rancher's installer image (clusterupgrade.RancherInstallerContainer) pull:
	// the directory of an image's files, or false when the image cannot be pulled.
	// Default DefaultRancherInstallers.
	RancherInstallers func(image string) (string, bool)
	// Kubeconfig is the kubeconfig of Client's API server, given to the program as
	// --kubeconfig for the helm it runs: in a pod, helm uses the pod's service account.
	Kubeconfig func() ([]byte, error)

	loop    passLoop
	mu      sync.Mutex
	started map[types.UID]bool
	runs    int
}

// Runs is how many Jobs were started.
func (j *ClusterUpgradeJobs) Runs() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.runs
}

// Start runs the Jobs until ctx ends.
func (j *ClusterUpgradeJobs) Start(ctx context.Context) {
	go j.loop.run(ctx, j.Interval, j.Cache, []client.Object{&batchv1.Job{}}, func(ctx context.Context) { _ = j.pass(ctx) })
}

func (j *ClusterUpgradeJobs) pass(ctx context.Context) error {
	ns := j.Namespace
	if ns == "" {
		ns = clusterupgrade.DefaultNamespace
	}
	jobs := &batchv1.JobList{}
	if err := j.Client.List(ctx, jobs, client.InNamespace(ns)); err != nil {
		return err
	}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if job.DeletionTimestamp != nil || jobCondition(job, batchv1.JobComplete) != nil || jobCondition(job, batchv1.JobFailed) != nil || ptr.Deref(job.Spec.Suspend, false) {
			continue
		}
		var args []string
		for _, c := range job.Spec.Template.Spec.Containers {
			if nodeSubcommand(c.Image, c.Args) == "cluster-upgrade" {
				args = c.Args[2:]
			}
		}
		if args == nil {
			continue
		}
		j.mu.Lock()
		if j.started == nil {
			j.started = map[types.UID]bool{}
		}
		started := j.started[job.UID]
		j.started[job.UID] = true
		if !started {
			j.runs++
		}
		j.mu.Unlock()
		if !started {
			go j.run(ctx, job.DeepCopy(), args)
		}
	}
	return nil
}

func (j *ClusterUpgradeJobs) run(ctx context.Context, job *batchv1.Job, args []string) {
	start := metav1.Now()
	if err := j.updateStatus(ctx, job, func(st *batchv1.JobStatus) {
		st.StartTime, st.Active, st.Ready = &start, 1, ptr.To[int32](1)
	}); err != nil {
		return
	}
	runCtx, cancel := jobDeadline(ctx, job)
	defer cancel()
	args, cleanup, err := j.releaseFiles(runCtx, job, args)
	defer cleanup()
	if err == nil {
		var cleanupInstaller func()
		args, cleanupInstaller, err = j.rancherInstaller(runCtx, job, args)
		defer cleanupInstaller()
	}
	if err != nil {
		if ctx.Err() == nil {
			j.finish(ctx, job, err)
		}
		return
	}
	in, p, err := clusterupgrade.ParseArgs(args)
	if err != nil {
		j.finish(ctx, job, fmt.Errorf("capi-inplace node cluster-upgrade: %w (exit code 2)", err))
		return
	}
	err = clusterupgrade.Run(runCtx, j.Client, in, p)
	if rest := j.MinDuration - time.Since(start.Time); rest > 0 && err == nil {
		select {
		case <-runCtx.Done():
			err = runCtx.Err()
		case <-time.After(rest):
		}
	}
	if ctx.Err() != nil {
		return // the test ended
	}
	if err != nil {
		err = fmt.Errorf("capi-inplace node cluster-upgrade: failed: %w", err)
	}
	j.finish(ctx, job, err)
}

// jobDeadline is ctx bounded by the Job's activeDeadlineSeconds, counted from now (the pod's
// start).
func jobDeadline(ctx context.Context, job *batchv1.Job) (context.Context, context.CancelFunc) {
	if d := job.Spec.ActiveDeadlineSeconds; d != nil {
		return context.WithTimeout(ctx, time.Duration(*d)*time.Second)
	}
	return context.WithCancel(ctx)
}

// releaseFiles plays the Job's init container that copies the release upgrade image's
// files (clusterupgrade.Job): it pulls the image from ReleaseImages and writes its files
// into a directory of its own, standing for the pod's emptyDir, and points the
// program's --release-files there when the program mounts that emptyDir where the flag
// says, as in the pod; a flag elsewhere gets an empty directory, as the pod would see.
// An image that cannot be pulled keeps the pod waiting (ErrImagePull) until the Job's
// deadline, which then fails the Job. Without the init container the arguments stay.
func (j *ClusterUpgradeJobs) releaseFiles(ctx context.Context, job *batchv1.Job, args []string) ([]string, func(), error) {
	spec := job.Spec.Template.Spec
	var init *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == clusterupgrade.ReleaseFilesContainer {
			init = &spec.InitContainers[i]
		}
	}
	if init == nil {
		return args, func() {}, nil
	}
	images := j.ReleaseImages
	if images == nil {
		images = DefaultReleaseImages
	}
	files, ok := images(init.Image)
	if !ok {
		<-ctx.Done()
		return nil, func() {}, fmt.Errorf("pod of Job %s/%s: init container %s: ErrImagePull: image %s cannot be pulled (%w)", job.Namespace, job.Name, init.Name, init.Image, context.DeadlineExceeded)
	}
	dir, err := os.MkdirTemp("", "release-files-")
	if err != nil {
		return nil, func() {}, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	initMounts := map[string]string{}
	for _, m := range init.VolumeMounts {
		initMounts[m.Name] = m.MountPath
	}
	copied := filepath.Join(dir, "copied")
	if err := os.CopyFS(copied, files); err != nil {
		return nil, cleanup, err
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		return nil, cleanup, err
	}
	const flag = "--release-files="
	out := slices.Clone(args)
	for i, a := range out {
		path, isFlag := strings.CutPrefix(a, flag)
		if !isFlag {
			continue
		}
		out[i] = flag + empty
		for _, c := range spec.Containers {
			for _, m := range c.VolumeMounts {
				if initMounts[m.Name] != "" && initMounts[m.Name] == m.MountPath && m.MountPath == path {
					out[i] = flag + copied
				}
			}
		}
	}
	return out, cleanup, nil
}

// rancherInstaller plays the Job's init containers that take helm and the Rancher chart
// out of Rancher's installer image (clusterupgrade.Job): the first copies the node
// program, which the second runs in the installer image to copy /helm and
// /rancher-*.tgz; here the image's files (RancherInstallers) are linked into a directory
// standing for their emptyDir, and --rancher-installer points there. It also gives the
// program Kubeconfig as --kubeconfig, for helm. An image that cannot be pulled keeps the
// pod waiting until the Job's deadline, as releaseFiles.
func (j *ClusterUpgradeJobs) rancherInstaller(ctx context.Context, job *batchv1.Job, args []string) ([]string, func(), error) {
	nothing := func() {}
	var init *corev1.Container
	for i, c := range job.Spec.Template.Spec.InitContainers {
		if c.Name == clusterupgrade.RancherInstallerContainer {
			init = &job.Spec.Template.Spec.InitContainers[i]
		}
	}
	if init == nil {
		return args, nothing, nil
	}
	images := j.RancherInstallers
	if images == nil {
		images = DefaultRancherInstallers
	}
	files, ok := images(init.Image)
	if !ok {
		<-ctx.Done()
		return nil, nothing, fmt.Errorf("pod of Job %s/%s: init container %s: ErrImagePull: image %s cannot be pulled (%w)", job.Namespace, job.Name, init.Name, init.Image, context.DeadlineExceeded)
	}
	dir, err := os.MkdirTemp("", "rancher-installer-")
	if err != nil {
		return nil, nothing, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	entries, err := os.ReadDir(files)
	if err != nil {
		return nil, cleanup, err
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(files, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return nil, cleanup, err
		}
	}
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "--rancher-installer=") {
			out[i] = "--rancher-installer=" + dir
		}
	}
	if j.Kubeconfig != nil {
		kc, err := j.Kubeconfig()
		if err != nil {
			return nil, cleanup, err
		}
		path := filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(path, kc, 0o600); err != nil {
			return nil, cleanup, err
		}
		out = append(out, "--kubeconfig="+path)
	}
	return out, cleanup, nil
}

func (j *ClusterUpgradeJobs) finish(ctx context.Context, job *batchv1.Job, runErr error) {
	now := metav1.Now()
	_ = j.updateStatus(ctx, job, func(st *batchv1.JobStatus) {
		st.Active, st.Ready = 0, ptr.To[int32](0)
		if runErr != nil {
			reason := batchv1.JobReasonBackoffLimitExceeded
			if errors.Is(runErr, context.DeadlineExceeded) {
				reason = batchv1.JobReasonDeadlineExceeded
			}
			st.Failed = 1
			st.Conditions = append(st.Conditions,
				batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: reason, Message: runErr.Error(), LastProbeTime: now, LastTransitionTime: now},
				batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: reason, Message: runErr.Error(), LastProbeTime: now, LastTransitionTime: now})
			return
		}
		st.Succeeded = 1
		st.CompletionTime = &now
		st.Conditions = append(st.Conditions,
			batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: now, LastTransitionTime: now},
			batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: now, LastTransitionTime: now})
	})
}

func (j *ClusterUpgradeJobs) updateStatus(ctx context.Context, job *batchv1.Job, mutate func(*batchv1.JobStatus)) error {
	return updateJobStatus(ctx, j.Client, job, mutate)
}
