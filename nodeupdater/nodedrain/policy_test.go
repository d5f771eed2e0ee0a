package nodedrain_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/nodedrain"
)

// blockedSince gives nu a DrainBlocked condition True since ago, as an earlier call left it.
func blockedSince(nu *inplacev1.NodeUpdate, reason string, ago time.Duration) {
	meta.RemoveStatusCondition(&nu.Status.Conditions, inplacev1.DrainBlockedCondition)
	meta.SetStatusCondition(&nu.Status.Conditions, metav1.Condition{Type: inplacev1.DrainBlockedCondition, Status: metav1.ConditionTrue,
		Reason: reason, Message: "blocked", LastTransitionTime: metav1.NewTime(time.Now().Add(-ago))})
}

func nodeUpdate(mode inplacev1.DrainMode) *inplacev1.NodeUpdate {
	nu := &inplacev1.NodeUpdate{Spec: inplacev1.NodeUpdateSpec{NodeName: "n1"}}
	if mode != "" {
		nu.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: mode, GracePeriod: &metav1.Duration{Duration: time.Minute}}
	}
	return nu
}

func condition(t *testing.T, nu *inplacev1.NodeUpdate) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(nu.Status.Conditions, inplacev1.DrainBlockedCondition)
	if c == nil {
		t.Fatal("no DrainBlocked condition")
	}
	return c
}

func blockage(evicted *time.Duration) *nodedrain.Blockage {
	b := &nodedrain.Blockage{Of: "the drain", What: "ns/db-0 (budget db)", Evicts: "they are deleted", Evicted: inplacev1.BlockingPodsDeletedReason,
		CannotEvict: "nothing to delete"}
	if evicted != nil {
		b.Evict = func(blockedFor, _ time.Duration) (string, error) {
			*evicted = blockedFor
			return "deleted ns/db-0", nil
		}
	}
	return b
}

func TestApplyPolicyHold(t *testing.T) {
	nu := nodeUpdate("")
	var events []string
	record := func(_, reason, _, note string) { events = append(events, reason+": "+note) }
	msg, err := nodedrain.ApplyPolicy(nu, blockage(nil), record)
	if err != nil || !strings.Contains(msg, "drainPolicy Hold: the node waits") {
		t.Fatalf("Hold: %q, %v", msg, err)
	}
	c := condition(t, nu)
	if c.Status != metav1.ConditionTrue || c.Reason != inplacev1.DrainHeldReason {
		t.Errorf("Hold: condition %s %s", c.Status, c.Reason)
	}
	if _, err := nodedrain.ApplyPolicy(nu, blockage(nil), record); err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], inplacev1.DrainBlockedCondition+": the drain of node n1 is blocked by ns/db-0") {
		t.Errorf("one Warning event when the block is first seen, none after: %v", events)
	}
	if _, err := nodedrain.ApplyPolicy(nu, nil, record); err != nil {
		t.Fatal(err)
	}
	if c := condition(t, nu); c.Status != metav1.ConditionFalse || c.Reason != inplacev1.DrainUnblockedReason {
		t.Errorf("unblocked: condition %s %s", c.Status, c.Reason)
	}
}

func TestApplyPolicySkip(t *testing.T) {
	nu := nodeUpdate(inplacev1.DrainModeSkip)
	msg, err := nodedrain.ApplyPolicy(nu, blockage(nil), nil)
	if err != nil || !strings.Contains(msg, "drainPolicy Skip: unless they go by") {
		t.Fatalf("before the grace period: %q, %v", msg, err)
	}
	if c := condition(t, nu); c.Reason != inplacev1.SkipPendingReason {
		t.Errorf("before the grace period: reason %s", c.Reason)
	}
	blockedSince(nu, inplacev1.SkipPendingReason, 2*time.Minute)
	b := blockage(nil)
	b.PutBack = "the node is put back as this updater does"
	_, err = nodedrain.ApplyPolicy(nu, b, nil)
	skip, ok := nodeupdater.AsSkip(err)
	if !ok {
		t.Fatalf("after the grace period: want a SkipError, got %v", err)
	}
	want := "drainPolicy Skip: the drain of node n1 was blocked for more than 1m0s by ns/db-0 (budget db); the node is put back as this updater does"
	if skip.Message != want {
		t.Errorf("skip message %q, want %q", skip.Message, want)
	}
	if c := condition(t, nu); c.Reason != inplacev1.NodeSkippedReason || time.Since(c.LastTransitionTime.Time) < 2*time.Minute-time.Second {
		t.Errorf("skipped: reason %s, since %s (the block's start is kept)", c.Reason, c.LastTransitionTime)
	}
}

func TestApplyPolicyEvict(t *testing.T) {
	var blockedFor time.Duration
	nu := nodeUpdate(inplacev1.DrainModeEvict)
	msg, err := nodedrain.ApplyPolicy(nu, blockage(&blockedFor), nil)
	if err != nil || !strings.Contains(msg, "drainPolicy Evict: they are deleted at ") || blockedFor != 0 {
		t.Fatalf("before the grace period: %q, %v, evicted after %s", msg, err, blockedFor)
	}
	if c := condition(t, nu); c.Reason != inplacev1.EvictionPendingReason {
		t.Errorf("before the grace period: reason %s", c.Reason)
	}
	blockedSince(nu, inplacev1.EvictionPendingReason, 2*time.Minute)
	msg, err = nodedrain.ApplyPolicy(nu, blockage(&blockedFor), nil)
	if err != nil || msg != "deleted ns/db-0" || blockedFor < 2*time.Minute-time.Second {
		t.Fatalf("after the grace period: %q, %v, evicted after %s", msg, err, blockedFor)
	}
	if c := condition(t, nu); c.Status != metav1.ConditionFalse || c.Reason != inplacev1.BlockingPodsDeletedReason {
		t.Errorf("evicted: condition %s %s", c.Status, c.Reason)
	}
	// Nothing it may act on: the node holds at once, saying why.
	msg, err = nodedrain.ApplyPolicy(nodeUpdate(inplacev1.DrainModeEvict), blockage(nil), nil)
	if err != nil || !strings.Contains(msg, "drainPolicy Evict cannot act on it: nothing to delete") {
		t.Errorf("nothing to act on: %q, %v", msg, err)
	}
}
