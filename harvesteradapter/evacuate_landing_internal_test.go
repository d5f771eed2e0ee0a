package harvesteradapter

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/kubevirt"
)

// TestLandingBeforeKubeVirt16 plays a workload cluster whose KubeVirt is older than
// v1.6.0: the API server prunes spec.addedNodeSelector from a migration, as the v1.5.x
// CRD's structural schema of spec knows vmiName only (kubevirt v1.5.2
// pkg/virt-operator/resource/generate/components/validations_generated.go,
// "virtualmachineinstancemigration"). The envtest suites serve v1.6.0's CRDs, so the
// pruning is played here by the client. The evacuation reads the dropped field back,
// confines nothing more, takes its landing label off and says why.
func TestLandingBeforeKubeVirt16(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kubevirtv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	nu := &inplacev1.NodeUpdate{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: "default", UID: "0b7c6f1e-0000-4000-8000-000000000001"}}
	nu.Spec.NodeName = "n1"
	label := kubevirt.LandingLabel(nu.UID)
	stays := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{label: "true"}}}
	pending := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: inplacev1.UpgradePendingTaint, Value: "default.workers", Effect: corev1.TaintEffectPreferNoSchedule}}}}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-a", Namespace: "vms"}}
	wc := fake.NewClientBuilder().WithScheme(scheme).WithObjects(stays, pending).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if m, ok := obj.(*kubevirtv1.VirtualMachineInstanceMigration); ok {
				m.Spec.AddedNodeSelector = nil // pruned: unknown to the v1.5.x schema
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	u := &Updater{}
	r := &nodeRun{nu: nu, wc: wc}

	if got := kubevirt.Landing([]*corev1.Node{stays, pending}); len(got) != 1 || got[0].Name != "n2" {
		t.Fatalf("landing nodes %v, want n2 only: n3 carries the upgrade-pending taint", nodeNames(got))
	}
	land := landing{label: label, nodes: []*corev1.Node{stays}}
	if hold, err := u.migrateOff(ctx, r, vmi, nil, land, 3); err != nil || hold != "" {
		t.Fatalf("migrateOff: hold %q, err %v", hold, err)
	}
	ours, err := u.migrations(ctx, r)
	if err != nil || len(ours) != 1 {
		t.Fatalf("migrations %v, err %v; want the one created", ours, err)
	}
	for _, m := range ours {
		if m.Annotations[kubevirt.AnnotationLandingLabel] != label || !kubevirt.AddedSelectorPruned(m) {
			t.Fatalf("migration %s: annotations %v, addedNodeSelector %v; want the label asked for and the selector pruned", m.Name, m.Annotations, m.Spec.AddedNodeSelector)
		}
	}

	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	l, err := u.landingFor(ctx, r, nodes.Items, []*corev1.Node{stays, pending}, []*kubevirtv1.VirtualMachineInstance{vmi}, ours)
	if err != nil {
		t.Fatal(err)
	}
	if l.label != "" || !strings.Contains(l.why, "older than v1.6.0") {
		t.Errorf("landing %+v; want no label and KubeVirt older than v1.6.0 named", l)
	}
	if !strings.Contains(l.note(), "the upgrade-pending taint's preference only") {
		t.Errorf("note %q; want the taint's preference named", l.note())
	}
	if err := wc.Get(ctx, client.ObjectKey{Name: "n2"}, stays); err != nil {
		t.Fatal(err)
	}
	if _, has := stays.Labels[label]; has {
		t.Errorf("node n2 still carries the landing label %s", label)
	}
	if note := unconfinedNote(ours); !strings.Contains(note, "vms/vm-a (KubeVirt older than v1.6.0 dropped its addedNodeSelector)") {
		t.Errorf("summary note %q; want vm-a named with KubeVirt's version", note)
	}
}
