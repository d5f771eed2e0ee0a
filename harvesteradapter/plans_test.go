package harvesteradapter

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

func testUpgrader() *harvesterv1.HarvesterUpgrader {
	return &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"},
		Spec: harvesterv1.HarvesterUpgraderSpec{
			Release:                 harvesterv1.Release{Version: "v1.6.0", RepositoryURL: "http://repo.example"},
			Images:                  harvesterv1.Images{RKE2Upgrade: "rancher/rke2-upgrade", OSUpgrade: "rancher/harvester-upgrade"},
			SystemUpgradeController: harvesterv1.SystemUpgradeController{Namespace: "cattle-system", ServiceAccountName: "system-upgrade-controller"},
		},
	}
}

func testNodeUpdate(node string) *inplacev1.NodeUpdate {
	return &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Name: "nu-" + node, Namespace: "default", UID: "0b1c7a52-3d8e-4f0a-9b9e-0d5f3c6a7e21"},
		Spec:       inplacev1.NodeUpdateSpec{ClusterName: "hv", MachineName: "m-" + node, NodeName: node, Version: "v1.33.3+rke2r1"},
	}
}

func TestPlanName(t *testing.T) {
	nu := testNodeUpdate("node-1")
	got := planName(planKubernetes, nu)
	if !strings.HasPrefix(got, "capi-inplace-rke2-node-1-") || len(got) != len("capi-inplace-rke2-node-1-")+10 {
		t.Errorf("planName = %q, want capi-inplace-rke2-node-1-<10 hex digits>", got)
	}
	if got != planName(planKubernetes, testNodeUpdate("node-1")) {
		t.Errorf("plan name is not deterministic")
	}
	other := testNodeUpdate("node-1")
	other.UID = "5e2d1f7c-8a4b-4c3d-9e0f-1a2b3c4d5e6f"
	if planName(planKubernetes, other) == got {
		t.Errorf("two NodeUpdates of node-1 share the plan name %q", got)
	}
	if planName(planOS, nu) == got {
		t.Errorf("two kinds share the plan name %q", got)
	}

	long := strings.Repeat("n", 80)
	a, b := planName(planOS, testNodeUpdate(long)), planName(planOS, testNodeUpdate(long+"x"))
	if len(a) > 63 || len(b) > 63 {
		t.Errorf("names longer than a label key allows: %d, %d", len(a), len(b))
	}
	if a == b {
		t.Errorf("two long node names gave the same plan name %q", a)
	}
	for _, name := range []string{got, a, b, planName(planPreload, testNodeUpdate("node-1.example.com"))} {
		if errs := validation.IsQualifiedName("plan.upgrade.cattle.io/" + name); len(errs) > 0 {
			t.Errorf("SUC's node label for plan %q is not a valid label key: %v", name, errs)
		}
	}
}

func TestPlanForNodeSelectsOnlyThatNode(t *testing.T) {
	cfg, nu := testUpgrader(), testNodeUpdate("node-2")
	for _, kind := range []planKind{planPreload, planKubernetes, planOS} {
		p := planForNode(cfg, nu, kind, "http://repo.example")
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
	cfg, nu := testUpgrader(), testNodeUpdate("node-1")
	cfg.Spec.Drain = harvesterv1.Drain{Force: true, GracePeriodSeconds: ptr.To[int32](30)}
	p := planForNode(cfg, nu, planKubernetes, "http://repo.example")
	if p.Spec.Version != "v1.33.3+rke2r1" || p.Spec.Upgrade.Image != "rancher/rke2-upgrade" {
		t.Errorf("upgrade %s at %s", p.Spec.Upgrade.Image, p.Spec.Version)
	}
	if !p.Spec.Cordon || p.Spec.Drain == nil || !p.Spec.Drain.Force || *p.Spec.Drain.GracePeriod != 30 ||
		!*p.Spec.Drain.IgnoreDaemonSets || !*p.Spec.Drain.DeleteEmptydirData {
		t.Errorf("drain %+v cordon %v", p.Spec.Drain, p.Spec.Cordon)
	}
	if p.Spec.Prepare == nil || strings.Join(p.Spec.Prepare.Args, " ") != "pre-drain" {
		t.Errorf("prepare %+v: virtual machines must be evacuated before the drain", p.Spec.Prepare)
	}

	cfg.Spec.Drain.Enabled = ptr.To(false)
	if p := planForNode(cfg, nu, planKubernetes, ""); p.Spec.Drain != nil || !p.Spec.Cordon {
		t.Errorf("drain disabled: drain %+v cordon %v", p.Spec.Drain, p.Spec.Cordon)
	}
}

func TestOSAndPreloadPlans(t *testing.T) {
	cfg, nu := testUpgrader(), testNodeUpdate("node-1")
	osPlan := planForNode(cfg, nu, planOS, "http://repo.example")
	if osPlan.Spec.Version != "v1.6.0" || strings.Join(osPlan.Spec.Upgrade.Args, " ") != "post-drain" || !*osPlan.Spec.Upgrade.SecurityContext.Privileged {
		t.Errorf("os plan %+v", osPlan.Spec.Upgrade)
	}
	if !osPlan.Spec.Cordon {
		t.Errorf("the OS plan reboots the node: it must cordon it")
	}
	preload := planForNode(cfg, nu, planPreload, "http://repo.example")
	if preload.Spec.Cordon || preload.Spec.Drain != nil {
		t.Errorf("the preload plan must leave the node in service")
	}
	found := false
	for _, e := range preload.Spec.Upgrade.Env {
		if e.Name == "UPGRADE_REPO_URL" && e.Value == "http://repo.example" {
			found = true
		}
	}
	if !found {
		t.Errorf("preload env %v lacks the repository URL", preload.Spec.Upgrade.Env)
	}
}
