package manager_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/procguard"
)

// TestKilledTestBinaryLeavesNoManager kills (SIGKILL) a test binary that started a
// manager process and checks that the manager ends with it. The manager is a stand-in
// (a script that execs sleep, whatever its flags): what is checked is how Start starts
// it, and building the real manager takes minutes.
func TestKilledTestBinaryLeavesNoManager(t *testing.T) {
	if os.Getenv(procguard.ChildEnv) == "manager" {
		dir := os.Getenv("MANAGER_TEST_DIR")
		_, err := manager.Start(manager.Options{Binary: filepath.Join(dir, "manager"), Kubeconfig: "unused", CertDir: dir, LogFile: filepath.Join(dir, "manager.log")})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		procguard.Block("sleep")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "manager"), []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil { //nolint:gosec // an executable script
		t.Fatal(err)
	}
	procguard.ExpectNoneLeft(t, procguard.Child{
		Test: "TestKilledTestBinaryLeavesNoManager", Role: "manager", Env: []string{"MANAGER_TEST_DIR=" + dir},
		Want:        []string{"sleep"},
		ReadyWithin: time.Minute, GoneWithin: 30 * time.Second,
	})
}
