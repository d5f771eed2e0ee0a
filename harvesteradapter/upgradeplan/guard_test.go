package upgradeplan

import (
	"context"
	"strings"
	"sync"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// writes counts the creates and updates a client sends, by kind.
type writes struct {
	mu      sync.Mutex
	creates map[string]int
	updates map[string]int
}

func (w *writes) client(c client.WithWatch) client.Client {
	w.creates, w.updates = map[string]int{}, map[string]int{}
	kind := func(obj client.Object) string {
		switch obj.(type) {
		case *admissionv1.ValidatingAdmissionPolicy:
			return "policy"
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			return "binding"
		}
		return "other"
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			w.mu.Lock()
			w.creates[kind(obj)]++
			w.mu.Unlock()
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			w.mu.Lock()
			w.updates[kind(obj)]++
			w.mu.Unlock()
			return c.Update(ctx, obj, opts...)
		},
	})
}

// The guard is looked at on every pass of a running plan: on a real API server, which
// defaults the policy's selectors, match policy and rules' scope, a look that finds it
// as it should be writes nothing; a plan whose guard says something else rewrites it.
func TestGuardWrittenOnlyWhenMissingOrChanged(t *testing.T) {
	env := testenv.ForTest(t)
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w := &writes{}
	pr := &PlanRun{
		Plan:     &harvesterv1.UpgradePlan{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hv1-v1-8-1"}, Spec: harvesterv1.UpgradePlanSpec{Version: "v1.8.1"}},
		Workload: w.client(wc),
	}
	ctx := context.Background()

	if err := ensureGuard(ctx, pr); err != nil {
		t.Fatal(err)
	}
	if w.creates["policy"] != 1 || w.creates["binding"] != 1 {
		t.Fatalf("first look: created %v, want the policy and its binding once each", w.creates)
	}
	for range 3 {
		if err := ensureGuard(ctx, pr); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.updates) != 0 || w.creates["policy"] != 1 || w.creates["binding"] != 1 {
		t.Fatalf("three more looks at an unchanged guard: created %v, updated %v, want nothing written", w.creates, w.updates)
	}

	pr.Plan.Spec.Version = "v1.8.2"
	if err := ensureGuard(ctx, pr); err != nil {
		t.Fatal(err)
	}
	if w.updates["policy"] != 1 {
		t.Fatalf("a guard whose message changed: updated %v, want the policy once", w.updates)
	}
	stored := &admissionv1.ValidatingAdmissionPolicy{}
	if err := wc.Get(ctx, client.ObjectKey{Name: guardName(pr)}, stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.Spec.Validations[0].Message; got == "" || !strings.Contains(got, "v1.8.2") {
		t.Fatalf("stored message %q does not name the plan's new version", got)
	}
}
