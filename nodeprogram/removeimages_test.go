package nodeprogram

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

const crictlPath = "/var/lib/rancher/rke2/bin/crictl"

// imageListsRepository serves a v1.6.0 repository with the image lists of v1.5.1 (the
// previous release) and of current (facts, fact 17).
func imageListsRepository(t *testing.T, previous, current string) *fileServer {
	t.Helper()
	files := map[string][]byte{"/harvester-iso/harvester-release.yaml": []byte(releaseYAML)}
	if previous != "" {
		files["/harvester-iso/bundle/harvester/images-lists-archive/v1.5.1/image_list_all.txt"] = []byte(previous)
	}
	if current != "" {
		files["/harvester-iso/bundle/harvester/images-lists-archive/current/image_list_all.txt"] = []byte(current)
	}
	return newFileServer(t, files)
}

// fakeRuntime is the node's containerd as crictl shows it.
type fakeRuntime struct {
	images     []criImage
	containers []map[string]any
	// failRmi names the images whose rmi fails.
	failRmi map[string]bool
}

// withCrictl gives the fake host RKE2's crictl answering from rt.
func withCrictl(host *fakeHost, rt *fakeRuntime) {
	host.tools[crictlPath] = func(c Command, _ []byte) ([]byte, error) {
		switch {
		case slices.Equal(c.Args, []string{"images", "-o", "json"}):
			return json.Marshal(map[string]any{"images": rt.images})
		case slices.Equal(c.Args, []string{"ps", "-a", "-o", "json"}):
			return json.Marshal(map[string]any{"containers": rt.containers})
		case len(c.Args) == 2 && c.Args[0] == "rmi":
			if rt.failRmi[c.Args[1]] {
				return nil, commandError(c, errors.New("exit status 1"), []byte("image is in use by a container"))
			}
			return nil, nil
		}
		return nil, commandError(c, errors.New("exit status 1"), []byte("unknown command"))
	}
}

func image(id string, tags ...string) criImage { return criImage{ID: id, RepoTags: tags} }

// rmis are the images the command asked crictl to remove, in order.
func rmis(host *fakeHost) []string {
	var out []string
	for _, c := range host.calls {
		if c.Name == crictlPath && len(c.Args) > 0 && c.Args[0] == "rmi" {
			out = append(out, c.Args[1])
		}
	}
	return out
}

const previousList = `rancher/harvester:v1.5.1
rancher/harvester-webhook:v1.5.1
rancher/harvester-upgrade:v1.5.1
longhornio/longhorn-engine:v1.8.1
longhornio/longhorn-instance-manager:v1.8.1
registry.suse.com/suse/vmdp/vmdp:2.5.4.3
busybox:1.36
docker.io/rancher/kubevirt-virt-launcher:v1.4.0
rancher/mirrored-library-nginx:1.24
rancher/hardened-coredns:v1.12.0
`

const currentList = `docker.io/rancher/harvester:v1.6.0
rancher/harvester-webhook:v1.6.0
docker.io/library/busybox:1.36
rancher/kubevirt-virt-launcher:v1.5.0
rancher/hardened-coredns:v1.12.0
`

func TestRemoveImagesRemovesThePreviousReleasesLeftovers(t *testing.T) {
	srv := imageListsRepository(t, previousList, currentList)
	host := newFakeHost(t)
	rt := &fakeRuntime{
		images: []criImage{
			image("sha256:01", "docker.io/rancher/harvester:v1.5.1"),
			image("sha256:02", "docker.io/rancher/harvester-webhook:v1.5.1"),
			image("sha256:03", "docker.io/rancher/harvester-upgrade:v1.5.1"),
			image("sha256:04", "docker.io/longhornio/longhorn-engine:v1.8.1"),
			image("sha256:05", "docker.io/longhornio/longhorn-instance-manager:v1.8.1"),
			image("sha256:06", "registry.suse.com/suse/vmdp/vmdp:2.5.4.3"),
			image("sha256:07", "docker.io/library/busybox:1.36"),
			image("sha256:08", "docker.io/rancher/kubevirt-virt-launcher:v1.4.0"),
			image("sha256:10", "docker.io/rancher/hardened-coredns:v1.12.0"),
			image("sha256:11", "docker.io/rancher/harvester:v1.6.0"),
			{ID: "sha256:12", RepoTags: []string{"docker.io/rancher/mirrored-pause:3.6"}, Pinned: true},
		},
		// A virtual machine not yet restarted still runs the old launcher: its image stays.
		containers: []map[string]any{
			{"id": "c1", "image": map[string]any{"image": "sha256:08"}, "imageRef": "sha256:08", "state": "CONTAINER_RUNNING"},
			{"id": "c2", "image": map[string]any{"image": "docker.io/rancher/harvester:v1.6.0"}, "imageRef": "sha256:11", "state": "CONTAINER_RUNNING"},
		},
		failRmi: map[string]bool{"docker.io/rancher/harvester-webhook:v1.5.1": true},
	}
	withCrictl(host, rt)
	r := runNode(t, host, nil, "remove-images", "--repository-url="+srv.URL+"/harvester-iso", "--version=v1.6.0", "--previous-version=v1.5.1")
	r.expect(t, ExitOK, "capi-inplace node remove-images: done")

	// v1.5.1 minus v1.6.0 (written either way), minus the retain list and VMDP, minus
	// what a container uses; nginx is not on the node and is not asked for. Sorted.
	want := []string{
		"docker.io/rancher/harvester-webhook:v1.5.1",
		"docker.io/rancher/harvester:v1.5.1",
	}
	if got := rmis(host); !slices.Equal(got, want) {
		t.Errorf("crictl rmi of %q, want exactly %q", got, want)
	}
	for _, c := range host.calls {
		if !slices.Contains(c.Env, "CONTAINER_RUNTIME_ENDPOINT=unix:///run/k3s/containerd/containerd.sock") {
			t.Errorf("%s ran without RKE2's containerd endpoint: %v", c, c.Env)
		}
	}
	for _, part := range []string{
		"docker.io/rancher/harvester-webhook:v1.5.1: not removed, left as it is", "image is in use by a container",
		"docker.io/rancher/kubevirt-virt-launcher:v1.4.0: a container on this node uses it, kept",
		"1 images removed, 1 could not be removed",
	} {
		if !strings.Contains(r.stdout, part) {
			t.Errorf("stdout does not say %q:\n%s", part, r.stdout)
		}
	}
}

func TestUnneededImages(t *testing.T) {
	got := unneededImages(strings.Fields(previousList+" busybox:1.37 busybox:1.37"), strings.Fields(currentList))
	want := []string{
		"docker.io/library/busybox:1.37",
		"docker.io/rancher/harvester-webhook:v1.5.1",
		"docker.io/rancher/harvester:v1.5.1",
		"docker.io/rancher/kubevirt-virt-launcher:v1.4.0",
		"docker.io/rancher/mirrored-library-nginx:1.24",
	}
	if !slices.Equal(got, want) {
		t.Errorf("unneededImages = %q, want %q", got, want)
	}
}

func TestRemoveImagesPinnedImagesStay(t *testing.T) {
	srv := imageListsRepository(t, "rancher/mirrored-pause:3.6\n", "rancher/mirrored-pause:3.7\n")
	host := newFakeHost(t)
	withCrictl(host, &fakeRuntime{images: []criImage{{ID: "sha256:12", RepoTags: []string{"docker.io/rancher/mirrored-pause:3.6"}, Pinned: true}}})
	r := runNode(t, host, nil, "remove-images", "--repository-url="+srv.URL+"/harvester-iso", "--previous-version=v1.5.1")
	r.expect(t, ExitOK)
	if got := rmis(host); len(got) != 0 {
		t.Errorf("removed the pinned image: %q", got)
	}
}

func TestRemoveImagesWithoutLists(t *testing.T) {
	for name, srv := range map[string]*fileServer{
		"no list of the previous release": imageListsRepository(t, "", currentList),
		"no list of the release":          imageListsRepository(t, previousList, ""),
	} {
		t.Run(name, func(t *testing.T) {
			host := newFakeHost(t)
			withCrictl(host, &fakeRuntime{})
			r := runNode(t, host, nil, "remove-images", "--repository-url="+srv.URL+"/harvester-iso", "--version=v1.6.0", "--previous-version=v1.5.1")
			r.expect(t, ExitOK, "remove-images: done")
			if !strings.Contains(r.stdout, "nothing to compare, no image removed") {
				t.Errorf("stdout %q does not say why nothing was removed", r.stdout)
			}
			if len(host.calls) != 0 {
				t.Errorf("ran %v without both lists", host.commandLines())
			}
		})
	}
}

func TestRemoveImagesFailures(t *testing.T) {
	srv := imageListsRepository(t, previousList, currentList)
	base := "--repository-url=" + srv.URL + "/harvester-iso"
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no previous version", []string{base}, ExitUsage, "--previous-version is required"},
		{"a previous version that is no version", []string{base, "--previous-version=../../etc"}, ExitUsage, `--previous-version "../../etc" is not a Harvester version`},
		{"the release itself", []string{base, "--version=v1.6.0", "--previous-version=v1.6.0"}, ExitUsage, "--previous-version and --version are both v1.6.0"},
		{"no repository", []string{"--previous-version=v1.5.1"}, ExitUsage, "--repository-url is required"},
		{"an argument", []string{base, "--previous-version=v1.5.1", "extra"}, ExitUsage, "unexpected arguments"},
		{"an unknown flag", []string{base, "--previous-version=v1.5.1", "--prune"}, ExitUsage, "flag provided but not defined: -prune"},
		{"a repository of another release", []string{base, "--version=v1.7.0", "--previous-version=v1.5.1"}, ExitFailed, "holds release v1.6.0, not v1.7.0"},
		// Without crictl no image is known to be unused: nothing is removed, try again.
		{"no crictl", []string{base, "--previous-version=v1.5.1"}, ExitRetry, "is RKE2 running on this node?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newFakeHost(t)
			runNode(t, host, nil, append([]string{"remove-images"}, tc.args...)...).expect(t, tc.code, tc.want)
			if got := rmis(host); len(got) != 0 {
				t.Errorf("removed %q", got)
			}
		})
	}

	// A runtime that lists images but not containers removes nothing.
	host := newFakeHost(t)
	withCrictl(host, &fakeRuntime{images: []criImage{image("sha256:01", "docker.io/rancher/harvester:v1.5.1")}})
	ps := host.tools[crictlPath]
	host.tools[crictlPath] = func(c Command, stdin []byte) ([]byte, error) {
		if len(c.Args) > 0 && c.Args[0] == "ps" {
			return nil, commandError(c, errors.New("exit status 1"), []byte("connect: connection refused"))
		}
		return ps(c, stdin)
	}
	runNode(t, host, nil, "remove-images", base, "--previous-version=v1.5.1").expect(t, ExitRetry, "connection refused")
	if got := rmis(host); len(got) != 0 {
		t.Errorf("removed %q without knowing which images containers use", got)
	}
}
