package clusterchecks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
)

// Names of the cluster preflight checks: Harvester's upgrade preflight (the
// upgrade-toolkit's init phase and UpgradePlan admission webhook, facts 46 and 47; the
// core's Upgrade admission, fact 4a), run once for a cluster before its upgrade starts.
const (
	// CheckImageGCDiskSpace: on every node, the image filesystem has room for the
	// release's images (ClusterCheckNewImagesBytes) below the kubelet's image garbage
	// collection threshold.
	CheckImageGCDiskSpace = "ImageGCDiskSpace"
	// CheckAPIServerCertificates: the workload API server's serving certificates do not
	// expire within AnnotationMinCertsExpirationDays days (default 7).
	CheckAPIServerCertificates = "APIServerCertificates"
	// CheckSingleReplicaVolumes: no Longhorn volume has a single replica; detached ones
	// can be accepted with AnnotationSkipDetachedSingleReplicaVolumes.
	CheckSingleReplicaVolumes = "SingleReplicaVolumes"
	// CheckVMBackupsIdle: no Harvester VM backup runs and every backup schedule is
	// suspended.
	CheckVMBackupsIdle = "VMBackupsIdle"
	// CheckNodesSchedulable: every node is Ready and not cordoned.
	CheckNodesSchedulable = "NodesSchedulable"
	// CheckRKE2Certificates: no certificate of RKE2's on a node (its components', etcd's,
	// the kubelet's) expires within AnnotationMinCertsExpirationDays days. The node
	// program checks it on each node as the first thing of its image preload, before any
	// node is disrupted (RKE2CertificateDays); no API serves those files.
	CheckRKE2Certificates = "RKE2Certificates"
)

// RKE2CertificateDays is the node program's --min-cert-days for a plan with annotations:
// the minimum of AnnotationMinCertsExpirationDays (DefaultMinCertsExpirationDays unless
// set to a whole number above 0; APIServerCertificates fails a plan whose value is not),
// 0 when the UpgradePlan skips CheckRKE2Certificates.
func RKE2CertificateDays(annotations map[string]string) int {
	if annotations[SkipCheckAnnotationPrefix+CheckRKE2Certificates] == "true" {
		return 0
	}
	if n, err := strconv.Atoi(annotations[AnnotationMinCertsExpirationDays]); err == nil && n > 0 {
		return n
	}
	return DefaultMinCertsExpirationDays
}

// SkipCheckAnnotationPrefix followed by a check's name, set to "true" on the UpgradePlan,
// skips that check.
const SkipCheckAnnotationPrefix = "skip-check.harvester.inplace.cluster.x-k8s.io/"

const (
	// AnnotationSkipDetachedSingleReplicaVolumes set to "true" lets SingleReplicaVolumes
	// pass detached single-replica volumes (Harvester's webhook has the same skip, fact
	// 47); attached ones still fail it.
	AnnotationSkipDetachedSingleReplicaVolumes = SkipCheckAnnotationPrefix + CheckSingleReplicaVolumes + "Detached"
	// AnnotationMinCertsExpirationDays is how many days the API server's certificates
	// must stay valid at least, a whole number above 0; our key for the toolkit's
	// management.harvesterhci.io/min-certs-expiration-in-day (fact 46), which is not read.
	AnnotationMinCertsExpirationDays = "harvester.inplace.cluster.x-k8s.io/min-certs-expiration-in-day"
)

const (
	// ClusterCheckNewImagesBytes is the room the release's images take on a node's image
	// filesystem: the upgrade-toolkit's estimate of all its image tarballs (13 GiB,
	// phase_init.go defaultNewImageSize).
	NewImagesBytes uint64 = 13 << 30
	// DefaultImageGCHighThresholdPercent is the kubelet's imageGCHighThresholdPercent
	// when its configuration does not set it.
	DefaultImageGCHighThresholdPercent = 85
	// DefaultMinCertsExpirationDays is how many days the API server's certificates must
	// stay valid at least, unless AnnotationMinCertsExpirationDays says otherwise.
	DefaultMinCertsExpirationDays = 7
)

// apiServerDialTimeout bounds the TLS handshake with the workload API server.
const apiServerDialTimeout = 10 * time.Second

// ClusterCheckResult is the outcome of one cluster preflight check. A check that did not
// pass and was not skipped blocks the upgrade; Message says what is wrong and what to do,
// or why the check was skipped or could not be evaluated.
type Result struct {
	Name    string
	Passed  bool
	Skipped bool
	Message string
}

// ClusterCheckInput is what the cluster preflight checks read.
type Input struct {
	// Workload is a client of the workload cluster.
	Workload client.Client
	// Kubelets reads each node's kubelet /stats/summary and /configz.
	Kubelets KubeletReader
	// APIServer reaches the workload API server, whose serving certificates are checked.
	// Nil: APIServerCertificates cannot tell and fails.
	APIServer *rest.Config
	// Annotations are the UpgradePlan's: the skips (SkipCheckAnnotationPrefix) and
	// AnnotationMinCertsExpirationDays.
	Annotations map[string]string
	// Now is the time certificates' expiry is measured from.
	Now time.Time
}

type clusterCheck struct {
	name string
	run  func(ctx context.Context, in Input) Result
}

// clusterChecks is every cluster preflight check, in the order they run and report.
var clusterChecks = []clusterCheck{
	{CheckImageGCDiskSpace, checkImageGCDiskSpace},
	{CheckAPIServerCertificates, checkAPIServerCertificates},
	{CheckSingleReplicaVolumes, checkSingleReplicaVolumes},
	{CheckVMBackupsIdle, checkVMBackupsIdle},
	{CheckNodesSchedulable, checkNodesSchedulable},
}

// ClusterCheckNames returns the names of the cluster preflight checks in the order
// RunClusterChecks reports them.
func Names() []string {
	names := make([]string, 0, len(clusterChecks))
	for _, c := range clusterChecks {
		names = append(names, c.name)
	}
	return names
}

// RunClusterChecks runs every cluster preflight check, in a fixed order, and returns one
// result each in that order. A check whose skip annotation is "true" is not run: it is
// reported Skipped, naming the annotation. A check that cannot be evaluated fails with
// the reason, so an upgrade never starts on a guess.
func Run(ctx context.Context, in Input) []Result {
	results := make([]Result, 0, len(clusterChecks))
	for _, c := range clusterChecks {
		key := SkipCheckAnnotationPrefix + c.name
		skip, err := annotationTrue(in.Annotations, key)
		switch {
		case err != nil:
			results = append(results, Result{Name: c.name, Message: err.Error()})
		case skip:
			results = append(results, Result{Name: c.name, Skipped: true, Message: fmt.Sprintf("skipped: the UpgradePlan has the annotation %s=true", key)})
		default:
			r := c.run(ctx, in)
			r.Name = c.name
			results = append(results, r)
		}
	}
	return results
}

// annotationTrue reads a boolean annotation: absent is false; a value that is not a
// boolean is an error, rather than a silent guess either way.
func annotationTrue(annotations map[string]string, key string) (bool, error) {
	v, ok := annotations[key]
	if !ok {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("the UpgradePlan's annotation %s=%q is not true or false; fix it", key, v)
	}
	return b, nil
}

func passed(format string, args ...any) Result {
	return Result{Passed: true, Message: fmt.Sprintf(format, args...)}
}

func failed(format string, args ...any) Result {
	return Result{Message: fmt.Sprintf(format, args...)}
}

// checkImageGCDiskSpace projects each node's image filesystem after the release's images
// are loaded (used + ClusterCheckNewImagesBytes) and fails where that passes the kubelet's
// imageGCHighThresholdPercent: the kubelet would then remove images, the new ones among
// them (fact 46). The upgrade-toolkit reads the node's root filesystem (summary node.fs);
// this check reads the runtime's image filesystem (node.runtime.imageFs), where the
// images go and which the kubelet's image GC watches, and node.fs only when the summary
// has no image filesystem. On a node with one filesystem both are the same.
func checkImageGCDiskSpace(ctx context.Context, in Input) Result {
	if in.Kubelets == nil {
		return failed("no kubelet reader was given: cannot tell how full the nodes' image filesystems are")
	}
	nodes := &corev1.NodeList{}
	if err := in.Workload.List(ctx, nodes); err != nil {
		return failed("list the workload cluster's nodes: %v", err)
	}
	if len(nodes.Items) == 0 {
		return failed("the workload cluster has no nodes: nothing to measure")
	}
	var problems []string
	for i := range nodes.Items {
		if p := nodeImageGCProblem(ctx, in.Kubelets, nodes.Items[i].Name); p != "" {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return failed("%s", strings.Join(problems, "; "))
	}
	return passed("every node's image filesystem has room for the release's images (%s) below its kubelet's image garbage collection threshold (%d nodes)", gib(NewImagesBytes), len(nodes.Items))
}

// nodeImageGCProblem says what keeps a node from taking the release's images, or why
// that cannot be told; empty when it can take them.
func nodeImageGCProblem(ctx context.Context, kubelets KubeletReader, node string) string {
	summary, err := kubelets.Summary(ctx, node)
	if err != nil {
		return fmt.Sprintf("node %s: cannot tell how full its image filesystem is: %v", node, err)
	}
	fs, which := summary.Node.imageFilesystem()
	if fs == nil {
		return fmt.Sprintf("node %s: its kubelet's /stats/summary reports neither the image filesystem's nor the node filesystem's used and capacity bytes: cannot tell how full it is", node)
	}
	cfg, err := kubelets.Config(ctx, node)
	if err != nil {
		return fmt.Sprintf("node %s: cannot tell its kubelet's image garbage collection threshold: %v", node, err)
	}
	threshold := float64(DefaultImageGCHighThresholdPercent)
	if cfg.ImageGCHighThresholdPercent != nil {
		threshold = float64(*cfg.ImageGCHighThresholdPercent)
	}
	used, capacity := *fs.UsedBytes, *fs.CapacityBytes
	after := float64(used+NewImagesBytes) / float64(capacity) * 100
	if after <= threshold {
		return ""
	}
	return fmt.Sprintf("node %s: its %s would be %.1f%% full after the release's images load (%s used + %s of images, of %s), above its kubelet's image garbage collection threshold of %s%%, so the kubelet would remove images the upgrade needs; free at least %s on it (for example remove unused images)",
		node, which, after, gib(used), gib(NewImagesBytes), gib(capacity), strconv.FormatFloat(threshold, 'f', -1, 64), gib(bytesToFree(used, capacity, threshold)))
}

// imageFilesystem returns the filesystem the release's images land on: the runtime's
// image filesystem, else the node's root filesystem; nil when neither reports its used
// and capacity bytes.
func (n KubeletNodeStats) imageFilesystem() (*KubeletFsStats, string) {
	usable := func(fs *KubeletFsStats) bool {
		return fs != nil && fs.UsedBytes != nil && fs.CapacityBytes != nil && *fs.CapacityBytes > 0
	}
	if n.Runtime != nil && usable(n.Runtime.ImageFs) {
		return n.Runtime.ImageFs, "image filesystem"
	}
	if usable(n.Fs) {
		return n.Fs, "root filesystem (its kubelet reports no separate image filesystem)"
	}
	return nil, ""
}

// bytesToFree is how much used space must go for used + the new images to stay at or
// below threshold percent of capacity.
func bytesToFree(used, capacity uint64, threshold float64) uint64 {
	allowed := threshold / 100 * float64(capacity)
	need := float64(used+NewImagesBytes) - allowed
	if need <= 0 {
		return 0
	}
	return uint64(math.Ceil(need))
}

func gib(b uint64) string {
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// checkAPIServerCertificates reads the certificates the workload API server serves (a
// TLS handshake with the address of in.APIServer) and fails when the first of them to
// expire does so within the minimum number of days (fact 46). The handshake does not
// verify the chain: it reads dates, and an expired or soon-expiring certificate must be
// seen rather than refused. The toolkit dials every endpoint of default/kubernetes; this
// check dials the address the manager reaches the cluster by.
func checkAPIServerCertificates(ctx context.Context, in Input) Result {
	days := DefaultMinCertsExpirationDays
	if v, ok := in.Annotations[AnnotationMinCertsExpirationDays]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return failed("the UpgradePlan's annotation %s=%q is not a whole number of days above 0; fix it", AnnotationMinCertsExpirationDays, v)
		}
		days = n
	}
	if in.APIServer == nil {
		return failed("no address of the workload API server was given: cannot tell when its serving certificate expires")
	}
	certs, addr, err := servedCertificates(ctx, in.APIServer)
	if err != nil {
		return failed("cannot tell when the workload API server's serving certificate expires: %v", err)
	}
	first := certs[0]
	for _, c := range certs[1:] {
		if c.NotAfter.Before(first.NotAfter) {
			first = c
		}
	}
	deadline := in.Now.AddDate(0, 0, days)
	if first.NotAfter.Before(deadline) {
		when := "expires"
		if first.NotAfter.Before(in.Now) {
			when = "expired"
		}
		return failed("the certificate %q that the workload API server %s serves %s at %s, within %d days (the minimum; annotation %s changes it): rotate the cluster's certificates (rke2 certificate rotate on each server node) before upgrading",
			first.Subject.String(), addr, when, first.NotAfter.UTC().Format(time.RFC3339), days, AnnotationMinCertsExpirationDays)
	}
	return passed("the workload API server's certificates are valid until %s, beyond %d days", first.NotAfter.UTC().Format(time.RFC3339), days)
}

// servedCertificates returns the certificates the API server of cfg presents, and the
// address dialled.
func servedCertificates(ctx context.Context, cfg *rest.Config) ([]*x509.Certificate, string, error) {
	addr, serverName, err := apiServerAddress(cfg)
	if err != nil {
		return nil, "", err
	}
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, addr, fmt.Errorf("TLS configuration for %s: %w", addr, err)
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{} //nolint:gosec // the handshake only reads certificates' dates
	}
	tlsCfg.InsecureSkipVerify = true // reads dates; an expired certificate must be seen, not refused
	if tlsCfg.ServerName == "" {
		tlsCfg.ServerName = serverName
	}
	dialer := &tls.Dialer{NetDialer: &net.Dialer{Timeout: apiServerDialTimeout}, Config: tlsCfg}
	dctx, cancel := context.WithTimeout(ctx, apiServerDialTimeout)
	defer cancel()
	conn, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, addr, fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, addr, fmt.Errorf("%s presented no certificate", addr)
	}
	return certs, addr, nil
}

// apiServerAddress returns host:port of cfg's API server and the host name to ask for.
func apiServerAddress(cfg *rest.Config) (addr, serverName string, err error) {
	host := cfg.Host
	if host == "" {
		return "", "", fmt.Errorf("the workload API server's configuration has no host")
	}
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return "", "", fmt.Errorf("the workload API server's host %q: %w", cfg.Host, err)
	}
	if u.Scheme != "https" {
		return "", "", fmt.Errorf("the workload API server's host %q is not reached over https: it serves no certificate", cfg.Host)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	name := u.Hostname()
	if net.ParseIP(name) != nil {
		name = ""
	}
	return net.JoinHostPort(u.Hostname(), port), name, nil
}

// checkSingleReplicaVolumes fails on Longhorn volumes with a single replica (fact 47): an
// attached one (also attaching or being created) loses its only copy's availability
// while that node is upgraded; a detached one cannot be attached meanwhile, and fails too
// unless AnnotationSkipDetachedSingleReplicaVolumes accepts it. A cluster without
// Longhorn passes.
func checkSingleReplicaVolumes(ctx context.Context, in Input) Result {
	served, err := kube.KindServed(in.Workload, schema.GroupKind{Group: longhornv1.SchemeGroupVersion.Group, Kind: "Volume"}, longhornv1.SchemeGroupVersion.Version)
	if err != nil {
		return failed("%v", err)
	}
	if !served {
		return passed("Longhorn is not installed (the workload cluster serves no longhorn.io/v1beta2 Volume): no volume to check")
	}
	skipDetached, err := annotationTrue(in.Annotations, AnnotationSkipDetachedSingleReplicaVolumes)
	if err != nil {
		return failed("%v", err)
	}
	volumes := &longhornv1.VolumeList{}
	if err := in.Workload.List(ctx, volumes, client.InNamespace(longhorn.Namespace)); err != nil {
		return failed("list Longhorn volumes in %s: %v", longhorn.Namespace, err)
	}
	var active, detached []string
	for i := range volumes.Items {
		v := &volumes.Items[i]
		if v.Spec.NumberOfReplicas != 1 {
			continue
		}
		switch v.Status.State {
		case longhornv1.VolumeStateCreating, longhornv1.VolumeStateAttached, longhornv1.VolumeStateAttaching:
			active = append(active, describeVolume(v, true))
		default:
			detached = append(detached, describeVolume(v, false))
		}
	}
	sort.Strings(active)
	sort.Strings(detached)
	var problems []string
	if len(active) > 0 {
		problems = append(problems, fmt.Sprintf("Longhorn volumes in use have a single replica: %s; their data is unavailable while that replica's node is upgraded: give them at least 2 replicas (spec.numberOfReplicas) or stop their workloads", strings.Join(active, ", ")))
	}
	if len(detached) > 0 && !skipDetached {
		problems = append(problems, fmt.Sprintf("detached Longhorn volumes have a single replica: %s; they cannot be attached while that replica's node is upgraded: give them at least 2 replicas, or accept it with the annotation %s=true", strings.Join(detached, ", "), AnnotationSkipDetachedSingleReplicaVolumes))
	}
	if len(problems) > 0 {
		return failed("%s", strings.Join(problems, "; "))
	}
	if len(detached) > 0 {
		return passed("no Longhorn volume in use has a single replica; %d detached ones do, accepted by the annotation %s", len(detached), AnnotationSkipDetachedSingleReplicaVolumes)
	}
	return passed("no Longhorn volume has a single replica")
}

func describeVolume(v *longhornv1.Volume, withNode bool) string {
	s := v.Name
	var details []string
	if k := v.Status.KubernetesStatus; k.PVCName != "" {
		details = append(details, fmt.Sprintf("PVC %s/%s", k.Namespace, k.PVCName))
	}
	if withNode && v.Status.CurrentNodeID != "" {
		details = append(details, "on node "+v.Status.CurrentNodeID)
	}
	if withNode {
		details = append(details, string(v.Status.State))
	}
	if len(details) > 0 {
		s += " (" + strings.Join(details, ", ") + ")"
	}
	return s
}

// checkVMBackupsIdle fails while a Harvester VM backup or snapshot runs (neither ready to
// use nor failed) or a backup schedule is not suspended (facts 4a and 47): a backup
// reads volumes whose replicas the upgrade takes down, and a schedule would start new
// ones. A schedule counts as suspended once Harvester says so (status.suspended), not
// when asked to (spec.suspend). A cluster that serves neither kind passes.
func checkVMBackupsIdle(ctx context.Context, in Input) Result {
	var problems, checked []string
	backupsServed, err := kube.KindServed(in.Workload, harvesterapi.GroupVersion.WithKind("VirtualMachineBackup").GroupKind(), harvesterapi.GroupVersion.Version)
	if err != nil {
		return failed("%v", err)
	}
	if backupsServed {
		checked = append(checked, "VM backups")
		backups := &harvesterapi.VirtualMachineBackupList{}
		if err := in.Workload.List(ctx, backups); err != nil {
			return failed("list Harvester VM backups: %v", err)
		}
		var running []string
		for i := range backups.Items {
			b := &backups.Items[i]
			if !b.Running() {
				continue
			}
			progress := 0
			if b.Status != nil {
				progress = b.Status.Progress
			}
			running = append(running, fmt.Sprintf("%s/%s (%d%%)", b.Namespace, b.Name, progress))
		}
		if len(running) > 0 {
			sort.Strings(running)
			problems = append(problems, fmt.Sprintf("VM backups are running: %s; wait until they finish", strings.Join(running, ", ")))
		}
	}
	schedulesServed, err := kube.KindServed(in.Workload, harvesterapi.GroupVersion.WithKind("ScheduleVMBackup").GroupKind(), harvesterapi.GroupVersion.Version)
	if err != nil {
		return failed("%v", err)
	}
	if schedulesServed {
		checked = append(checked, "backup schedules")
		schedules := &harvesterapi.ScheduleVMBackupList{}
		if err := in.Workload.List(ctx, schedules); err != nil {
			return failed("list Harvester VM backup schedules: %v", err)
		}
		var active, suspending []string
		for i := range schedules.Items {
			s := &schedules.Items[i]
			switch {
			case !s.Spec.Suspend && !s.Status.Suspended:
				active = append(active, s.Namespace+"/"+s.Name)
			case !s.Status.Suspended:
				suspending = append(suspending, s.Namespace+"/"+s.Name)
			}
		}
		sort.Strings(active)
		sort.Strings(suspending)
		if len(active) > 0 {
			problems = append(problems, fmt.Sprintf("VM backup schedules are not suspended: %s; suspend them (spec.suspend: true) for the upgrade and resume them after it", strings.Join(active, ", ")))
		}
		if len(suspending) > 0 {
			problems = append(problems, fmt.Sprintf("VM backup schedules are asked to suspend but Harvester has not suspended them yet (status.suspended): %s; wait until it has", strings.Join(suspending, ", ")))
		}
	}
	switch {
	case len(problems) > 0:
		return failed("%s", strings.Join(problems, "; "))
	case len(checked) == 0:
		return passed("the workload cluster serves no Harvester VM backup kinds (harvesterhci.io/v1beta1 VirtualMachineBackup, ScheduleVMBackup): no backup to wait for")
	default:
		return passed("no %s running or active", strings.Join(checked, " or "))
	}
}

// checkNodesSchedulable fails when a node is not Ready or is cordoned (facts 4a and 47):
// the upgrade drains nodes one at a time onto the others, and a node already down or
// cordoned is either a problem to look at first or another operation under way.
func checkNodesSchedulable(ctx context.Context, in Input) Result {
	nodes := &corev1.NodeList{}
	if err := in.Workload.List(ctx, nodes); err != nil {
		return failed("list the workload cluster's nodes: %v", err)
	}
	if len(nodes.Items) == 0 {
		return failed("the workload cluster has no nodes")
	}
	var notReady, cordoned []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !kube.NodeReady(n) {
			notReady = append(notReady, n.Name)
		}
		if n.Spec.Unschedulable {
			cordoned = append(cordoned, n.Name)
		}
	}
	var problems []string
	if len(notReady) > 0 {
		problems = append(problems, fmt.Sprintf("nodes are not Ready: %s; bring them back first", strings.Join(notReady, ", ")))
	}
	if len(cordoned) > 0 {
		problems = append(problems, fmt.Sprintf("nodes are cordoned (spec.unschedulable): %s; finish what cordoned them and uncordon them (kubectl uncordon) first", strings.Join(cordoned, ", ")))
	}
	if len(problems) > 0 {
		return failed("%s", strings.Join(problems, "; "))
	}
	return passed("all %d nodes are Ready and schedulable", len(nodes.Items))
}
