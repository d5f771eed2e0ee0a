package disruption_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The ledger against a real API server: claims that race are judged one after the other,
// however they interleave, because each write carries the resourceVersion it read.
func TestLedger(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	c := env.Client

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ledger-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	newNodeUpdate := func(t *testing.T, name, target string, maxUnavailable int) *inplacev1.NodeUpdate {
		t.Helper()
		nu := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, Annotations: map[string]string{
				disruption.TargetAnnotation: target, disruption.MaxUnavailableAnnotation: fmt.Sprint(maxUnavailable)}},
			Spec: inplacev1.NodeUpdateSpec{ClusterName: "c", MachineName: "m-" + name, NodeName: "node-" + name, Version: "v1.34.3",
				UpdaterRef: inplacev1.UpdaterReference{Kind: "JobUpdater", Name: "u"}},
		}
		if err := c.Create(ctx, nu); err != nil {
			t.Fatal(err)
		}
		return nu
	}
	// ledgerOf creates cluster's ledger with no entry.
	ledgerOf := func(t *testing.T, cluster string) {
		t.Helper()
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: disruption.LedgerName(cluster),
			Annotations: map[string]string{disruption.LedgerAnnotation: "[]"}}}
		if err := c.Create(ctx, lease); err != nil {
			t.Fatal(err)
		}
	}
	// race runs one Admit per NodeUpdate at once against cluster's ledger and returns
	// each one's answer.
	race := func(t *testing.T, cluster string, nus []*inplacev1.NodeUpdate, controlPlane bool) []string {
		t.Helper()
		answers := make([]string, len(nus))
		errs := make([]error, len(nus))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, nu := range nus {
			wg.Add(1)
			go func() {
				defer wg.Done()
				claim := disruption.ClaimFor(ctx, c, nu, controlPlane, "be cordoned")
				<-start
				answers[i], errs[i] = disruption.Admit(ctx, c, c, ns.Name, cluster, claim, time.Now())
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return answers
	}
	passed := func(answers []string) int {
		n := 0
		for _, a := range answers {
			if a == "" {
				n++
			}
		}
		return n
	}

	t.Run("of two control plane nodes that ask at once, exactly one passes", func(t *testing.T) {
		for round := range 10 {
			cluster := fmt.Sprintf("cp-race-%d", round)
			if round%2 == 1 {
				ledgerOf(t, cluster) // the claims update a ledger that exists, rather than create it
			}
			a := newNodeUpdate(t, cluster+"-a", disruption.ControlPlaneTarget("cp"), 1)
			b := newNodeUpdate(t, cluster+"-b", disruption.ControlPlaneTarget("cp"), 1)
			answers := race(t, cluster, []*inplacev1.NodeUpdate{a, b}, true)
			if passed(answers) != 1 {
				t.Fatalf("round %d: %d of 2 control plane claims passed, want exactly 1: %q", round, passed(answers), answers)
			}
			for _, held := range answers {
				if held != "" && !strings.Contains(held, "are past their first disruption; one control plane node at a time") {
					t.Fatalf("round %d: the held claim says %q", round, held)
				}
			}
		}
	})

	t.Run("of three workers of a target with maxUnavailable 2 that ask at once, exactly two pass; another target is not counted", func(t *testing.T) {
		for round := range 6 {
			cluster := fmt.Sprintf("md-race-%d", round)
			if round%2 == 1 {
				ledgerOf(t, cluster)
			}
			var nus []*inplacev1.NodeUpdate
			for _, n := range []string{"a", "b", "c"} {
				nus = append(nus, newNodeUpdate(t, cluster+"-"+n, disruption.MachineDeploymentTargetPrefix+"md", 2))
			}
			other := newNodeUpdate(t, cluster+"-other", disruption.MachineDeploymentTargetPrefix+"other", 1)
			answers := race(t, cluster, append(nus, other), false)
			if passed(answers[:3]) != 2 || answers[3] != "" {
				t.Fatalf("round %d: answers %q, want two of the first three and the other target's to pass", round, answers)
			}
		}
	})

	t.Run("a claim written down is answered again without a write; an ended NodeUpdate's entry no longer counts", func(t *testing.T) {
		a := newNodeUpdate(t, "end-a", disruption.ControlPlaneTarget("cp"), 1)
		b := newNodeUpdate(t, "end-b", disruption.ControlPlaneTarget("cp"), 1)
		admit := func(nu *inplacev1.NodeUpdate) string {
			t.Helper()
			held, err := disruption.Admit(ctx, c, c, ns.Name, "end", disruption.ClaimFor(ctx, c, nu, false, "restart RKE2"), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			return held
		}
		if held := admit(a); held != "" {
			t.Fatalf("first claim held: %s", held)
		}
		lease := &coordinationv1.Lease{}
		key := client.ObjectKey{Namespace: ns.Name, Name: disruption.LedgerName("end")}
		if err := c.Get(ctx, key, lease); err != nil {
			t.Fatal(err)
		}
		rv := lease.ResourceVersion
		if held := admit(a); held != "" {
			t.Fatalf("the same claim asked again was held: %s", held)
		}
		if err := c.Get(ctx, key, lease); err != nil || lease.ResourceVersion != rv {
			t.Fatalf("asking again wrote the ledger (resourceVersion %s, was %s; err %v)", lease.ResourceVersion, rv, err)
		}
		if held := admit(b); !strings.Contains(held, "node-end-a (NodeUpdate end-a)") || !strings.Contains(held, "before it is allowed to restart RKE2") {
			t.Fatalf("a second control plane claim was not held by the first: %q", held)
		}
		a.Status.Phase = inplacev1.NodeUpdatePhaseFailed
		if err := c.Status().Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		if held := admit(b); held != "" {
			t.Fatalf("the claim was still held after the first NodeUpdate ended: %s", held)
		}
		if err := c.Get(ctx, key, lease); err != nil {
			t.Fatal(err)
		}
		if got := lease.Annotations[disruption.LedgerAnnotation]; strings.Contains(got, "end-a") || !strings.Contains(got, "end-b") {
			t.Fatalf("the ledger holds %s; want only end-b", got)
		}
	})

	// Every other way a NodeUpdate past its first disruption can end: aborted (an abort,
	// and a timeout, end it Aborted or Failed), deleted, or made again under its name
	// (another UID). Its entry no longer holds the next node, with no clean-up.
	for _, ending := range []struct {
		name string
		end  func(t *testing.T, nu *inplacev1.NodeUpdate)
	}{
		{"aborted", func(t *testing.T, nu *inplacev1.NodeUpdate) {
			nu.Status.Phase = inplacev1.NodeUpdatePhaseAborted
			if err := c.Status().Update(ctx, nu); err != nil {
				t.Fatal(err)
			}
		}},
		{"deleted", func(t *testing.T, nu *inplacev1.NodeUpdate) {
			if err := c.Delete(ctx, nu); err != nil {
				t.Fatal(err)
			}
		}},
		{"made again", func(t *testing.T, nu *inplacev1.NodeUpdate) {
			if err := c.Delete(ctx, nu); err != nil {
				t.Fatal(err)
			}
			again := nu.DeepCopy()
			again.ResourceVersion, again.UID = "", ""
			again.Status = inplacev1.NodeUpdateStatus{}
			if err := c.Create(ctx, again); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run("an entry no longer counts once its NodeUpdate was "+ending.name, func(t *testing.T) {
			cluster := "gone-" + strings.ReplaceAll(ending.name, " ", "-")
			a := newNodeUpdate(t, cluster+"-a", disruption.ControlPlaneTarget("cp"), 1)
			b := newNodeUpdate(t, cluster+"-b", disruption.ControlPlaneTarget("cp"), 1)
			admit := func(nu *inplacev1.NodeUpdate) string {
				t.Helper()
				held, err := disruption.Admit(ctx, c, c, ns.Name, cluster, disruption.ClaimFor(ctx, c, nu, true, "be cordoned"), time.Now())
				if err != nil {
					t.Fatal(err)
				}
				return held
			}
			if held := admit(a); held != "" {
				t.Fatalf("first claim held: %s", held)
			}
			if held := admit(b); held == "" {
				t.Fatal("a second control plane claim passed while the first counts")
			}
			ending.end(t, a)
			if held := admit(b); held != "" {
				t.Fatalf("the claim was still held after the first NodeUpdate was %s: %s", ending.name, held)
			}
		})
	}

	t.Run("a ledger nobody can read is an error that says what to do, and no claim passes", func(t *testing.T) {
		nu := newNodeUpdate(t, "bad-a", disruption.ControlPlaneTarget("cp"), 1)
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: disruption.LedgerName("bad"),
			Annotations: map[string]string{disruption.LedgerAnnotation: "{not a list"}}}
		if err := c.Create(ctx, lease); err != nil {
			t.Fatal(err)
		}
		held, err := disruption.Admit(ctx, c, c, ns.Name, "bad", disruption.ClaimFor(ctx, c, nu, true, "be cordoned"), time.Now())
		if err == nil || held != "" || !strings.Contains(err.Error(), "delete the annotation") {
			t.Fatalf("Admit over a corrupt ledger: held %q, err %v", held, err)
		}
	})
}
