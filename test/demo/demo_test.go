package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// TestDemoViaHook runs the demo's whole flow, as `make demo ARGS=--via=hook` does, on a
// small cluster with fast simulated steps, and checks from the simulators' own records
// that it did what it printed: every node upgraded exactly once, never more nodes down
// than allowed.
func TestDemoViaHook(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	cfg := defaultConfig()
	cfg.via, cfg.workers, cfg.maxUnavailable = viaHook, 3, 2
	cfg.stepDelay, cfg.pollInterval, cfg.timeout = 300*time.Millisecond, 100*time.Millisecond, 3*time.Minute

	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 0 {
		t.Fatalf("the demo ended with exit code %d, error %v; its output:\n%s", res.exitCode(), err, out.String())
	}
	for _, want := range []string{"6/6 nodes upgraded", "NODE  ", "All 6 nodes reached Kubernetes " + scenario.ToVersion} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}

	runs := scenario.RunsPerNode(res.record.Runs())
	var cp, workers []string
	for _, node := range cfg.nodeNames() {
		for _, kind := range scenario.PlanKinds {
			if got := runs[node][kind]; got != 1 {
				t.Errorf("node %s ran its %s Plan %d times, want exactly once", node, kind, got)
			}
		}
		if strings.Contains(node, "-"+scenario.ControlPlaneName+"-") {
			cp = append(cp, node)
		} else {
			workers = append(workers, node)
		}
	}
	if len(cp) != 3 || len(workers) != 3 {
		t.Fatalf("control plane %v and workers %v: want 3 of each", cp, workers)
	}
	downs := res.record.DownLog()
	if got := scenario.MaxDownAtOnce(downs, cp); got != 1 {
		t.Errorf("%d control plane nodes were down at once, want exactly 1 (one at a time, and each went down)", got)
	}
	if got := scenario.MaxDownAtOnce(downs, workers); got < 1 || got > cfg.maxUnavailable {
		t.Errorf("%d workers were down at once, want from 1 to maxUnavailable %d", got, cfg.maxUnavailable)
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("invariant broken: %s: %s", c.Name, c.Detail)
		}
	}
}

// TestConfigRefusesUnknownNodes checks that a mistyped --fail is refused before anything
// is started.
func TestConfigRefusesUnknownNodes(t *testing.T) {
	cfg := defaultConfig()
	for name, ok := range map[string]bool{"demo-cp-1": true, "cp-3": true, "workers-3": true, "demo-workers-4": false, "cp-4": false, "nope": false} {
		cfg.fail = name
		if err := cfg.validate(); (err == nil) != ok {
			t.Errorf("--fail=%s: validate() = %v, want accepted %v", name, err, ok)
		}
	}
	cfg.fail, cfg.via = "", "kubectl"
	if err := cfg.validate(); err == nil {
		t.Error("--via=kubectl was accepted")
	}
}
