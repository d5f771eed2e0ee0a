package testenv_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// TestKilledTestBinaryLeavesNoControlPlane kills (SIGKILL) a test binary whose test
// environment runs, as a timeout or a Ctrl-C does, and checks that its kube-apiserver and
// etcd end with it instead of running on.
func TestKilledTestBinaryLeavesNoControlPlane(t *testing.T) {
	if os.Getenv(procguard.ChildEnv) == "testenv" {
		// The child: start a test environment and wait to be killed.
		if _, err := testenv.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		procguard.Block()
	}
	if testing.Short() {
		t.Skip("starts a test API server")
	}
	procguard.ExpectNoneLeft(t, procguard.Child{
		Test: "TestKilledTestBinaryLeavesNoControlPlane", Role: "testenv",
		// The child's directories (certificates, etcd's data), which it is killed
		// before it removes, go where this test removes them.
		Env:         []string{"TMPDIR=" + t.TempDir()},
		Want:        []string{"kube-apiserver", "etcd"},
		ReadyWithin: 3 * time.Minute, GoneWithin: 30 * time.Second,
	})
}
