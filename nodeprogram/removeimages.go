package nodeprogram

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// imageListPath is the repository path of the list of every image of a Harvester version
// (facts, fact 17); "current" is the release the repository holds.
func imageListPath(version string) string {
	return path.Join("bundle/harvester/images-lists-archive", version, "image_list_all.txt")
}

// retainedImages are the images an upgrade never removes, though the previous release
// lists them and the new one does not: Harvester's own retain list
// (harvester/harvester pkg/controller/master/upgrade/upgrade_repo.go imageRetainList).
// Longhorn keeps running a volume on its old engine and instance manager until that
// volume is upgraded, the upgrade image is what a later upgrade's repository first runs,
// and the logging images are those of a logging stack the user may keep at its version.
// Each is a substring of the reference, as there. Unlike there, every image a substring
// matches is kept, not only the first.
var retainedImages = []string{
	"rancher/harvester-upgrade",
	"longhornio/longhorn-engine",
	"longhornio/longhorn-instance-manager",
	"rancher/mirrored-banzaicloud-fluentd",
	"rancher/mirrored-fluent-fluent-bit",
}

// harvesterVersion is what --previous-version accepts; it is also a path of the
// repository, so nothing else may be in it.
var harvesterVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

type removeImagesOptions struct {
	repositoryURL   string
	version         string
	previousVersion string
	crictl          string
	runtimeEndpoint string
}

// runRemoveImages does on one node what Harvester's image cleanup does once every node
// runs the new release (facts, fact 55): the images of the previous release that the new
// one no longer lists, less the retain list, are removed from the node's containerd with
// `crictl rmi`, one at a time, and an image that will not go is logged and left. It also
// leaves, as Harvester's core cleanup script does (fact 55, prepareCleanupPlan), images
// the runtime pins and the VMDP images (vmdp:*) that a stopped virtual machine may still
// need, and, which neither of Harvester's does, every image a container on the node
// (running or stopped) was created from: containerd removes an image in use without a
// word, and the container could not be started again on a node without a registry.
// Images the node does not have are not asked for. Dangling images, which core's script
// also removes, are left: they are no release's and this command removes only what the
// releases' lists name. Without either list in the repository there is nothing to
// compare, and the command says so and succeeds (the toolkit skips the cleanup then).
func runRemoveImages(ctx context.Context, env *Env, args []string) error {
	var o removeImagesOptions
	fs := newFlagSet(env, "remove-images")
	fs.StringVar(&o.repositoryURL, "repository-url", "", "base URL of the release repository (required); it serves the image lists of the previous release and of this one")
	fs.StringVar(&o.version, "version", "", "the Harvester release the repository must hold (e.g. v1.6.0); empty accepts any")
	fs.StringVar(&o.previousVersion, "previous-version", "", "the Harvester release the nodes ran before (required), e.g. v1.5.1: its images that the new release does not list are removed")
	fs.StringVar(&o.crictl, "crictl", "/var/lib/rancher/rke2/bin/crictl", "crictl on the host (RKE2's own)")
	fs.StringVar(&o.runtimeEndpoint, "runtime-endpoint", "unix:///run/k3s/containerd/containerd.sock", "RKE2's containerd CRI socket on the host")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	repo, err := newRepository(env, o.repositoryURL)
	if err != nil {
		return err
	}
	switch {
	case o.previousVersion == "":
		return usagef("--previous-version is required: the Harvester release the nodes ran before, e.g. v1.5.1")
	case !harvesterVersion.MatchString(o.previousVersion):
		return usagef("--previous-version %q is not a Harvester version such as v1.5.1", o.previousVersion)
	case o.previousVersion == o.version:
		return usagef("--previous-version and --version are both %s: give the release the nodes ran before", o.version)
	case o.crictl == "" || o.runtimeEndpoint == "":
		return usagef("--crictl and --runtime-endpoint must not be empty")
	}
	rel, err := repo.release(ctx, o.version)
	if err != nil {
		return err
	}
	previous, err := repo.imageList(ctx, imageListPath(o.previousVersion))
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("read the image list of %s: %w", o.previousVersion, err)
	}
	if err != nil {
		env.say("the repository has no image list of %s (%s): nothing to compare, no image removed\n", o.previousVersion, repo.url(imageListPath(o.previousVersion)))
		return nil
	}
	current, err := repo.imageList(ctx, imageListPath("current"))
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("read the image list of %s: %w", rel.Harvester, err)
	}
	if err != nil {
		env.say("the repository has no image list of %s (%s): nothing to compare, no image removed\n", rel.Harvester, repo.url(imageListPath("current")))
		return nil
	}
	candidates := unneededImages(previous, current)
	env.say("%d images of %s are not in %s and not retained\n", len(candidates), o.previousVersion, rel.Harvester)
	if len(candidates) == 0 {
		return nil
	}

	node, err := nodeImages(ctx, env, o)
	if err != nil {
		return err
	}
	removed, failed := 0, 0
	for _, ref := range candidates {
		img, ok := node.byRef[ref]
		switch {
		case !ok:
			continue
		case img.Pinned:
			env.say("%s: pinned by the runtime, kept\n", ref)
			continue
		case node.inUse(img):
			env.say("%s: a container on this node uses it, kept\n", ref)
			continue
		}
		if _, err := env.host().Run(ctx, crictlCommand(o, "rmi", ref)); err != nil {
			failed++
			env.say("%s: not removed, left as it is: %v\n", ref, err)
			continue
		}
		removed++
		env.say("%s: removed\n", ref)
	}
	env.say("%d images removed, %d could not be removed\n", removed, failed)
	return nil
}

// unneededImages are the images of previous that current does not list, less the retained
// ones and the VMDP images, normalized and sorted so that the removals run in a stable
// order.
func unneededImages(previous, current []string) []string {
	keep := map[string]bool{}
	for _, ref := range current {
		keep[normalizeImage(ref)] = true
	}
	var out []string
	for _, ref := range previous {
		ref = normalizeImage(ref)
		if keep[ref] || retained(ref) {
			continue
		}
		keep[ref] = true // once
		out = append(out, ref)
	}
	slices.Sort(out)
	return out
}

func retained(ref string) bool {
	for _, r := range retainedImages {
		if strings.Contains(ref, r) {
			return true
		}
	}
	return strings.HasPrefix(ref[strings.LastIndex(ref, "/")+1:], "vmdp:")
}

func crictlCommand(o removeImagesOptions, args ...string) Command {
	return Command{
		Name: o.crictl,
		Args: args,
		Env:  []string{"CONTAINER_RUNTIME_ENDPOINT=" + o.runtimeEndpoint, "IMAGE_SERVICE_ENDPOINT=" + o.runtimeEndpoint},
	}
}

// criImage is an image of `crictl images -o json`.
type criImage struct {
	ID          string   `json:"id"`
	RepoTags    []string `json:"repoTags"`
	RepoDigests []string `json:"repoDigests"`
	Pinned      bool     `json:"pinned"`
}

// criContainer is a container of `crictl ps -a -o json`: the image it was created from,
// as the kubelet asked for it and as the runtime resolved it.
type criContainer struct {
	Image struct {
		Image string `json:"image"`
	} `json:"image"`
	ImageRef string `json:"imageRef"`
}

// runtimeImages is what the node's containerd holds: its images by normalized tag, and
// what its containers were created from.
type runtimeImages struct {
	byRef map[string]criImage
	used  map[string]bool
}

// inUse tells whether a container was created from img, named by its ID, a tag or a
// digest.
func (r runtimeImages) inUse(img criImage) bool {
	for _, name := range append(append([]string{img.ID}, img.RepoTags...), img.RepoDigests...) {
		if r.used[name] || r.used[normalizeImage(name)] {
			return true
		}
	}
	return false
}

// nodeImages asks the node's runtime for its images and containers. Without them no
// image can be known to be unused, so a runtime that does not answer stops the command.
func nodeImages(ctx context.Context, env *Env, o removeImagesOptions) (runtimeImages, error) {
	r := runtimeImages{byRef: map[string]criImage{}, used: map[string]bool{}}
	var images struct {
		Images []criImage `json:"images"`
	}
	if err := crictlJSON(ctx, env, o, &images, "images", "-o", "json"); err != nil {
		return r, err
	}
	for _, img := range images.Images {
		for _, tag := range img.RepoTags {
			r.byRef[normalizeImage(tag)] = img
		}
	}
	var containers struct {
		Containers []criContainer `json:"containers"`
	}
	if err := crictlJSON(ctx, env, o, &containers, "ps", "-a", "-o", "json"); err != nil {
		return r, err
	}
	for _, c := range containers.Containers {
		for _, name := range []string{c.Image.Image, c.ImageRef} {
			if name != "" {
				r.used[name] = true
				r.used[normalizeImage(name)] = true
			}
		}
	}
	return r, nil
}

func crictlJSON(ctx context.Context, env *Env, o removeImagesOptions, into any, args ...string) error {
	cmd := crictlCommand(o, args...)
	out, err := env.host().Run(ctx, cmd)
	if err != nil {
		return retryf("ask containerd for its images and containers (is RKE2 running on this node?): %w", err)
	}
	if err := json.Unmarshal(out, into); err != nil {
		return fmt.Errorf("`%s` printed no JSON this program reads: %w", cmd, err)
	}
	return nil
}
