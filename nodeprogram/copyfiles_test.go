package nodeprogram

import (
	"os"
	"path/filepath"
	"testing"
)

// The cluster upgrade Job's init container runs copy-files in Rancher's installer image,
// which holds /helm and /rancher-<version>.tgz at its root: here a directory stands for
// that root.
func TestCopyFilesCopiesEachMatchKeepingItsMode(t *testing.T) {
	image, to := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(image, "helm"), []byte("#!helm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, "rancher-2.13.3.tgz"), []byte("chart"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runNode(t, newFakeHost(t), nil, "copy-files", "--to="+to, "--file="+filepath.Join(image, "helm"), "--file="+filepath.Join(image, "rancher-*.tgz"))
	r.expect(t, ExitOK)
	for name, mode := range map[string]os.FileMode{"helm": 0o755, "rancher-2.13.3.tgz": 0o644} {
		info, err := os.Stat(filepath.Join(to, name))
		if err != nil {
			t.Fatalf("%s not copied: %v", name, err)
		}
		if info.Mode().Perm() != mode {
			t.Errorf("%s has mode %v, want %v", name, info.Mode().Perm(), mode)
		}
	}
	if _, err := os.Stat(filepath.Join(to, "helm.tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary file stayed: %v", err)
	}
}

func TestCopyFilesFailsOnAPatternNoFileMatches(t *testing.T) {
	image, to := t.TempDir(), t.TempDir()
	r := runNode(t, newFakeHost(t), nil, "copy-files", "--to="+to, "--file="+filepath.Join(image, "rancher-*.tgz"))
	r.expect(t, ExitFailed, "no file of this container matches", "rancher-*.tgz", "expected one")
	entries, err := os.ReadDir(to)
	if err != nil || len(entries) != 0 {
		t.Errorf("something was written: %v %v", entries, err)
	}
	runNode(t, newFakeHost(t), nil, "copy-files", "--file=/helm").expect(t, ExitUsage, "--to")
}
