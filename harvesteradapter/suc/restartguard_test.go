package suc

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
)

func TestRestartGuardPlan(t *testing.T) {
	cfg := fixtures.Upgrader()
	p := RestartGuardPlan(cfg, "capi-inplace-restart-guard-hv", "http://repo.example")

	if p.Name != "capi-inplace-restart-guard-hv" || p.Namespace != "cattle-system" || p.Labels[LabelPlanKind] != "restart-guard" {
		t.Errorf("plan %s/%s labels %v", p.Namespace, p.Name, p.Labels)
	}
	if p.Spec.NodeSelector != nil {
		t.Errorf("node selector %+v: the caller sets it", p.Spec.NodeSelector)
	}
	if p.Spec.Concurrency != 10 {
		t.Errorf("concurrency %d, want Harvester's 10 (fact 12)", p.Spec.Concurrency)
	}
	if p.Spec.Version != "v1.6.0" || p.Spec.ServiceAccountName != "system-upgrade-controller" {
		t.Errorf("version %q service account %q", p.Spec.Version, p.Spec.ServiceAccountName)
	}
	if d := p.Spec.JobActiveDeadlineSecs; d == nil || *d != 600 {
		t.Errorf("jobActiveDeadlineSecs %v, want 10 minutes", d)
	}
	if len(p.Spec.Tolerations) != 1 || p.Spec.Tolerations[0].Operator != corev1.TolerationOpExists || p.Spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v: every node, control plane and etcd ones too", p.Spec.Tolerations)
	}
	if p.Spec.Cordon || p.Spec.Drain != nil || p.Spec.Prepare != nil {
		t.Errorf("cordon %v drain %+v prepare %+v: restarting the system agent needs neither", p.Spec.Cordon, p.Spec.Drain, p.Spec.Prepare)
	}

	up := p.Spec.Upgrade
	want := "node rke2-restart-guard --host-root=/host --repository-url=http://repo.example --version=v1.6.0"
	if up == nil || up.Image != fixtures.NodeImage || strings.Join(up.Command, " ") != "/capi-inplace" || strings.Join(up.Args, " ") != want {
		t.Fatalf("upgrade %+v, want %s /capi-inplace %s", up, fixtures.NodeImage, want)
	}
	// systemctl talks to the host's systemd.
	if sc := (&corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)}); !equality.Semantic.DeepEqual(up.SecurityContext, sc) {
		t.Errorf("securityContext %+v, want %+v", up.SecurityContext, sc)
	}
	if len(up.Volumes) != 0 {
		t.Errorf("volumes %+v: SUC mounts the host's / at /host itself", up.Volumes)
	}
}

func TestUnguardPlan(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	p := NodePlan(cfg, nu, PlanUnguard, "http://repo.example")
	if !strings.HasPrefix(p.Name, "capi-inplace-unguard-node-1-") || p.Labels[LabelPlanKind] != "unguard" {
		t.Errorf("name %q labels %v", p.Name, p.Labels)
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
	if err != nil || sel.String() != "kubernetes.io/hostname in (node-1)" {
		t.Errorf("selector %v, %v: node-1 only", sel, err)
	}
	if p.Spec.Version != "v1.6.0" || p.Spec.Concurrency != 1 {
		t.Errorf("version %q concurrency %d", p.Spec.Version, p.Spec.Concurrency)
	}
	if p.Spec.Cordon || p.Spec.Drain != nil {
		t.Errorf("cordon %v drain %+v: removing the guard leaves the node in service", p.Spec.Cordon, p.Spec.Drain)
	}
	expectPreDrainSettings(t, p)
	up := p.Spec.Upgrade
	want := "node rke2-restart-guard --remove --host-root=/host --repository-url=http://repo.example --version=v1.6.0"
	if up == nil || up.Image != fixtures.NodeImage || strings.Join(up.Command, " ") != "/capi-inplace" || strings.Join(up.Args, " ") != want {
		t.Fatalf("upgrade %+v, want %s /capi-inplace %s", up, fixtures.NodeImage, want)
	}
	if sc := (&corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)}); !equality.Semantic.DeepEqual(up.SecurityContext, sc) {
		t.Errorf("securityContext %+v, want %+v as os-upgrade's", up.SecurityContext, sc)
	}
	if d := p.Spec.JobActiveDeadlineSecs; d == nil || *d != 600 {
		t.Errorf("jobActiveDeadlineSecs %v, want 10 minutes", d)
	}
	// Fixed: the step timeouts are about other work.
	long := harvesterv1.Timeouts{ImagePreload: &metav1.Duration{Duration: 2 * time.Hour}, OSUpgrade: &metav1.Duration{Duration: 3 * time.Hour}}
	if got := PlanTimeout(PlanUnguard, long); got != 10*time.Minute {
		t.Errorf("PlanTimeout(unguard) = %s, want 10m whatever the step timeouts", got)
	}
}

func TestUnguardClusterPlan(t *testing.T) {
	cfg := fixtures.Upgrader()
	p := UnguardPlan(cfg, "capi-inplace-unguard-v1-6-0-abc", "http://repo.example")
	if p.Name != "capi-inplace-unguard-v1-6-0-abc" || p.Labels[LabelPlanKind] != string(PlanUnguard) {
		t.Errorf("name %q labels %v", p.Name, p.Labels)
	}
	if p.Spec.NodeSelector != nil {
		t.Errorf("selector %v: the caller names the nodes", p.Spec.NodeSelector)
	}
	if p.Spec.Prepare != nil || p.Spec.Cordon || p.Spec.Drain != nil {
		t.Errorf("prepare %+v cordon %v drain %+v: taking the guard off is all it does", p.Spec.Prepare, p.Spec.Cordon, p.Spec.Drain)
	}
	want := "node rke2-restart-guard --remove --host-root=/host --repository-url=http://repo.example --version=v1.6.0"
	if up := p.Spec.Upgrade; up == nil || strings.Join(up.Args, " ") != want {
		t.Fatalf("upgrade %+v, want args %s", up, want)
	}
	if guard := RestartGuardPlan(cfg, "x", "http://repo.example"); guard.Labels[LabelPlanKind] != string(PlanRestartGuard) {
		t.Errorf("RestartGuardPlan's labels changed by UnguardPlan: %v", guard.Labels)
	}
}
