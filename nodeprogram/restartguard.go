package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Host paths and unit of the restart guard (shared/facts/harvester-release-steps.md,
// facts 12 and 44).
const (
	// agentUnit is Rancher's system agent, which applies the machine plans Rancher
	// renders and restarts rke2-server or rke2-agent when a plan's installer runs.
	agentUnit = "rancher-system-agent.service"
	// restartGuardDir is the agent's runtime drop-in directory, the one Harvester's
	// skip_restart_rancher_system_agent writes into. /run is a tmpfs: what is there is
	// gone after a reboot.
	restartGuardDir = "/run/systemd/system/rancher-system-agent.service.d"
	// restartGuardDropIn is our own drop-in, not Harvester's: Harvester writes
	// override.conf (EnvironmentFile=-.../10-harvester-upgrade.env) and that env file.
	// --remove takes the whole directory away, both guards, as the release does.
	restartGuardDropIn = restartGuardDir + "/capi-inplace-skip-restart.conf"
	// restartGuardMarker says that the agent was restarted after the drop-in was
	// written: a run killed between the write and the restart leaves the drop-in
	// without the marker, and the next run restarts the agent instead of taking the
	// drop-in as done. On /run too, so that it goes with the drop-in.
	restartGuardMarker = "/run/capi-inplace/rke2-restart-guard"
)

// restartGuardContent is the drop-in: the variable Harvester's env file gives the
// agent, INSTALL_RKE2_SKIP_ENABLE=true, set directly with Environment= (one file instead
// of Harvester's two). The agent passes its environment to the plan's installer
// (system-agent-installer-rke2's run.sh), which then stops after installing, before it
// enables and restarts rke2-server or rke2-agent: what Harvester's guard relies on
// (harvester-release-steps.md fact 12).
const restartGuardContent = "# Written by `capi-inplace node rke2-restart-guard`; removed by its --remove, or by the next reboot.\n" +
	"[Service]\n" +
	"Environment=INSTALL_RKE2_SKIP_ENABLE=true\n"

type restartGuardOptions struct {
	remove        bool
	repositoryURL string
	version       string
}

// runRestartGuard places or removes the restart guard: Harvester's
// skip_restart_rancher_system_agent (harvester-release-steps.md fact 12) and
// recover_rancher_system_agent (fact 44), on the node it runs on.
//
// Without --remove it writes restartGuardDropIn, a runtime drop-in for
// rancher-system-agent giving it INSTALL_RKE2_SKIP_ENABLE=true, then reloads systemd and
// restarts the agent: from then on, a machine plan Rancher re-renders (as it does for
// every node when Rancher is upgraded) is installed without restarting rke2-server or
// rke2-agent, which would take the node's Longhorn volumes and virtual machines down
// (fact 12). With --remove it deletes the drop-in directory (ours and any guard
// Harvester's own upgrade left), reloads and restarts the agent, so that the next plan
// restarts RKE2 again (fact 44). Both are idempotent: a guard in
// place, or no guard to remove, does nothing and restarts nothing.
//
// The drop-in lives under /run, a tmpfs: a reboot of the node removes the guard as
// well (fact 12), so a node rebooted by os-upgrade comes back unguarded.
//
// systemctl runs with SYSTEMD_OFFLINE=0: systemctl in a chroot whose root is not PID
// 1's does nothing and says so, unless told to talk to PID 1 anyway. Harvester's Plan
// needs no such setting only because SUC's pods share the host's PID namespace.
func runRestartGuard(ctx context.Context, env *Env, args []string) error {
	var o restartGuardOptions
	fs := newFlagSet(env, "rke2-restart-guard")
	fs.BoolVar(&o.remove, "remove", false, "remove the guard instead of placing it: the next machine plan restarts RKE2 again")
	// Accepted so that every Plan runs the node program with the same flags; the guard
	// reads nothing from the repository.
	fs.StringVar(&o.repositoryURL, "repository-url", "", "accepted and unused: the guard needs no repository")
	fs.StringVar(&o.version, "version", "", "accepted and unused: the guard is the same for every release")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.remove {
		return removeRestartGuard(ctx, env)
	}
	return placeRestartGuard(ctx, env)
}

// placeRestartGuard writes the drop-in and restarts the agent, unless both were done.
func placeRestartGuard(ctx context.Context, env *Env) error {
	h := env.host()
	current, err := os.ReadFile(h.Path(restartGuardDropIn))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s on the host: %w", restartGuardDropIn, err)
	}
	same := err == nil && string(current) == restartGuardContent
	restarted, err := hostFileExists(h, restartGuardMarker)
	if err != nil {
		return err
	}
	if same && restarted {
		env.say("the restart guard is already in place (%s): %s not restarted\n", restartGuardDropIn, agentUnit)
		return nil
	}
	if !same {
		if err := writeHostFile(h, restartGuardDropIn, restartGuardContent); err != nil {
			return err
		}
		env.say("wrote %s\n", restartGuardDropIn)
	}
	if err := restartAgent(ctx, env, "the drop-in "+restartGuardDropIn+" is written but the agent does not use it yet"); err != nil {
		return err
	}
	if err := writeHostFile(h, restartGuardMarker, restartGuardDropIn+"\n"); err != nil {
		return err
	}
	env.say("restart guard in place: %s installs new machine plans without restarting RKE2\n", agentUnit)
	return nil
}

// removeRestartGuard removes the agent's runtime drop-in directory, whatever it holds,
// and restarts the agent, as the release's recover_rancher_system_agent does
// (upgrade_node.sh: rm -rf /run/systemd/system/rancher-system-agent.service.d, then
// daemon-reload and restart; fact 44): our drop-in, and Harvester's override.conf and
// 10-harvester-upgrade.env that an interrupted Harvester upgrade may have left, which
// would otherwise keep INSTALL_RKE2_SKIP_ENABLE=true and stop every later plan from
// restarting RKE2 (issue #53). Nothing is done when neither the directory nor a restart
// under our guard is there.
func removeRestartGuard(ctx context.Context, env *Env) error {
	h := env.host()
	entries, err := os.ReadDir(h.Path(restartGuardDir))
	present := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s on the host: %w", restartGuardDir, err)
	}
	marked, err := hostFileExists(h, restartGuardMarker)
	if err != nil {
		return err
	}
	if !present && !marked {
		env.say("no restart guard on this node (%s is absent): %s not restarted\n", restartGuardDir, agentUnit)
		return nil
	}
	if present {
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if err := os.RemoveAll(h.Path(restartGuardDir)); err != nil {
			return fmt.Errorf("remove %s on the host: %w", restartGuardDir, err)
		}
		env.say("removed %s (%s), as the release's recover_rancher_system_agent does\n", restartGuardDir, strings.Join(names, ", "))
	}
	if err := restartAgent(ctx, env, "the drop-ins of "+restartGuardDir+" are removed but the agent still runs with INSTALL_RKE2_SKIP_ENABLE=true"); err != nil {
		return err
	}
	if err := os.Remove(h.Path(restartGuardMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s on the host: %w", restartGuardMarker, err)
	}
	env.say("restart guard removed: %s restarts RKE2 again when it installs a new machine plan\n", agentUnit)
	return nil
}

// restartAgent reloads the host's systemd and restarts the agent; state says where a
// failure leaves the node.
func restartAgent(ctx context.Context, env *Env, state string) error {
	systemdEnv := []string{"SYSTEMD_OFFLINE=0"}
	for _, args := range [][]string{{"daemon-reload"}, {"restart", agentUnit}} {
		if _, err := env.host().Run(ctx, Command{Name: "systemctl", Args: args, Env: systemdEnv}); err != nil {
			return fmt.Errorf("%s; run again, or on the node `systemctl daemon-reload && systemctl restart %s`: %w", state, agentUnit, err)
		}
	}
	return nil
}

// hostFileExists tells whether the host path p exists.
func hostFileExists(h Host, p string) (bool, error) {
	_, err := os.Lstat(h.Path(p))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("look for %s on the host: %w", filepath.Clean(p), err)
	}
}
