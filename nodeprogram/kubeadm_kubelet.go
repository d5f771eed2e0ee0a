package nodeprogram

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// kubeletBinaries are what `node kubeadm kubelet` installs.
var kubeletBinaries = []string{"kubelet", "kubectl"}

type kubeadmKubeletOptions struct {
	version string
	source  binarySource
	unit    string
}

// kubeletRestartedMarker is the host file in which `node kubeadm kubelet` records the
// SHA-256 of the kubelet binary it restarted the kubelet unit with.
func kubeletRestartedMarker(v kubeVersion) string {
	return path.Join(kubeadmStageRoot, v.String(), "kubelet-restarted")
}

// runKubeadmKubelet is `node kubeadm kubelet`: the "Upgrade kubelet and kubectl" step of
// Kubernetes' kubeadm upgrade, run once the manager has drained the node. It installs
// kubelet and kubectl at the target (packages: unhold, install, hold, as for kubeadm;
// url and dir: from the staged, checked files, atomically), checks that the installed
// kubelet reports the target, then runs `systemctl daemon-reload` and `systemctl restart
// <unit>`, and records the restart.
//
// Run again, it does not restart a kubelet it already restarted: when the record names
// the SHA-256 of the kubelet binary installed now and the unit is active, the running
// kubelet is the one this phase started from that very binary, and restarting it again
// would only take the node's kubelet away for nothing. Any other case restarts it: a
// new binary, a record of another binary, no record (the run was killed between the
// restart and the record: one restart too many, never one too few), or a unit that is
// not active.
func runKubeadmKubelet(ctx context.Context, env *Env, args []string) error {
	var o kubeadmKubeletOptions
	fs := newFlagSet(env, "kubeadm kubelet")
	versionFlag(fs, &o.version)
	o.source.bind(fs)
	fs.StringVar(&o.unit, "unit", "kubelet", "the systemd unit of the kubelet")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v, err := requireKubeVersion(o.version)
	if err != nil {
		return err
	}
	if err := o.source.validate(kubeletBinaries); err != nil {
		return err
	}
	if o.unit == "" || strings.ContainsAny(o.unit, " /") {
		return usagef("--unit %q is not a systemd unit name", o.unit)
	}
	if o.source.kind == sourcePackages {
		p, err := detectPackageManager(env, o.source.repoFile)
		if err != nil {
			return err
		}
		if err := switchRepository(env, p, v); err != nil {
			return err
		}
		if err := installPackages(ctx, env, p, v, kubeletBinaries...); err != nil {
			return err
		}
	} else {
		if err := o.source.stage(ctx, env, v, kubeletBinaries); err != nil {
			return err
		}
		for _, name := range kubeletBinaries {
			if err := installStaged(env, v, name, o.source.binDir); err != nil {
				return err
			}
		}
	}

	kubelet := path.Join(o.source.binDir, "kubelet")
	got, err := reportedVersion(ctx, env, Command{Name: kubelet, Args: []string{"--version"}})
	if err != nil {
		return fmt.Errorf("check the installed kubelet: %w; the kubelet was not restarted", err)
	}
	if got != v.String() {
		return fmt.Errorf("the installed %s reports version %q, not %s: the source does not hold kubelet %s; the kubelet was not restarted", kubelet, got, v, v)
	}
	sum, err := fileSHA256(env.host().Path(kubelet))
	if err != nil {
		return fmt.Errorf("read the installed kubelet: %w", err)
	}
	marker := env.host().Path(kubeletRestartedMarker(v))
	systemdEnv := []string{"SYSTEMD_OFFLINE=0"}
	if recorded, err := os.ReadFile(marker); err == nil && strings.TrimSpace(string(recorded)) == sum {
		if _, err := env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"is-active", "--quiet", o.unit}, Env: systemdEnv}); err == nil {
			env.say("%s was already restarted with this kubelet %s (SHA-256 %s…) and is active: not restarting it again\n", o.unit, v, sum[:16])
			return nil
		}
		env.say("%s is not active: restarting it\n", o.unit)
	}
	if _, err := env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"daemon-reload"}, Env: systemdEnv}); err != nil {
		return fmt.Errorf("reload systemd: %w; the kubelet was not restarted", err)
	}
	if _, err := env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"restart", o.unit}, Env: systemdEnv}); err != nil {
		return fmt.Errorf("restart the kubelet: %w; look at `systemctl status %s` and `journalctl -xeu %s` on the node", err, o.unit, o.unit)
	}
	if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
		return fmt.Errorf("record the kubelet restart: %w", err)
	}
	if err := os.WriteFile(marker, []byte(sum+"\n"), 0o644); err != nil {
		return fmt.Errorf("record the kubelet restart: %w", err)
	}
	env.say("restarted %s: it runs kubelet %s\n", o.unit, v)
	return nil
}
