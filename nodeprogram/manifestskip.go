package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Host paths of the manifest skip (shared/facts/harvester-release-steps.md, fact 34).
const (
	// rke2ManifestsDir is RKE2's server manifests directory, which its deploy controller
	// applies at start and looks at again periodically. Only server nodes (control plane,
	// etcd, witness) have it; an agent (worker) node runs no deploy controller.
	rke2ManifestsDir = "/var/lib/rancher/rke2/server/manifests"
	// multusManifestSkip is the file whose presence makes RKE2's deploy controller ignore
	// rke2-multus.yaml: <manifest>.skip next to the manifest (k3s pkg/deploy/controller.go
	// listFilesIn, shouldSkipFile).
	multusManifestSkip = rke2ManifestsDir + "/rke2-multus.yaml.skip"
)

// multusManifestSkipContent is what the skip file holds. RKE2 looks at its name only;
// the content says who wrote it.
const multusManifestSkipContent = "# Written by `capi-inplace node rke2-manifest-skip`; removed by its --remove at the end of the upgrade.\n"

type manifestSkipOptions struct {
	remove        bool
	repositoryURL string
	version       string
}

// runManifestSkip places or removes rke2-multus.yaml.skip in RKE2's server manifests
// directory on the node it runs on: Harvester's skip-manifests Plans (fact 34, Harvester
// v1.8.2 pkg/controller/master/upgrade/common.go skipManifestScript). With the file in
// place, RKE2 restarting at a new version during the node phase does not apply its new
// rke2-multus chart, so that no node's restart runs a helm upgrade of multus, which under
// helm-controller's reinstall policy can delete the NetworkAttachmentDefinition CRD and
// every VM network (fact 9). Taken off at the end, RKE2's deploy controller applies the
// chart once, at its next pass.
//
// A node without the manifests directory (an agent node: no deploy controller) has
// nothing to skip: the subcommand says so and succeeds, as Harvester's script exits 0
// there. Both directions are idempotent: a skip file in place, or none to remove, is
// done.
func runManifestSkip(_ context.Context, env *Env, args []string) error {
	var o manifestSkipOptions
	fs := newFlagSet(env, "rke2-manifest-skip")
	fs.BoolVar(&o.remove, "remove", false, "remove the skip file instead of placing it: RKE2 applies rke2-multus.yaml again")
	// Accepted so that every Plan runs the node program with the same flags; the skip
	// reads nothing from the repository.
	fs.StringVar(&o.repositoryURL, "repository-url", "", "accepted and unused: the skip needs no repository")
	fs.StringVar(&o.version, "version", "", "accepted and unused: the skip is the same for every release")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	h := env.host()
	info, err := os.Stat(h.Path(rke2ManifestsDir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		env.say("no RKE2 server manifests directory on this node (%s): not an RKE2 server, nothing to skip\n", rke2ManifestsDir)
		return nil
	case err != nil:
		return fmt.Errorf("look for %s on the host: %w", rke2ManifestsDir, err)
	case !info.IsDir():
		return fmt.Errorf("%s on the host is not a directory: RKE2 keeps its server manifests there; see what put a file in its place", rke2ManifestsDir)
	}
	if o.remove {
		err := os.Remove(h.Path(multusManifestSkip))
		switch {
		case errors.Is(err, os.ErrNotExist):
			env.say("%s is absent: RKE2 already applies rke2-multus.yaml\n", multusManifestSkip)
			return nil
		case err != nil:
			return fmt.Errorf("remove %s on the host; RKE2 keeps ignoring rke2-multus.yaml until it is gone: %w", multusManifestSkip, err)
		}
		env.say("removed %s: RKE2 applies rke2-multus.yaml at its next pass\n", multusManifestSkip)
		return nil
	}
	exists, err := hostFileExists(h, multusManifestSkip)
	if err != nil {
		return err
	}
	if exists {
		env.say("%s is already in place: RKE2 ignores rke2-multus.yaml\n", multusManifestSkip)
		return nil
	}
	if err := writeHostFile(h, multusManifestSkip, multusManifestSkipContent); err != nil {
		return err
	}
	env.say("wrote %s: RKE2 restarting at a new version does not apply rke2-multus.yaml\n", multusManifestSkip)
	return nil
}
