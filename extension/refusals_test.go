package extension

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// checkRefusalLog checks what every log holds, in memory or in Leases: what Cluster API
// keeps, the latest answer per pair of MachineSets, a refusal for 24 hours, and an answer
// in place forgets an earlier refusal. answer and of may be two logs (two replicas, or a
// manager before and after its restart).
func checkRefusalLog(t *testing.T, answer, of *RefusalLog, ns string) {
	t.Helper()
	ctx := context.Background()
	old, next, other := client.ObjectKey{Namespace: ns, Name: "ms-a"}, client.ObjectKey{Namespace: ns, Name: "ms-b"}, client.ObjectKey{Namespace: ns, Name: "ms-c"}
	at := time.Now().UTC().Truncate(time.Second)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	refusals := func(ms client.ObjectKey, now time.Time) []Refusal {
		t.Helper()
		got, err := of.Of(ctx, ms, now)
		must(err)
		return got
	}
	must(answer.answered(ctx, old, next, true, "not in place: no updater configured", at))
	must(answer.answered(ctx, other, next, false, "covers version", at))
	if got := refusals(old, at.Add(23*time.Hour)); len(got) != 1 || got[0].NewMachineSet != next || !got[0].Until().Equal(at.Add(24*time.Hour)) || got[0].Message != "not in place: no updater configured" {
		t.Fatalf("the refusal within 24 hours: %+v", got)
	}
	if got := refusals(other, at); len(got) != 0 {
		t.Errorf("an answer in place is no refusal: %+v", got)
	}
	if got := refusals(old, at.Add(24*time.Hour)); len(got) != 0 {
		t.Errorf("Cluster API forgets the answer after 24 hours: %+v", got)
	}
	must(answer.answered(ctx, old, next, false, "covers version", at.Add(time.Hour)))
	if got := refusals(old, at.Add(2*time.Hour)); len(got) != 0 {
		t.Errorf("a later answer in place (Cluster API asked again) forgets the refusal: %+v", got)
	}
}

func TestRefusalLog(t *testing.T) {
	l := NewRefusalLog()
	checkRefusalLog(t, l, l, "ns")
	var none *RefusalLog
	key := client.ObjectKey{Namespace: "ns", Name: "ms-a"}
	if err := none.answered(context.Background(), key, key, true, "x", time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, err := none.Of(context.Background(), key, time.Now()); got != nil || err != nil {
		t.Errorf("a nil log remembers nothing: %+v, %v", got, err)
	}
}

// A log kept in Leases is what another replica, or the manager after a restart, reads:
// the preview on the leader knows what any hook server answered.
func TestRefusalLogInLeases(t *testing.T) {
	env := testenv.ForTest(t)
	ctx := context.Background()
	ns := "refusals"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	answering := &RefusalLog{Client: env.Client}
	restarted := &RefusalLog{Client: env.Client, Reader: env.Client}
	checkRefusalLog(t, answering, restarted, ns)

	// One more refusal stays in the Lease for a manager started after it.
	old, next := client.ObjectKey{Namespace: ns, Name: "ms-x"}, client.ObjectKey{Namespace: ns, Name: "ms-y"}
	if err := answering.answered(ctx, old, next, true, "not in place: the bootstrap template changed", time.Now()); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: RefusalLeaseName}, lease); err != nil {
		t.Fatalf("the refusal Lease: %v", err)
	}
	if lease.Annotations[RefusalsAnnotation] == "" {
		t.Fatalf("the refusal Lease holds no entries: %+v", lease.Annotations)
	}
	got, err := (&RefusalLog{Client: env.Client}).Of(ctx, old, time.Now())
	if err != nil || len(got) != 1 || got[0].NewMachineSet != next {
		t.Fatalf("a new log reads %+v, %v; want the refusal to %s", got, err, next)
	}
	if got, err := (&RefusalLog{Client: env.Client}).Of(ctx, client.ObjectKey{Namespace: "elsewhere", Name: "ms-x"}, time.Now()); err != nil || len(got) != 0 {
		t.Fatalf("another namespace without a Lease: %+v, %v; want nothing", got, err)
	}
}
