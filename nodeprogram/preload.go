package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

type preloadOptions struct {
	repositoryURL     string
	version           string
	ctr               string
	containerdAddress string
	rke2ImagesDir     string
	agentImagesDir    string
	placeArchives     bool
	minCertDays       int
}

// runPreload does what Harvester's `upgrade_node.sh prepare` does once the repository is
// there (facts, fact 22): import every common and rke2 archive whose images containerd
// does not all have yet, then leave the rke2 and agent archives where RKE2 and the
// system agent load them from when they restart.
func runPreload(ctx context.Context, env *Env, args []string) error {
	var o preloadOptions
	fs := newFlagSet(env, "preload")
	fs.StringVar(&o.repositoryURL, "repository-url", "", "base URL of the release repository (required), e.g. http://upgrade-repo.harvester-system/harvester-iso")
	fs.StringVar(&o.version, "version", "", "the Harvester release the repository must hold (e.g. v1.6.0); empty accepts any")
	fs.StringVar(&o.ctr, "ctr", "/var/lib/rancher/rke2/bin/ctr", "containerd's ctr on the host (RKE2's own)")
	fs.StringVar(&o.containerdAddress, "containerd-address", "/run/k3s/containerd/containerd.sock", "RKE2's containerd socket on the host")
	fs.StringVar(&o.rke2ImagesDir, "rke2-images-dir", "/var/lib/rancher/rke2/agent/images", "host directory RKE2 imports archives from at start")
	fs.StringVar(&o.agentImagesDir, "agent-images-dir", "/var/lib/rancher/agent/images", "host directory the system agent imports archives from")
	fs.BoolVar(&o.placeArchives, "place-archives", true, "also copy the rke2 and agent lists and archives into --rke2-images-dir and --agent-images-dir, as Harvester does")
	fs.IntVar(&o.minCertDays, "min-cert-days", 7, "fail, before anything is imported, when a certificate of RKE2's on the node expires within this many days; 0 checks none")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// Before the first node of the cluster is disrupted: preload runs on every node
	// ahead of the roll (the UpgradePlan's preload), and each node's own preload before
	// it is drained.
	if o.minCertDays < 0 {
		return usagef("--min-cert-days must be 0 (no check) or more, not %d", o.minCertDays)
	}
	if err := checkRKE2Certificates(env, o.minCertDays); err != nil {
		return err
	}
	repo, err := newRepository(env, o.repositoryURL)
	if err != nil {
		return err
	}
	if o.ctr == "" || o.containerdAddress == "" {
		return usagef("--ctr and --containerd-address must not be empty")
	}
	rel, err := repo.release(ctx, o.version)
	if err != nil {
		return err
	}
	var meta bundleMetadata
	if err := repo.read(ctx, "bundle/metadata.yaml", &meta); err != nil {
		return fmt.Errorf("read the image index: %w", err)
	}
	if len(meta.Images.Common)+len(meta.Images.RKE2) == 0 {
		return fmt.Errorf("%s lists no common or rke2 images: the repository is not a complete Harvester release", repo.url("bundle/metadata.yaml"))
	}
	present, err := containerdImages(ctx, env, o)
	if err != nil {
		return err
	}
	imported, skipped := 0, 0
	// The agent archive too, unlike the release: it holds Rancher's installer image
	// (system-agent-installer-rancher), from which the cluster upgrade Job takes Rancher's
	// chart and helm by running it, so the kubelet must find it without a registry (the
	// release's script extracts it from the archive with wharfie, fact 16.1).
	archives := append(append(append([]imageArchive{}, meta.Images.Common...), meta.Images.RKE2...), meta.Images.Agent...)
	for _, entry := range archives {
		if entry.List == "" || entry.Archive == "" {
			return fmt.Errorf("%s has an entry without list or archive (%+v)", repo.url("bundle/metadata.yaml"), entry)
		}
		images, err := repo.imageList(ctx, bundlePath(entry.List))
		if err != nil {
			return fmt.Errorf("read image list: %w", err)
		}
		if allPresent(images, present) {
			skipped++
			env.say("%s: all %d images already in containerd\n", entry.List, len(images))
			continue
		}
		if err := importArchive(ctx, env, o, repo, bundlePath(entry.Archive)); err != nil {
			return err
		}
		imported++
		env.say("%s: imported %s (%d images)\n", entry.List, entry.Archive, len(images))
	}
	if o.placeArchives {
		for _, place := range []struct {
			dir     string
			entries []imageArchive
		}{{o.rke2ImagesDir, meta.Images.RKE2}, {o.agentImagesDir, meta.Images.Agent}} {
			for _, entry := range place.entries {
				for _, file := range []string{entry.List, entry.Archive} {
					if err := placeFile(ctx, env, repo, bundlePath(file), place.dir); err != nil {
						return err
					}
				}
			}
		}
	}
	env.say("release %s: %d archives imported, %d already present\n", rel.Harvester, imported, skipped)
	return nil
}

// bundlePath is the repository path of a metadata.yaml path (relative to bundle/, with a
// leading "/").
func bundlePath(p string) string { return path.Join("bundle", path.Clean("/"+p)) }

func ctrCommand(o preloadOptions, stdin io.Reader, args ...string) Command {
	return Command{
		Name:  o.ctr,
		Args:  append([]string{"-n", "k8s.io"}, args...),
		Env:   []string{"CONTAINERD_ADDRESS=" + o.containerdAddress},
		Stdin: stdin,
	}
}

// containerdImages is the set of image references containerd's k8s.io namespace holds.
func containerdImages(ctx context.Context, env *Env, o preloadOptions) (map[string]bool, error) {
	out, err := env.host().Run(ctx, ctrCommand(o, nil, "images", "ls", "-q"))
	if err != nil {
		return nil, retryf("list containerd's images (is RKE2 running on this node?): %w", err)
	}
	present := map[string]bool{}
	for line := range strings.SplitSeq(string(out), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			present[normalizeImage(line)] = true
		}
	}
	return present, nil
}

func allPresent(images []string, present map[string]bool) bool {
	for _, image := range images {
		if !present[normalizeImage(image)] {
			return false
		}
	}
	return true
}

// normalizeImage writes an image reference the way containerd stores it: with a
// registry, and with library/ for Docker Hub's official images.
func normalizeImage(ref string) string {
	name := ref
	first, rest, found := strings.Cut(name, "/")
	if !found || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		name = "docker.io/" + name
		first, rest, _ = strings.Cut(name, "/")
	}
	if first == "docker.io" && !strings.Contains(rest, "/") {
		name = "docker.io/library/" + rest
	}
	return name
}

// importArchive streams a zstd-compressed `docker save` archive from the repository into
// `ctr images import`, as `curl | zstdcat | ctr -n k8s.io images import --no-unpack -`.
func importArchive(ctx context.Context, env *Env, o preloadOptions, repo *repository, archive string) error {
	body, err := repo.open(ctx, archive)
	if err != nil {
		return fmt.Errorf("download image archive: %w", err)
	}
	defer body.Close() //nolint:errcheck // read only
	dec, err := zstd.NewReader(body)
	if err != nil {
		return fmt.Errorf("read %s: %w", repo.url(archive), err)
	}
	defer dec.Close()
	if _, err := env.host().Run(ctx, ctrCommand(o, dec, "images", "import", "--no-unpack", "-")); err != nil {
		return fmt.Errorf("import %s into containerd: %w", repo.url(archive), err)
	}
	return nil
}

// placeFile copies a repository file into a host directory, through a temporary name so
// that RKE2 never reads half a file.
func placeFile(ctx context.Context, env *Env, repo *repository, file, hostDir string) error {
	dir := env.host().Path(hostDir)
	dest := filepath.Join(dir, path.Base(file))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s on the host: %w", hostDir, err)
	}
	body, err := repo.open(ctx, file)
	if err != nil {
		return fmt.Errorf("download %s: %w", file, err)
	}
	defer body.Close() //nolint:errcheck // read only
	tmp, err := os.CreateTemp(dir, "."+path.Base(file)+".*")
	if err != nil {
		return fmt.Errorf("write into %s on the host: %w", hostDir, err)
	}
	_, copyErr := io.Copy(tmp, body)
	closeErr := tmp.Close()
	if err := errors.Join(copyErr, closeErr); err != nil {
		_ = os.Remove(tmp.Name())
		return retryf("copy %s to %s: %w", repo.url(file), hostDir, err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("move %s into place: %w", dest, err)
	}
	return nil
}
