package sim

import (
	"bytes"
	"context"
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
	"github.com/capi-inplace/capi-inplace/nodeprogram"
)

// ClusterUpgradeJobs plays the Job controller and the pod for the Jobs that run the
// capi-inplace node program's `node cluster-upgrade` (harvesteradapter/clusterupgrade
// Job): it recognises them as the SUC Job runner recognises the node program
// (nodeSubcommand, jobrunner.go) and runs the container's program in-process: the real
// `node cluster-upgrade` (clusterupgrade.Run) against Client, the workload cluster,
// within the Job's activeDeadlineSeconds (the Job of fact 51, harvester-node-upgrade.md,
// whose work is fact 41's script). Its init container that copies the release upgrade image's files
// (clusterupgrade.ReleaseFilesContainer) is played too (releaseFiles): the image is
// pulled from ReleaseImages, and one that cannot be pulled keeps the pod waiting until
// the Job's deadline. The program runs as in its container: nodeprogram.Main, with the
// pod's termination message file (--termination-log) and its stdout and stderr as the
// container's log, so that its exit code (2 for arguments it refuses), its termination
// message and its log are the program's own. The Job then gets the conditions the Job
// controller sets, as the SUC simulator's Jobs do (jobrunner.go, sucpods.go): Complete;
// or, for a container that exited non-zero, Failed with reason BackoffLimitExceeded and
// only the Job controller's words ("Job has reached the specified backoff limit"), the
// failure's own words being on the failed pod it leaves (leaveFailedPod: the container's
// exit code and termination message; its log through PodLog); or, past the Job's
// activeDeadlineSeconds, Failed with reason DeadlineExceeded ("Job was active longer
// than specified deadline"), and no pod: the Job controller deletes the active pods
// (kubernetes pkg/controller/job/job_controller.go, syncJob and deleteActivePods). The
// pod is placed on the first Ready, schedulable node by name, standing for the
// scheduler's pick. Ended records how each run ended as the simulator saw it, for tests.
// A Job deleted while its pod runs stops the pod as the garbage collector and the kubelet
// do (kubernetes pkg/controller/garbagecollector: a Job's pods are its dependents, deleted
// with it; pkg/kubelet/kuberuntime killContainer: SIGTERM, then SIGKILL once the pod's
// grace period has passed): after TerminationDelay the program's context is cancelled, as
// the node program's SIGTERM handler cancels it (main.go runNodeProgram), and the pod's
// run ends without writing to its Job. Deleted with foreground propagation, the Job stays,
// its deletionTimestamp set and the finalizer foregroundDeletion on it (k8s.io/apiserver
// pkg/registry/generic/registry/store.go), until that pod and the failed pods it left are
// gone; then the finalizer is taken off and the Job goes (the garbage collector's
// processDeletingDependentsItem). Deleted in the background, the Job goes at once and its
// pod is stopped all the same: the two can overlap with the pod of a Job created again
// under the same name, as on a real cluster.
// One pod is run per Job: the backoffLimit retries a real Job controller makes first
// (shared/facts/harvester-release-steps.md fact 6 for Harvester's own Job,
// clusterupgrade.DefaultBackoffLimit for this one) are not played; a test runs the Job
// again by deleting and re-creating it.
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

	// TerminationDelay is how long the pod of a deleted Job goes on running before its
	// container is stopped: the garbage collector's deletion of the pod and the kubelet's
	// SIGTERM. Default 0: at the simulator's next pass.
	TerminationDelay time.Duration

	loop    passLoop
	mu      sync.Mutex
	started map[types.UID]bool
	// running are the pods whose program runs, by their Job's UID.
	running map[types.UID]*upgradePod
	runs    int
	// ended is how the run of each Job (namespace/name) ended; podLogs the logs of the
	// failed pods' containers (namespace/pod/container).
	ended   map[string]string
	podLogs map[string]string
}

// Runs is how many Jobs were started.
func (j *ClusterUpgradeJobs) Runs() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.runs
}

// Ended is how the last run of the Job namespace/name ended, as the simulator saw it: the
// program's termination message, or why its pod never ran the program (an image that
// could not be pulled; a real cluster shows that only on the pod while it waits, and in
// its events), or StoppedMessage; false while it runs or before it started.
func (j *ClusterUpgradeJobs) Ended(namespace, name string) (string, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	message, ok := j.ended[namespace+"/"+name]
	return message, ok
}

// PodLog is the log of a container of a failed pod the simulator left, and whether it
// knows that container (Kubelet.Logs fits).
func (j *ClusterUpgradeJobs) PodLog(namespace, pod, container string) (string, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	log, ok := j.podLogs[namespace+"/"+pod+"/"+container]
	return log, ok
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
	present := map[types.UID]bool{}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		args := clusterUpgradeArgs(job)
		if args == nil {
			continue
		}
		present[job.UID] = true
		if job.DeletionTimestamp != nil {
			if !j.stop(job.UID) {
				j.collect(ctx, client.ObjectKeyFromObject(job), job.UID)
			}
			continue
		}
		if jobCondition(job, batchv1.JobComplete) != nil || jobCondition(job, batchv1.JobFailed) != nil || ptr.Deref(job.Spec.Suspend, false) {
			continue
		}
		j.mu.Lock()
		if j.started == nil {
			j.started = map[types.UID]bool{}
		}
		started := j.started[job.UID]
		j.started[job.UID] = true
		var pod *upgradePod
		if !started {
			j.runs++
			podCtx, kill := context.WithCancel(ctx)
			pod = &upgradePod{namespace: job.Namespace, ctx: podCtx, kill: kill}
			if j.running == nil {
				j.running = map[types.UID]*upgradePod{}
			}
			j.running[job.UID] = pod
		}
		j.mu.Unlock()
		if pod != nil {
			go j.run(ctx, pod, job.DeepCopy(), args)
		}
	}
	// A Job deleted in the background is gone at once; its pod is stopped all the same.
	j.mu.Lock()
	var gone []types.UID
	for uid, pod := range j.running {
		if !present[uid] && pod.namespace == ns {
			gone = append(gone, uid)
		}
	}
	j.mu.Unlock()
	for _, uid := range gone {
		j.stop(uid)
	}
	return nil
}

// clusterUpgradeArgs are the arguments of `node cluster-upgrade` in the Job's pod, nil
// when its pod runs no such program.
func clusterUpgradeArgs(job *batchv1.Job) []string {
	for _, c := range job.Spec.Template.Spec.Containers {
		if nodeSubcommand(c.Image, c.Args) == "cluster-upgrade" {
			return c.Args[2:]
		}
	}
	return nil
}

// upgradePod is the pod of a Job whose program runs: ctx is cancelled when its container
// is stopped (kill), stopping says that its Job was deleted.
type upgradePod struct {
	namespace string
	ctx       context.Context
	kill      context.CancelFunc
	stopping  bool
}

// stop stops, after TerminationDelay, the container of the running pod of the Job uid,
// and says whether there is one.
func (j *ClusterUpgradeJobs) stop(uid types.UID) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	pod := j.running[uid]
	if pod == nil {
		return false
	}
	if !pod.stopping {
		pod.stopping = true
		time.AfterFunc(j.TerminationDelay, pod.kill)
	}
	return true
}

// collect plays the garbage collector for the Job key (of uid) deleted with foreground
// propagation, once no pod of it runs: the failed pods it left are deleted, then the
// finalizer foregroundDeletion is taken off, which lets the Job go.
func (j *ClusterUpgradeJobs) collect(ctx context.Context, key client.ObjectKey, uid types.UID) {
	job := &batchv1.Job{}
	if err := j.Client.Get(ctx, key, job); err != nil || job.UID != uid || job.DeletionTimestamp == nil ||
		!slices.Contains(job.Finalizers, metav1.FinalizerDeleteDependents) {
		return
	}
	pods := &corev1.PodList{}
	if err := j.Client.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabels{LabelJobName: key.Name}); err != nil {
		return
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if owner := metav1.GetControllerOf(pod); owner != nil && owner.UID == uid {
			if err := j.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
				return
			}
		}
	}
	before := job.DeepCopy()
	job.Finalizers = slices.DeleteFunc(job.Finalizers, func(f string) bool { return f == metav1.FinalizerDeleteDependents })
	_ = j.Client.Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

func (j *ClusterUpgradeJobs) run(ctx context.Context, pod *upgradePod, job *batchv1.Job, args []string) {
	defer func() {
		j.mu.Lock()
		delete(j.running, job.UID)
		j.mu.Unlock()
		pod.kill()
		// The pod is gone: a Job deleted in the foreground goes now.
		j.collect(ctx, client.ObjectKeyFromObject(job), job.UID)
	}()
	start := metav1.Now()
	if err := j.updateStatus(ctx, job, func(st *batchv1.JobStatus) {
		st.StartTime, st.Active, st.Ready = &start, 1, ptr.To[int32](1)
	}); err != nil {
		return
	}
	runCtx, cancel := jobDeadline(pod.ctx, job)
	defer cancel()
	failing := clusterupgrade.ReleaseFilesContainer
	args, cleanup, err := j.releaseFiles(runCtx, job, args)
	defer cleanup()
	if err == nil {
		var cleanupInstaller func()
		failing = clusterupgrade.RancherInstallerContainer
		args, cleanupInstaller, err = j.rancherInstaller(runCtx, job, args)
		defer cleanupInstaller()
	}
	switch {
	case ctx.Err() != nil:
		return // the test ended
	case pod.ctx.Err() != nil:
		j.stopped(job) // the Job was deleted and its pod stopped
		return
	case err != nil && runCtx.Err() != nil:
		j.finish(ctx, job, start, err.Error(), nil, true) // an image never pulled, until the deadline
		return
	case err != nil:
		// What the simulator could not do in the init container's stead fails that
		// container, its error in the log (cp and copy-files write to stderr).
		j.finish(ctx, job, start, err.Error(), &containerExit{container: failing, code: 1, log: err.Error() + "\n"}, false)
		return
	}
	exit := j.program(runCtx, args)
	if rest := j.MinDuration - time.Since(start.Time); rest > 0 && exit.code == 0 {
		select {
		case <-runCtx.Done():
		case <-time.After(rest):
		}
	}
	switch {
	case ctx.Err() != nil:
		return // the test ended
	case pod.ctx.Err() != nil:
		j.stopped(job) // the Job was deleted and its pod stopped
		return
	case runCtx.Err() != nil:
		j.finish(ctx, job, start, exit.termination, nil, true) // the pod was still active at the deadline
	case exit.code != 0:
		j.finish(ctx, job, start, exit.termination, exit, false)
	default:
		j.finish(ctx, job, start, exit.termination, nil, false)
	}
}

// StoppedMessage is what Ended reports of a run whose pod was stopped because its Job was
// deleted.
const StoppedMessage = "stopped: its Job was deleted"

// stopped records that the run of job ended because its Job was deleted.
func (j *ClusterUpgradeJobs) stopped(job *batchv1.Job) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ended == nil {
		j.ended = map[string]string{}
	}
	j.ended[job.Namespace+"/"+job.Name] = StoppedMessage
}

// program runs the pod's apply container: the node program's `node cluster-upgrade`
// with args, through nodeprogram.Main as the image's entrypoint runs it, its termination
// message written to a file of its own (the container's terminationMessagePath) and its
// stdout and stderr to its log. The program reaches the API server through Client.
func (j *ClusterUpgradeJobs) program(ctx context.Context, args []string) *containerExit {
	exit := &containerExit{container: "apply"}
	dir, err := os.MkdirTemp("", "cluster-upgrade-pod-")
	if err != nil {
		exit.code, exit.log = 1, err.Error()
		return exit
	}
	defer func() { _ = os.RemoveAll(dir) }()
	terminationLog := filepath.Join(dir, "termination-log")
	log := &lockedBuffer{}
	env := &nodeprogram.Env{Stdout: log, Stderr: log, Client: func() (client.Client, error) { return j.Client, nil }}
	argv := append([]string{"--termination-log=" + terminationLog, "cluster-upgrade"}, args...)
	exit.code = int32(nodeprogram.Main(ctx, argv, env))
	if message, err := os.ReadFile(terminationLog); err == nil {
		exit.termination = string(message)
	}
	exit.log = log.String()
	return exit
}

// lockedBuffer is a container's log, written by the program's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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

// finish ends the Job as the kubelet and the Job controller do (see ClusterUpgradeJobs):
// past the Job's deadline, Failed with DeadlineExceeded and no pod; else with exit set,
// a container that failed: its failed pod is left first, as the kubelet reports it before
// the Job controller counts it, then the Job is Failed with BackoffLimitExceeded; else
// Complete. ended is what Ended reports.
func (j *ClusterUpgradeJobs) finish(ctx context.Context, job *batchv1.Job, start metav1.Time, ended string, exit *containerExit, deadline bool) {
	now := metav1.Now()
	if exit != nil && !deadline {
		pod, err := leaveFailedPod(ctx, j.Client, job, j.podNode(ctx), exit, start, now)
		if err != nil {
			return
		}
		j.mu.Lock()
		if j.podLogs == nil {
			j.podLogs = map[string]string{}
		}
		j.podLogs[job.Namespace+"/"+pod+"/"+exit.container] = exit.log
		j.mu.Unlock()
	}
	j.mu.Lock()
	if j.ended == nil {
		j.ended = map[string]string{}
	}
	j.ended[job.Namespace+"/"+job.Name] = ended
	j.mu.Unlock()
	_ = j.updateStatus(ctx, job, func(st *batchv1.JobStatus) {
		st.Active, st.Ready = 0, ptr.To[int32](0)
		reason, message := "", ""
		switch {
		case deadline:
			reason, message = batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline"
		case exit != nil:
			reason, message = batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage
		}
		if reason != "" {
			st.Failed = 1
			st.Conditions = append(st.Conditions,
				batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastProbeTime: now, LastTransitionTime: now},
				batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastProbeTime: now, LastTransitionTime: now})
			return
		}
		st.Succeeded = 1
		st.CompletionTime = &now
		st.Conditions = append(st.Conditions,
			batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: now, LastTransitionTime: now},
			batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: now, LastTransitionTime: now})
	})
}

// podNode is where the scheduler would have put the Job's pod: the first Ready,
// schedulable node by name; "" when there is none (the pod stays unscheduled).
func (j *ClusterUpgradeJobs) podNode(ctx context.Context) string {
	nodes := &corev1.NodeList{}
	if err := j.Client.List(ctx, nodes); err != nil {
		return ""
	}
	slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for i := range nodes.Items {
		if n := &nodes.Items[i]; NodeReady(n) && !n.Spec.Unschedulable {
			return n.Name
		}
	}
	return ""
}

func (j *ClusterUpgradeJobs) updateStatus(ctx context.Context, job *batchv1.Job, mutate func(*batchv1.JobStatus)) error {
	return updateJobStatus(ctx, j.Client, job, mutate)
}
