package nodeprogram

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// guardNode is a fake node whose systemctl succeeds and checks it was told to talk to
// PID 1 even from a chroot.
func guardNode(t *testing.T) *fakeHost {
	t.Helper()
	host := newFakeHost(t)
	host.tools["systemctl"] = func(c Command, _ []byte) ([]byte, error) {
		if !slices.Contains(c.Env, "SYSTEMD_OFFLINE=0") {
			return nil, errors.New("Running in chroot, ignoring request.")
		}
		return nil, nil
	}
	return host
}

var agentRestart = []string{"systemctl daemon-reload", "systemctl restart rancher-system-agent.service"}

func TestRestartGuardPlacesTheDropInAndRestartsTheAgentOnce(t *testing.T) {
	host := guardNode(t)
	// The flags every Plan's node program gets are accepted.
	r := runNode(t, host, nil, "rke2-restart-guard", "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.6.0")
	r.expect(t, ExitOK, "capi-inplace node rke2-restart-guard: done")

	got, err := os.ReadFile(host.Path("/run/systemd/system/rancher-system-agent.service.d/capi-inplace-skip-restart.conf"))
	if err != nil {
		t.Fatalf("the drop-in was not written: %v", err)
	}
	if !strings.Contains(string(got), "[Service]\nEnvironment=INSTALL_RKE2_SKIP_ENABLE=true\n") {
		t.Errorf("drop-in %q does not give the agent INSTALL_RKE2_SKIP_ENABLE=true", got)
	}
	if lines := host.commandLines(); !slices.Equal(lines, agentRestart) {
		t.Fatalf("host commands %q, want %q", lines, agentRestart)
	}

	// Placed twice (the Job ran again): the agent is not restarted again.
	r = runNode(t, host, nil, "rke2-restart-guard")
	r.expect(t, ExitOK)
	if lines := host.commandLines(); len(lines) != len(agentRestart) {
		t.Errorf("the second run ran %q", lines[len(agentRestart):])
	}
	if !strings.Contains(r.stdout, "already in place") {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestRestartGuardRewritesAChangedDropIn(t *testing.T) {
	host := guardNode(t)
	runNode(t, host, nil, "rke2-restart-guard").expect(t, ExitOK)
	host.write(t, restartGuardDropIn, "[Service]\nEnvironment=INSTALL_RKE2_SKIP_ENABLE=false\n")
	runNode(t, host, nil, "rke2-restart-guard").expect(t, ExitOK)
	if got, _ := os.ReadFile(host.Path(restartGuardDropIn)); string(got) != restartGuardContent {
		t.Errorf("drop-in %q, want %q", got, restartGuardContent)
	}
	if lines := host.commandLines(); !slices.Equal(lines, append(slices.Clone(agentRestart), agentRestart...)) {
		t.Errorf("host commands %q: a changed drop-in restarts the agent again", lines)
	}
}

func TestRestartGuardRemove(t *testing.T) {
	host := guardNode(t)
	runNode(t, host, nil, "rke2-restart-guard").expect(t, ExitOK)
	host.write(t, "/run/systemd/system/rancher-system-agent.service.d/override.conf", "someone else's")

	r := runNode(t, host, nil, "rke2-restart-guard", "--remove")
	r.expect(t, ExitOK, "done")
	if _, err := os.Stat(host.Path(restartGuardDropIn)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the drop-in is still there: %v", err)
	}
	if _, err := os.Stat(host.Path("/run/systemd/system/rancher-system-agent.service.d/override.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory's other drop-in stays, where the release's recover_rancher_system_agent removes the whole directory: %v", err)
	}
	want := append(slices.Clone(agentRestart), agentRestart...)
	if lines := host.commandLines(); !slices.Equal(lines, want) {
		t.Fatalf("host commands %q, want %q", lines, want)
	}

	// Removed twice: nothing to remove, nothing restarted.
	r = runNode(t, host, nil, "rke2-restart-guard", "--remove")
	r.expect(t, ExitOK)
	if lines := host.commandLines(); len(lines) != len(want) {
		t.Errorf("the second removal ran %q", lines[len(want):])
	}
}

func TestRestartGuardRemoveWithoutAGuardRestartsNothing(t *testing.T) {
	host := guardNode(t)
	r := runNode(t, host, nil, "rke2-restart-guard", "--remove")
	r.expect(t, ExitOK, "done")
	if lines := host.commandLines(); len(lines) != 0 {
		t.Errorf("ran %q on a node without a guard", lines)
	}
	if !strings.Contains(r.stdout, "no restart guard on this node") {
		t.Errorf("stdout %q", r.stdout)
	}
}

// TestRestartGuardRemoveTakesHarvestersGuard: a node left guarded by an interrupted
// Harvester upgrade (its override.conf and env file, upgrade_manifests.sh
// skip_restart_rancher_system_agent) loses that guard too, as the release's
// recover_rancher_system_agent removes it (rm -rf of the directory), and the agent is
// restarted: otherwise it keeps INSTALL_RKE2_SKIP_ENABLE=true and never restarts RKE2
// for our plan (issue #53).
func TestRestartGuardRemoveTakesHarvestersGuard(t *testing.T) {
	host := guardNode(t)
	dir := "/run/systemd/system/rancher-system-agent.service.d"
	host.write(t, dir+"/override.conf", "[Service]\nEnvironmentFile=-"+dir+"/10-harvester-upgrade.env\n")
	host.write(t, dir+"/10-harvester-upgrade.env", "INSTALL_RKE2_SKIP_ENABLE=true\n")
	r := runNode(t, host, nil, "rke2-restart-guard", "--remove")
	r.expect(t, ExitOK, "done")
	if _, err := os.Stat(host.Path(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Harvester's guard is still there: %v", err)
	}
	if lines := host.commandLines(); !slices.Equal(lines, agentRestart) {
		t.Errorf("host commands %q, want the agent restarted once: %q", lines, agentRestart)
	}
	if !strings.Contains(r.stdout, "override.conf") {
		t.Errorf("stdout %q does not name what it removed", r.stdout)
	}
}

func TestRestartGuardRemoveTakesTheEmptyDirectory(t *testing.T) {
	host := guardNode(t)
	runNode(t, host, nil, "rke2-restart-guard").expect(t, ExitOK)
	runNode(t, host, nil, "rke2-restart-guard", "--remove").expect(t, ExitOK)
	if _, err := os.Stat(host.Path(restartGuardDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the empty drop-in directory is still there: %v", err)
	}
}

func TestRestartGuardFailingSystemctl(t *testing.T) {
	host := guardNode(t)
	host.tools["systemctl"] = func(c Command, _ []byte) ([]byte, error) {
		if c.Args[0] == "restart" {
			return nil, commandError(c, errors.New("exit status 1"), []byte("Failed to restart rancher-system-agent.service: Unit rancher-system-agent.service not found."))
		}
		return nil, nil
	}
	r := runNode(t, host, nil, "rke2-restart-guard")
	r.expect(t, ExitFailed,
		"capi-inplace node rke2-restart-guard: failed",
		"the agent does not use it yet",
		"host command `systemctl restart rancher-system-agent.service`",
		"Unit rancher-system-agent.service not found")

	// The restart never happened: the next run restarts the agent, although the drop-in
	// is already there.
	host.tools["systemctl"] = func(Command, []byte) ([]byte, error) { return nil, nil }
	runNode(t, host, nil, "rke2-restart-guard").expect(t, ExitOK)
	want := []string{"systemctl daemon-reload", "systemctl restart rancher-system-agent.service", "systemctl daemon-reload", "systemctl restart rancher-system-agent.service"}
	if lines := host.commandLines(); !slices.Equal(lines, want) {
		t.Errorf("host commands %q, want %q", lines, want)
	}

	// The same for a removal whose restart failed.
	host.tools["systemctl"] = func(c Command, _ []byte) ([]byte, error) {
		return nil, commandError(c, errors.New("exit status 1"), []byte("Failed to connect to bus"))
	}
	r = runNode(t, host, nil, "rke2-restart-guard", "--remove")
	r.expect(t, ExitFailed, "host command `systemctl daemon-reload`", "the agent still runs with INSTALL_RKE2_SKIP_ENABLE=true")
	host.tools["systemctl"] = func(Command, []byte) ([]byte, error) { return nil, nil }
	before := len(host.commandLines())
	runNode(t, host, nil, "rke2-restart-guard", "--remove").expect(t, ExitOK)
	if lines := host.commandLines()[before:]; !slices.Equal(lines, agentRestart) {
		t.Errorf("after a failed removal the next one ran %q, want %q", lines, agentRestart)
	}
}

func TestRestartGuardRefusesArguments(t *testing.T) {
	runNode(t, guardNode(t), nil, "rke2-restart-guard", "remove").expect(t, ExitUsage, `unexpected arguments ["remove"]`)
}

func TestRKE2RestartTakesTheGuardOffAndRestartsTheActiveService(t *testing.T) {
	host := guardNode(t)
	runNode(t, host, nil, "rke2-restart-guard").expect(t, ExitOK)
	systemctl := host.tools["systemctl"]
	host.tools["systemctl"] = func(c Command, in []byte) ([]byte, error) {
		if len(c.Args) > 0 && c.Args[0] == "is-active" && slices.Contains(c.Args, "rke2-server.service") {
			return nil, errors.New("exit status 3") // a worker: rke2-agent runs
		}
		return systemctl(c, in)
	}
	before := len(host.commandLines())
	r := runNode(t, host, nil, "rke2-restart", "--repository-url=http://repo.example", "--version=v1.8.1")
	r.expect(t, ExitOK, "capi-inplace node rke2-restart: done")
	if !strings.Contains(r.stdout, "restarted rke2-agent.service") {
		t.Errorf("stdout %q does not say what it restarted", r.stdout)
	}
	if _, err := os.Stat(host.Path(restartGuardDropIn)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the restart guard is still there: %v", err)
	}
	want := append(append([]string{}, agentRestart...),
		"systemctl is-active --quiet rke2-server.service", "systemctl is-active --quiet rke2-agent.service", "systemctl restart rke2-agent.service")
	if lines := host.commandLines()[before:]; !slices.Equal(lines, want) {
		t.Fatalf("host commands %q, want %q", lines, want)
	}
}

func TestRKE2RestartFailsWhereNoRKE2Runs(t *testing.T) {
	host := guardNode(t)
	host.tools["systemctl"] = func(c Command, _ []byte) ([]byte, error) {
		if len(c.Args) > 0 && c.Args[0] == "is-active" {
			return nil, errors.New("exit status 3")
		}
		return nil, nil
	}
	r := runNode(t, host, nil, "rke2-restart")
	if r.code == ExitOK {
		t.Fatalf("rke2-restart succeeded on a node where no RKE2 service is active: %s", r.stdout)
	}
	if !strings.Contains(r.termination, "neither rke2-server.service nor rke2-agent.service is active") {
		t.Errorf("termination message %q does not say why", r.termination)
	}
}
