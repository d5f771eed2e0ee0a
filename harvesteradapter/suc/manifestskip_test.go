package suc

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
)

func TestManifestSkipPlan(t *testing.T) {
	cfg := fixtures.Upgrader()
	for _, tc := range []struct {
		remove bool
		kind   string
		args   string
	}{
		{false, "manifest-skip", "node rke2-manifest-skip --host-root=/host --repository-url=http://repo.example --version=v1.6.0"},
		{true, "manifest-unskip", "node rke2-manifest-skip --remove --host-root=/host --repository-url=http://repo.example --version=v1.6.0"},
	} {
		p := ManifestSkipPlan(cfg, "capi-inplace-skip-hv", "http://repo.example", tc.remove, 4)
		if p.Name != "capi-inplace-skip-hv" || p.Namespace != "cattle-system" || p.Labels[LabelPlanKind] != tc.kind {
			t.Errorf("remove=%v: plan %s/%s labels %v", tc.remove, p.Namespace, p.Name, p.Labels)
		}
		if p.Spec.NodeSelector != nil {
			t.Errorf("node selector %+v: the caller sets it", p.Spec.NodeSelector)
		}
		if p.Spec.Concurrency != 4 {
			t.Errorf("concurrency %d, want the node count as Harvester (fact 34)", p.Spec.Concurrency)
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
			t.Errorf("cordon %v drain %+v prepare %+v: writing a file needs neither", p.Spec.Cordon, p.Spec.Drain, p.Spec.Prepare)
		}
		up := p.Spec.Upgrade
		if up == nil || up.Image != fixtures.NodeImage || strings.Join(up.Command, " ") != "/capi-inplace" || strings.Join(up.Args, " ") != tc.args {
			t.Fatalf("upgrade %+v, want %s /capi-inplace %s", up, fixtures.NodeImage, tc.args)
		}
		if sc := (&corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}); !equality.Semantic.DeepEqual(up.SecurityContext, sc) {
			t.Errorf("securityContext %+v, want %+v: root, not privileged", up.SecurityContext, sc)
		}
		if len(up.Volumes) != 0 {
			t.Errorf("volumes %+v: SUC mounts the host's / at /host itself", up.Volumes)
		}
	}
	if p := ManifestSkipPlan(cfg, "x", "http://repo.example", false, 0); p.Spec.Concurrency != 1 {
		t.Errorf("concurrency %d for no node: SUC runs nothing at 0", p.Spec.Concurrency)
	}
}
