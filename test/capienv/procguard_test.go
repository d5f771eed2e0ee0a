package capienv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/test/procguard"
)

// TestKilledTestBinaryLeavesNoController kills (SIGKILL) a test binary that started one
// of Cluster API's controllers and checks that the controller ends with it. The controller
// is a stand-in (a script that execs sleep, whatever its flags): what is checked is how
// startProcess starts it, and CAPI's controllers are built by make capi-binaries.
func TestKilledTestBinaryLeavesNoController(t *testing.T) {
	if os.Getenv(procguard.ChildEnv) == "controller" {
		dir := os.Getenv("CAPIENV_TEST_DIR")
		_, err := startProcess("core", filepath.Join(dir, "controller"), "unused", filepath.Join(dir, "core.log"), nil, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		procguard.Block("sleep")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "controller"), []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil { //nolint:gosec // an executable script
		t.Fatal(err)
	}
	procguard.ExpectNoneLeft(t, procguard.Child{
		Test: "TestKilledTestBinaryLeavesNoController", Role: "controller", Env: []string{"CAPIENV_TEST_DIR=" + dir},
		Want:        []string{"sleep"},
		ReadyWithin: time.Minute, GoneWithin: 30 * time.Second,
	})
}
