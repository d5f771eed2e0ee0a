package nodeprogram

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

const releaseYAML = `harvester: v1.6.0
harvesterChart: 1.6.0
os: Harvester v1.6.0
osImage: rancher/harvester-os:v1.6.0
kubernetes: v1.33.3+rke2r1
rancher: v2.12.0
minUpgradableVersion: 'v1.5.0'
`

// bundleYAML follows bundle/metadata.yaml as the ISO build writes it (facts, fact 19):
// paths relative to bundle/, starting with "/".
const bundleYAML = `images:
  common:
  - list: /harvester/images/harvester-images-v1.6.0.txt
    archive: /harvester/images/harvester-images-v1.6.0.tar.zst
  rke2:
  - list: /harvester/images/rke2-images.linux-amd64-v1.33.3-rke2r1.txt
    archive: /harvester/images/rke2-images.linux-amd64-v1.33.3-rke2r1.tar.zst
  agent:
  - list: /rancherd/images/rancherd-bootstrap-images-v0.7.0.txt
    archive: /rancherd/images/rancherd-bootstrap-images-v0.7.0.tar.zst
`

func zstdOf(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// releaseRepository serves a generated release: harvester-release.yaml, the bundle index,
// image lists and zstd archives whose content is a recognisable string.
func releaseRepository(t *testing.T) *fileServer {
	t.Helper()
	return newFileServer(t, map[string][]byte{
		"/harvester-iso/harvester-release.yaml":                                                 []byte(releaseYAML),
		"/harvester-iso/bundle/metadata.yaml":                                                   []byte(bundleYAML),
		"/harvester-iso/bundle/harvester/images/harvester-images-v1.6.0.txt":                    []byte("rancher/harvester:v1.6.0\n# a comment\n\nbusybox:1.36\n"),
		"/harvester-iso/bundle/harvester/images/harvester-images-v1.6.0.tar.zst":                zstdOf(t, []byte("docker save of the harvester images")),
		"/harvester-iso/bundle/harvester/images/rke2-images.linux-amd64-v1.33.3-rke2r1.txt":     []byte("docker.io/rancher/hardened-kubernetes:v1.33.3-rke2r1-build20250716\n"),
		"/harvester-iso/bundle/harvester/images/rke2-images.linux-amd64-v1.33.3-rke2r1.tar.zst": zstdOf(t, []byte("docker save of the rke2 images")),
		"/harvester-iso/bundle/rancherd/images/rancherd-bootstrap-images-v0.7.0.txt":            []byte("rancher/system-agent-installer-rancher:v2.12.0\n"),
		"/harvester-iso/bundle/rancherd/images/rancherd-bootstrap-images-v0.7.0.tar.zst":        zstdOf(t, []byte("docker save of the agent images")),
	})
}

// withCtr gives the fake host RKE2's ctr: `images ls -q` lists present, `images import`
// succeeds.
func withCtr(host *fakeHost, present ...string) {
	host.tools["/var/lib/rancher/rke2/bin/ctr"] = func(c Command, _ []byte) ([]byte, error) {
		if slices.Equal(c.Args, []string{"-n", "k8s.io", "images", "ls", "-q"}) {
			return []byte(strings.Join(present, "\n") + "\n"), nil
		}
		return nil, nil
	}
}

func TestPreloadImportsWhatContainerdLacks(t *testing.T) {
	srv := releaseRepository(t)
	host := newFakeHost(t)
	// The harvester list is all there (written as containerd writes references); the RKE2
	// image is not.
	withCtr(host, "docker.io/rancher/harvester:v1.6.0", "docker.io/library/busybox:1.36", "docker.io/rancher/hardened-kubernetes:v1.32.0")
	r := runNode(t, host, nil, "preload", "--repository-url="+srv.URL+"/harvester-iso/", "--version=v1.6.0")
	r.expect(t, ExitOK, "capi-inplace node preload: done")

	var imports []ranCommand
	for _, c := range host.calls {
		if slices.Contains(c.Args, "import") {
			imports = append(imports, c)
		}
	}
	// The rke2 archive, and the agent archive: Rancher's installer image, from which the
	// cluster upgrade Job takes Rancher's chart and helm, must be in containerd for the
	// kubelet to run it without a registry (the release extracts it from the archive with
	// wharfie instead, harvester-release-steps.md fact 16.1).
	if len(imports) != 2 {
		t.Fatalf("%d imports, want the rke2 and the agent archives': %v", len(imports), host.commandLines())
	}
	if string(imports[1].stdin) != "docker save of the agent images" {
		t.Errorf("ctr read %q second, want the decompressed agent archive", imports[1].stdin)
	}
	imp := imports[0]
	if got := imp.String(); got != "/var/lib/rancher/rke2/bin/ctr -n k8s.io images import --no-unpack -" {
		t.Errorf("import command %q", got)
	}
	if string(imp.stdin) != "docker save of the rke2 images" {
		t.Errorf("ctr read %q, want the decompressed rke2 archive", imp.stdin)
	}
	if !slices.Contains(imp.Env, "CONTAINERD_ADDRESS=/run/k3s/containerd/containerd.sock") {
		t.Errorf("ctr environment %v has no RKE2 containerd address", imp.Env)
	}
	if !strings.Contains(r.stdout, "2 archives imported, 1 already present") {
		t.Errorf("stdout %q", r.stdout)
	}
	// RKE2's and the system agent's archives are where they load them from on restart;
	// the common archive is not.
	for hostPath, want := range map[string]string{
		"/var/lib/rancher/rke2/agent/images/rke2-images.linux-amd64-v1.33.3-rke2r1.txt": "docker.io/rancher/hardened-kubernetes:v1.33.3-rke2r1-build20250716\n",
		"/var/lib/rancher/agent/images/rancherd-bootstrap-images-v0.7.0.txt":            "rancher/system-agent-installer-rancher:v2.12.0\n",
	} {
		if got, err := os.ReadFile(host.Path(hostPath)); err != nil || string(got) != want {
			t.Errorf("%s on the host: %q, %v", hostPath, got, err)
		}
	}
	for _, dir := range []string{"/var/lib/rancher/rke2/agent/images", "/var/lib/rancher/agent/images"} {
		entries, _ := os.ReadDir(host.Path(dir))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if len(names) != 2 {
			t.Errorf("%s holds %v, want one list and one archive", dir, names)
		}
	}
	if _, err := os.Stat(host.Path("/var/lib/rancher/rke2/agent/images/harvester-images-v1.6.0.tar.zst")); err == nil {
		t.Error("the common archive was placed for RKE2")
	}
}

func TestPreloadFailures(t *testing.T) {
	srv := releaseRepository(t)
	base := "--repository-url=" + srv.URL + "/harvester-iso"

	host := newFakeHost(t)
	withCtr(host)
	runNode(t, host, nil, "preload", base, "--version=v1.7.0").expect(t, ExitFailed, "holds release v1.6.0, not v1.7.0")
	if len(host.calls) != 0 {
		t.Errorf("ran %v for the wrong release", host.commandLines())
	}

	// No ctr: RKE2 is not running or --ctr is wrong.
	runNode(t, newFakeHost(t), nil, "preload", base).expect(t, ExitRetry, "list containerd's images (is RKE2 running on this node?)")

	// The import fails: the reason from ctr is in the message.
	host = newFakeHost(t)
	host.tools["/var/lib/rancher/rke2/bin/ctr"] = func(c Command, _ []byte) ([]byte, error) {
		if slices.Contains(c.Args, "import") {
			return nil, commandError(c, os.ErrInvalid, []byte("ctr: no space left on device"))
		}
		return nil, nil
	}
	runNode(t, host, nil, "preload", base).expect(t, ExitFailed, "harvester-images-v1.6.0.tar.zst into containerd", "no space left on device")

	// The repository is not (yet) there.
	runNode(t, newFakeHost(t), nil, "preload", "--repository-url="+srv.URL+"/nothing").expect(t, ExitFailed, "harvester-release.yaml: 404")
}

func TestNormalizeImage(t *testing.T) {
	for ref, want := range map[string]string{
		"busybox:1.36":                       "docker.io/library/busybox:1.36",
		"rancher/harvester:v1.6.0":           "docker.io/rancher/harvester:v1.6.0",
		"docker.io/rancher/harvester:v1.6.0": "docker.io/rancher/harvester:v1.6.0",
		"docker.io/nginx:1":                  "docker.io/library/nginx:1",
		"registry.suse.com/bci/bci-base:15":  "registry.suse.com/bci/bci-base:15",
		"localhost/x:1":                      "localhost/x:1",
		"myregistry:5000/x:1":                "myregistry:5000/x:1",
	} {
		if got := normalizeImage(ref); got != want {
			t.Errorf("normalizeImage(%q) = %q, want %q", ref, got, want)
		}
	}
}

func TestRemoveArchivesAfterTheRKE2Upgrade(t *testing.T) {
	srv := releaseRepository(t)
	host := newFakeHost(t)
	withCtr(host)
	base := "--repository-url=" + srv.URL + "/harvester-iso"
	runNode(t, host, nil, "preload", base).expect(t, ExitOK)
	host.write(t, "/var/lib/rancher/rke2/agent/images/someone-elses.tar", "kept")

	r := runNode(t, host, nil, "remove-archives", base)
	r.expect(t, ExitOK, "remove-archives: done")
	entries, err := os.ReadDir(host.Path("/var/lib/rancher/rke2/agent/images"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "someone-elses.tar" {
		t.Errorf("RKE2's images directory holds %v, want only the file preload did not place", entries)
	}
	if agent, _ := os.ReadDir(host.Path("/var/lib/rancher/agent/images")); len(agent) != 2 {
		t.Errorf("the system agent's archives were touched: %v", agent)
	}
	// Nothing left to remove: still done.
	r = runNode(t, host, nil, "remove-archives", base)
	r.expect(t, ExitOK)
	if !strings.Contains(r.stdout, "0 files removed") {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestRemoveArchivesPlacesThisProgramOnTheHost(t *testing.T) {
	srv := releaseRepository(t)
	host := newFakeHost(t)
	base := "--repository-url=" + srv.URL + "/harvester-iso"
	r := runNode(t, host, nil, "remove-archives", base, "--place-program=/usr/local/upgrade_tmp/capi-inplace")
	r.expect(t, ExitOK, "remove-archives: done")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	placed := host.Path("/usr/local/upgrade_tmp/capi-inplace")
	got, err := os.ReadFile(placed)
	if err != nil {
		t.Fatalf("the program was not placed: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the placed file is not this program")
	}
	if info, _ := os.Stat(placed); info.Mode().Perm() != 0o755 {
		t.Errorf("placed with mode %v, want 0755", info.Mode().Perm())
	}
	if _, err := os.Stat(placed + ".new"); err == nil {
		t.Error("the temporary copy was left")
	}
	// Again (a retried Job): replaced, still done.
	runNode(t, host, nil, "remove-archives", base, "--place-program=/usr/local/upgrade_tmp/capi-inplace").expect(t, ExitOK)
	runNode(t, host, nil, "remove-archives", base, "--place-program=capi-inplace").expect(t, ExitUsage, `--place-program "capi-inplace" must be an absolute path on the host`)
}
