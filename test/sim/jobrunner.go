package sim

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/nodeprogram"
)

// This file plays what a real cluster does with the Jobs SUC creates, which a test API
// server does not: the Job controller (start, activeDeadlineSeconds, terminal
// conditions), the registry (an image that does not exist is never pulled), kubectl
// cordon and drain in the pod, and the kubelet of a node whose upgrade restarts it.

// podRun is the pod of one started Job.
type podRun struct {
	record    int
	node      string
	plan      *sucv1.Plan
	start     time.Time
	running   bool // init containers done, upgrade container started
	down      bool // the upgrade took the node NotReady
	finished  bool
	exclusive bool
	pullError string
	// exit is how the pod's failing container ended (nil while none failed): what the
	// kubelet reports on the pod the Job controller leaves (failedPod); podLeft once
	// that pod was created.
	exit    *containerExit
	podLeft bool
	// drainStart is when its kubectl drain began (zero before): a drain whose evictions
	// are refused runs on until its --timeout.
	drainStart time.Time
	// repositoryDown is since when its work waits for a repository that does not serve
	// (zero while it serves).
	repositoryDown time.Time
}

// containerExit is a container that ended in error: its exit code, the termination
// message the kubelet read from its terminationMessagePath (the node program writes its
// outcome there; kubectl writes nothing), and the last lines of its log.
type containerExit struct {
	container   string
	code        int32
	termination string
	log         string
}

// blockedByAntiAffinity says whether the pod of job must stay Pending: a pod of the same
// Plan (or, for an exclusive Plan, of any exclusive Plan) still runs on its node
// (facts 23, 29, 43).
func (s *SUC) blockedByAntiAffinity(job *batchv1.Job) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exclusive := job.Labels[LabelExclusive] == "true"
	for uid, r := range s.running {
		// The node first: the runs of other nodes are being changed by their own kubelets.
		if r.node != job.Labels[LabelNode] || uid == job.UID || r.finished {
			continue
		}
		if exclusive && r.exclusive || !exclusive && r.plan.Name == job.Labels[LabelPlan] {
			return true
		}
	}
	return false
}

// DefaultImageExists is the simulator's registry. It serves any tagged or digested image
// except two repositories whose tags it knows: rancher/rke2-upgrade serves RKE2 versions
// (v1.33.3-rke2r1), and capi-inplace (the manager's and node program's image, any
// registry) serves manager versions (v0.4.0, dev) and never a Kubernetes version. An
// untagged image is pulled as :latest, which neither of those serves (the Makefile never
// tags capi-inplace latest). So capi-inplace:v1.33.3-rke2r1, what SUC makes of an
// untagged prepare or upgrade image in an RKE2 Plan (fact 35), does not exist.
func DefaultImageExists(image string) bool {
	if strings.Contains(image, "@") {
		return true
	}
	repo, tag := imageRepository(image), "latest"
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		tag = image[i+1:]
	}
	switch {
	case strings.HasSuffix(repo, "rancher/rke2-upgrade"):
		return rke2Tag.MatchString(tag)
	case IsNodeImage(image):
		return managerTag.MatchString(tag) && !rke2Tag.MatchString(tag)
	}
	return true
}

var (
	rke2Tag    = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+-rke2r[0-9]+$`)
	managerTag = regexp.MustCompile(`^(dev|v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$`)
)

// IsNodeImage tells whether image is a capi-inplace image, from any registry or mirror:
// the image whose node program (`capi-inplace node ...`) the Harvester updater runs.
func IsNodeImage(image string) bool {
	repo := imageRepository(image)
	return repo == "capi-inplace" || strings.HasSuffix(repo, "/capi-inplace")
}

// nodeSubcommand is the node program subcommand a container runs, such as "os-upgrade"
// or "repository download", or "" when it runs something else: the capi-inplace image
// with `node <subcommand> [flags]` as its arguments (nodeprogram/program.go).
func nodeSubcommand(image string, args []string) string {
	if !IsNodeImage(image) || len(args) < 2 || args[0] != "node" {
		return ""
	}
	if args[1] == "repository" && len(args) > 2 {
		return args[1] + " " + args[2]
	}
	return args[1]
}

// placeProgramFlag is the flag with which a node program container copies the program
// onto the host (nodeprogram remove-archives --place-program), for a later container of
// the same pod, of another image, to execute it from the host root SUC mounts at /host
// in every container (shared/facts/suc.md fact 31).
const placeProgramFlag = "--place-program"

// placedPrograms are the paths, as the pod's containers see them under /host, where the
// node program containers among containers place the program.
func placedPrograms(containers []corev1.Container) []string {
	var placed []string
	for _, c := range containers {
		if nodeSubcommand(c.Image, c.Args) == "" {
			continue
		}
		if p := flagValue(c.Args, placeProgramFlag); p != "" {
			placed = append(placed, "/host"+p)
		}
	}
	return placed
}

// containerSubcommand is the node program subcommand a container runs, "" when it runs
// something else: the capi-inplace image's own program (nodeSubcommand), or, in any other
// image, the copy an earlier container of the pod placed on the host (placed, from
// placedPrograms of the containers before it), executed as the container's command.
func containerSubcommand(image string, command, args []string, placed []string) string {
	if sub := nodeSubcommand(image, args); sub != "" {
		return sub
	}
	if len(command) != 1 || !slices.Contains(placed, command[0]) || len(args) < 2 || args[0] != "node" {
		return ""
	}
	if args[1] == "repository" && len(args) > 2 {
		return args[1] + " " + args[2]
	}
	return args[1]
}

// PlanSubcommand is the node program subcommand the upgrade container of plan runs, ""
// when it runs something else. SUC runs the prepare container as an init container before
// the upgrade container, in the same pod (suc.md fact 34), so a program prepare places
// on the host is there for upgrade.
func PlanSubcommand(plan *sucv1.Plan) string {
	up := plan.Spec.Upgrade
	if up == nil {
		return ""
	}
	var before []corev1.Container
	if p := plan.Spec.Prepare; p != nil {
		before = append(before, corev1.Container{Image: p.Image, Command: p.Command, Args: p.Args})
	}
	return containerSubcommand(up.Image, up.Command, up.Args, placedPrograms(before))
}

// missingExecutable is the first container of pod whose command is a program under /host
// that no earlier container placed there, and what the runtime says when it cannot start
// it (runc's exec of a file that does not exist: the kubelet reports the container
// terminated with exit code 128, reason StartError); "" when there is none. The
// simulated hosts hold no other programs under /host for a container to run.
func missingExecutable(pod corev1.PodSpec) (string, string) {
	containers := append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...)
	for i, c := range containers {
		if len(c.Command) == 0 || !strings.HasPrefix(c.Command[0], "/host/") {
			continue
		}
		if !slices.Contains(placedPrograms(containers[:i]), c.Command[0]) {
			return c.Name, fmt.Sprintf("container %s: StartError: failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: %q: stat %s: no such file or directory: unknown", c.Name, c.Command[0], c.Command[0])
		}
	}
	return "", ""
}

// podCommand is what a container of a Job's pod runs, in a few words: the node program's
// subcommand with its own flags (not the host root, repository and version every one
// gets), kubectl's verb, else the image's last path element. placed are the programs
// the containers before it placed on the host (placedPrograms).
func podCommand(c corev1.Container, placed []string) string {
	if sub := containerSubcommand(c.Image, c.Command, c.Args, placed); sub != "" {
		for _, a := range c.Args {
			name, _, _ := strings.Cut(a, "=")
			if strings.HasPrefix(a, "--") && !slices.Contains([]string{"--host-root", "--repository-url", "--version"}, name) {
				sub += " " + a
			}
		}
		return sub
	}
	if strings.Contains(imageRepository(c.Image), "kubectl") && len(c.Args) > 0 {
		return "kubectl " + c.Args[0]
	}
	return c.Image[strings.LastIndex(c.Image, "/")+1:]
}

// knownSubcommand tells whether the node program of this build has the subcommand sub
// (nodeprogram.Subcommands): a Job's container that runs another one exits with code 2
// at once, as the real program does (nodeprogram/program.go). Every subcommand the
// Harvester updater's Plans run is known this way, remove-images among them, the image
// cleanup of upgrade-toolkit run on each node once all nodes run the release
// (shared/facts/harvester-node-upgrade.md, fact 55); apart from os-upgrade (which
// reboots the node, DefaultOSImage) the simulator plays them all alike: the Job runs
// for its work duration and completes, and the Record has the run.
func knownSubcommand(sub string) bool {
	return slices.Contains(nodeprogram.Subcommands(), sub)
}

// unknownSubcommand is the first container of pod that runs a node program subcommand
// this build does not have, and its message; "" when there is none.
func unknownSubcommand(pod corev1.PodSpec) (string, string) {
	containers := append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...)
	for i, c := range containers {
		if sub := containerSubcommand(c.Image, c.Command, c.Args, placedPrograms(containers[:i])); sub != "" && !knownSubcommand(sub) {
			return c.Name, fmt.Sprintf("container %s: capi-inplace node: unknown subcommand %q (exit code %d)", c.Name, sub, nodeprogram.ExitUsage)
		}
	}
	return "", ""
}

// imageRepository is an image reference without its tag or digest.
func imageRepository(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i]
	}
	return image
}

func (s *SUC) imageExists(image string) bool {
	if s.ImageExists != nil {
		return s.ImageExists(image)
	}
	return DefaultImageExists(image)
}

func (s *SUC) work(plan *sucv1.Plan) time.Duration {
	if s.Work != nil {
		return s.Work(plan)
	}
	if s.JobDuration == 0 {
		return 200 * time.Millisecond
	}
	return s.JobDuration
}

func (s *SUC) drainDuration() time.Duration {
	if s.DrainDuration == 0 {
		return time.Second
	}
	return s.DrainDuration
}

// runPods advances the pod of every un-paused, unfinished Job of this controller.
func (s *SUC) runPods(ctx context.Context) error {
	jobs := &batchv1.JobList{}
	if err := s.cached().List(ctx, jobs, client.InNamespace(s.Namespace), client.MatchingLabels{LabelController: s.name()}); err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	// Each node's kubelet runs its own pods, whatever the other nodes do: the nodes go
	// at once, the Jobs of one node one after the other (so that one sees the pods the
	// other started, for the anti-affinity).
	byNode := map[string][]*batchv1.Job{}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if job.DeletionTimestamp != nil || jobCondition(job, batchv1.JobComplete) != nil || jobCondition(job, batchv1.JobFailed) != nil {
			continue
		}
		if job.Spec.Parallelism == nil || *job.Spec.Parallelism == 0 {
			continue // fact 28: paused until its node is applying
		}
		node := job.Labels[LabelNode]
		byNode[node] = append(byNode[node], job)
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, nodeJobs := range byNode {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, job := range nodeJobs {
				if err := s.runPod(ctx, job); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("job %s: %w", job.Name, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *SUC) runPod(ctx context.Context, job *batchv1.Job) error {
	now := s.clock().Now()
	s.mu.Lock()
	run := s.running[job.UID]
	s.mu.Unlock()
	if run == nil {
		return s.startPod(ctx, job, now)
	}
	if run.finished {
		return nil
	}
	// The Job controller fails a Job active longer than its deadline, whatever its pod does.
	if d := job.Spec.ActiveDeadlineSeconds; d != nil && now.Sub(run.start) >= time.Duration(*d)*time.Second {
		message := fmt.Sprintf("active for %s, longer than the Job's activeDeadlineSeconds %d", now.Sub(run.start), *d)
		if run.pullError != "" {
			message = run.pullError + "; " + message
		}
		return s.finishPod(ctx, job, run, batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline", message)
	}
	if run.pullError != "" {
		return nil // ImagePullBackOff until the deadline, if there is one
	}
	if !run.running {
		return s.startContainers(ctx, job, run, now)
	}
	if now.Sub(run.start) < s.work(run.plan) {
		return nil
	}
	if waiting, message := s.repositoryWait(run, now); waiting {
		return nil
	} else if message != "" {
		run.exit = &containerExit{container: "upgrade", code: nodeprogram.ExitRetry, termination: message, log: message}
		return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
	}
	message, fail := s.certificateFailure(run.plan, run.node, now)
	if !fail {
		message, fail = s.failure(run.plan, run.node)
	}
	if fail {
		// A failed upgrade container: the Job controller gives up after backoffLimit
		// retries and says only that (jobReasonBackoffLimitExceeded): the failure's own
		// words are the node program's termination message and log on the failed pod,
		// where the kubelet puts them (failedPod).
		run.exit = &containerExit{container: "upgrade", code: 1, termination: message, log: message}
		return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
	}
	return s.finishPod(ctx, job, run, "", "", "")
}

// repositoryWait plays the node program reading the release repository of run's Plan
// (see SUC.Repository): waiting while the repository has not served for
// RepositoryPatience, then the failure's message.
func (s *SUC) repositoryWait(run *podRun, now time.Time) (waiting bool, message string) {
	up := run.plan.Spec.Upgrade
	if s.Repository == nil || up == nil {
		return false, ""
	}
	repositoryURL := flagValue(up.Args, "--repository-url")
	if repositoryURL == "" {
		return false, ""
	}
	serves, why := s.Repository.Serves(repositoryURL)
	if serves {
		run.repositoryDown = time.Time{}
		return false, ""
	}
	if run.repositoryDown.IsZero() {
		run.repositoryDown = now
	}
	patience := s.RepositoryPatience
	if patience == 0 {
		patience = time.Second
	}
	if now.Sub(run.repositoryDown) < patience {
		return true, ""
	}
	return false, fmt.Sprintf("capi-inplace node %s: not done yet: GET %s/harvester-release.yaml: dial tcp: connect: connection refused (%s)", PlanSubcommand(run.plan), repositoryURL, why)
}

// startPod creates the Job's pod: the Job gets its start time and one active pod. A pod
// whose images the registry does not serve stays in ImagePullBackOff.
func (s *SUC) startPod(ctx context.Context, job *batchv1.Job, now time.Time) error {
	plan := &sucv1.Plan{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: job.Labels[LabelPlan]}, plan); err != nil {
		return err
	}
	node := job.Labels[LabelNode]
	if s.blockedByAntiAffinity(job) {
		return nil // Pending
	}
	run := &podRun{node: node, plan: plan, start: now, exclusive: job.Labels[LabelExclusive] == "true"}
	pod := job.Spec.Template.Spec
	var images, commands []string
	all := append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...)
	for i, c := range all {
		images = append(images, c.Image)
		commands = append(commands, podCommand(c, placedPrograms(all[:i])))
	}
	for _, c := range append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...) {
		if !s.imageExists(c.Image) {
			run.pullError = fmt.Sprintf("container %s: ImagePullBackOff: image %s not found", c.Name, c.Image)
			break
		}
	}
	if err := s.updateJobStatus(ctx, job, func(st *batchv1.JobStatus) {
		st.StartTime = &metav1.Time{Time: now}
		st.Active = 1
		st.Ready = ptr.To[int32](0)
	}); err != nil {
		return err
	}
	s.mu.Lock()
	seen := s.planSeen[plan.UID]
	s.mu.Unlock()
	run.record = s.Record.startRun(PlanRun{Plan: plan.Name, Node: node, Job: job.Name, Hash: job.Labels[NodePlanPrefix+plan.Name], Version: plan.Spec.Version, Images: images, Commands: commands, PlanSeen: seen, Start: now})
	if run.pullError != "" {
		s.Record.noteRun(run.record, run.pullError)
	}
	s.mu.Lock()
	s.running[job.UID] = run
	s.mu.Unlock()
	return nil
}

// startContainers runs the init containers (kubectl cordon / drain act on the node), then
// starts the upgrade container: one that restarts the kubelet or reboots takes the node
// NotReady. A kubectl drain whose --timeout is shorter than the drain fails the pod.
func (s *SUC) startContainers(ctx context.Context, job *batchv1.Job, run *podRun, now time.Time) error {
	pod := job.Spec.Template.Spec
	if container, message := missingExecutable(pod); message != "" {
		run.exit = &containerExit{container: container, code: 128, termination: message, log: message}
		return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
	}
	if container, message := unknownSubcommand(pod); message != "" {
		// The node program writes its own termination message (nodeprogram Main).
		run.exit = &containerExit{container: container, code: nodeprogram.ExitUsage, termination: message, log: message}
		return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
	}
	for _, c := range append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...) {
		if len(c.Args) < 2 || !strings.Contains(imageRepository(c.Image), "kubectl") {
			continue
		}
		switch c.Args[0] {
		case "cordon":
			if err := s.Kubelet.SetUnschedulable(ctx, c.Args[1], true); err != nil {
				return err
			}
		case "drain":
			if err := s.Kubelet.SetUnschedulable(ctx, c.Args[1], true); err != nil {
				return err
			}
			if run.drainStart.IsZero() {
				s.Record.drained(c.Args[1], run.plan.Name, now)
				run.drainStart = now
			}
			refused, fatal, err := s.evictPods(ctx, c.Args[1], c.Args)
			if err != nil {
				return err
			}
			if fatal != "" {
				message := fmt.Sprintf("container %s: %s", c.Name, fatal)
				run.exit = &containerExit{container: c.Name, code: 1, log: message}
				return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
			}
			if len(refused) > 0 {
				// kubectl retries a refused eviction every 5 s until its --timeout.
				t, err := time.ParseDuration(flagValue(c.Args, "--timeout"))
				if err != nil || t <= 0 || now.Sub(run.drainStart) < t {
					return nil
				}
				message := fmt.Sprintf("container %s: error: unable to drain node %q due to error: [error when evicting %s: global timeout reached: %s], continuing command...", c.Name, c.Args[1], strings.Join(refused, ", "), t)
				run.exit = &containerExit{container: c.Name, code: 1, log: message}
				return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
			}
			if t := flagValue(c.Args, "--timeout"); t != "" {
				d, err := time.ParseDuration(t)
				if err != nil || d < s.drainDuration() {
					message := fmt.Sprintf("container %s: error: unable to drain node %q due to error: global timeout reached: %s", c.Name, c.Args[1], t)
					if err != nil {
						message = fmt.Sprintf("container %s: error: invalid argument %q for \"--timeout\" flag: %v", c.Name, t, err)
					}
					// kubectl writes no termination message: its error is in its log.
					run.exit = &containerExit{container: c.Name, code: 1, log: message}
					return s.finishPod(ctx, job, run, batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage, message)
				}
			}
		}
	}
	// The RKE2 upgrade restarts RKE2, and the kubelet with it, inside the Job. The OS
	// install runs while the node serves; its reboot comes after the Job (finishPod).
	if s.kubeletVersion(run.plan) != "" {
		if err := s.Kubelet.SetReady(ctx, run.node, false, "UpgradeInProgress"); err != nil {
			return err
		}
		run.down = true
	}
	run.running = true
	return s.updateJobStatus(ctx, job, func(st *batchv1.JobStatus) { st.Ready = ptr.To[int32](1) })
}

// finishPod ends the Job: Complete when reason is empty, else Failed with reason and
// message; recordMessage is what the run shows in the Record.
func (s *SUC) finishPod(ctx context.Context, job *batchv1.Job, run *podRun, reason, message, recordMessage string) error {
	failed := reason != ""
	if run.down {
		if !failed {
			if err := s.Kubelet.SetVersion(ctx, run.node, s.kubeletVersion(run.plan), ""); err != nil {
				return err
			}
			if err := s.rke2Restarted(ctx, run); err != nil {
				return err
			}
		}
		if err := s.Kubelet.SetReady(ctx, run.node, true, "KubeletReady"); err != nil {
			return err
		}
	}
	now := metav1.NewTime(s.clock().Now())
	// The kubelet reports the pod failed before the Job controller, counting failed pods
	// against the backoff limit, marks the Job Failed: the pod is there, with the node's
	// words, before anyone sees the Job's failure.
	if failed && run.exit != nil && !run.podLeft {
		if err := s.failedPod(ctx, job, run, now); err != nil {
			return err
		}
		run.podLeft = true
	}
	if err := s.updateJobStatus(ctx, job, func(st *batchv1.JobStatus) {
		st.Active, st.Ready = 0, ptr.To[int32](0)
		if failed {
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
	}); err != nil {
		return err
	}
	run.finished = true
	s.Record.endRun(run.record, now.Time, failed, recordMessage, false)
	if osImage := s.osImage(run.plan); !failed && osImage != "" {
		// The node program installs nothing and arms no reboot on a node that already
		// runs the release's OS (nodeprogram/osupgrade.go: "the node already runs %s:
		// nothing to install, no reboot"): an os-upgrade Job run again after the reboot.
		node := &corev1.Node{}
		if err := s.Client.Get(ctx, client.ObjectKey{Name: run.node}, node); err != nil || node.Status.NodeInfo.OSImage != osImage {
			s.armReboot(run.node, osImage, now.Time)
		}
	}
	return nil
}

func (s *SUC) updateJobStatus(ctx context.Context, job *batchv1.Job, mutate func(*batchv1.JobStatus)) error {
	return updateJobStatus(ctx, s.Client, job, mutate)
}

// updateJobStatus changes the status of job, as the Job controller writes it, on the
// newest copy; a Job deleted and created again under the same name is not job.
func updateJobStatus(ctx context.Context, c client.Client, job *batchv1.Job, mutate func(*batchv1.JobStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		j := &batchv1.Job{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), j); err != nil {
			return err
		}
		if j.UID != job.UID {
			return apierrors.NewNotFound(batchv1.Resource("jobs"), job.Name)
		}
		mutate(&j.Status)
		return c.Status().Update(ctx, j)
	})
}

// rke2Restarted tells Multus, when set, that the run's rke2-upgrade Plan restarted RKE2
// at a new version on a server node: RKE2's deploy controller applies the server
// manifests at start, rke2-multus.yaml among them unless skipped (Multus.RKE2Restarted;
// harvester-release-steps.md facts 9 and 34). An agent node runs no deploy controller,
// and a Plan that does not change the kubelet (the OS upgrade's reboot starts RKE2 at the
// version it had) changes no chart.
func (s *SUC) rke2Restarted(ctx context.Context, run *podRun) error {
	version := s.kubeletVersion(run.plan)
	if s.Multus == nil || version == "" {
		return nil
	}
	node := &corev1.Node{}
	if err := s.Client.Get(ctx, client.ObjectKey{Name: run.node}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !ServerNode(node) {
		return nil
	}
	return s.Multus.RKE2Restarted(ctx, run.node, version)
}

func (s *SUC) kubeletVersion(plan *sucv1.Plan) string {
	if s.KubeletVersion != nil {
		return s.KubeletVersion(plan)
	}
	return DefaultKubeletVersion(plan)
}

func (s *SUC) osImage(plan *sucv1.Plan) string {
	if s.OSImage != nil {
		return s.OSImage(plan)
	}
	return DefaultOSImage(plan)
}

// flagValue is the value after flag in args ("--timeout 5m" or "--timeout=5m").
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}
