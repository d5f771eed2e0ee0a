package suc

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
)

func TestImageCleanupPlan(t *testing.T) {
	cfg := fixtures.Upgrader()
	p := ImageCleanupPlan(cfg, "capi-inplace-image-cleanup-hv", "http://repo.example", "v1.5.1")

	if p.Name != "capi-inplace-image-cleanup-hv" || p.Namespace != "cattle-system" || p.Labels[LabelPlanKind] != "image-cleanup" {
		t.Errorf("plan %s/%s labels %v", p.Namespace, p.Name, p.Labels)
	}
	// Every node, one at a time (fact 55).
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-1", "witness"} {
		if !sel.Matches(labels.Set{corev1.LabelHostname: node}) {
			t.Errorf("selector %s does not select %s", sel, node)
		}
	}
	if p.Spec.Concurrency != 1 {
		t.Errorf("concurrency %d, want 1 as upgrade-toolkit's cleanup", p.Spec.Concurrency)
	}
	if p.Spec.Version != "v1.6.0" || p.Spec.ServiceAccountName != "system-upgrade-controller" {
		t.Errorf("version %q service account %q", p.Spec.Version, p.Spec.ServiceAccountName)
	}
	if d := p.Spec.JobActiveDeadlineSecs; d == nil || *d != 1800 {
		t.Errorf("jobActiveDeadlineSecs %v, want 30 minutes (SUC's default is 10)", d)
	}
	if len(p.Spec.Tolerations) != 1 || p.Spec.Tolerations[0].Operator != corev1.TolerationOpExists || p.Spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v: control plane and etcd nodes too", p.Spec.Tolerations)
	}
	if p.Spec.Cordon || p.Spec.Drain != nil || p.Spec.Prepare != nil {
		t.Errorf("cordon %v drain %+v prepare %+v: removing unused images needs neither", p.Spec.Cordon, p.Spec.Drain, p.Spec.Prepare)
	}

	up := p.Spec.Upgrade
	want := "node remove-images --previous-version=v1.5.1 --host-root=/host --repository-url=http://repo.example --version=v1.6.0"
	if up == nil || up.Image != fixtures.NodeImage || strings.Join(up.Command, " ") != "/capi-inplace" || strings.Join(up.Args, " ") != want {
		t.Fatalf("upgrade %+v, want %s /capi-inplace %s", up, fixtures.NodeImage, want)
	}
	// crictl talks to containerd's socket on the host.
	if sc := (&corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)}); !equality.Semantic.DeepEqual(up.SecurityContext, sc) {
		t.Errorf("securityContext %+v, want %+v", up.SecurityContext, sc)
	}
	if len(up.Volumes) != 0 {
		t.Errorf("volumes %+v: SUC mounts the host's / at /host itself", up.Volumes)
	}
}
