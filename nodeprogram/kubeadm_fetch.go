package nodeprogram

import (
	"context"
	"fmt"
	"path"
)

type kubeadmFetchOptions struct {
	version string
	source  binarySource
}

// runKubeadmFetch is `node kubeadm fetch`: the "Upgrade kubeadm" step of Kubernetes'
// kubeadm upgrade, on every node before `node kubeadm upgrade`.
//
// With --source packages it switches the node's pkgs.k8s.io repository to the target's
// minor release and installs kubeadm at exactly the target with the node's package
// manager; kubelet and kubectl are left to `node kubeadm kubelet`, as the documentation
// upgrades them only after the drain. With --source url or dir it stages all three
// binaries, SHA-256 checked, under /var/lib/capi-inplace/kubeadm/<version>/ (where
// `node kubeadm kubelet` takes kubelet and kubectl from) and installs kubeadm in
// --bin-dir. Either way it ends by checking that the installed kubeadm reports the
// target version. Run again, it downloads nothing already staged and replaces nothing
// already installed.
func runKubeadmFetch(ctx context.Context, env *Env, args []string) error {
	var o kubeadmFetchOptions
	fs := newFlagSet(env, "kubeadm fetch")
	versionFlag(fs, &o.version)
	o.source.bind(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v, err := requireKubeVersion(o.version)
	if err != nil {
		return err
	}
	if err := o.source.validate(kubeBinaries); err != nil {
		return err
	}
	if o.source.kind == sourcePackages {
		p, err := detectPackageManager(env, o.source.repoFile)
		if err != nil {
			return err
		}
		if err := switchRepository(env, p, v); err != nil {
			return err
		}
		if err := installPackages(ctx, env, p, v, "kubeadm"); err != nil {
			return err
		}
	} else {
		if err := o.source.stage(ctx, env, v, kubeBinaries); err != nil {
			return err
		}
		if err := installStaged(env, v, "kubeadm", o.source.binDir); err != nil {
			return err
		}
	}
	kubeadm := path.Join(o.source.binDir, "kubeadm")
	got, err := reportedVersion(ctx, env, Command{Name: kubeadm, Args: []string{"version", "-o", "short"}})
	if err != nil {
		return fmt.Errorf("check the installed kubeadm: %w", err)
	}
	if got != v.String() {
		return fmt.Errorf("the installed %s reports version %q, not %s: the source does not hold kubeadm %s", kubeadm, got, v, v)
	}
	env.say("%s reports %s\n", kubeadm, got)
	return nil
}
