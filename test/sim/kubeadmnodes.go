package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater/kubeadmupdater"
)

// KubeadmNodes plays, for the KubeadmUpdater's node Jobs, what a kubeadm cluster's nodes
// and its Job controller do: for each Job it runs the node program's own subcommand
// (`capi-inplace node kubeadm fetch|upgrade|kubelet`, nodeprogram.Main, the code the
// Job's container runs) on a fake root of the Job's node, whose kubeadm, kubelet,
// systemctl and uname are recording stand-ins; it ends the Job as the Job controller does
// and, on a failure, leaves the pod with the node program's termination message as the
// kubelet does; and on the kubelet's restart it makes the workload Node go NotReady and
// come back Ready reporting the kubelet binary now installed.
//
// A pod whose exit the Job's podFailurePolicy does not list (the node program's 3, "not
// done yet") is counted against the Job's backoffLimit and, below it, the Job controller
// starts another pod after a back-off that doubles with each failure (kubernetes v1.36.3
// pkg/controller/job: DefaultJobPodFailureBackOff 10 s, MaxJobPodFailureBackOff 10 min,
// backoff_utils.go getRemainingTimeForFailuresCount; the Job fails with
// BackoffLimitExceeded once status.failed is above spec.backoffLimit). The simulator runs
// the node program again on the same root, leftovers of the failed run included, each
// failed pod left as the kubelet leaves it; the back-off is compressed to RetryBackoff.
//
// The binaries come from the `url` source: Binaries serves each version's fake kubeadm,
// kubelet and kubectl, whose SHA-256 the KubeadmUpdater names (Checksums), so the node
// program's download and checksum check run as they do on a node.
type KubeadmNodes struct {
	jobs      client.Client
	namespace string
	nuNS      string
	mgmt      client.Client
	scheme    *runtime.Scheme
	nodes     Nodes
	hold      time.Duration
	logf      func(format string, args ...any)

	binaries *httptest.Server
	root     string
	cancel   context.CancelFunc
	done     chan struct{}

	mu        sync.Mutex
	hosts     map[string]*kubeadmHost // by namespace/cluster/node
	workloads map[string]workload     // by namespace/cluster
	handled   map[types.UID]*kubeadmJob
	runs      []KubeadmRun
	failures  map[string]string // node -> the command line prefix that fails
	// brokenDownloads is how many binary downloads are still to be answered 503
	// (FailDownloads).
	brokenDownloads int
	retryBackoff    time.Duration
	restarts        sync.WaitGroup
}

// KubeadmRun is one pod of a node Job the simulator ran: its node (and Cluster), step,
// the node program's arguments, the host commands it ran in order, its exit code and
// termination message.
type KubeadmRun struct {
	Namespace, Cluster, Node, Step, Job string
	NodeUpdate                          string
	// Attempt counts the Job's pods: 1 for its first, 2 for the one the Job controller
	// started after the first failed, and so on.
	Attempt    int
	Args       []string
	Commands   []string
	Exit       int
	Message    string
	Start, End time.Time
}

// kubeadmJob is what the simulated Job controller keeps of a Job: its failed pods, when
// it may start the next one, and whether the Job has ended.
type kubeadmJob struct {
	failed int
	next   time.Time
	ended  bool
}

type workload struct {
	client     client.Client
	kubeconfig []byte
}

// KubeadmNodesOptions say where the Jobs are and how to reach the nodes.
type KubeadmNodesOptions struct {
	// Jobs is the client of the API server the KubeadmUpdater's Jobs are created in, and
	// Namespace their namespace there (the KubeadmUpdater's spec.namespace).
	Jobs      client.Client
	Namespace string
	// NodeUpdateNamespace, when set, limits the simulator to the Jobs of the NodeUpdates
	// of that namespace (the Clusters of one spec).
	NodeUpdateNamespace string
	// Management reads the NodeUpdates and the Clusters' kubeconfig Secrets.
	Management client.Client
	Scheme     *runtime.Scheme
	// Nodes play the workload Nodes' readiness and version (capienv.WorkloadNodes).
	Nodes Nodes
	// Hold is how long a restarted kubelet takes to report Ready again.
	Hold time.Duration
	// RetryBackoff is the Job controller's back-off before the pod that follows a
	// failed one, doubled for each further failure (the real one starts at 10 s).
	// Default 100ms.
	RetryBackoff time.Duration
	Logf         func(format string, args ...any)
}

// RunKubeadmNodes starts the simulator; Stop ends it.
func RunKubeadmNodes(ctx context.Context, o KubeadmNodesOptions) (*KubeadmNodes, error) {
	root, err := os.MkdirTemp("", "capi-inplace-kubeadm-hosts-")
	if err != nil {
		return nil, err
	}
	s := &KubeadmNodes{jobs: o.Jobs, namespace: o.Namespace, nuNS: o.NodeUpdateNamespace, mgmt: o.Management, scheme: o.Scheme, nodes: o.Nodes, hold: o.Hold, logf: o.Logf,
		root: root, hosts: map[string]*kubeadmHost{}, workloads: map[string]workload{}, handled: map[types.UID]*kubeadmJob{}, failures: map[string]string{}, done: make(chan struct{}),
		retryBackoff: o.RetryBackoff}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if s.retryBackoff <= 0 {
		s.retryBackoff = 100 * time.Millisecond
	}
	s.binaries = httptest.NewServer(http.HandlerFunc(s.serveFakeBinary))
	ctx, s.cancel = context.WithCancel(ctx)
	go s.loop(ctx)
	return s, nil
}

// Stop ends the simulator and removes the fake hosts.
func (s *KubeadmNodes) Stop() {
	s.cancel()
	<-s.done
	s.restarts.Wait()
	s.binaries.Close()
	_ = os.RemoveAll(s.root)
}

// URLTemplate is the KubeadmUpdater's spec.source.url.template that downloads the fake
// binaries from the simulator.
func (s *KubeadmNodes) URLTemplate() string {
	return s.binaries.URL + "/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"
}

// Checksums are the SHA-256 of the fake binaries of version, for spec.source.url.sha256.
func Checksums(version string) inplacev1.KubeadmChecksums {
	sum := func(name string) string {
		h := sha256.Sum256([]byte(FakeKubeBinary(name, version)))
		return hex.EncodeToString(h[:])
	}
	return inplacev1.KubeadmChecksums{Kubeadm: sum("kubeadm"), Kubelet: sum("kubelet"), Kubectl: sum("kubectl")}
}

// FakeKubeBinary is the content of a fake Kubernetes binary: its name and version, which
// the stand-ins report as `kubeadm version -o short` and `kubelet --version` do.
func FakeKubeBinary(name, version string) string { return "fake " + name + " " + version + "\n" }

// serveFakeBinary serves /release/<version>/bin/linux/<arch>/<binary> in dl.k8s.io's
// layout (kubernetes.io/releases/download/); while downloads are broken (FailDownloads)
// it answers 503 Service Unavailable, as a mirror that is down does.
func (s *KubeadmNodes) serveFakeBinary(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if len(parts) != 6 || parts[0] != "release" || !slices.Contains([]string{"kubeadm", "kubelet", "kubectl"}, parts[5]) {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	broken := s.brokenDownloads > 0
	if broken {
		s.brokenDownloads--
	}
	s.mu.Unlock()
	if broken {
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, FakeKubeBinary(parts[5], parts[1]))
}

// FailDownloads makes the next n binary downloads, from any node, fail with 503 Service
// Unavailable: the node program's fetch says "not done yet" (exit 3) and its Job runs
// it again.
func (s *KubeadmNodes) FailDownloads(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.brokenDownloads = n
}

// FailCommand makes every later host command of node that starts with prefix (such as
// "kubeadm upgrade") fail with exit code 1 and stderr as its words.
func (s *KubeadmNodes) FailCommand(node, prefix, stderr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[node] = prefix + "\x00" + stderr
}

// Runs are the Jobs' pods run so far, in the order they ended.
func (s *KubeadmNodes) Runs() []KubeadmRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.runs)
}

func (s *KubeadmNodes) loop(ctx context.Context) {
	defer close(s.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		jobs := &batchv1.JobList{}
		if err := s.jobs.List(ctx, jobs, client.InNamespace(s.namespace), client.HasLabels{kubeadmupdater.NodeUpdateUIDLabel}); err != nil {
			continue
		}
		for i := range jobs.Items {
			job := &jobs.Items[i]
			if s.nuNS != "" && !strings.HasPrefix(job.Annotations[kubeadmupdater.NodeUpdateAnnotation], s.nuNS+"/") {
				continue
			}
			s.mu.Lock()
			state := s.handled[job.UID]
			if state == nil {
				state = &kubeadmJob{}
				s.handled[job.UID] = state
			}
			due := !state.ended && !time.Now().Before(state.next)
			s.mu.Unlock()
			if !due || !job.DeletionTimestamp.IsZero() {
				continue
			}
			if err := s.run(ctx, job, state); err != nil && ctx.Err() == nil {
				s.logf("kubeadm node sim: job %s: %v\n", job.Name, err) // tried again on the next pass
			}
		}
	}
}

// run runs one pod of a Job on its node and writes what the Job controller makes of it:
// the Job's end, or a failure counted and the next pod's back-off.
func (s *KubeadmNodes) run(ctx context.Context, job *batchv1.Job, state *kubeadmJob) error {
	ref := strings.SplitN(job.Annotations[kubeadmupdater.NodeUpdateAnnotation], "/", 2)
	if len(ref) != 2 {
		return fmt.Errorf("no NodeUpdate annotation")
	}
	nu := &inplacev1.NodeUpdate{}
	if err := s.mgmt.Get(ctx, client.ObjectKey{Namespace: ref[0], Name: ref[1]}, nu); err != nil {
		return fmt.Errorf("read NodeUpdate %s: %w", ref, err)
	}
	wl, err := s.workload(ctx, nu.Namespace, nu.Spec.ClusterName)
	if err != nil {
		return err
	}
	podSpec := job.Spec.Template.Spec
	node := podSpec.NodeName
	if len(podSpec.Containers) != 1 || len(podSpec.Containers[0].Args) < 2 || podSpec.Containers[0].Args[0] != "node" {
		return fmt.Errorf("not a node program Job: %v", podSpec.Containers)
	}
	if err := s.markStaticPods(ctx, wl.client, node); err != nil {
		return err
	}
	host, err := s.host(ctx, nu, wl, node)
	if err != nil {
		return err
	}
	args := podSpec.Containers[0].Args[1:]
	termination := filepath.Join(host.root, "termination-log")
	_ = os.Remove(termination)
	host.begin(nu)
	var stdout, stderr bytes.Buffer
	start := time.Now()
	// The node program itself, as the Job's container runs it (main.go: `capi-inplace
	// node <args>`), its termination message written where the kubelet reads it.
	code := nodeprogram.Main(ctx, append([]string{"--termination-log", termination}, args...), &nodeprogram.Env{
		Host: host, Stdout: &stdout, Stderr: &stderr, Identity: job.Name + "-sim",
	})
	message, _ := os.ReadFile(termination)
	end := time.Now()
	s.mu.Lock()
	attempt := state.failed + 1
	s.runs = append(s.runs, KubeadmRun{Namespace: nu.Namespace, Cluster: nu.Spec.ClusterName, Node: node, Step: job.Labels[kubeadmupdater.StepLabel], Job: job.Name,
		NodeUpdate: nu.Name, Attempt: attempt, Args: args, Commands: host.end(), Exit: code, Message: string(message), Start: start, End: end})
	// The pod has run: whatever happens to the writes below, it is not run again but by
	// the Job controller's rule.
	if code == nodeprogram.ExitOK || code == nodeprogram.ExitFailed || code == nodeprogram.ExitUsage || attempt > backoffLimit(job) {
		state.ended = true
	} else {
		state.failed = attempt
		state.next = end.Add(podFailureBackoff(s.retryBackoff, attempt))
	}
	s.mu.Unlock()
	s.logf("kubeadm node sim: %s ran `node %s` (pod %d of its Job): exit %d: %s\n", node, strings.Join(args[:min(2, len(args))], " "), attempt, code, strings.TrimSpace(string(message)))

	now := metav1.Now()
	started := metav1.NewTime(start)
	if code != nodeprogram.ExitOK {
		// The kubelet reports the pod Failed with the container's termination message
		// (kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go,
		// getTerminationMessage). The pod goes where the KubeadmUpdater reads the Job's pods:
		// the workload cluster (CAPD's in-memory server has no status subresource: the pod is
		// written whole).
		exit := &containerExit{container: kubeadmupdater.ContainerName, code: int32(code), termination: string(message), log: stderr.String()}
		pod := failedPod(job, node, exit, started, now)
		if err := retry.OnError(retry.DefaultBackoff, s.transient(ctx), func() error { return wl.client.Create(ctx, pod) }); err != nil {
			return fmt.Errorf("leave the failed pod of job %s: %w", job.Name, err)
		}
	}
	// The pod ran: its outcome is written until it is, never by running it again.
	return retry.OnError(retry.DefaultBackoff, s.transient(ctx), func() error {
		current := &batchv1.Job{}
		if err := s.jobs.Get(ctx, client.ObjectKeyFromObject(job), current); err != nil {
			return err
		}
		jobAfterPod(current, code, attempt, started, now)
		return s.jobs.Status().Update(ctx, current)
	})
}

// transient says which errors of a write the simulator tries again: all but a gone
// object (the Job deleted meanwhile) and an ended test.
func (s *KubeadmNodes) transient(ctx context.Context) func(error) bool {
	return func(err error) bool { return !apierrors.IsNotFound(err) && ctx.Err() == nil }
}

// podFailureBackoff is the Job controller's wait before the pod that follows the
// failures-th failed one: base doubled for each failure after the first, at most 60 times
// base (kubernetes v1.36.3 backoff_utils.go getRemainingTimeForFailuresCount, with
// DefaultJobPodFailureBackOff 10 s and MaxJobPodFailureBackOff 10 min).
func podFailureBackoff(base time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < 60*base; i++ {
		d *= 2
	}
	return min(d, 60*base)
}

// backoffLimit is the Job's spec.backoffLimit, 6 when unset (the API server's default).
func backoffLimit(job *batchv1.Job) int {
	if job.Spec.BackoffLimit == nil {
		return 6
	}
	return int(*job.Spec.BackoffLimit)
}

// jobAfterPod writes what the Job controller makes of the Job's pod number attempt
// (kubernetes v1.36 pkg/controller/job/job_controller.go): a pod that succeeded
// completes the Job (SuccessCriteriaMet, then Complete, with the completion time); a pod
// whose container exited with a code the podFailurePolicy's FailJob rule lists fails it
// at once (FailureTarget, then Failed, reason PodFailurePolicy, the message of
// pkg/controller/job/pod_failure_policy.go). An exit the rule does not list (3: run
// again) is counted in status.failed; the Job fails with BackoffLimitExceeded once that
// count is above spec.backoffLimit, and otherwise stays without a condition, no pod
// active, until its next pod starts.
func jobAfterPod(job *batchv1.Job, code, attempt int, started, now metav1.Time) {
	if job.Status.StartTime == nil {
		job.Status.StartTime = &started
	}
	cond := func(t batchv1.JobConditionType, reason, msg string) batchv1.JobCondition {
		return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastProbeTime: now, LastTransitionTime: now}
	}
	if code == nodeprogram.ExitOK {
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &now
		job.Status.Conditions = append(job.Status.Conditions,
			cond(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods"),
			cond(batchv1.JobComplete, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods"))
		return
	}
	job.Status.Failed = int32(attempt)
	job.Status.Active = 0
	reason := batchv1.JobReasonPodFailurePolicy
	msg := fmt.Sprintf("Container %s for pod %s/%s failed with exit code %d matching FailJob rule at index 0", kubeadmupdater.ContainerName, job.Namespace, job.Name, code)
	if code != nodeprogram.ExitFailed && code != nodeprogram.ExitUsage {
		if attempt <= backoffLimit(job) {
			return // the next pod comes after the back-off
		}
		reason, msg = batchv1.JobReasonBackoffLimitExceeded, backoffLimitMessage
	}
	job.Status.Conditions = append(job.Status.Conditions,
		cond(batchv1.JobFailureTarget, reason, msg), cond(batchv1.JobFailed, reason, msg))
}

// workload returns a client of the Cluster's workload API server and its kubeconfig,
// from the kubeconfig Secret Cluster API keeps.
func (s *KubeadmNodes) workload(ctx context.Context, namespace, cluster string) (workload, error) {
	key := namespace + "/" + cluster
	s.mu.Lock()
	w, ok := s.workloads[key]
	s.mu.Unlock()
	if ok {
		return w, nil
	}
	secret := &corev1.Secret{}
	if err := s.mgmt.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster + "-kubeconfig"}, secret); err != nil {
		return workload{}, fmt.Errorf("read the kubeconfig of %s: %w", key, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
	if err != nil {
		return workload{}, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s.scheme})
	if err != nil {
		return workload{}, err
	}
	w = workload{client: c, kubeconfig: secret.Data["value"]}
	s.mu.Lock()
	s.workloads[key] = w
	s.mu.Unlock()
	return w, nil
}

// mirrorAnnotation is what the kubelet sets on the API server's copy of each static pod
// it runs (kubernetes pkg/kubelet/pod/mirror_client.go, CreateMirrorPod, and
// pkg/kubelet/types ConfigMirrorAnnotationKey): kubectl drain leaves such pods, and so
// does the KubeadmUpdater's drain. CAPD's in-memory backend creates the control plane's
// static pods (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) without it;
// the simulator, playing the node's kubelet, adds it.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// markStaticPods marks the control plane pods of node as the mirror pods they stand for.
func (s *KubeadmNodes) markStaticPods(ctx context.Context, wc client.Client, node string) error {
	pods := &corev1.PodList{}
	if err := wc.List(ctx, pods, client.InNamespace(metav1.NamespaceSystem), client.MatchingFields{"spec.nodeName": node}); err != nil {
		return fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Labels["tier"] != "control-plane" || p.Annotations[mirrorAnnotation] != "" {
			continue
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[mirrorAnnotation] = "static-" + p.Name
		if err := wc.Update(ctx, p); err != nil {
			return fmt.Errorf("mark static pod %s as a mirror pod: %w", p.Name, err)
		}
	}
	return nil
}

// host returns the fake root of node, made on first use at what the workload Node
// reports: kubeadm, kubelet and kubectl of its kubelet version in /usr/bin and, on a
// control plane node, /etc/kubernetes/admin.conf (kubeadm writes it at init and join),
// here the Cluster's kubeconfig.
func (s *KubeadmNodes) host(ctx context.Context, nu *inplacev1.NodeUpdate, wl workload, node string) (*kubeadmHost, error) {
	key := nu.Namespace + "/" + nu.Spec.ClusterName + "/" + node
	s.mu.Lock()
	h, ok := s.hosts[key]
	s.mu.Unlock()
	if ok {
		return h, nil
	}
	n := &corev1.Node{}
	if err := wl.client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return nil, fmt.Errorf("read workload Node %s: %w", node, err)
	}
	h = &kubeadmHost{sim: s, node: node, workload: wl.client, root: filepath.Join(s.root, nu.Namespace, nu.Spec.ClusterName, node), active: true}
	for _, b := range []string{"kubeadm", "kubelet", "kubectl"} {
		if err := h.write("/usr/bin/"+b, FakeKubeBinary(b, n.Status.NodeInfo.KubeletVersion)); err != nil {
			return nil, err
		}
	}
	if _, cp := n.Labels[kubeadmupdater.ControlPlaneLabel]; cp {
		if err := h.write("/etc/kubernetes/admin.conf", string(wl.kubeconfig)); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	s.hosts[key] = h
	s.mu.Unlock()
	return h, nil
}

// kubeadmHost is one node's root: a directory, and the stand-ins of its tools.
type kubeadmHost struct {
	sim      *KubeadmNodes
	node     string
	workload client.Client
	root     string

	mu     sync.Mutex
	nu     *inplacev1.NodeUpdate
	calls  []string
	active bool
}

var _ nodeprogram.Host = &kubeadmHost{}

func (h *kubeadmHost) begin(nu *inplacev1.NodeUpdate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nu, h.calls = nu, nil
}

func (h *kubeadmHost) end() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

func (h *kubeadmHost) write(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(h.Path(p)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(h.Path(p), []byte(content), 0o755)
}

// version is the version the fake binary at host path p holds.
func (h *kubeadmHost) version(p string) string {
	data, err := os.ReadFile(h.Path(p))
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(data))
	return fields[len(fields)-1]
}

func (h *kubeadmHost) Path(p string) string { return filepath.Join(h.root, p) }

// hostExit is a host command's non-zero exit as nodeprogram.ChrootHost reports it.
type hostExit struct{ code int }

func (e hostExit) Error() string { return fmt.Sprintf("exit status %d", e.code) }
func (e hostExit) ExitCode() int { return e.code }

func failed(c nodeprogram.Command, stderr string) error {
	return fmt.Errorf("host command `%s`: %w: %s", c, hostExit{code: 1}, stderr)
}

// Run records the command and runs its stand-in.
func (h *kubeadmHost) Run(ctx context.Context, c nodeprogram.Command) ([]byte, error) {
	h.mu.Lock()
	h.calls = append(h.calls, c.String())
	h.mu.Unlock()
	h.sim.mu.Lock()
	failure := h.sim.failures[h.node]
	h.sim.mu.Unlock()
	if prefix, stderr, ok := strings.Cut(failure, "\x00"); ok && strings.HasPrefix(strings.TrimPrefix(c.String(), "/usr/bin/"), prefix) {
		return nil, failed(c, stderr)
	}
	switch filepath.Base(c.Name) {
	case "uname":
		return []byte("x86_64\n"), nil
	case "kubeadm":
		return h.kubeadm(ctx, c)
	case "kubelet":
		return []byte("Kubernetes " + h.version("/usr/bin/kubelet") + "\n"), nil
	case "systemctl":
		return h.systemctl(ctx, c)
	}
	return nil, fmt.Errorf("host command `%s`: exit status 127: %s: command not found", c, c.Name)
}

// kubeadm stands in for kubeadm: `version -o short` prints the installed binary's
// version; `upgrade apply <v> --yes` refuses a version other than its own (kubeadm's
// "Specified version to upgrade to ... is higher than the kubeadm version") and, as its
// upload-config phase does (cmd/kubeadm/app/phases/uploadconfig/uploadconfig.go), writes
// the version into the ClusterConfiguration of kube-system/kubeadm-config; `upgrade node`
// upgrades this node only and writes nothing of the cluster's.
func (h *kubeadmHost) kubeadm(ctx context.Context, c nodeprogram.Command) ([]byte, error) {
	version := h.version("/usr/bin/kubeadm")
	switch {
	case slices.Equal(c.Args, []string{"version", "-o", "short"}):
		return []byte(version + "\n"), nil
	case len(c.Args) >= 3 && c.Args[0] == "upgrade" && c.Args[1] == "apply":
		if !slices.Contains(c.Args, "--yes") {
			return nil, failed(c, "won't proceed; the user didn't answer (Y|n) in order to continue")
		}
		if c.Args[2] != version {
			return nil, failed(c, fmt.Sprintf("Specified version to upgrade to %q is higher than the kubeadm version %q", c.Args[2], version))
		}
		if err := h.uploadConfig(ctx, version); err != nil {
			return nil, failed(c, err.Error())
		}
		return []byte("[upgrade/successful] SUCCESS! Your cluster was upgraded to \"" + version + "\". Enjoy!\n"), nil
	case len(c.Args) >= 2 && c.Args[0] == "upgrade" && c.Args[1] == "node":
		return []byte("[upgrade] The configuration for this node was successfully upgraded!\n"), nil
	}
	return nil, failed(c, "unknown command")
}

func (h *kubeadmHost) uploadConfig(ctx context.Context, version string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm := &corev1.ConfigMap{}
		if err := h.workload.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"}, cm); err != nil {
			return err
		}
		doc := map[string]any{}
		if err := yaml.Unmarshal([]byte(cm.Data["ClusterConfiguration"]), &doc); err != nil {
			return err
		}
		doc["kubernetesVersion"] = version
		out, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		cm.Data["ClusterConfiguration"] = string(out)
		return h.workload.Update(ctx, cm)
	})
}

// systemctl stands in for systemctl: daemon-reload; is-active reports the unit; restart
// restarts the kubelet: the Node goes NotReady at once and, after the simulator's hold,
// reports Ready and the version of the kubelet binary it was restarted with (the kubelet
// posts its version in node status at start, kubernetes pkg/kubelet/nodestatus/setters.go
// VersionInfo). systemctl in a chroot ignores a request without SYSTEMD_OFFLINE=0.
func (h *kubeadmHost) systemctl(ctx context.Context, c nodeprogram.Command) ([]byte, error) {
	if !slices.Contains(c.Env, "SYSTEMD_OFFLINE=0") {
		return nil, failed(c, "Running in chroot, ignoring request.")
	}
	switch {
	case slices.Equal(c.Args, []string{"daemon-reload"}):
		return nil, nil
	case len(c.Args) == 3 && c.Args[0] == "is-active":
		h.mu.Lock()
		active := h.active
		h.mu.Unlock()
		if !active {
			return nil, fmt.Errorf("host command `%s`: %w", c, hostExit{code: 3})
		}
		return nil, nil
	case len(c.Args) == 2 && c.Args[0] == "restart":
		h.mu.Lock()
		nu := h.nu
		h.mu.Unlock()
		if err := h.sim.nodes.SetReady(ctx, nu, false); err != nil {
			return nil, failed(c, err.Error())
		}
		running := h.version("/usr/bin/kubelet")
		h.sim.restarts.Add(1)
		go func() {
			defer h.sim.restarts.Done()
			time.Sleep(h.sim.hold)
			bg := context.WithoutCancel(ctx)
			if running == nu.Spec.Version {
				if err := h.sim.nodes.Upgraded(bg, nu); err != nil {
					h.sim.logf("kubeadm node sim: %s: report kubelet %s: %v\n", h.node, running, err)
				}
			}
			if err := h.sim.nodes.SetReady(bg, nu, true); err != nil {
				h.sim.logf("kubeadm node sim: %s: report Ready: %v\n", h.node, err)
			}
		}()
		return nil, nil
	}
	return nil, failed(c, "unknown command")
}

func (h *kubeadmHost) LoopMount(string, string, string) error {
	return errors.New("no loop devices on a kubeadm node")
}
func (h *kubeadmHost) BindMount(string, string) error {
	return errors.New("no bind mounts on a kubeadm node")
}
func (h *kubeadmHost) Unmount(string) error         { return errors.New("nothing mounted") }
func (h *kubeadmHost) Mounted(string) (bool, error) { return false, nil }

// KubeadmUpgrades are the `kubeadm upgrade ...` command lines each node of a Cluster ran,
// by node, in order.
func (s *KubeadmNodes) KubeadmUpgrades(namespace, cluster string) map[string][]string {
	out := map[string][]string{}
	for _, r := range s.Runs() {
		if r.Namespace != namespace || r.Cluster != cluster {
			continue
		}
		for _, c := range r.Commands {
			if strings.HasPrefix(strings.TrimPrefix(c, "/usr/bin/"), "kubeadm upgrade") {
				out[r.Node] = append(out[r.Node], strings.TrimPrefix(c, "/usr/bin/"))
			}
		}
	}
	return out
}
