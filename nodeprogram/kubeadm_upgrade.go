package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
)

// The roles of `kubeadm upgrade --role`.
const (
	roleControlPlane = "control-plane"
	roleWorker       = "worker"
)

type kubeadmUpgradeOptions struct {
	version    string
	role       string
	kubeconfig string
	binDir     string
}

// runKubeadmUpgrade is `node kubeadm upgrade`: the "Call kubeadm upgrade" step of
// Kubernetes' kubeadm upgrade. On a control plane node it reads the version the cluster
// was last applied at (the kubeadm-config ConfigMap's ClusterConfiguration): below the
// target, this is the first control plane node and it runs `kubeadm upgrade apply
// <version> --yes`; at the target, apply has been done (here, or on another node) and it
// runs `kubeadm upgrade node`, so that a run again after a successful apply never
// applies twice. A worker runs `kubeadm upgrade node` and reads nothing from the cluster.
// A target kubeadm refuses (more than one minor up) or a downgrade is refused before
// anything runs on the host. The kubelet is not touched: `node kubeadm kubelet` does that
// once the manager has drained the node.
func runKubeadmUpgrade(ctx context.Context, env *Env, args []string) error {
	var o kubeadmUpgradeOptions
	fs := newFlagSet(env, "kubeadm upgrade")
	versionFlag(fs, &o.version)
	fs.StringVar(&o.role, "role", "", "the node's role: control-plane or worker (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", defaultAdminKubeconfig, "with --role control-plane: the host's kubeconfig to read the cluster's version with (kubeadm's own default); also given to kubeadm when it is not the default")
	fs.StringVar(&o.binDir, "bin-dir", defaultKubeBinDir, "the host directory kubeadm is run from (where `node kubeadm fetch` installed it)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	target, err := requireKubeVersion(o.version)
	if err != nil {
		return err
	}
	if o.role != roleControlPlane && o.role != roleWorker {
		return usagef("--role %q: want control-plane or worker", o.role)
	}
	if err := absHostDir("--bin-dir", o.binDir); err != nil {
		return err
	}
	if err := absHostDir("--kubeconfig", o.kubeconfig); err != nil {
		return err
	}

	kubeadm := path.Join(o.binDir, "kubeadm")
	upgrade := KubeadmUpgradeArgs(false, target.String(), "")
	if o.role == roleControlPlane {
		cluster, err := readClusterVersion(ctx, env, o.kubeconfig)
		if err != nil {
			return err
		}
		if err := checkUpgradeSkew(cluster, target); err != nil {
			return err
		}
		first := cluster.compare(target) < 0
		if first {
			env.say("the cluster's ClusterConfiguration is at %s: this is the first control plane node to upgrade, running `kubeadm upgrade apply %s`\n", cluster, target)
		} else {
			env.say("the cluster's ClusterConfiguration is already at %s: `kubeadm upgrade apply` is done, running `kubeadm upgrade node`\n", target)
		}
		upgrade = KubeadmUpgradeArgs(first, target.String(), o.kubeconfig)
	}
	if err := checkKubeadmVersion(ctx, env, kubeadm, target); err != nil {
		return err
	}
	cmd := Command{Name: kubeadm, Args: upgrade}
	out, err := env.host().Run(ctx, cmd)
	if err != nil {
		return kubeadmFailed(cmd, out, err)
	}
	if len(out) > 0 {
		env.say("%s\n", strings.TrimRight(string(out), "\n"))
	}
	env.say("`kubeadm %s` succeeded\n", strings.Join(upgrade, " "))
	return nil
}

// KubeadmUpgradeArgs is the kubeadm command line (after the binary) that `node kubeadm
// upgrade` runs: `upgrade apply <target> --yes` on the first control plane node (apply),
// `upgrade node` on every other node. kubeconfig, the host's kubeconfig of a control plane
// node, is passed on when it is not kubeadm's own default (empty: the default). The check
// against the real kubeadm (make check-real-kubeadm) runs these very arguments.
func KubeadmUpgradeArgs(apply bool, target, kubeconfig string) []string {
	args := []string{"upgrade", "node"}
	if apply {
		args = []string{"upgrade", "apply", target, "--yes"}
	}
	if kubeconfig != "" && kubeconfig != defaultAdminKubeconfig {
		args = append(args, "--kubeconfig", kubeconfig)
	}
	return args
}

// checkKubeadmVersion makes sure the kubeadm at path reports the target version.
func checkKubeadmVersion(ctx context.Context, env *Env, kubeadm string, target kubeVersion) error {
	got, err := reportedVersion(ctx, env, Command{Name: kubeadm, Args: []string{"version", "-o", "short"}})
	if err != nil {
		return fmt.Errorf("%w: run `capi-inplace node kubeadm fetch --version %s` on this node first", err, target)
	}
	if got != target.String() {
		return fmt.Errorf("%s reports version %q, not %s: run `capi-inplace node kubeadm fetch --version %s` on this node first", kubeadm, got, target, target)
	}
	return nil
}

// reportedVersion is the version a Kubernetes binary reports: the last word of its
// output (`kubeadm version -o short` prints v1.35.2, `kubelet --version` Kubernetes
// v1.35.2).
func reportedVersion(ctx context.Context, env *Env, cmd Command) (string, error) {
	out, err := env.host().Run(ctx, cmd)
	if err != nil {
		return "", err
	}
	words := strings.Fields(string(out))
	if len(words) == 0 {
		return "", nil
	}
	return tail(words[len(words)-1], 100), nil
}

// kubeadmFailed is the error of a failed kubeadm run: its exit code, its own words
// (standard error, carried by err) and the end of its standard output, bounded so that
// the whole termination message stays within what Kubernetes keeps.
func kubeadmFailed(cmd Command, stdout []byte, err error) error {
	code := "unknown"
	var exit interface{ ExitCode() int }
	if errors.As(err, &exit) {
		code = fmt.Sprint(exit.ExitCode())
	}
	msg := fmt.Sprintf("`%s` failed with exit code %s: %s", cmd, code, tail(err.Error(), 1500))
	if out := tail(string(stdout), 1500); out != "" {
		msg += "; its output ended with: " + out
	}
	return errors.New(msg + "; the kubelet was not touched: fix what kubeadm says and run `node kubeadm upgrade` again (kubeadm upgrade is idempotent)")
}
