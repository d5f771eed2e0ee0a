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
	placeProgram  string
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
	fs.StringVar(&o.placeProgram, "place-program", "", "then copy this program to that host path (absolute), for a later container of the Job to run from another image (the os Plan's upgrade container on the v1.6 -> v1.7 hop runs it in the release's upgrade image); empty copies nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.placeProgram != "" && !filepath.IsAbs(o.placeProgram) {
		return usagef("--place-program %q must be an absolute path on the host", o.placeProgram)
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
	if o.placeProgram != "" {
		return placeProgram(env, o.placeProgram)
	}
	return nil
}

// placeProgram copies this program's own executable to hostPath on the host, executable,
// through a temporary file renamed into place, so that a container that runs it never
// sees half a copy. The program is static (CGO_ENABLED=0, Dockerfile): it runs in any
// image, the release's upgrade image included.
func placeProgram(env *Env, hostPath string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program's executable to place it at %s: %w", hostPath, err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("read this program (%s) to place it at %s: %w", self, hostPath, err)
	}
	h := env.host()
	if err := os.MkdirAll(h.Path(filepath.Dir(hostPath)), 0o755); err != nil {
		return fmt.Errorf("create %s on the host: %w", filepath.Dir(hostPath), err)
	}
	tmp := h.Path(hostPath + ".new")
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		return fmt.Errorf("write %s on the host: %w", hostPath+".new", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("make %s executable on the host: %w", hostPath+".new", err)
	}
	if err := os.Rename(tmp, h.Path(hostPath)); err != nil {
		return fmt.Errorf("place the program at %s on the host: %w", hostPath, err)
	}
	env.say("placed this program at %s\n", hostPath)
	return nil
}
