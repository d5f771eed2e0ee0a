package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	"github.com/rancher/wrangler/v3/pkg/genericcondition"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/nodeprogram"
)

// SUC plays System Upgrade Controller (rancher/system-upgrade-controller@f1362a3) on a
// workload cluster, as shared/facts/suc.md describes it, together with what the cluster
// does with the Jobs it creates (the Job controller, the pod, kubectl drain, the kubelet):
// see jobrunner.go. For each Plan in Namespace it resolves the latest version and hash as
// SUC does (version, service account, digest paths and Secrets only), selects nodes, and
// creates each node's Job exactly as SUC builds it on the API server, so that the API
// server rejects what it would reject on a real cluster. It labels a node
// plan.upgrade.cattle.io/<plan> when its Job completes, uncordons as SUC does, marks the
// Plan JobFailed when a Job fails, deletes finished Jobs after their TTL and re-creates a
// failed one only when the Plan object changes.
//
// Time (Job deadlines, TTLs, how long a Job's work takes) runs on Clock, so a test can
// use a fake or fast clock; the simulator itself looks at the cluster every Interval of
// real time.
type SUC struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace is where Plans and Jobs live (SUC's namespace, cattle-system on Harvester).
	Namespace string
	// Name is the controller's name, written into every Job's upgrade.cattle.io/controller
	// label (fact 2). Default system-upgrade-controller.
	Name string
	// Settings are the Job defaults SUC reads from its environment. Default
	// DefaultJobSettings (SUC's code defaults, fact 4).
	Settings *JobSettings
	// Kubelet reports the nodes going down and coming back.
	Kubelet *Kubelet
	// Record receives every run.
	Record *Record
	// Clock is the time Jobs run on. Default the real clock.
	Clock clock.PassiveClock
	// JobDuration is how long the work of each Job's upgrade container takes on Clock.
	// Default 200ms.
	JobDuration time.Duration
	// Work, when set, says how long the upgrade container of a Job of plan takes on Clock
	// instead of JobDuration (an OS install takes longer than a preload).
	Work func(plan *sucv1.Plan) time.Duration
	// DrainDuration is how long kubectl drain takes to evict the node's pods on Clock; a
	// drain whose --timeout is shorter fails. Default 1s.
	DrainDuration time.Duration
	// ImageExists says whether a registry serves an image reference. Default
	// DefaultImageExists.
	ImageExists func(image string) bool
	// Interval is how often the cluster is looked at, in real time. Default 50ms.
	Interval time.Duration
	// Cache, when set, makes the simulator read and react as SUC does: from informers,
	// its handlers running on their events (shared/facts/suc.md, fact 50). The Plan
	// handlers see the Plans and select among the Nodes of the informers' caches and read
	// Secrets from them (SUC's handle_upgrade.go reads secrets.Cache() and nodes.Cache()),
	// and the job handler sees the Jobs of the cache and reads their Nodes from it
	// (handle_batch.go); the job handler's Plan, and the Jobs the apply compares, are read
	// from the API server, as SUC reads them. The Job controller and the kubelet act on
	// the cache's Jobs. So besides every Interval a pass runs as soon as a Plan or a Job
	// of Namespace or a Node changes, and when a running pod's work ends. The cache must
	// be started by the caller and serve Plans, Jobs, Nodes and Secrets. Without it the
	// simulator lists everything from the API server on every pass and only polls, which
	// adds up to an Interval to every hand-over.
	Cache ctrlcache.Cache
	// KubeletVersion returns the kubelet version a node reports after the Plan
	// succeeded on it, or "" for a Plan that does not change it. Default:
	// DefaultKubeletVersion.
	KubeletVersion func(*sucv1.Plan) string
	// OSImage returns the OS image a node reports after the Plan succeeded on it (and
	// rebooted it), or "" for a Plan that does not change it. Default: DefaultOSImage.
	OSImage func(*sucv1.Plan) string
	// RebootDelay is how long, on Clock, after an os-upgrade Job's pod ended the node's
	// host reboots: the node program arms the reboot on the host (systemd-run
	// --on-active, its --reboot-delay, a minute by default; Harvester's unit reboots 10 s
	// after its container exited) and exits, so that the Job completes and SUC labels the
	// node before the node goes down (harvester-node-upgrade.md fact 28: "the Job
	// therefore completes before the reboot"). Scaled down for tests. Default 300ms.
	RebootDelay time.Duration
	// RestartDuration is how long a node is NotReady while the node program's
	// rke2-restart restarts its RKE2 service. Default 100ms.
	RestartDuration time.Duration
	// RebootDuration is how long, on Clock, a rebooting node is down before its kubelet
	// reports Ready again on the new boot. Default 200ms.
	RebootDuration time.Duration
	// NoJobs, when set, says for which Plans the controller makes no Job at all, though
	// it runs: what operators report of a SUC that validates nothing wrong and never
	// creates the Plan's Jobs (rancher/system-upgrade-controller#217; rancher/rancher#44221,
	// SUC stuck at "Starting upgrade.cattle.io/v1, Kind=Plan controller").
	NoJobs func(plan *sucv1.Plan) bool
	// Multus, when set, plays RKE2's deploy controller and helm-controller for the
	// rke2-multus chart on the server nodes (see Multus): told when an rke2-upgrade Plan
	// restarted RKE2 at a new version on a server node (finishPod), and when a Job removed
	// the node's rke2-multus.yaml.skip while RKE2 runs (playHost).
	Multus *Multus
	// Repository, when set, answers for the release repository a Job's node program
	// reads (its --repository-url): a pod whose work ends while the repository does not
	// serve fails with the node program's "not done yet" (exit 3, nodeprogram fetch), and
	// the Job controller starts it again with back-off (10 s, 20 s, ... up to backoffLimit,
	// 2 by SUC's code default, fact 4), compressed here into RepositoryPatience: a
	// repository back within it lets the run complete, else the Job fails with
	// BackoffLimitExceeded and the node program's words on its pod.
	Repository interface {
		Serves(repositoryURL string) (bool, string)
	}
	// RepositoryPatience is how long, on Clock, a run waits for its repository to serve
	// again before its Job fails (see Repository). Default 1s.
	RepositoryPatience time.Duration

	mu            sync.Mutex
	fails         map[string]string
	labelledFails []labelledFailure
	// certs holds each node's RKE2 certificates that the test dated (SetRKE2Certificates).
	certs map[string][]nodeprogram.ExpiringCertificate
	// appliedRV is the Plan resourceVersion whose Jobs were last applied, per Plan UID:
	// SUC applies at most once per resourceVersion (fact 48).
	appliedRV map[types.UID]string
	// jobSeen is the resourceVersion of each Job the job handler last looked at, and
	// jobRequeue when it asked to look again: the handler runs on Job events and its own
	// re-queues only (facts 43 to 46).
	jobSeen    map[types.UID]string
	jobRequeue map[types.UID]time.Time
	// running is what the pod of each started Job is doing (jobrunner.go).
	running map[types.UID]*podRun
	// planSeen is when the simulator first synced each Plan (by UID).
	planSeen map[types.UID]time.Time
	// guarded holds the nodes that carry the restart guard (Guarded), skipped those
	// that carry rke2-multus.yaml.skip (ManifestSkipped), and hostPlayed the Jobs whose
	// work was played on their node's host state (playHost).
	guarded    map[string]bool
	skipped    map[string]bool
	hostPlayed map[types.UID]bool
	// reboots are the reboots armed on the nodes' hosts, by node (hostreboot.go).
	reboots map[string]*hostReboot
	// lose holds the nodes whose next armed reboot is lost (LoseReboot).
	lose map[string]bool
	// podLogs are the logs of the failed pods' containers (sucpods.go).
	podLogs map[string]string
}

// DefaultKubeletVersion is the Plan's version when its upgrade image is an rke2-upgrade
// image (the RKE2 upgrade restarts the kubelet at that version), else "".
func DefaultKubeletVersion(plan *sucv1.Plan) string {
	if plan.Spec.Upgrade == nil {
		return ""
	}
	if strings.HasSuffix(imageRepository(plan.Spec.Upgrade.Image), "rke2-upgrade") {
		return plan.Spec.Version
	}
	return ""
}

// DefaultOSImage is "Harvester <version>" for a Plan whose upgrade container runs the
// node program's os-upgrade from the capi-inplace image, else "". That subcommand
// installs the release's OS and arms the reboot that brings the node back on it (after
// the Job completed: RebootDelay),
// whose os-release PRETTY_NAME is then the release's os, "Harvester <version>"
// (nodeprogram/osupgrade.go; facts, harvester-node-upgrade.md fact 27); with
// --reboot=false it leaves the reboot to someone else and the node keeps its OS.
func DefaultOSImage(plan *sucv1.Plan) string {
	if plan.Spec.Upgrade == nil {
		return ""
	}
	up := plan.Spec.Upgrade
	if PlanSubcommand(plan) == "os-upgrade" && !slices.Contains(up.Args, "--reboot=false") {
		return "Harvester " + plan.Spec.Version
	}
	return ""
}

// RestartGuardSubcommand is the node program subcommand that places the restart guard,
// and with --remove takes it away (nodeprogram/restartguard.go).
const RestartGuardSubcommand = "rke2-restart-guard"

// Guarded tells whether node carries the restart guard of
// shared/facts/harvester-release-steps.md fact 12: the runtime drop-in under
// /run/systemd/system/rancher-system-agent.service.d that gives rancher-system-agent
// INSTALL_RKE2_SKIP_ENABLE=true, so that a new machine plan is installed without
// restarting RKE2. That is host state no API server shows; the simulator keeps it from
// the Jobs that ran on the node (playHost). Wire it to RancherPlanner.Guarded to have the
// planner honour it. Safe for concurrent use.
func (s *SUC) Guarded(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.guarded[node]
}

// ManifestSkipSubcommand is the node program subcommand that places
// rke2-multus.yaml.skip in RKE2's server manifests, and with --remove takes it away
// (nodeprogram/manifestskip.go).
const ManifestSkipSubcommand = "rke2-manifest-skip"

// ManifestSkipped tells whether node carries
// /var/lib/rancher/rke2/server/manifests/rke2-multus.yaml.skip, the file of
// shared/facts/harvester-release-steps.md fact 34 that makes RKE2's deploy controller
// ignore rke2-multus.yaml. Host state no API server shows: the simulator keeps it from
// the Jobs that ran on the node (playHost), for the nodes that have that directory, the
// RKE2 servers (ServerNode): Harvester's script, and the node program, do nothing where
// it does not exist (Harvester v1.8.2 pkg/controller/master/upgrade/common.go
// skipManifestScript). Wire it to Multus.Skipped. Safe for concurrent use.
func (s *SUC) ManifestSkipped(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped[node]
}

// ServerNode tells whether a node runs RKE2 as a server, and so has
// /var/lib/rancher/rke2/server/manifests and a deploy controller: RKE2 labels its
// servers node-role.kubernetes.io/control-plane and etcd (a Harvester witness is an
// etcd-only server); an agent (worker) has neither label.
func ServerNode(node *corev1.Node) bool {
	for _, role := range []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/etcd", "node-role.kubernetes.io/master"} {
		if node.Labels[role] == "true" {
			return true
		}
	}
	return false
}

// playHost plays, once per Job, what the completed work of job's upgrade container left
// on its node's host, which the rest of the simulated cluster may look at (Guarded,
// ManifestSkipped):
//   - a Plan whose upgrade container runs the node program's rke2-restart-guard guards
//     the node (harvester-release-steps.md fact 12, skip_restart_rancher_system_agent);
//     with --remove it unguards it (fact 44, recover_rancher_system_agent);
//   - a Plan whose upgrade container runs the node program's rke2-restart unguards the
//     node and restarts its RKE2 service, which starts the RKE2 installed on its disk
//     (Kubelet.RestartRKE2: rancher-system-agent's install under the guard,
//     Kubelet.InstallRKE2); the node is NotReady for RestartDuration meanwhile;
//   - a Plan whose upgrade container runs the node program's rke2-manifest-skip puts
//     rke2-multus.yaml.skip on a server node (fact 34), and with --remove takes it off;
//     on an agent node it does nothing. When the file goes from a node while RKE2 runs,
//     RKE2's deploy controller applies rke2-multus.yaml at its next pass: Multus is told
//     (Multus.SkipRemoved) with the version the node runs. The file is under /var/lib,
//     a reboot keeps it.
//
// It runs when SUC's job handler first sees the Job Complete, before the node is
// labelled, and reads the Plan the pod ran (the pod's, even if the Plan changed or went
// since); a failed Job changes nothing. The reboot an os-upgrade Job arms, and what it
// does to the host, is played when it comes (hostreboot.go).
func (s *SUC) playHost(ctx context.Context, job *batchv1.Job) error {
	if jobCondition(job, batchv1.JobComplete) == nil {
		return nil
	}
	s.mu.Lock()
	run := s.running[job.UID]
	played := s.hostPlayed[job.UID]
	s.mu.Unlock()
	if run == nil || played {
		return nil
	}
	// Decided without the lock: s.OSImage is the test's function.
	up := run.plan.Spec.Upgrade
	guard, unguard, skip, unskip, restart := false, false, false, false, false
	var node *corev1.Node
	switch {
	case up != nil && nodeSubcommand(up.Image, up.Args) == RestartGuardSubcommand:
		guard, unguard = !removesGuard(up.Args), removesGuard(up.Args)
	case up != nil && nodeSubcommand(up.Image, up.Args) == RKE2RestartSubcommand:
		unguard, restart = true, true
	case up != nil && nodeSubcommand(up.Image, up.Args) == ManifestSkipSubcommand:
		node = &corev1.Node{}
		if err := s.cached().Get(ctx, client.ObjectKey{Name: run.node}, node); err != nil {
			return client.IgnoreNotFound(err)
		}
		if ServerNode(node) {
			skip, unskip = !removesGuard(up.Args), removesGuard(up.Args)
		}
	}
	s.mu.Lock()
	if s.hostPlayed == nil {
		s.hostPlayed, s.guarded, s.skipped = map[types.UID]bool{}, map[string]bool{}, map[string]bool{}
	}
	s.hostPlayed[job.UID] = true
	removed := unskip && s.skipped[run.node]
	switch {
	case guard:
		s.guarded[run.node] = true
	case unguard:
		delete(s.guarded, run.node)
	case skip:
		s.skipped[run.node] = true
	case unskip:
		delete(s.skipped, run.node)
	}
	s.mu.Unlock()
	if restart {
		if _, err := s.Kubelet.RestartRKE2(ctx, run.node, orDefault(s.RestartDuration, 100*time.Millisecond)); err != nil {
			return fmt.Errorf("restart RKE2 on node %s: %w", run.node, err)
		}
	}
	if removed && s.Multus != nil {
		return s.Multus.SkipRemoved(ctx, run.node, node.Status.NodeInfo.KubeletVersion)
	}
	return nil
}

// RKE2RestartSubcommand is the node program subcommand that takes the restart guard off
// and restarts RKE2's service (nodeprogram/rke2restart.go).
const RKE2RestartSubcommand = "rke2-restart"

// removesGuard tells whether the node program's arguments say --remove (a Go boolean
// flag: --remove, -remove, or either with =true).
func removesGuard(args []string) bool {
	remove := false
	for _, a := range args {
		name, value, hasValue := strings.Cut(a, "=")
		if name != "--remove" && name != "-remove" {
			continue
		}
		remove = !hasValue
		if hasValue {
			remove, _ = strconv.ParseBool(value)
		}
	}
	return remove
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

// SetRKE2Certificates dates RKE2's certificates on node, host state no API server
// shows (the files under /var/lib/rancher/rke2, nodeprogram.ExpiringRKE2Certificates). A
// node program preload on the node fails, before it imports anything, when one expires
// within its --min-cert-days (default 7), with the node program's own words
// (nodeprogram.RKE2CertificatesError). Nodes not told of hold certificates valid for
// long.
func (s *SUC) SetRKE2Certificates(node string, certs ...nodeprogram.ExpiringCertificate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.certs == nil {
		s.certs = map[string][]nodeprogram.ExpiringCertificate{}
	}
	s.certs[node] = certs
}

// certificateFailure is what the node program's preload says on node at now of RKE2's
// certificates there ("", false when they pass its check).
func (s *SUC) certificateFailure(plan *sucv1.Plan, node string, now time.Time) (string, bool) {
	up := plan.Spec.Upgrade
	if up == nil || PlanSubcommand(plan) != "preload" {
		return "", false
	}
	days := 7
	if v := flagValue(up.Args, "--min-cert-days"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return "", false
		}
		days = n
	}
	if days <= 0 {
		return "", false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var expiring []nodeprogram.ExpiringCertificate
	for _, c := range s.certs[node] {
		if c.NotAfter.Before(now.AddDate(0, 0, days)) {
			expiring = append(expiring, c)
		}
	}
	if len(expiring) == 0 {
		return "", false
	}
	sort.SliceStable(expiring, func(i, j int) bool { return expiring[i].NotAfter.Before(expiring[j].NotAfter) })
	return nodeprogram.RKE2CertificatesError(expiring, now, days).Error(), true
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

func (s *SUC) name() string {
	if s.Name == "" {
		return "system-upgrade-controller"
	}
	return s.Name
}

func (s *SUC) settings() JobSettings {
	if s.Settings == nil {
		return DefaultJobSettings()
	}
	return *s.Settings
}

func (s *SUC) clock() clock.PassiveClock {
	if s.Clock == nil {
		return clock.RealClock{}
	}
	return s.Clock
}

// Run plays SUC until ctx ends. Errors of one pass are returned on ctx's end only if
// every pass failed; a transient API error does not stop the simulator.
func (s *SUC) Run(ctx context.Context) error {
	interval := s.Interval
	if interval == 0 {
		interval = 50 * time.Millisecond
	}
	events, err := s.events(ctx)
	if err != nil {
		return err
	}
	var lastErr error
	for {
		if err := s.pass(ctx); err != nil && ctx.Err() == nil {
			lastErr = err
		}
		wait := interval
		if events != nil {
			if left, ok := s.untilWorkEnds(); ok && left < wait {
				wait = left
			}
		}
		select {
		case <-ctx.Done():
			return lastErr
		case <-time.After(wait):
		case <-events:
		}
	}
}

// events signals (coalesced) every change of a Plan, a Job or a Node in Cache, while
// ctx lasts, when Cache is set; nil otherwise.
func (s *SUC) events(ctx context.Context) (<-chan struct{}, error) {
	if s.Cache == nil {
		return nil, nil
	}
	kick := make(chan struct{}, 1)
	signal := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal() },
		UpdateFunc: func(any, any) { signal() },
		DeleteFunc: func(any) { signal() },
	}
	for _, obj := range []client.Object{&sucv1.Plan{}, &batchv1.Job{}, &corev1.Node{}} {
		informer, err := s.Cache.GetInformer(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("informer of %T: %w", obj, err)
		}
		registration, err := informer.AddEventHandler(handler)
		if err != nil {
			return nil, fmt.Errorf("event handler of %T: %w", obj, err)
		}
		go func() {
			<-ctx.Done()
			_ = informer.RemoveEventHandler(registration)
		}()
	}
	return kick, nil
}

// cached is where the simulator reads what SUC reads from its informers: Cache when set,
// else the API server.
func (s *SUC) cached() client.Reader {
	if s.Cache != nil {
		return s.Cache
	}
	return s.Client
}

// untilWorkEnds is how long, on Clock, until the first running pod's work ends; false
// when no pod is working.
func (s *SUC) untilWorkEnds() (time.Duration, bool) {
	now := s.clock().Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Duration
	found := false
	for _, r := range s.running {
		if !r.running || r.finished || r.pullError != "" {
			continue
		}
		left := max(r.start.Add(s.work(r.plan)).Sub(now), time.Millisecond)
		if !found || left < next {
			next, found = left, true
		}
	}
	for _, rb := range s.reboots {
		if rb.lost {
			continue // its timer never fires
		}
		left := max(rb.next().Sub(now), time.Millisecond)
		if !found || left < next {
			next, found = left, true
		}
	}
	return next, found
}

// pass is one look at the cluster: every Plan's status and Jobs (SUC's plan handlers),
// every Job of this controller (SUC's job handler), then every Job's pod (the cluster).
func (s *SUC) pass(ctx context.Context) error {
	s.mu.Lock()
	if s.appliedRV == nil {
		s.appliedRV, s.jobSeen, s.jobRequeue, s.running = map[types.UID]string{}, map[types.UID]string{}, map[types.UID]time.Time{}, map[types.UID]*podRun{}
		s.planSeen = map[types.UID]time.Time{}
	}
	s.mu.Unlock()
	// Fact 1: only this namespace.
	plans := &sucv1.PlanList{}
	if err := s.cached().List(ctx, plans, client.InNamespace(s.Namespace)); err != nil {
		return fmt.Errorf("list plans: %w", err)
	}
	nodes := &corev1.NodeList{}
	if err := s.cached().List(ctx, nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var errs []error
	for i := range plans.Items {
		wrote, err := s.syncPlan(ctx, &plans.Items[i], nodes.Items)
		if err == nil && wrote && s.Cache != nil {
			// The status write is itself a Plan event: SUC's handlers run again on it at
			// once, and that sync resumes the Jobs the first created paused (fact 28).
			_, err = s.syncPlan(ctx, &plans.Items[i], nodes.Items)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("plan %s: %w", plans.Items[i].Name, err))
		}
	}
	if err := s.handleJobs(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := s.runPods(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := s.playReboots(ctx); err != nil {
		errs = append(errs, err)
	}
	if s.Cache != nil {
		// A Job that just completed or failed is a Job event: SUC's job handler labels
		// the node or marks the Plan failed at once (facts 44 to 46, 50).
		if err := s.handleJobs(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncPlan is SUC's status handler then its generating handler on one Plan event
// (handle_upgrade.go; facts 12 to 22, 48, 49). It reports whether it wrote the Plan's
// status; plan then carries the written object.
func (s *SUC) syncPlan(ctx context.Context, plan *sucv1.Plan, nodes []corev1.Node) (bool, error) {
	now := s.clock().Now()
	s.mu.Lock()
	if _, ok := s.planSeen[plan.UID]; !ok {
		s.planSeen[plan.UID] = now
	}
	s.mu.Unlock()
	st := plan.Status.DeepCopy()
	ensureCondition(st, "Complete", now)

	// Facts 12, 13: validate.
	ensureCondition(st, "Validated", now)
	if err := s.validate(ctx, plan); err != nil {
		setCondition(st, "Validated", corev1.ConditionFalse, "Error", err.Error(), now)
	} else {
		setCondition(st, "Validated", corev1.ConditionTrue, "PlanIsValid", "", now)
		// Fact 14: resolve the version (a channel is not served by the simulator).
		ensureCondition(st, "LatestResolved", now)
		switch {
		case plan.Spec.Version == "" && plan.Spec.Channel == "":
			setCondition(st, "LatestResolved", corev1.ConditionFalse, "Error", sucv1.ErrPlanUnresolvable.Error(), now)
		case plan.Spec.Version == "":
			setCondition(st, "LatestResolved", corev1.ConditionFalse, "Error", "the simulator does not resolve channels: set spec.version", now)
		default:
			latest := MungeVersion(plan.Spec.Version)
			if conditionStatus(st, "LatestResolved") != corev1.ConditionTrue || st.LatestVersion != latest {
				// Fact 15: a version change resets Complete.
				setCondition(st, "Complete", corev1.ConditionFalse, "Resolved", "", now)
			}
			st.LatestVersion = latest
			setCondition(st, "LatestResolved", corev1.ConditionTrue, "Version", "", now)
		}
	}
	// Fact 16: the hash, unless resolution failed.
	if conditionReason(st, "LatestResolved") != "Error" {
		h, err := s.latestHash(ctx, plan, st.LatestVersion)
		if err != nil {
			return false, err
		}
		st.LatestHash = h
	}

	// The generating handler sees the Plan with the status computed so far.
	work := plan.DeepCopy()
	work.Status = *st
	jobs, err := s.generate(work, nodes, now)
	if err != nil {
		return false, err
	}
	if err := s.apply(ctx, plan, jobs); err != nil {
		return false, err
	}
	if equality.Semantic.DeepEqual(plan.Status, work.Status) {
		return false, nil
	}
	plan.Status = work.Status
	if err := s.Client.Status().Update(ctx, plan); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("update status: %w", err)
	}
	return true, nil
}

// validate is plan.go Validate (fact 13); the window is checked by SUC's timewindow
// parser, here by TimeWindowSpec itself.
func (s *SUC) validate(ctx context.Context, plan *sucv1.Plan) error {
	if d := plan.Spec.Drain; d != nil {
		if d.DeleteEmptydirData != nil && d.DeleteLocalData != nil {
			return errors.New("spec.drain cannot specify both deleteEmptydirData and deleteLocalData")
		}
		if d.PodSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(d.PodSelector); err != nil {
				return err
			}
		}
	}
	if d := plan.Spec.PostCompleteDelay; d != nil && d.Duration < 0 {
		return errors.New("spec.postCompleteDelay is negative")
	}
	for _, sec := range plan.Spec.Secrets {
		if sec.IgnoreUpdates {
			continue
		}
		if err := s.cached().Get(ctx, client.ObjectKey{Namespace: plan.Namespace, Name: sec.Name}, &corev1.Secret{}); err != nil {
			return err
		}
	}
	return nil
}

func (s *SUC) latestHash(ctx context.Context, plan *sucv1.Plan, latestVersion string) (string, error) {
	digest, err := digestValues(plan)
	if err != nil {
		return "", err
	}
	var secrets []string
	for _, sec := range plan.Spec.Secrets {
		if sec.IgnoreUpdates {
			continue
		}
		secret := &corev1.Secret{}
		if err := s.cached().Get(ctx, client.ObjectKey{Namespace: plan.Namespace, Name: sec.Name}, secret); err != nil {
			return "", fmt.Errorf("secret %s: %w", sec.Name, err)
		}
		h, err := secretHash(secret)
		if err != nil {
			return "", err
		}
		secrets = append(secrets, h)
	}
	return LatestHash(latestVersion, plan.Spec.ServiceAccountName, digest, secrets), nil
}

// generate is the generating handler (facts 18 to 23): it selects the nodes, returns the
// Jobs to apply, and writes applying and Complete into plan.Status.
func (s *SUC) generate(plan *sucv1.Plan, nodes []corev1.Node, now time.Time) ([]*batchv1.Job, error) {
	st := &plan.Status
	if conditionStatus(st, "Validated") != corev1.ConditionTrue || conditionStatus(st, "LatestResolved") != corev1.ConditionTrue {
		setCondition(st, "Complete", corev1.ConditionFalse, "NotReady", "plan is not valid and resolved", now) // fact 18
		return nil, nil
	}
	selected, err := selectConcurrentNodes(plan, nodes)
	if err != nil {
		setCondition(st, "Complete", corev1.ConditionFalse, "SelectNodesFailed", err.Error(), now)
		return nil, err
	}
	var jobs []*batchv1.Job
	var hostnames []string
	for i := range selected {
		jobs = append(jobs, newJob(plan, &selected[i], s.name(), s.settings()))
		hostnames = append(hostnames, nodeHostname(&selected[i]))
	}
	if len(hostnames) == 0 {
		// Fact 22: nothing left: Complete.
		st.Applying = nil
		setCondition(st, "Complete", corev1.ConditionTrue, "Complete", "", now)
		return nil, nil
	}
	// Fact 21: the window is looked at only while nothing is applying.
	if w := plan.Spec.Window; w != nil && len(st.Applying) == 0 && !w.Contains(now) {
		setCondition(st, "Complete", corev1.ConditionFalse, "Waiting", "current time is not within configured window", now)
		return nil, nil
	}
	// Fact 22: a new applying list resets Complete to SyncJob.
	if !slices.Equal(st.Applying, hostnames) {
		st.Applying = hostnames
		setCondition(st, "Complete", corev1.ConditionFalse, "SyncJob", "", now)
	}
	return jobs, nil
}

// selectConcurrentNodes is plan.go SelectConcurrentNodes (facts 7 to 10, 19).
func selectConcurrentNodes(plan *sucv1.Plan, nodes []corev1.Node) ([]corev1.Node, error) {
	// Fact 8: a nil selector selects nothing (LabelSelectorAsSelector(nil) is Nothing).
	sel, err := metav1.LabelSelectorAsSelector(plan.Spec.NodeSelector)
	if err != nil {
		return nil, err
	}
	hasHostname, _ := labels.NewRequirement(corev1.LabelHostname, selection.Exists, nil) // fact 9
	notDone, err := labels.NewRequirement(NodePlanPrefix+plan.Name, selection.NotIn, []string{"disabled", plan.Status.LatestHash})
	if err != nil {
		return nil, err
	}
	sel = sel.Add(*hasHostname, *notDone) // fact 10
	var selected, candidates []corev1.Node
	for _, n := range nodes {
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		if slices.Contains(plan.Status.Applying, n.Labels[corev1.LabelHostname]) {
			selected = append(selected, n)
		} else {
			candidates = append(candidates, n)
		}
	}
	if int64(len(selected)) < plan.Spec.Concurrency { // fact 7: 0 adds nothing
		order := func(n corev1.Node) string {
			sum := sha256.Sum256([]byte(string(n.UID) + string(plan.UID) + plan.Status.LatestHash))
			return hex.EncodeToString(sum[:])
		}
		sort.Slice(candidates, func(i, j int) bool { return order(candidates[i]) < order(candidates[j]) })
		for i := 0; i < len(candidates) && int64(len(selected)) < plan.Spec.Concurrency; i++ {
			selected = append(selected, candidates[i])
		}
	}
	sort.Slice(selected, func(i, j int) bool { return selected[i].Name < selected[j].Name })
	return selected, nil
}

// apply is wrangler's apply of the generated Jobs, with SUC's options (facts 27, 48, 49):
// at most once per Plan resourceVersion; a missing Job is created; a Job whose pod
// template differs from the one last applied is deleted, and created again on the next
// sync; otherwise its parallelism and metadata are brought to the desired ones. Nothing
// is deleted because it is no longer desired (WithNoDelete). The API server validates
// every Job; a rejected Job is recorded and the Plan stays as it is.
func (s *SUC) apply(ctx context.Context, plan *sucv1.Plan, jobs []*batchv1.Job) error {
	if s.NoJobs != nil && s.NoJobs(plan) {
		return nil
	}
	s.mu.Lock()
	done := s.appliedRV[plan.UID] == plan.ResourceVersion
	s.mu.Unlock()
	if done {
		return nil
	}
	replaced := false
	var errs []error
	for _, want := range jobs {
		digest := templateDigest(&want.Spec.Template)
		want.Annotations[annotationApplied] = digest
		want.Annotations[annotationObjectSet] = "system-upgrade-controller"
		want.Annotations[annotationOwnerGVK] = "upgrade.cattle.io/v1, Kind=Plan"
		want.Annotations[annotationOwnerName] = plan.Name
		want.Annotations[annotationOwnerNS] = plan.Namespace
		want.Labels[labelObjectSetHash] = digest[:32]

		current := &batchv1.Job{}
		err := s.Client.Get(ctx, client.ObjectKeyFromObject(want), current)
		switch {
		case apierrors.IsNotFound(err):
			if err := s.Client.Create(ctx, want); err != nil {
				s.Record.rejectJob(JobRejection{Plan: plan.Name, Node: want.Labels[LabelNode], Job: want.Name, Error: err.Error()})
				errs = append(errs, fmt.Errorf("create job %s: %w", want.Name, err))
			}
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		}
		if current.Annotations[annotationApplied] != digest {
			// Fact 49: wrangler's Job reconciler replaces a Job whose template changed.
			if err := s.deleteJob(ctx, current, "its pod template changed: replaced"); err != nil {
				errs = append(errs, err)
			}
			replaced = true
			continue
		}
		if *current.Spec.Parallelism != *want.Spec.Parallelism {
			current.Spec.Parallelism = want.Spec.Parallelism
			if err := s.Client.Update(ctx, current); err != nil && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("update job %s: %w", want.Name, err))
			}
		}
	}
	if len(errs) == 0 && !replaced {
		s.mu.Lock()
		s.appliedRV[plan.UID] = plan.ResourceVersion
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// handleJobs is SUC's job handler (handle_batch.go; facts 2, 42 to 47), run for a Job
// when it changed since last time or when the handler asked to look at it again.
func (s *SUC) handleJobs(ctx context.Context) error {
	jobs := &batchv1.JobList{}
	if err := s.cached().List(ctx, jobs, client.InNamespace(s.Namespace), client.MatchingLabels{LabelController: s.name()}); err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	now := s.clock().Now()
	var errs []error
	for i := range jobs.Items {
		job := &jobs.Items[i]
		s.mu.Lock()
		due := s.jobSeen[job.UID] != job.ResourceVersion
		if at, ok := s.jobRequeue[job.UID]; ok && !now.Before(at) {
			due = true
			delete(s.jobRequeue, job.UID)
		}
		s.jobSeen[job.UID] = job.ResourceVersion
		s.mu.Unlock()
		if job.DeletionTimestamp != nil {
			continue
		}
		if gone, err := s.ownerPlanGone(ctx, job); err != nil {
			errs = append(errs, err)
			continue
		} else if gone {
			// The garbage collector deletes a Job whose controlling Plan is gone (fact 27),
			// whether or not SUC's handler sees an event for it: a running Job's pod
			// (a kubectl drain retrying refused evictions) may change nothing for long.
			if err := s.collectJob(ctx, job); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if !due {
			continue
		}
		err := s.handleJob(ctx, job, now)
		switch {
		case err == nil || apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			// A Node or Plan that changed since it was read: the handler's error re-queues
			// the Job, as wrangler does.
			s.requeueJob(job, now)
		default:
			errs = append(errs, fmt.Errorf("job %s: %w", job.Name, err))
			s.requeueJob(job, now)
		}
	}
	return errors.Join(errs...)
}

// ownerPlanGone reports whether the Plan that controls job (its ownerReference, fact 27)
// no longer exists, or exists as another object of the same name.
func (s *SUC) ownerPlanGone(ctx context.Context, job *batchv1.Job) (bool, error) {
	ref := metav1.GetControllerOf(job)
	if ref == nil || ref.Kind != "Plan" {
		return false, nil
	}
	plan := &sucv1.Plan{}
	switch err := s.cached().Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: ref.Name}, plan); {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get the Plan of job %s: %w", job.Name, err)
	}
	return plan.UID != ref.UID, nil
}

func (s *SUC) requeueJob(job *batchv1.Job, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.jobRequeue[job.UID]; !ok || at.Before(cur) {
		s.jobRequeue[job.UID] = at
	}
}

func (s *SUC) handleJob(ctx context.Context, job *batchv1.Job, now time.Time) error {
	if err := s.playHost(ctx, job); err != nil {
		return err
	}
	planName, okPlan := job.Labels[LabelPlan]
	version, okVersion := job.Labels[LabelVersion]
	nodeName, okNode := job.Labels[LabelNode]
	if !okPlan || !okVersion {
		return s.deleteJob(ctx, job, "malformed: no plan or version label") // fact 42
	}
	plan := &sucv1.Plan{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: planName}, plan); err != nil {
		if apierrors.IsNotFound(err) {
			return s.deleteJob(ctx, job, "its Plan is gone") // facts 27, 42
		}
		return err
	}
	if version != plan.Status.LatestVersion {
		// Fact 43: another version: deleted whatever its state, the node not labelled.
		return s.deleteJob(ctx, job, fmt.Sprintf("its version %s is no longer the Plan's %s", version, plan.Status.LatestVersion))
	}
	if !okNode {
		return s.deleteJob(ctx, job, "malformed: no node label")
	}
	node := &corev1.Node{}
	if err := s.cached().Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return s.deleteJob(ctx, job, "its node is gone")
		}
		return err
	}
	if c := jobCondition(job, batchv1.JobFailed); c != nil {
		// Fact 45: the Plan shows the failure; the Job goes after its TTL.
		message := fmt.Sprintf("Job %s/%s failed on Node %s: %s: %s", job.Namespace, job.Name, nodeName, c.Reason, c.Message)
		setCondition(&plan.Status, "Complete", corev1.ConditionFalse, "JobFailed", message, now)
		if err := s.Client.Status().Update(ctx, plan); err != nil {
			return err
		}
		return s.deleteAfterTTL(ctx, job, c.LastTransitionTime.Time, now)
	}
	if c := jobCondition(job, batchv1.JobComplete); c != nil {
		hashLabel := NodePlanPrefix + planName
		if hash, ok := job.Labels[hashLabel]; ok {
			var delay time.Duration
			if plan.Spec.PostCompleteDelay != nil {
				delay = plan.Spec.PostCompleteDelay.Duration
			}
			if waited := now.Sub(c.LastTransitionTime.Time); waited < delay {
				s.requeueJob(job, now.Add(delay-waited))
			} else {
				// Fact 46: the Job's hash, and the expanded postCompleteLabels.
				if node.Labels == nil {
					node.Labels = map[string]string{}
				}
				for k, v := range plan.Spec.PostCompleteLabels {
					node.Labels[k] = strings.NewReplacer("$(LATEST_VERSION)", plan.Status.LatestVersion, "$(LATEST_HASH)", plan.Status.LatestHash).Replace(v)
				}
				node.Labels[hashLabel] = hash
			}
			// Fact 46: uncordon at once when the Plan cordons or drains, whoever cordoned.
			uncordon := node.Spec.Unschedulable && (plan.Spec.Cordon || plan.Spec.Drain != nil)
			if uncordon {
				node.Spec.Unschedulable = false
			}
			if err := s.Client.Update(ctx, node); err != nil {
				return err
			}
			s.mu.Lock()
			run := s.running[job.UID]
			s.mu.Unlock()
			if run != nil && node.Labels[hashLabel] == hash {
				s.Record.labelledRun(run.record, now)
			}
			if uncordon {
				s.Record.uncordonedBySUC(node.Name, plan.Name, now)
			}
		}
		return s.deleteAfterTTL(ctx, job, c.LastTransitionTime.Time, now)
	}
	// Fact 47: a running Job of a node that is not applying runs out of turn.
	if !slices.Contains(plan.Status.Applying, nodeName) {
		return s.deleteJob(ctx, job, "running out of turn: its node is not in status.applying")
	}
	return nil
}

// deleteAfterTTL deletes a finished Job once its TTL has passed since it finished, and
// otherwise looks at it again then (handle_batch.go enqueueOrDelete).
func (s *SUC) deleteAfterTTL(ctx context.Context, job *batchv1.Job, finished, now time.Time) error {
	var ttl time.Duration
	if job.Spec.TTLSecondsAfterFinished != nil {
		ttl = time.Duration(*job.Spec.TTLSecondsAfterFinished) * time.Second
	}
	if waited := now.Sub(finished); waited < ttl {
		s.requeueJob(job, finished.Add(ttl))
		return nil
	}
	return s.deleteJob(ctx, job, "its TTL after finishing has passed")
}

// deleteJob deletes a Job with background propagation (fact 42). A Job whose pod still
// runs is recorded as interrupted: its upgrade stopped part way.
// collectJob is the garbage collector deleting a Job whose Plan is gone (fact 27). A Job
// still running is recorded as deleted while running, as SUC's own deletions are; one
// that had finished is removed without a record: its run had ended, and nothing was
// interrupted (the records' Deleted lists what was cut short or replaced).
func (s *SUC) collectJob(ctx context.Context, job *batchv1.Job) error {
	s.mu.Lock()
	run := s.running[job.UID]
	finished := run != nil && run.finished
	s.mu.Unlock()
	if !finished {
		return s.deleteJob(ctx, job, "its Plan is gone (garbage collector)")
	}
	if err := s.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete job %s: %w", job.Name, err)
	}
	if err := s.deletePods(ctx, job); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.running, job.UID)
	delete(s.hostPlayed, job.UID)
	s.mu.Unlock()
	return nil
}

func (s *SUC) deleteJob(ctx context.Context, job *batchv1.Job, why string) error {
	if err := s.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete job %s: %w", job.Name, err)
	}
	if err := s.deletePods(ctx, job); err != nil {
		return err
	}
	s.mu.Lock()
	run := s.running[job.UID]
	delete(s.running, job.UID)
	delete(s.hostPlayed, job.UID)
	s.mu.Unlock()
	if run == nil {
		return nil
	}
	s.Record.deletedRun(run.record, why)
	if !run.finished {
		s.Record.endRun(run.record, s.clock().Now(), true, "deleted by SUC while running: "+why, true)
		if run.down {
			_ = s.Kubelet.SetReady(ctx, run.node, true, "KubeletReady")
		}
	}
	return nil
}

func jobCondition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range job.Status.Conditions {
		if c := &job.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// Plan conditions are wrangler GenericConditions; SUC writes lastUpdateTime only, never
// lastTransitionTime (fact 6).
func ensureCondition(st *sucv1.PlanStatus, typ string, now time.Time) {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return
		}
	}
	st.Conditions = append(st.Conditions, genericcondition.GenericCondition{Type: typ, Status: corev1.ConditionUnknown, LastUpdateTime: now.UTC().Format(time.RFC3339)})
}

func setCondition(st *sucv1.PlanStatus, typ string, status corev1.ConditionStatus, reason, message string, now time.Time) {
	ensureCondition(st, typ, now)
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type == typ && (c.Status != status || c.Reason != reason || c.Message != message) {
			c.Status, c.Reason, c.Message = status, reason, message
			c.LastUpdateTime = now.UTC().Format(time.RFC3339)
		}
	}
}

func conditionStatus(st *sucv1.PlanStatus, typ string) corev1.ConditionStatus {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func conditionReason(st *sucv1.PlanStatus, typ string) string {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c.Reason
		}
	}
	return ""
}
