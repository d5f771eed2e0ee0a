package nodeprogram

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// osNode is a fake node running osPretty, with the host tools os-upgrade calls. elemental
// checks that the new OS image is mounted where it is told to read it.
func osNode(t *testing.T, osPretty string) *fakeHost {
	t.Helper()
	host := newFakeHost(t)
	host.write(t, "/etc/os-release", "NAME=\"SLE Micro\"\nPRETTY_NAME=\""+osPretty+"\"\nVERSION_ID=\"5.5\"\n")
	host.write(t, passiveImage, "passive image")
	host.write(t, "/oem/harvester.config", "os:\n  hostname: node-1\n  externalstorage:\n    enabled: false\n")
	for _, tool := range []string{"fallocate", "systemd-run"} {
		host.tools[tool] = func(Command, []byte) ([]byte, error) { return nil, nil }
	}
	host.tools["nproc"] = func(Command, []byte) ([]byte, error) { return []byte("4\n"), nil }
	// The new OS image holds the release's elemental (fact 54.3).
	host.onMount = func(image, target string) error {
		data, err := os.ReadFile(image)
		if err != nil || string(data) != "new root file system" {
			return nil
		}
		if err := os.MkdirAll(filepath.Join(target, "usr/bin"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(target, "usr/bin/elemental"), []byte("the release's elemental"), 0o755)
	}
	for _, tool := range []string{"mount"} {
		host.tools[tool] = func(Command, []byte) ([]byte, error) { return nil, nil }
	}
	host.tools["blkid"] = func(Command, []byte) ([]byte, error) { return []byte("/dev/sda3\n"), nil }
	host.tools["grub2-editenv"] = fakeGrubEditenv(host)
	host.tools[releaseElementalPath] = func(c Command, _ []byte) ([]byte, error) {
		data, err := os.ReadFile(host.Path(releaseElementalPath))
		if err != nil || string(data) != "the release's elemental" {
			return nil, errors.New("not the release's elemental")
		}
		if len(c.Args) == 1 && c.Args[0] == "version" {
			return []byte("v2.2.1\n"), nil
		}
		return host.tools["elemental"](c, nil)
	}
	host.tools["elemental"] = func(c Command, _ []byte) ([]byte, error) {
		i := slices.Index(c.Args, "--directory")
		if i < 0 || i+1 >= len(c.Args) {
			return nil, errors.New("elemental: no --directory")
		}
		m, ok := host.mounts[host.Path(c.Args[i+1])]
		if !ok || m.fstype != "squashfs" {
			return nil, errors.New("elemental: " + c.Args[i+1] + " is not the mounted squashfs")
		}
		data, err := os.ReadFile(m.image)
		if err != nil || string(data) != "new root file system" {
			return nil, errors.New("elemental: the mounted image is not the release's rootfs")
		}
		return nil, nil
	}
	return host
}

// releaseElementalPath is where os-upgrade puts the release's elemental on the host.
const releaseElementalPath = "/usr/local/upgrade_tmp/elemental"

// fakeGrubEditenv plays grub2-editenv on a host file of key=value lines: create, list,
// set.
func fakeGrubEditenv(host *fakeHost) func(Command, []byte) ([]byte, error) {
	return func(c Command, _ []byte) ([]byte, error) {
		if len(c.Args) < 2 {
			return nil, errors.New("grub2-editenv: usage")
		}
		file := host.Path(c.Args[0])
		switch c.Args[1] {
		case "create":
			return nil, os.WriteFile(file, []byte("# GRUB Environment Block\n"), 0o644)
		case "list":
			data, err := os.ReadFile(file)
			if err != nil {
				return nil, err
			}
			var out []string
			for _, l := range strings.Split(string(data), "\n") {
				if l != "" && !strings.HasPrefix(l, "#") {
					out = append(out, l)
				}
			}
			return []byte(strings.Join(out, "\n") + "\n"), nil
		case "set":
			data, err := os.ReadFile(file)
			if err != nil {
				return nil, err
			}
			lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			for _, kv := range c.Args[2:] {
				key, _, _ := strings.Cut(kv, "=")
				lines = slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, key+"=") })
				lines = append(lines, kv)
			}
			return nil, os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
		}
		return nil, errors.New("grub2-editenv: unknown command " + c.Args[1])
	}
}

func osRepository(t *testing.T) *fileServer {
	t.Helper()
	return newFileServer(t, map[string][]byte{
		"/harvester-iso/harvester-release.yaml": []byte(releaseYAML),
		"/harvester-iso/rootfs.squashfs":        []byte("new root file system"),
	})
}

func TestOSUpgradeInstallsAndSchedulesTheReboot(t *testing.T) {
	srv := osRepository(t)
	host := osNode(t, "Harvester v1.5.0")
	r := runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--version=v1.6.0")
	r.expect(t, ExitOK, "capi-inplace node os-upgrade: done")

	want := []string{
		"nproc", // the post-drain settings' CPU reservation, first (rke2settings_test.go)
		// The state partition, read-write only while its passive image is made sparse.
		"mount -o rw,remount /run/initramfs/cos-state",
		"fallocate --dig-holes /run/initramfs/cos-state/cOS/passive.img",
		"mount -o ro,remount /run/initramfs/cos-state",
		"blkid -L COS_STATE", // not a multipath device: nothing mounted
		// The release's elemental, from the new OS image.
		"/usr/local/upgrade_tmp/elemental version",
		"/usr/local/upgrade_tmp/elemental upgrade --logfile /usr/local/upgrade_tmp/elemental-upgrade.log --directory /tmp/capi-inplace-rootfs --config-dir /usr/local/upgrade_tmp/elemental-config --debug",
		// The boot settings of the release.
		"grub2-editenv /oem/grubenv create",
		"grub2-editenv /oem/grubenv list",
		"grub2-editenv /oem/grubenv set third_party_kernel_args=multipath=off",
		"systemd-run --unit=capi-inplace-reboot --description=capi-inplace: reboot into the upgraded OS --on-active=60s /bin/sh -c rm -f /var/lib/rancher/rke2/agent/pod-manifests/*; systemctl reboot",
	}
	if got := host.commandLines(); !slices.Equal(got, want) {
		t.Fatalf("host commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, _ := os.ReadFile(host.Path("/usr/local/upgrade_tmp/elemental-config/config.yaml")); string(got) != elementalConfig {
		t.Errorf("elemental config %q", got)
	}
	if len(host.mounts) != 0 {
		t.Errorf("still mounted: %v", host.mounts)
	}
	if _, err := os.Stat(host.Path("/usr/local/upgrade_tmp/rootfs.squashfs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the squashfs was left on the host disk: %v", err)
	}
	if got, _ := os.ReadFile(host.Path(installedMarker)); string(got) != "Harvester v1.6.0\n" {
		t.Errorf("installed marker %q", got)
	}

	// The Job runs again before the reboot (its pod was deleted, say): neither the install
	// nor the reboot is done twice.
	r = runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso")
	r.expect(t, ExitOK)
	if got := host.commandLines(); len(got) != len(want) {
		t.Errorf("the second run ran %v", got[len(want):])
	}
	if !strings.Contains(r.stdout, "already installed") || !strings.Contains(r.stdout, "already scheduled") {
		t.Errorf("stdout %q", r.stdout)
	}
	if n := srv.count("/harvester-iso/rootfs.squashfs"); n != 1 {
		t.Errorf("rootfs.squashfs downloaded %d times", n)
	}
}

// A reboot scheduled long ago that never came on this boot (its timer lost:
// harvester/harvester#6022, #7457) is scheduled again by the next run, the old timer
// stopped first; the install is not done again.
func TestOSUpgradeSchedulesALostRebootAgain(t *testing.T) {
	srv := osRepository(t)
	host := osNode(t, "Harvester v1.5.0")
	runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--version=v1.6.0").expect(t, ExitOK)
	before := len(host.commandLines())
	// Each run's clock starts at 2026-11-24T01:00:00Z: a reboot due five minutes before.
	if err := os.WriteFile(host.Path(rebootMarker), []byte("2026-11-24T00:55:00Z\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--version=v1.6.0")
	r.expect(t, ExitOK)
	want := []string{
		"systemctl stop capi-inplace-reboot.timer",
		"systemctl reset-failed capi-inplace-reboot.timer capi-inplace-reboot.service",
		"systemd-run --unit=capi-inplace-reboot --description=capi-inplace: reboot into the upgraded OS --on-active=60s /bin/sh -c rm -f /var/lib/rancher/rke2/agent/pod-manifests/*; systemctl reboot",
	}
	if got := host.commandLines()[before:]; !slices.Equal(got, want) {
		t.Fatalf("host commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(r.stdout, "did not come and this boot still runs: scheduling it again") {
		t.Errorf("stdout %q", r.stdout)
	}
	if got, _ := os.ReadFile(host.Path(rebootMarker)); string(got) != "2026-11-24T01:01:00Z\n" {
		t.Errorf("reboot marker %q", got)
	}
}

func TestOSUpgradeAlreadyAtTarget(t *testing.T) {
	srv := osRepository(t)
	host := osNode(t, "Harvester v1.6.0")
	r := runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso")
	r.expect(t, ExitOK, "done")
	// Only the post-drain settings' CPU count: no install, no reboot.
	if got := host.commandLines(); !slices.Equal(got, []string{"nproc"}) {
		t.Errorf("ran %v on a node already at the target", got)
	}
	if len(host.mountHistory) != 0 || srv.count("/harvester-iso/rootfs.squashfs") != 0 {
		t.Errorf("mounted %v, downloaded the rootfs %d times", host.mountHistory, srv.count("/harvester-iso/rootfs.squashfs"))
	}
	if _, err := os.Stat(host.Path(rebootMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a reboot was scheduled: %v", err)
	}
	if !strings.Contains(r.stdout, "already runs Harvester v1.6.0: nothing to install, no reboot") {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestOSUpgradeElementalFails(t *testing.T) {
	srv := osRepository(t)
	host := osNode(t, "Harvester v1.5.0")
	host.tools["elemental"] = func(c Command, _ []byte) ([]byte, error) {
		return nil, commandError(c, errors.New("exit status 1"), []byte("ERRO[0003] not enough space in the state partition"))
	}
	// (the release's elemental answers `version`, then fails the upgrade as above)
	r := runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso")
	r.expect(t, ExitFailed, "install the OS (elemental's log is /usr/local/upgrade_tmp/elemental-upgrade.log on the node)", "not enough space in the state partition")
	for _, line := range host.commandLines() {
		if strings.HasPrefix(line, "systemd-run") {
			t.Errorf("a reboot was scheduled after a failed install: %s", line)
		}
	}
	for _, marker := range []string{installedMarker, rebootMarker} {
		if _, err := os.Stat(host.Path(marker)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s written after a failed install", marker)
		}
	}
	if len(host.mounts) != 0 {
		t.Errorf("the squashfs stayed mounted: %v", host.mounts)
	}
}

// os-upgrade is Harvester's post-drain tail: the release's post-drain RKE2 settings are
// written before the OS (fact 51), also on a node whose OS is the release's already.
func TestOSUpgradeWritesThePostDrainSettingsFirst(t *testing.T) {
	srv := osRepository(t)
	for _, running := range []string{"Harvester v1.5.0", "Harvester v1.6.0"} {
		host := osNode(t, running)
		runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--version=v1.6.0").expect(t, ExitOK)
		for _, p := range []string{"/etc/rancher/rke2/config.yaml.d/99-max-pods.yaml", "/etc/rancher/rke2/config.yaml.d/99-z00-harvester-reserved-resources.yaml",
			"/etc/rancher/rke2/config.yaml.d/91-harvester-cdi.yaml", "/oem/91_cleanup_kubelet.yaml"} {
			if _, there := readHost(t, host, p); !there {
				t.Errorf("running %s: %s was not written", running, p)
			}
		}
	}
	host := osNode(t, "Harvester v1.5.0")
	runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--rke2-settings=false").expect(t, ExitOK)
	if _, there := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/99-max-pods.yaml"); there {
		t.Error("--rke2-settings=false wrote the settings")
	}
}

func TestOSUpgradeWithoutReboot(t *testing.T) {
	srv := osRepository(t)
	host := osNode(t, "Harvester v1.5.0")
	runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--reboot=false").expect(t, ExitOK)
	for _, line := range host.commandLines() {
		if strings.HasPrefix(line, "systemd-run") {
			t.Errorf("rebooted with --reboot=false: %s", line)
		}
	}
}

func TestOSUpgradeBadInput(t *testing.T) {
	srv := osRepository(t)
	repo := "--repository-url=" + srv.URL + "/harvester-iso"
	runNode(t, osNode(t, "x"), nil, "os-upgrade", repo, "--reboot-delay=1s").expect(t, ExitUsage, "--reboot-delay 1s is too short")
	runNode(t, osNode(t, "x"), nil, "os-upgrade", repo, "--work-dir=tmp").expect(t, ExitUsage, `--work-dir "tmp" must be an absolute path`)
	runNode(t, newFakeHost(t), nil, "os-upgrade", repo).expect(t, ExitFailed, "read the host's /etc/os-release (is --host-root the node's root?)")

	host := newFakeHost(t)
	host.write(t, "/etc/os-release", "NAME=Harvester\n")
	runNode(t, host, nil, "os-upgrade", repo).expect(t, ExitFailed, "has no PRETTY_NAME")
}

func TestPrettyName(t *testing.T) {
	for content, want := range map[string]string{
		"PRETTY_NAME=\"Harvester v1.6.0\"\n":    "Harvester v1.6.0",
		"PRETTY_NAME='Harvester v1.6.0'\n":      "Harvester v1.6.0",
		"ID=x\nPRETTY_NAME=Harvester\n":         "Harvester",
		"PRETTY_NAME=\"Harvester \\\"q\\\"\"\n": `Harvester "q"`,
	} {
		p := filepath.Join(t.TempDir(), "os-release")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := prettyName(p); err != nil || got != want {
			t.Errorf("prettyName(%q) = %q, %v; want %q", content, got, err, want)
		}
	}
}
