package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// TestDemoKilledLeavesNoProcesses kills (SIGKILL) a running demo, as a timeout or a
// closed terminal does, once its API servers and manager run, and checks that none of its
// kube-apiservers, etcds and manager outlives it. A whole run (make test-e2e).
func TestDemoKilledLeavesNoProcesses(t *testing.T) {
	if os.Getenv(procguard.ChildEnv) == "demo" {
		// The child: the demo, as make demo runs it, until it is killed mid-upgrade.
		cfg := defaultConfig()
		cfg.timeout = 10 * time.Minute
		res, err := run(context.Background(), cfg, os.Stdout, false)
		fmt.Printf("the demo ended before it was killed: exit code %d, error %v\n", res.exitCode(), err)
		os.Exit(4)
	}
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	procguard.ExpectNoneLeft(t, procguard.Child{
		Test: "TestDemoKilledLeavesNoProcesses", Role: "demo",
		// The demo's directories (certificates, etcd's data, the manager binary and log),
		// which it is killed before it removes, go where this test removes them.
		Env: []string{"TMPDIR=" + t.TempDir()},
		// view.ready's line of the manager: both API servers and the manager run.
		ReadyText: "hooks on https://127.0.0.1:",
		Want:      []string{"kube-apiserver", "etcd", "capi-inplace"},
		// The manager is built first (go build, from the build cache when warm).
		ReadyWithin: 10 * time.Minute, GoneWithin: 30 * time.Second,
	})
}
