package suc

import (
	"slices"
	"strings"
	"testing"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
)

func TestPlanName(t *testing.T) {
	nu := fixtures.NodeUpdate("node-1")
	got := PlanName(PlanKubernetes, nu)
	if !strings.HasPrefix(got, "capi-inplace-rke2-node-1-") || len(got) != len("capi-inplace-rke2-node-1-")+10 {
		t.Errorf("planName = %q, want capi-inplace-rke2-node-1-<10 hex digits>", got)
	}
	if got != PlanName(PlanKubernetes, fixtures.NodeUpdate("node-1")) {
		t.Errorf("plan name is not deterministic")
	}
	other := fixtures.NodeUpdate("node-1")
	other.UID = "5e2d1f7c-8a4b-4c3d-9e0f-1a2b3c4d5e6f"
	if PlanName(PlanKubernetes, other) == got {
		t.Errorf("two NodeUpdates of node-1 share the plan name %q", got)
	}
	if PlanName(PlanOS, nu) == got {
		t.Errorf("two kinds share the plan name %q", got)
	}

	long := strings.Repeat("n", 80)
	a, b := PlanName(PlanOS, fixtures.NodeUpdate(long)), PlanName(PlanOS, fixtures.NodeUpdate(long+"x"))
	if len(a) > 63 || len(b) > 63 {
		t.Errorf("names longer than a label key allows: %d, %d", len(a), len(b))
	}
	if a == b {
		t.Errorf("two long node names gave the same plan name %q", a)
	}
	for _, name := range []string{got, a, b, PlanName(PlanPreload, fixtures.NodeUpdate("node-1.example.com"))} {
		if errs := validation.IsQualifiedName("plan.upgrade.cattle.io/" + name); len(errs) > 0 {
			t.Errorf("SUC's node label for plan %q is not a valid label key: %v", name, errs)
		}
	}
}

func TestPlanForNodeSelectsOnlyThatNode(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-2")
	for _, kind := range []PlanKind{PlanPreload, PlanDrain, PlanKubernetes, PlanOS, PlanUnguard} {
		p := NodePlan(cfg, nu, kind, "http://repo.example")
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if !sel.Matches(labels.Set{corev1.LabelHostname: "node-2"}) || sel.Matches(labels.Set{corev1.LabelHostname: "node-1"}) {
			t.Errorf("%s: selector %s does not select exactly node-2", kind, sel)
		}
		if p.Spec.Concurrency != 1 || p.Namespace != "cattle-system" || p.Spec.ServiceAccountName != "system-upgrade-controller" {
			t.Errorf("%s: %+v", kind, p.ObjectMeta)
		}
		if p.Labels[LabelNodeUpdate] != string(nu.UID) || p.Labels[LabelPlanKind] != string(kind) {
			t.Errorf("%s: labels %v", kind, p.Labels)
		}
	}
}

func TestKubernetesPlan(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	p := NodePlan(cfg, nu, PlanKubernetes, "http://repo.example")
	if p.Spec.Version != "v1.33.3+rke2r1" || p.Spec.Upgrade.Image != "rancher/rke2-upgrade:v1.33.3-rke2r1" {
		t.Errorf("upgrade %s at %s: the image must carry the munged version as its tag", p.Spec.Upgrade.Image, p.Spec.Version)
	}
	if p.Spec.Cordon || p.Spec.Drain != nil {
		t.Errorf("cordon %v drain %+v: the node is drained once, by the drain Plan, and SUC would uncordon after a cordoning Plan", p.Spec.Cordon, p.Spec.Drain)
	}
	expectPreDrainSettings(t, p)
	if p.Spec.JobActiveDeadlineSecs == nil || *p.Spec.JobActiveDeadlineSecs != 3600 {
		t.Errorf("jobActiveDeadlineSecs %v, want the step's 1h", p.Spec.JobActiveDeadlineSecs)
	}
	cfg.Spec.Images.RKE2Upgrade = "mirror.example/rke2-upgrade@sha256:0123"
	if p := NodePlan(cfg, nu, PlanKubernetes, ""); p.Spec.Upgrade.Image != "mirror.example/rke2-upgrade@sha256:0123" {
		t.Errorf("a digested image is used as given, got %s", p.Spec.Upgrade.Image)
	}
}

func TestDrainPlan(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	cfg.Spec.Images.Kubectl = "rancher/kubectl:v1.30.3"
	cfg.Spec.Drain = harvesterv1.Drain{Force: true, GracePeriodSeconds: ptr.To[int32](30), Timeout: ptr.To(intstr.FromInt32(900))}
	p := NodePlan(cfg, nu, PlanDrain, "http://repo.example")
	if p.Spec.Cordon || p.Spec.Drain != nil {
		t.Errorf("cordon %v drain %+v: SUC uncordons after a Plan that cordons or drains", p.Spec.Cordon, p.Spec.Drain)
	}
	if p.Spec.Prepare != nil {
		t.Errorf("prepare %+v: the updater evacuates virtual machines through KubeVirt's API, not Harvester's pre-drain script (it needs Harvester's Upgrade object)", p.Spec.Prepare)
	}
	want := "drain node-1 --pod-selector !upgrade.cattle.io/controller --ignore-daemonsets --delete-emptydir-data --force --timeout 15m0s --grace-period 30"
	if got := strings.Join(p.Spec.Upgrade.Args, " "); got != want || p.Spec.Upgrade.Image != "rancher/kubectl:v1.30.3" {
		t.Errorf("upgrade %s %q, want %q: 900 in the HarvesterUpgrader is seconds", p.Spec.Upgrade.Image, got, want)
	}
}

func TestDrainTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   intstr.IntOrString
		want time.Duration
		err  string
	}{
		{in: intstr.FromInt32(900), want: 15 * time.Minute},
		{in: intstr.FromString("1h30m"), want: 90 * time.Minute},
		{in: intstr.FromInt32(0), err: "drain.timeout 0 is not a positive number of seconds"},
		{in: intstr.FromString("900"), err: `drain.timeout "900" is not a positive duration such as 15m`},
		{in: intstr.FromString("-5m"), err: `drain.timeout "-5m" is not a positive duration such as 15m`},
	} {
		got, err := DrainTimeout(&tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%v: error %v, want %q", tc.in.String(), err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %v, %v; want %v", tc.in.String(), got, err, tc.want)
		}
	}
}

func TestOSPlan(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	p := NodePlan(cfg, nu, PlanOS, "http://repo.example")
	if p.Spec.Version != "v1.6.0" {
		t.Errorf("version %q, want the release", p.Spec.Version)
	}
	// Harvester's post-drain removes the RKE2 archives, then installs the OS (fact 26).
	for _, c := range []struct {
		name string
		got  *sucv1.ContainerSpec
		args string
		sc   *corev1.SecurityContext
	}{
		{"prepare", p.Spec.Prepare, "node remove-archives --host-root=/host --repository-url=http://repo.example --version=v1.6.0",
			&corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}},
		{"upgrade", p.Spec.Upgrade, "node os-upgrade --host-root=/host --repository-url=http://repo.example --version=v1.6.0",
			&corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)}},
	} {
		if c.got == nil {
			t.Fatalf("%s: no container", c.name)
		}
		if c.got.Image != fixtures.NodeImage || strings.Join(c.got.Command, " ") != "/capi-inplace" || strings.Join(c.got.Args, " ") != c.args {
			t.Errorf("%s runs %s %v %v, want %s /capi-inplace %s", c.name, c.got.Image, c.got.Command, c.got.Args, fixtures.NodeImage, c.args)
		}
		// SUC honours a container's securityContext as given (fact 37): the image's
		// user 65532 must be replaced by root, or the node program cannot chroot.
		if !equality.Semantic.DeepEqual(c.got.SecurityContext, c.sc) {
			t.Errorf("%s securityContext %+v, want %+v", c.name, c.got.SecurityContext, c.sc)
		}
		if len(c.got.Volumes) != 0 {
			t.Errorf("%s volumes %+v: SUC mounts the host's / at /host itself; another host-root makes the Job invalid", c.name, c.got.Volumes)
		}
	}
	if p.Spec.Cordon || p.Spec.Drain != nil {
		t.Errorf("the OS plan must not cordon: SUC would uncordon the node when it completes")
	}
	if *p.Spec.JobActiveDeadlineSecs != 2700 {
		t.Errorf("jobActiveDeadlineSecs %d, want the OS step's 45m", *p.Spec.JobActiveDeadlineSecs)
	}
}

func TestPreloadPlan(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	p := NodePlan(cfg, nu, PlanPreload, "http://capi-inplace-repo-v1-6-0.harvester-system.svc")
	if p.Spec.Cordon || p.Spec.Drain != nil || p.Spec.Prepare != nil {
		t.Errorf("the preload plan must leave the node in service and run one container")
	}
	u := p.Spec.Upgrade
	want := "node preload --host-root=/host --repository-url=http://capi-inplace-repo-v1-6-0.harvester-system.svc --version=v1.6.0"
	if u.Image != fixtures.NodeImage || strings.Join(u.Command, " ") != "/capi-inplace" || strings.Join(u.Args, " ") != want {
		t.Errorf("preload runs %s %v %v, want %s /capi-inplace %s", u.Image, u.Command, u.Args, fixtures.NodeImage, want)
	}
	if sc := u.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("securityContext %+v: preload imports into the host's containerd, privileged and as root", sc)
	}
	if p.Spec.Version != "v1.6.0" || *p.Spec.JobActiveDeadlineSecs != 1800 {
		t.Errorf("version %q deadline %d", p.Spec.Version, *p.Spec.JobActiveDeadlineSecs)
	}
}

// expectPreDrainSettings checks that a Plan's prepare writes the release's pre-drain RKE2
// settings, right before RKE2 restarts at the release (harvester-release-steps.md fact
// 49): the node program, files only, as root, no privilege.
func expectPreDrainSettings(t *testing.T, p *sucv1.Plan) {
	t.Helper()
	pre := p.Spec.Prepare
	if pre == nil || pre.Image != fixtures.NodeImage || strings.Join(pre.Args, " ") != "node rke2-settings --stage=pre-drain --host-root=/host --repository-url=http://repo.example --version=v1.6.0" ||
		pre.SecurityContext == nil || pre.SecurityContext.Privileged != nil || pre.SecurityContext.RunAsUser == nil || *pre.SecurityContext.RunAsUser != 0 {
		t.Errorf("prepare %+v: want the node program's rke2-settings --stage=pre-drain as root", pre)
	}
}

// On the v1.6 -> v1.7 hop the os Plan runs os-upgrade in the release's upgrade image, as
// Harvester runs upgrade_os there, so that the libraries bound for the release's
// elemental are that image's (harvester-release-steps.md fact 54.4): prepare (the node
// image, an init container before upgrade in the same pod, suc.md fact 34) places the
// node program on the host, which upgrade executes from the host root SUC mounts at /host
// (fact 31). Other hops keep the node image.
func TestOSPlanOnTheHopThatBindsTheReleasesLibraries(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	cfg.Spec.Release.Version = "v1.7.1"
	cfg.Spec.Images.Upgrade = "rancher/harvester-upgrade"
	p := NodePlan(cfg, nu, PlanOS, "http://repo.example")
	WithPreviousVersion(p, "v1.6.1", cfg.Spec.Images.Upgrade)
	if got, want := strings.Join(p.Spec.Prepare.Args, " "), "node remove-archives --host-root=/host --repository-url=http://repo.example --version=v1.7.1 --place-program=/usr/local/upgrade_tmp/capi-inplace"; got != want || p.Spec.Prepare.Image != fixtures.NodeImage {
		t.Errorf("prepare runs %s %q, want %s %q", p.Spec.Prepare.Image, got, fixtures.NodeImage, want)
	}
	up := p.Spec.Upgrade
	if up.Image != "rancher/harvester-upgrade:v1.7.1" || strings.Join(up.Command, " ") != "/host/usr/local/upgrade_tmp/capi-inplace" {
		t.Errorf("upgrade runs %s %v, want the release's upgrade image running the placed program", up.Image, up.Command)
	}
	if got, want := strings.Join(up.Args, " "), "node os-upgrade --host-root=/host --repository-url=http://repo.example --version=v1.7.1 --previous-version=v1.6.1 --glibc-libraries=container"; got != want {
		t.Errorf("upgrade args %q, want %q", got, want)
	}
	if !equality.Semantic.DeepEqual(up.SecurityContext, PrivilegedRoot()) {
		t.Errorf("upgrade securityContext %+v, want privileged root", up.SecurityContext)
	}

	for _, tc := range []struct{ previous, release, upgradeImage string }{
		{"v1.7.1", "v1.8.1", "rancher/harvester-upgrade"},     // no library bind on v1.7 -> v1.8
		{"v1.7.0", "v1.7.1", "rancher/harvester-upgrade"},     // a patch hop
		{"v1.6.1-rc2", "v1.7.1", "rancher/harvester-upgrade"}, // the release's guard does not match
		{"v1.6.1", "v1.7.1", ""},                              // no upgrade image configured
	} {
		cfg.Spec.Release.Version = tc.release
		p := NodePlan(cfg, nu, PlanOS, "http://repo.example")
		WithPreviousVersion(p, tc.previous, tc.upgradeImage)
		if p.Spec.Upgrade.Image != fixtures.NodeImage || strings.Join(p.Spec.Upgrade.Command, " ") != "/capi-inplace" ||
			slices.ContainsFunc(p.Spec.Prepare.Args, func(a string) bool { return strings.HasPrefix(a, "--place-program") }) {
			t.Errorf("%s -> %s (upgrade image %q): upgrade runs %s %v, prepare %q; want the node image's own program", tc.previous, tc.release, tc.upgradeImage, p.Spec.Upgrade.Image, p.Spec.Upgrade.Command, p.Spec.Prepare.Args)
		}
	}
}
