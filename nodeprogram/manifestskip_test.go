package nodeprogram

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// serverNode is a fake RKE2 server node: it has the server manifests directory, with
// rke2-multus.yaml in it.
func serverNode(t *testing.T) *fakeHost {
	t.Helper()
	host := newFakeHost(t)
	host.write(t, "/var/lib/rancher/rke2/server/manifests/rke2-multus.yaml", "apiVersion: helm.cattle.io/v1\nkind: HelmChart\n")
	return host
}

func skipFileExists(t *testing.T, host *fakeHost) bool {
	t.Helper()
	_, err := os.Stat(host.Path("/var/lib/rancher/rke2/server/manifests/rke2-multus.yaml.skip"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestManifestSkipPlacesTheSkipFileNextToRKE2sMultusManifest(t *testing.T) {
	host := serverNode(t)
	// The flags every Plan's node program gets are accepted.
	r := runNode(t, host, nil, "rke2-manifest-skip", "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.6.0")
	r.expect(t, ExitOK, "capi-inplace node rke2-manifest-skip: done")
	if !skipFileExists(t, host) {
		t.Fatal("rke2-multus.yaml.skip was not written")
	}
	if got, _ := os.ReadFile(host.Path("/var/lib/rancher/rke2/server/manifests/rke2-multus.yaml")); !strings.Contains(string(got), "HelmChart") {
		t.Errorf("the manifest itself was changed: %q", got)
	}
	if lines := host.commandLines(); len(lines) != 0 {
		t.Errorf("ran %q: placing the skip file runs nothing on the host", lines)
	}

	// Placed twice (the Job ran again): done, the file still there.
	r = runNode(t, host, nil, "rke2-manifest-skip")
	r.expect(t, ExitOK)
	if !strings.Contains(r.stdout, "already in place") || !skipFileExists(t, host) {
		t.Errorf("second run: stdout %q, skip file there: %v", r.stdout, skipFileExists(t, host))
	}
}

func TestManifestSkipRemove(t *testing.T) {
	host := serverNode(t)
	runNode(t, host, nil, "rke2-manifest-skip").expect(t, ExitOK)
	host.write(t, "/var/lib/rancher/rke2/server/manifests/rke2-canal.yaml.skip", "someone else's")

	r := runNode(t, host, nil, "rke2-manifest-skip", "--remove")
	r.expect(t, ExitOK, "done")
	if skipFileExists(t, host) {
		t.Error("rke2-multus.yaml.skip is still there")
	}
	if _, err := os.Stat(host.Path("/var/lib/rancher/rke2/server/manifests/rke2-canal.yaml.skip")); err != nil {
		t.Errorf("another skip file was removed: %v", err)
	}
	if _, err := os.Stat(host.Path("/var/lib/rancher/rke2/server/manifests/rke2-multus.yaml")); err != nil {
		t.Errorf("the manifest was removed: %v", err)
	}

	// Removed twice: nothing to remove, done.
	r = runNode(t, host, nil, "rke2-manifest-skip", "--remove")
	r.expect(t, ExitOK)
	if !strings.Contains(r.stdout, "is absent") {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestManifestSkipOnAnAgentNodeDoesNothing(t *testing.T) {
	for _, args := range [][]string{{"rke2-manifest-skip"}, {"rke2-manifest-skip", "--remove"}} {
		host := newFakeHost(t)
		r := runNode(t, host, nil, args...)
		r.expect(t, ExitOK, "done")
		if !strings.Contains(r.stdout, "not an RKE2 server, nothing to skip") {
			t.Errorf("%q: stdout %q", args, r.stdout)
		}
		if _, err := os.Stat(host.Path("/var/lib/rancher/rke2/server")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q created the server directory on an agent node: %v", args, err)
		}
	}
}

func TestManifestSkipRefusesAFileWhereTheDirectoryShouldBe(t *testing.T) {
	host := newFakeHost(t)
	host.write(t, "/var/lib/rancher/rke2/server/manifests", "not a directory")
	r := runNode(t, host, nil, "rke2-manifest-skip")
	r.expect(t, ExitFailed, "is not a directory")
}
