package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SUC labels and the Plan condition it sets, as System Upgrade Controller uses them.
const (
	LabelPlan      = "upgrade.cattle.io/plan"
	LabelNode      = "upgrade.cattle.io/node"
	LabelVersion   = "upgrade.cattle.io/version"
	NodePlanPrefix = "plan.upgrade.cattle.io/"
	annotationHash = "sim.inplace.cluster.x-k8s.io/plan-hash"
)

// SUC plays System Upgrade Controller on a workload cluster: for every Plan in Namespace
// it resolves the latest hash, runs a Job on each selected node (at most the Plan's
// concurrency at once, cordoning and taking the node down while the Plan cordons or
// drains), and when the Job succeeds labels the node plan.upgrade.cattle.io/<plan> with
// the hash, as SUC signals completion. A node told to fail gets a failed Job and the
// Plan's Complete condition False with reason JobFailed.
type SUC struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace is where Plans and Jobs live (SUC's namespace, cattle-system on Harvester).
	Namespace string
	// Kubelet reports the nodes going down and coming back.
	Kubelet *Kubelet
	// Record receives every run.
	Record *Record
	// JobDuration is how long each Job runs. Default 200ms.
	JobDuration time.Duration
	// Interval is how often Plans are looked at. Default 50ms.
	Interval time.Duration
	// KubeletVersion returns the kubelet version a node reports after the Plan
	// succeeded on it, or "" for a Plan that does not change it. Default:
	// DefaultKubeletVersion.
	KubeletVersion func(*sucv1.Plan) string
	// OSImage returns the OS image a node reports after the Plan succeeded on it (and
	// rebooted it), or "" for a Plan that does not change it. Default: DefaultOSImage.
	OSImage func(*sucv1.Plan) string

	mu            sync.Mutex
	fails         map[string]string
	labelledFails []labelledFailure
	runs          map[string]int // job name -> index in Record
}

// DefaultKubeletVersion is the Plan's version when its upgrade image is an rke2-upgrade
// image (the RKE2 upgrade restarts the kubelet at that version), else "".
func DefaultKubeletVersion(plan *sucv1.Plan) string {
	if plan.Spec.Upgrade == nil {
		return ""
	}
	repo, _, _ := strings.Cut(plan.Spec.Upgrade.Image, ":")
	if strings.HasSuffix(repo, "rke2-upgrade") {
		return plan.Spec.Version
	}
	return ""
}

// DefaultOSImage is "Harvester <version>" for a Plan that runs the harvester-upgrade
// image's post-drain phase (which installs the OS and reboots), else "".
func DefaultOSImage(plan *sucv1.Plan) string {
	if plan.Spec.Upgrade == nil {
		return ""
	}
	repo, _, _ := strings.Cut(plan.Spec.Upgrade.Image, ":")
	if strings.HasSuffix(repo, "harvester-upgrade") && slices.Contains(plan.Spec.Upgrade.Args, "post-drain") {
		return "Harvester " + plan.Spec.Version
	}
	return ""
}

// FailNode makes the next Job of the named Plan on node fail with message. An empty
// plan fails every Plan's Job on that node.
func (s *SUC) FailNode(plan, node, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails == nil {
		s.fails = map[string]string{}
	}
	s.fails[plan+"/"+node] = message
}

// labelledFailure is a failure told by FailNodeLabelled.
type labelledFailure struct {
	planLabels    labels.Set
	node, message string
}

// FailNodeLabelled makes the Jobs on node of every Plan whose labels include planLabels
// fail with message, as FailNode does for a named Plan. It is for Plans whose names a
// test cannot know in advance, such as names that carry the NodeUpdate they belong to.
func (s *SUC) FailNodeLabelled(planLabels map[string]string, node, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.labelledFails = append(s.labelledFails, labelledFailure{planLabels: labels.Set(planLabels), node: node, message: message})
}

func (s *SUC) failure(plan *sucv1.Plan, node string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.fails[plan.Name+"/"+node]; ok {
		return m, true
	}
	for _, f := range s.labelledFails {
		if f.node == node && labels.SelectorFromSet(f.planLabels).Matches(labels.Set(plan.Labels)) {
			return f.message, true
		}
	}
	m, ok := s.fails["/"+node]
	return m, ok
}

// Run plays SUC until ctx ends. Errors of one pass are returned on ctx's end only if
// every pass failed; a transient API error does not stop the simulator.
func (s *SUC) Run(ctx context.Context) error {
	interval := s.Interval
	if interval == 0 {
		interval = 50 * time.Millisecond
	}
	var lastErr error
	for {
		if err := s.pass(ctx); err != nil && ctx.Err() == nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return lastErr
		case <-time.After(interval):
		}
	}
}

func (s *SUC) pass(ctx context.Context) error {
	plans := &sucv1.PlanList{}
	if err := s.Client.List(ctx, plans, client.InNamespace(s.Namespace)); err != nil {
		return fmt.Errorf("list plans: %w", err)
	}
	nodes := &corev1.NodeList{}
	if err := s.Client.List(ctx, nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for i := range plans.Items {
		if err := s.reconcilePlan(ctx, &plans.Items[i], nodes.Items); err != nil {
			return fmt.Errorf("plan %s: %w", plans.Items[i].Name, err)
		}
	}
	return nil
}

// PlanHash is the hash the simulator resolves for a Plan: a digest of its spec, so a
// changed Plan runs again on every node.
func PlanHash(plan *sucv1.Plan) string {
	data, _ := json.Marshal(plan.Spec)
	sum := sha256.Sum224(data)
	return hex.EncodeToString(sum[:])
}

func (s *SUC) reconcilePlan(ctx context.Context, plan *sucv1.Plan, nodes []corev1.Node) error {
	hash := PlanHash(plan)
	selected, err := selectNodes(plan, nodes)
	if err != nil {
		return err
	}
	jobs := &batchv1.JobList{}
	if err := s.Client.List(ctx, jobs, client.InNamespace(s.Namespace), client.MatchingLabels{LabelPlan: plan.Name}); err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	jobOf := map[string]*batchv1.Job{}
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if j.Annotations[annotationHash] == hash {
			jobOf[j.Labels[LabelNode]] = j
		}
	}

	var applying []string
	var failedMessage string
	done := 0
	for _, node := range selected {
		if node.Labels[NodePlanPrefix+plan.Name] == hash {
			done++
			continue
		}
		job := jobOf[node.Name]
		switch {
		case job == nil:
			continue
		case jobFinished(job, batchv1.JobFailed):
			failedMessage = fmt.Sprintf("Job %s on node %s failed: %s", job.Name, node.Name, jobConditionMessage(job, batchv1.JobFailed))
		case jobFinished(job, batchv1.JobComplete):
			// Completed but the label is not there yet: finishRun labels it next.
			if err := s.labelNode(ctx, node.Name, plan.Name, hash); err != nil {
				return err
			}
		default:
			applying = append(applying, node.Name)
			if time.Since(job.CreationTimestamp.Time) >= s.jobDuration() {
				if err := s.finishRun(ctx, plan, job, node.Name, hash); err != nil {
					return err
				}
			}
		}
	}

	concurrency := int(plan.Spec.Concurrency)
	if concurrency < 1 {
		concurrency = 1
	}
	for _, node := range selected {
		if len(applying) >= concurrency || failedMessage != "" {
			break
		}
		if node.Labels[NodePlanPrefix+plan.Name] == hash || jobOf[node.Name] != nil {
			continue
		}
		if err := s.startRun(ctx, plan, node.Name, hash); err != nil {
			return err
		}
		applying = append(applying, node.Name)
	}

	return s.updatePlanStatus(ctx, plan, hash, applying, failedMessage, done == len(selected) && len(selected) > 0)
}

func (s *SUC) jobDuration() time.Duration {
	if s.JobDuration == 0 {
		return 200 * time.Millisecond
	}
	return s.JobDuration
}

func takesNodeDown(plan *sucv1.Plan) bool {
	return plan.Spec.Cordon || plan.Spec.Drain != nil
}

func (s *SUC) startRun(ctx context.Context, plan *sucv1.Plan, node, hash string) error {
	name := jobName(plan.Name, node, hash)
	image := "simulated"
	if plan.Spec.Upgrade != nil && plan.Spec.Upgrade.Image != "" {
		image = plan.Spec.Upgrade.Image
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: s.Namespace,
			Labels:      map[string]string{LabelPlan: plan.Name, LabelNode: node, LabelVersion: sanitizeLabel(plan.Spec.Version)},
			Annotations: map[string]string{annotationHash: hash},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					NodeName:      node,
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "upgrade", Image: image}},
				},
			},
		},
	}
	if err := s.Client.Create(ctx, job); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("create job %s: %w", name, err)
	}
	s.mu.Lock()
	if s.runs == nil {
		s.runs = map[string]int{}
	}
	s.runs[name] = s.Record.startRun(PlanRun{Plan: plan.Name, Node: node, Hash: hash, Version: plan.Spec.Version, Start: time.Now()})
	s.mu.Unlock()

	if takesNodeDown(plan) {
		if err := s.Kubelet.SetUnschedulable(ctx, node, true); err != nil {
			return err
		}
		if err := s.Kubelet.SetReady(ctx, node, false, "UpgradeInProgress"); err != nil {
			return err
		}
	}
	return nil
}

func (s *SUC) finishRun(ctx context.Context, plan *sucv1.Plan, job *batchv1.Job, node, hash string) error {
	message, fail := s.failure(plan, node)
	if takesNodeDown(plan) {
		if !fail {
			v, osImage := s.kubeletVersion(plan), s.osImage(plan)
			if v != "" || osImage != "" {
				if err := s.Kubelet.SetVersion(ctx, node, v, osImage); err != nil {
					return err
				}
			}
		}
		if err := s.Kubelet.SetReady(ctx, node, true, "KubeletReady"); err != nil {
			return err
		}
	}
	if fail {
		if err := s.setJobFinished(ctx, job, batchv1.JobFailed, "BackoffLimitExceeded", message); err != nil {
			return err
		}
	} else {
		if err := s.labelNode(ctx, node, plan.Name, hash); err != nil {
			return err
		}
		if takesNodeDown(plan) {
			// SUC uncordons a node after success when the Plan cordoned or drained it.
			if err := s.Kubelet.SetUnschedulable(ctx, node, false); err != nil {
				return err
			}
		}
		if err := s.setJobFinished(ctx, job, batchv1.JobComplete, "", ""); err != nil {
			return err
		}
	}
	s.mu.Lock()
	if i, ok := s.runs[job.Name]; ok {
		s.Record.endRun(i, time.Now(), fail, message)
		delete(s.runs, job.Name)
	}
	s.mu.Unlock()
	return nil
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

func (s *SUC) labelNode(ctx context.Context, node, plan, hash string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := &corev1.Node{}
		if err := s.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return err
		}
		if n.Labels[NodePlanPrefix+plan] == hash {
			return nil
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[NodePlanPrefix+plan] = hash
		return s.Client.Update(ctx, n)
	})
}

// setJobFinished writes a terminal Job status the way the Job controller does: the
// interim condition (SuccessCriteriaMet or FailureTarget) and the terminal one.
func (s *SUC) setJobFinished(ctx context.Context, job *batchv1.Job, condition batchv1.JobConditionType, reason, message string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		j := &batchv1.Job{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(job), j); err != nil {
			return err
		}
		now := metav1.Now()
		start := j.CreationTimestamp
		j.Status.StartTime = &start
		if condition == batchv1.JobComplete {
			j.Status.Succeeded = 1
			j.Status.CompletionTime = &now
			j.Status.Conditions = append(j.Status.Conditions,
				batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: now, LastTransitionTime: now},
				batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: now, LastTransitionTime: now})
		} else {
			j.Status.Failed = 1
			j.Status.Conditions = append(j.Status.Conditions,
				batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastProbeTime: now, LastTransitionTime: now},
				batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastProbeTime: now, LastTransitionTime: now})
		}
		return s.Client.Status().Update(ctx, j)
	})
}

func (s *SUC) updatePlanStatus(ctx context.Context, plan *sucv1.Plan, hash string, applying []string, failedMessage string, complete bool) error {
	sort.Strings(applying)
	want := plan.DeepCopy()
	want.Status.LatestHash = hash
	want.Status.LatestVersion = plan.Spec.Version
	want.Status.Applying = applying
	setPlanCondition(&want.Status, "LatestResolved", corev1.ConditionTrue, "Version", "")
	switch {
	case failedMessage != "":
		setPlanCondition(&want.Status, "Complete", corev1.ConditionFalse, "JobFailed", failedMessage)
	case complete:
		setPlanCondition(&want.Status, "Complete", corev1.ConditionTrue, "", "")
	default:
		setPlanCondition(&want.Status, "Complete", corev1.ConditionUnknown, "", "")
	}
	if equalStatus(plan.Status, want.Status) {
		return nil
	}
	if err := s.Client.Status().Update(ctx, want); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update status: %w", err)
	}
	return nil
}

func equalStatus(a, b sucv1.PlanStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func setPlanCondition(st *sucv1.PlanStatus, typ string, status corev1.ConditionStatus, reason, message string) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == typ {
			c := &st.Conditions[i]
			if c.Status != status || c.Reason != reason || c.Message != message {
				c.Status, c.Reason, c.Message = status, reason, message
				c.LastUpdateTime = time.Now().UTC().Format(time.RFC3339)
			}
			return
		}
	}
	st.Conditions = append(st.Conditions, genericcondition.GenericCondition{
		Type: typ, Status: status, Reason: reason, Message: message, LastUpdateTime: time.Now().UTC().Format(time.RFC3339),
	})
}

func selectNodes(plan *sucv1.Plan, nodes []corev1.Node) ([]corev1.Node, error) {
	if plan.Spec.NodeSelector == nil {
		return nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(plan.Spec.NodeSelector)
	if err != nil {
		return nil, fmt.Errorf("node selector: %w", err)
	}
	var out []corev1.Node
	for _, n := range nodes {
		if sel.Matches(labels.Set(n.Labels)) {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func jobFinished(job *batchv1.Job, condition batchv1.JobConditionType) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == condition && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func jobConditionMessage(job *batchv1.Job, condition batchv1.JobConditionType) string {
	for _, c := range job.Status.Conditions {
		if c.Type == condition {
			return strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return ""
}

func jobName(plan, node, hash string) string {
	name := fmt.Sprintf("apply-%s-on-%s-with-%s", plan, node, hash[:8])
	if len(name) > 63 {
		sum := sha256.Sum256([]byte(name))
		name = name[:54] + "-" + hex.EncodeToString(sum[:])[:8]
	}
	return strings.TrimRight(name, "-.")
}

func sanitizeLabel(v string) string {
	v = strings.NewReplacer("+", "-").Replace(v)
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "-_.")
}
