package nodeprogram

import (
	"context"
	"fmt"
)

// The RKE2 services, one of which runs on a node: rke2-server on a server (etcd,
// control plane), rke2-agent on a worker.
var rke2Units = []string{"rke2-server.service", "rke2-agent.service"}

type rke2RestartOptions struct {
	repositoryURL string
	version       string
}

// runRKE2Restart starts the RKE2 installed on the node: it takes the restart guard off
// (removeRestartGuard, as recover_rancher_system_agent does before a node's RKE2 is let
// restart, harvester-release-steps.md fact 44) and restarts the RKE2 service that runs
// there, rke2-server or rke2-agent.
//
// It is for a node where rancher-system-agent applied Rancher's plan under the restart
// guard: system-agent-installer-rke2's run.sh installed the new binaries and wrote the
// restart stamp, then exited on INSTALL_RKE2_SKIP_ENABLE=true before the restart (fact
// 12), and the agent counts the plan as applied, so it never runs it again. Rancher
// waits for that node's kubelet at the declared version for good (fact 61) and will not
// restart it. Only a restart of the service, or a reboot, starts what is installed; the
// NodeUpdate runs this once the node is drained, inside its own update.
//
// systemctl runs with SYSTEMD_OFFLINE=0, as in rke2-restart-guard (chroot). A node
// where neither service is active has nothing to restart: that is an error, since the
// node's Kubernetes then does not run at all.
func runRKE2Restart(ctx context.Context, env *Env, args []string) error {
	var o rke2RestartOptions
	fs := newFlagSet(env, "rke2-restart")
	fs.StringVar(&o.repositoryURL, "repository-url", "", "accepted and unused: the restart needs no repository")
	fs.StringVar(&o.version, "version", "", "accepted and unused: the restart starts whatever RKE2 is installed")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := removeRestartGuard(ctx, env); err != nil {
		return err
	}
	systemdEnv := []string{"SYSTEMD_OFFLINE=0"}
	for _, unit := range rke2Units {
		// is-active exits non-zero for a unit that is not active (or not installed).
		if _, err := env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"is-active", "--quiet", unit}, Env: systemdEnv}); err != nil {
			continue
		}
		if _, err := env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"restart", unit}, Env: systemdEnv}); err != nil {
			return fmt.Errorf("restart %s: %w; the node runs the RKE2 it ran, or none: look at `journalctl -u %s` on the node", unit, err, unit)
		}
		env.say("restarted %s: it runs the RKE2 that rancher-system-agent installed\n", unit)
		return nil
	}
	return fmt.Errorf("neither %s nor %s is active on this node: nothing runs RKE2 to restart; look at the node", rke2Units[0], rke2Units[1])
}
