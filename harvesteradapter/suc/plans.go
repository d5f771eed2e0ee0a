package suc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
)

// planKind is one of the per-node Plans the adapter creates.
type PlanKind string

const (
	// planPreload pulls the release's images onto the node from the repository.
	PlanPreload PlanKind = "preload"
	// planDrain drains the node (kubectl drain), once, after the updater cordoned it and
	// evacuated its virtual machines.
	PlanDrain PlanKind = "drain"
	// planKubernetes upgrades RKE2 on the node.
	PlanKubernetes PlanKind = "rke2"
	// planOS installs the release's operating system and reboots the node.
	PlanOS PlanKind = "os"
	// PlanUnguard removes the restart guard of RestartGuardPlan from the node
	// (`rke2-restart-guard --remove`), so that the next machine plan Rancher gives it
	// restarts RKE2 again: Harvester's recover_rancher_system_agent at the start of a
	// node's pre-drain (shared/facts/harvester-release-steps.md fact 44).
	PlanUnguard PlanKind = "unguard"
	// PlanReguard puts the restart guard back on the node (`rke2-restart-guard`) when
	// its NodeUpdate is aborted after PlanUnguard took it off and before Rancher was let
	// restart RKE2 there: with the guard off, the machine plan Rancher gives the node
	// once the plan's hooks are gone would restart RKE2 outside any NodeUpdate.
	PlanReguard PlanKind = "reguard"
	// PlanRKE2Restart starts the RKE2 that rancher-system-agent installed on the node
	// under the restart guard (`rke2-restart`: the guard taken off, rke2-server or
	// rke2-agent restarted), for a node whose Rancher plan is applied at the target while
	// its kubelet still runs the old version: Rancher counts that plan as applied and
	// never restarts it (harvester-release-steps.md facts 12 and 61). As for
	// PlanUnguard, the release's pre-drain settings come first.
	PlanRKE2Restart PlanKind = "rke2-restart"
)

// Labels the adapter puts on what it creates in the workload cluster, so that it finds
// (and cleans up) exactly the objects of one NodeUpdate.
const (
	// LabelNodeUpdate is the UID of the NodeUpdate a Plan belongs to.
	LabelNodeUpdate = "harvester.inplace.cluster.x-k8s.io/node-update"
	// LabelPlanKind is the kind of Plan: preload, drain, rke2, os, unguard, reguard or
	// rke2-restart for
	// a node's Plans; image-cleanup, restart-guard, manifest-skip or manifest-unskip for
	// the Plans of every node.
	LabelPlanKind = "harvester.inplace.cluster.x-k8s.io/plan-kind"
	// AnnotationNode names the node a Plan is for.
	AnnotationNode = "harvester.inplace.cluster.x-k8s.io/node"
	// AnnotationBootID is, on a node's os Plan, the node's status.nodeInfo.bootID when
	// the Plan was created: the boot the reboot armed by the Plan's Job ends. Written
	// once, at creation (Sync never changes a Plan's annotations).
	AnnotationBootID = "harvester.inplace.cluster.x-k8s.io/boot-id"
)

// hostRoot is where SUC mounts the node's / in every container of a Plan's Job
// (shared/facts/suc.md, facts 30 and 31), the node program's --host-root.
const HostRoot = "/host"

// nodeProgram is the container that runs one node program subcommand (nodeprogram/) from
// the node image: the subcommand's words, the host root SUC mounts, the repository the
// node reads the release from and the release it must hold (the subcommand refuses a
// repository of another release). The node program takes no node name: it works on the
// host it runs on, and names itself by SUC's SYSTEM_UPGRADE_POD_NAME.
func NodeProgram(image string, subcommand []string, repositoryURL, release string, sc *corev1.SecurityContext) *sucv1.ContainerSpec {
	args := append(append([]string{"node"}, subcommand...),
		"--host-root="+HostRoot, "--repository-url="+repositoryURL, "--version="+release)
	return &sucv1.ContainerSpec{Image: image, Command: []string{nodeprogram.Binary}, Args: args, SecurityContext: sc}
}

// hostRootUser is the security context of a node program container that only changes
// files on the host: root, which the image's user 65532 is not. SUC honours a Plan
// container's securityContext as given (fact 37), so the user must be said here.
func HostRootUser() *corev1.SecurityContext {
	return &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
}

// privilegedRoot is the security context of a node program container that mounts, runs
// host tools against host sockets and devices (containerd, loop devices, systemd):
// privileged, and root. Privileged alone keeps the image's user 65532, which can neither
// chroot nor mount.
func PrivilegedRoot() *corev1.SecurityContext {
	return &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)}
}

// planName is the deterministic name of one NodeUpdate's Plan of one kind:
// capi-inplace-<kind>-<node>-<hash>, the hash taken of the node and the NodeUpdate's UID
// (metadata.uid of the NodeUpdate object).
// The NodeUpdate is in the name because SUC deletes a running Job when its Plan changes
// (shared/facts/suc.md, facts 43 and 49): with Plans named per node only, a second
// NodeUpdate for the same node, or one recreated under the same name, would rewrite the
// first one's Plan and kill its upgrade half-way. The UID, not the name, so that a
// recreated NodeUpdate never meets the Plans of its predecessor. SUC labels the node
// plan.upgrade.cattle.io/<plan name>, so the name must fit a label key's 63 characters
// (facts 25, 46): a long node name is shortened, and the hash, which covers it whole,
// keeps names apart. The kind comes first; test/scenario reads it from there.
func PlanName(kind PlanKind, nu *inplacev1.NodeUpdate) string {
	sum := sha256.Sum256([]byte(nu.Spec.NodeName + "/" + string(nu.UID)))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	base := fmt.Sprintf("capi-inplace-%s-%s", kind, nu.Spec.NodeName)
	if len(base)+len(suffix) > 63 {
		base = strings.TrimRight(base[:63-len(suffix)], "-.")
	}
	return base + suffix
}

// planForNode builds the SUC Plan of one kind for the node of a NodeUpdate, from the
// configuration fixed when the node started (see package config). The Plan selects that
// node only (kubernetes.io/hostname), runs on one node at a time, and says in its labels
// which NodeUpdate it belongs to. It is written for SUC as it is (shared/facts/suc.md):
//   - no volume: SUC mounts the host's / at /host in every container itself (facts 30,
//     31), and a second host-root makes the Job invalid;
//   - every image tagged here (fact 35: SUC tags an untagged prepare or upgrade image
//     with the Plan's version);
//   - jobActiveDeadlineSecs is the step's timeout (fact 36: SUC's default is 600 s);
//   - neither cordon nor drain: the updater cordons the node itself, and the drain Plan
//     runs kubectl drain as its upgrade container, because SUC uncordons a node when a
//     Plan that cordons or drains completes (fact 46), which would put the node back in
//     service between its drain and its OS upgrade.
func NodePlan(cfg *harvesterv1.HarvesterUpgrader, nu *inplacev1.NodeUpdate, kind PlanKind, repositoryURL string) *sucv1.Plan {
	spec := cfg.Spec
	release := spec.Release.Version
	env := []corev1.EnvVar{
		{Name: "UPGRADE_REPO_URL", Value: repositoryURL},
		{Name: "HARVESTER_UPGRADE_NODE_NAME", Value: nu.Spec.NodeName},
		{Name: "HARVESTER_RELEASE", Value: release},
		{Name: "KUBERNETES_VERSION", Value: nu.Spec.Version},
	}
	// The node image, resolved and tagged with the manager's version before the
	// snapshot was taken (config.Reader.ResolveImages).
	harvesterImage := spec.Images.Node
	plan := &sucv1.Plan{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PlanName(kind, nu),
			Namespace:   spec.SystemUpgradeController.Namespace,
			Labels:      map[string]string{LabelNodeUpdate: string(nu.UID), LabelPlanKind: string(kind)},
			Annotations: map[string]string{AnnotationNode: nu.Spec.NodeName},
		},
		Spec: sucv1.PlanSpec{
			Concurrency:           1,
			ServiceAccountName:    spec.SystemUpgradeController.ServiceAccountName,
			JobActiveDeadlineSecs: ptr.To(DeadlineSeconds(PlanTimeout(kind, spec.Timeouts))),
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpIn, Values: []string{nu.Spec.NodeName},
			}}},
			// Harvester nodes carry control plane and etcd taints; the upgrade must run there.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}

	switch kind {
	case PlanPreload:
		plan.Spec.Version = release
		plan.Spec.Upgrade = NodeProgram(harvesterImage, []string{"preload"}, repositoryURL, release, PrivilegedRoot())
	case PlanDrain:
		// Only kubectl drain: the updater evacuated the virtual machines through
		// KubeVirt's API before (EvacuateVMs). Harvester's pre-drain script cannot do it
		// for us, it needs Harvester's own Upgrade object (harvester-node-upgrade.md,
		// fact 32). kubectl needs no privilege; without a security context SUC would run
		// it privileged (fact 37). With drain off there is no drain Plan (skipDrain).
		plan.Spec.Version = release
		plan.Spec.Upgrade = &sucv1.ContainerSpec{Image: spec.Images.Kubectl, Args: DrainArgs(spec.Drain, nu.Spec.NodeName), SecurityContext: &corev1.SecurityContext{}}
	case PlanKubernetes:
		// Harvester's pre-drain settings (harvester-release-steps.md fact 49: the canal
		// leftover removed, RKE2's snapshot charts disabled) right before RKE2 restarts at
		// the release, which applies them; files only, as root.
		plan.Spec.Version = nu.Spec.Version
		plan.Spec.Prepare = NodeProgram(harvesterImage, []string{"rke2-settings", "--stage=pre-drain"}, repositoryURL, release, HostRootUser())
		plan.Spec.Upgrade = &sucv1.ContainerSpec{Image: ImageWithTag(spec.Images.RKE2Upgrade, MungeVersion(nu.Spec.Version)), Env: env}
	case PlanOS:
		// Harvester's post-drain, after RKE2 is upgraded: remove the RKE2 archives preload
		// placed (fact 26.4), then (os-upgrade) write the release's post-drain RKE2
		// settings (fact 51) and install the OS. os-upgrade exits once the reboot is
		// scheduled on the host a minute later, so SUC records the Job as succeeded and
		// labels the node first (fact 28's order); the OS step then waits for the node
		// to come back Ready on the release.
		plan.Spec.Version = release
		plan.Spec.Prepare = NodeProgram(harvesterImage, []string{"remove-archives"}, repositoryURL, release, HostRootUser())
		plan.Spec.Upgrade = NodeProgram(harvesterImage, []string{"os-upgrade"}, repositoryURL, release, PrivilegedRoot())
		if !releases.UpgradesOS(cfg) {
			// upgradeOS false: the rest of Harvester's post-drain all the same
			// (upgrade_node.sh command_post_drain runs the settings and
			// clean_rke2_archives whether or not upgrade_os then installs anything): the
			// archives removed, the post-drain settings written, no OS installed and no
			// reboot. They take effect at RKE2's next start.
			plan.Spec.Upgrade = NodeProgram(harvesterImage, []string{"rke2-settings", "--stage=post-drain"}, repositoryURL, release, HostRootUser())
		}
	case PlanUnguard:
		// Privileged and root, as os-upgrade: it runs the host's systemctl, which talks
		// to the host's systemd. Where Rancher restarts RKE2, this is the node's
		// pre-drain: the release's pre-drain settings first, as for the rke2 Plan.
		plan.Spec.Version = release
		plan.Spec.Prepare = NodeProgram(harvesterImage, []string{"rke2-settings", "--stage=pre-drain"}, repositoryURL, release, HostRootUser())
		plan.Spec.Upgrade = NodeProgram(harvesterImage, []string{"rke2-restart-guard", "--remove"}, repositoryURL, release, PrivilegedRoot())
	case PlanReguard:
		plan.Spec.Version = release
		plan.Spec.Upgrade = NodeProgram(harvesterImage, []string{"rke2-restart-guard"}, repositoryURL, release, PrivilegedRoot())
	case PlanRKE2Restart:
		plan.Spec.Version = release
		plan.Spec.Prepare = NodeProgram(harvesterImage, []string{"rke2-settings", "--stage=pre-drain"}, repositoryURL, release, HostRootUser())
		plan.Spec.Upgrade = NodeProgram(harvesterImage, []string{"rke2-restart"}, repositoryURL, release, PrivilegedRoot())
	}
	return plan
}

// WithPreviousVersion gives the os Plan's os-upgrade the Harvester release the nodes ran
// when the upgrade started (the UpgradePlan's status.previousVersion), on which the
// release keys its node migrations (harvester-release-steps.md fact 53: the v1.6 to v1.7
// hop's NetworkManager and hostname migrations). Other Plans, and an empty version, are
// left as they are.
//
// On a hop whose node migrations include the GLIBC library bind (v1.6 to v1.7, fact
// 54.4: the release's elemental, built for SL Micro 6.1, cannot run on a SLE Micro 5.5
// host), the os Plan takes Harvester's own shape for it, so that the libraries bound are
// the release's: the upgrade container runs the release's upgrade image, upgradeImage
// tagged with the release (rancher/harvester-upgrade:<release>, harvester-node-upgrade.md
// fact 3), whose /lib64 (and /lib) upgrade_os binds over the host's, executing a copy of
// this node program that the prepare container (the node image, remove-archives
// --place-program) put on the host before it. SUC runs prepare as an init container
// before upgrade in the same pod (shared/facts/suc.md fact 34) and mounts the host's / at
// /host in both (fact 31), so the copy is at /host<ProgramOnHost> in the upgrade
// container. upgradeImage empty leaves the Plan as it is.
func WithPreviousVersion(plan *sucv1.Plan, previous, upgradeImage string) {
	if previous == "" || plan.Labels[LabelPlanKind] != string(PlanOS) || plan.Spec.Upgrade == nil || !slices.Contains(plan.Spec.Upgrade.Args, "os-upgrade") {
		return
	}
	plan.Spec.Upgrade.Args = append(plan.Spec.Upgrade.Args, "--previous-version="+previous)
	if upgradeImage == "" || plan.Spec.Prepare == nil || !slices.Contains(releases.NodeMigrations(previous, plan.Spec.Version), releases.BindLibrariesMigration) {
		return
	}
	plan.Spec.Prepare.Args = append(plan.Spec.Prepare.Args, "--place-program="+ProgramOnHost)
	plan.Spec.Upgrade.Image = ImageWithTag(upgradeImage, plan.Spec.Version)
	plan.Spec.Upgrade.Command = []string{HostRoot + ProgramOnHost}
	plan.Spec.Upgrade.Args = append(plan.Spec.Upgrade.Args, "--glibc-libraries=container")
}

// PreviousVersionOf is the previous version an os Plan was made with
// (WithPreviousVersion), "" when none.
func PreviousVersionOf(plan *sucv1.Plan) string {
	if plan == nil || plan.Spec.Upgrade == nil {
		return ""
	}
	for _, a := range plan.Spec.Upgrade.Args {
		if v, ok := strings.CutPrefix(a, "--previous-version="); ok {
			return v
		}
	}
	return ""
}

// ProgramOnHost is where the os Plan's prepare container places the node program on the
// host for an upgrade container of the release's upgrade image to run
// (WithPreviousVersion): beside the copy of the release's elemental os-upgrade runs from
// the same directory (its --work-dir).
const ProgramOnHost = "/usr/local/upgrade_tmp/capi-inplace"

// planTimeout is the timeout of the step a Plan kind belongs to.
func PlanTimeout(kind PlanKind, t harvesterv1.Timeouts) time.Duration {
	switch kind {
	case PlanPreload:
		return harvesterv1.DurationOr(t.ImagePreload, harvesterv1.DefaultImagePreloadTimeout)
	case PlanDrain:
		return harvesterv1.DurationOr(t.Drain, harvesterv1.DefaultDrainTimeout)
	case PlanKubernetes, PlanRKE2Restart:
		return harvesterv1.DurationOr(t.KubernetesUpgrade, harvesterv1.DefaultKubernetesUpgradeTimeout)
	case PlanUnguard, PlanReguard:
		return restartGuardTimeout
	default:
		return harvesterv1.DurationOr(t.OSUpgrade, harvesterv1.DefaultOSUpgradeTimeout)
	}
}

// deadlineSeconds is a timeout in whole seconds, rounded up, and at least one: SUC reads
// 0 as "no deadline" and a negative value as its own default (fact 36).
func DeadlineSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		return 1
	}
	return s
}

// mungeVersion is the version as SUC writes it into tags and labels: '+' becomes '-'
// (fact 14), so v1.33.3+rke2r1 is the tag v1.33.3-rke2r1.
func MungeVersion(v string) string { return strings.ReplaceAll(v, "+", "-") }

// imageWithTag tags an image that has neither tag nor digest; one that has either is
// used as given.
func ImageWithTag(image, tag string) string {
	if strings.Contains(image, "@") {
		return image
	}
	if strings.Contains(image[strings.LastIndex(image, "/")+1:], ":") {
		return image
	}
	return image + ":" + tag
}

// LabelSUCController is the label SUC puts on the pods of its Jobs (facts 25, 39): the drain
// leaves them out.
const LabelSUCController = "upgrade.cattle.io/controller"

// drainArgs are the kubectl drain arguments of the drain Plan, nil when draining is off.
// They are SUC's own (facts 39 to 41), the timeout always a duration: never evict SUC's
// pods (the drain's own among them), DaemonSet pods stay, emptyDir data goes unless
// told otherwise.
func DrainArgs(d harvesterv1.Drain, node string) []string {
	if d.Enabled != nil && !*d.Enabled {
		return nil
	}
	args := []string{"drain", node, "--pod-selector", "!" + LabelSUCController}
	if d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets {
		args = append(args, "--ignore-daemonsets")
	}
	if d.DeleteEmptyDirData == nil || *d.DeleteEmptyDirData {
		args = append(args, "--delete-emptydir-data")
	}
	if d.Force {
		args = append(args, "--force")
	}
	if t, err := DrainTimeout(d.Timeout); err == nil && t > 0 {
		args = append(args, "--timeout", t.String())
	}
	if d.GracePeriodSeconds != nil {
		args = append(args, "--grace-period", fmt.Sprint(*d.GracePeriodSeconds))
	}
	return args
}

// drainTimeout reads the HarvesterUpgrader's drain.timeout: a number is seconds, a string
// a Go duration. 0 means none was given.
func DrainTimeout(t *intstr.IntOrString) (time.Duration, error) {
	if t == nil {
		return 0, nil
	}
	if t.Type == intstr.Int {
		if t.IntVal < 1 {
			return 0, fmt.Errorf("drain.timeout %d is not a positive number of seconds", t.IntVal)
		}
		return time.Duration(t.IntVal) * time.Second, nil
	}
	d, err := time.ParseDuration(t.StrVal)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("drain.timeout %q is not a positive duration such as 15m", t.StrVal)
	}
	return d, nil
}
