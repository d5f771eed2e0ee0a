package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
)

type cleanupOptions struct {
	repositoryURL string
	version       string
	rke2ImagesDir string
}

// runRemoveArchives does step 4 of Harvester's post-drain (facts, fact 26): once RKE2 has
// been upgraded and has imported them, the RKE2 lists and archives that preload placed in
// RKE2's images directory go, so that RKE2 does not import them again at every start and
// they do not hold the disk. The system agent's are left, as Harvester leaves them.
func runRemoveArchives(ctx context.Context, env *Env, args []string) error {
	var o cleanupOptions
	fs := newFlagSet(env, "remove-archives")
	fs.StringVar(&o.repositoryURL, "repository-url", "", "base URL of the release repository (required); its bundle/metadata.yaml names the files to remove")
	fs.StringVar(&o.version, "version", "", "the Harvester release the repository must hold (e.g. v1.6.0); empty accepts any")
	fs.StringVar(&o.rke2ImagesDir, "rke2-images-dir", "/var/lib/rancher/rke2/agent/images", "host directory preload placed RKE2's archives in")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	repo, err := newRepository(env, o.repositoryURL)
	if err != nil {
		return err
	}
	if _, err := repo.release(ctx, o.version); err != nil {
		return err
	}
	var meta bundleMetadata
	if err := repo.read(ctx, "bundle/metadata.yaml", &meta); err != nil {
		return fmt.Errorf("read the image index: %w", err)
	}
	removed := 0
	for _, entry := range meta.Images.RKE2 {
		for _, file := range []string{entry.List, entry.Archive} {
			if file == "" {
				continue
			}
			hostPath := filepath.Join(o.rke2ImagesDir, path.Base(file))
			err := os.Remove(env.host().Path(hostPath))
			switch {
			case err == nil:
				removed++
				env.say("removed %s\n", hostPath)
			case !errors.Is(err, os.ErrNotExist):
				return fmt.Errorf("remove %s on the host: %w", hostPath, err)
			}
		}
	}
	env.say("%d files removed from %s\n", removed, o.rke2ImagesDir)
	return nil
}
