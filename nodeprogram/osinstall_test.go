package nodeprogram

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// What upgrade_os does around elemental (harvester-release-steps.md fact 54), each case
// written from the facts.

func installOn(t *testing.T, host *fakeHost, args ...string) result {
	t.Helper()
	srv := osRepository(t)
	return runNode(t, host, nil, append([]string{"os-upgrade", "--repository-url=" + srv.URL + "/harvester-iso", "--version=v1.6.0", "--rke2-settings=false"}, args...)...)
}

func hostHas(t *testing.T, host *fakeHost, line string) bool {
	t.Helper()
	return slices.Contains(host.commandLines(), line)
}

func TestOSInstallMovesAnIncompleteStateFileAside(t *testing.T) {
	host := osNode(t, "Harvester v1.5.0")
	host.write(t, "/run/initramfs/cos-state/state.yaml", "state:\n  fs: ext4\n") // no label (harvester#4526)
	installOn(t, host).expect(t, ExitOK)
	if _, there := readHost(t, host, "/run/initramfs/cos-state/state.yaml"); there {
		t.Error("the incomplete state.yaml is still there")
	}
	if got, _ := readHost(t, host, "/run/initramfs/cos-state/state.yaml.bak"); got != "state:\n  fs: ext4\n" {
		t.Errorf("state.yaml.bak is %q", got)
	}
	lines := host.commandLines()
	rw, ro := slices.Index(lines, "mount -o rw,remount /run/initramfs/cos-state"), slices.Index(lines, "mount -o ro,remount /run/initramfs/cos-state")
	if rw < 0 || ro < rw {
		t.Errorf("the state partition was not remounted read-write, then read-only: %q", lines)
	}

	complete := osNode(t, "Harvester v1.5.0")
	complete.write(t, "/run/initramfs/cos-state/state.yaml", "state:\n  label: COS_STATE\n")
	installOn(t, complete).expect(t, ExitOK)
	if _, there := readHost(t, complete, "/run/initramfs/cos-state/state.yaml"); !there {
		t.Error("a complete state.yaml was removed")
	}
}

func TestOSInstallMountsAStatePartitionOnMultipath(t *testing.T) {
	host := osNode(t, "Harvester v1.5.0")
	host.tools["blkid"] = func(Command, []byte) ([]byte, error) { return []byte("/dev/mapper/mpatha3\n"), nil }
	installOn(t, host).expect(t, ExitOK)
	if !hostHas(t, host, "mount -L COS_STATE /run/cos/state") {
		t.Errorf("COS_STATE on multipath was not mounted where elemental looks: %q", host.commandLines())
	}
	if info, err := os.Stat(host.Path("/run/cos/state")); err != nil || !info.IsDir() {
		t.Errorf("/run/cos/state: %v", err)
	}
}

func TestOSInstallKernelArguments(t *testing.T) {
	// Two NICs, one of them a bond's slave (pinned by its permanent address), one already
	// pinned, and a loopback and a bridge that are not en*.
	nics := func(host *fakeHost) {
		host.write(t, "/sys/class/net/eno1/address", "aa:bb:cc:00:00:01\n")
		host.write(t, "/sys/class/net/enp6s0f0/address", "aa:bb:cc:00:00:99\n")
		host.write(t, "/sys/class/net/enp6s0f0/bonding_slave/perm_hwaddr", "aa:bb:cc:00:00:02\n")
		host.write(t, "/sys/class/net/ens3/address", "aa:bb:cc:00:00:03\n")
		host.write(t, "/sys/class/net/lo/address", "00:00:00:00:00:00\n")
		host.write(t, "/sys/class/net/mgmt-br/address", "aa:bb:cc:00:00:01\n")
	}
	for name, tc := range map[string]struct {
		config, args string
		want         string
	}{
		"multipath=off added, NICs pinned": {"os:\n  externalstorage:\n    enabled: false\n", "console=tty1 ifname=ens3:aa:bb:cc:00:00:03",
			"third_party_kernel_args=console=tty1 ifname=ens3:aa:bb:cc:00:00:03 multipath=off ifname=eno1:aa:bb:cc:00:00:01 ifname=enp6s0f0:aa:bb:cc:00:00:02"},
		"external storage: no multipath=off": {"os:\n  externalstorage:\n    enabled: true\n", "",
			"third_party_kernel_args=ifname=eno1:aa:bb:cc:00:00:01 ifname=enp6s0f0:aa:bb:cc:00:00:02 ifname=ens3:aa:bb:cc:00:00:03"},
		"a multipath argument is kept as it is": {"os: {}\n", "multipath=on",
			"third_party_kernel_args=multipath=on ifname=eno1:aa:bb:cc:00:00:01 ifname=enp6s0f0:aa:bb:cc:00:00:02 ifname=ens3:aa:bb:cc:00:00:03"},
	} {
		t.Run(name, func(t *testing.T) {
			host := osNode(t, "Harvester v1.5.0")
			host.write(t, "/oem/harvester.config", tc.config)
			host.write(t, "/oem/grubenv", "# GRUB Environment Block\nthird_party_kernel_args="+tc.args+"\n")
			nics(host)
			installOn(t, host).expect(t, ExitOK)
			got, _ := readHost(t, host, "/oem/grubenv")
			if !strings.Contains(got, tc.want+"\n") {
				t.Errorf("grubenv is %q, want the line %q", got, tc.want)
			}
			if hostHas(t, host, "grub2-editenv /oem/grubenv create") {
				t.Error("an existing grubenv was created again")
			}
			if _, there := readHost(t, host, "/oem/grubcustom"); !there {
				t.Error("/oem/grubcustom was not created")
			}
		})
	}

	// To v1.7.0, whose upgrade_os has no set_nic_names_by_mac_address (v1.7.1 on, fact
	// 54.6): multipath=off only, no NIC pinned.
	v170 := newFileServer(t, map[string][]byte{
		"/harvester-iso/harvester-release.yaml": []byte(strings.ReplaceAll(strings.ReplaceAll(releaseYAML, "v1.6.0", "v1.7.0"), "1.6.0", "1.7.0")),
		"/harvester-iso/rootfs.squashfs":        []byte("new root file system"),
	})
	to170 := osNode(t, "Harvester v1.6.1")
	to170.write(t, "/oem/harvester.config", "os: {}\n")
	to170.write(t, "/oem/grubenv", "# GRUB Environment Block\nthird_party_kernel_args=console=tty1\n")
	nics(to170)
	runNode(t, to170, nil, "os-upgrade", "--repository-url="+v170.URL+"/harvester-iso", "--version=v1.7.0", "--rke2-settings=false").expect(t, ExitOK)
	if got, _ := readHost(t, to170, "/oem/grubenv"); !strings.Contains(got, "third_party_kernel_args=console=tty1 multipath=off\n") {
		t.Errorf("to v1.7.0: grubenv is %q, want multipath=off added and no ifname= pin", got)
	}

	// Everything there already: nothing is written.
	host := osNode(t, "Harvester v1.5.0")
	host.write(t, "/oem/grubenv", "# GRUB Environment Block\nthird_party_kernel_args=multipath=off ifname=eno1:aa:bb:cc:00:00:01\n")
	host.write(t, "/sys/class/net/eno1/address", "aa:bb:cc:00:00:01\n")
	installOn(t, host).expect(t, ExitOK)
	for _, l := range host.commandLines() {
		if strings.HasPrefix(l, "grub2-editenv /oem/grubenv set") {
			t.Errorf("wrote the kernel arguments again: %s", l)
		}
	}
}

func TestOSInstallFixesTheSFTPServerPath(t *testing.T) {
	host := osNode(t, "Harvester v1.5.0")
	host.write(t, "/etc/ssh/sshd_config.d/sftp.conf", "Subsystem sftp /usr/lib/ssh/sftp-server\n")
	installOn(t, host).expect(t, ExitOK)
	if got, _ := readHost(t, host, "/etc/ssh/sshd_config.d/sftp.conf"); got != "Subsystem sftp /usr/libexec/ssh/sftp-server\n" {
		t.Errorf("sftp.conf is %q", got)
	}
}

// glibcHost is a SLE Micro 5.5 host (Harvester v1.6) on which the release's elemental,
// built for SL Micro 6.1, finds its C library only while the new OS image's /lib64 is
// bound over the host's.
func glibcHost(t *testing.T) (*fakeHost, *[]string) {
	t.Helper()
	host := osNode(t, "Harvester v1.6.1")
	var bound []string
	host.tools["mount"] = func(c Command, _ []byte) ([]byte, error) {
		if len(c.Args) == 4 && c.Args[0] == "-o" && c.Args[1] == "bind" {
			bound = append(bound, c.Args[3])
		}
		return nil, nil
	}
	host.tools["umount"] = func(c Command, _ []byte) ([]byte, error) {
		if i := slices.Index(bound, c.Args[len(c.Args)-1]); i >= 0 {
			bound = slices.Delete(bound, i, i+1)
		}
		return nil, nil
	}
	host.tools[releaseElementalPath] = func(c Command, _ []byte) ([]byte, error) {
		if !slices.Contains(bound, "/lib64") {
			return nil, commandError(c, errors.New("exit status 1"), []byte("/usr/local/upgrade_tmp/elemental: /lib64/libc.so.6: version `GLIBC_2.38' not found (required by /usr/local/upgrade_tmp/elemental)"))
		}
		return nil, nil
	}
	return host, &bound
}

func TestOSInstallBindsTheNewOSLibrariesForAReleaseElementalTheHostCannotRun(t *testing.T) {
	host, bound := glibcHost(t)
	installOn(t, host).expect(t, ExitOK)
	lines := host.commandLines()
	at := func(line string) int {
		i := slices.Index(lines, line)
		if i < 0 {
			t.Fatalf("%q not run: %q", line, lines)
		}
		return i
	}
	lib64 := at("mount -o bind /tmp/capi-inplace-rootfs/lib64 /lib64")
	lib := at("mount -o bind /tmp/capi-inplace-rootfs/lib /lib")
	upgrade := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, releaseElementalPath+" upgrade") })
	unLib64, unLib := at("umount /lib64"), at("umount /lib")
	grub := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "grub2-editenv") })
	if lib64 >= lib || lib >= upgrade || unLib64 <= upgrade || unLib <= unLib64 || (grub >= 0 && grub < unLib) {
		t.Errorf("the new OS's libraries were not bound for elemental alone (bind, elemental upgrade, unbind, then the host's grub tools): %q", lines)
	}
	if len(*bound) != 0 {
		t.Errorf("left bound: %q", *bound)
	}
}

func TestOSInstallFailsWhenTheReleaseElementalCannotRunEvenWithTheNewLibraries(t *testing.T) {
	host, bound := glibcHost(t)
	host.tools[releaseElementalPath] = func(c Command, _ []byte) ([]byte, error) {
		return nil, commandError(c, errors.New("exit status 1"), []byte("/usr/local/upgrade_tmp/elemental: /lib64/libc.so.6: version `GLIBC_2.99' not found"))
	}
	r := installOn(t, host)
	r.expect(t, ExitFailed, "the release's elemental cannot run on this host even with the new OS image's /lib64 and /lib", "GLIBC_2.99' not found")
	for _, l := range host.commandLines() {
		if strings.Contains(l, " upgrade ") || strings.HasPrefix(l, "systemd-run") {
			t.Errorf("ran %q after the release's elemental was found unusable", l)
		}
	}
	if len(*bound) != 0 {
		t.Errorf("left bound: %q", *bound)
	}
	if _, there := readHost(t, host, releaseElementalPath); there {
		t.Error("the copy of the release's elemental was left on the host")
	}
}

func TestOSInstallWithTheHostsElemental(t *testing.T) {
	host := osNode(t, "Harvester v1.5.0")
	installOn(t, host, "--elemental=elemental").expect(t, ExitOK)
	if !hostHas(t, host, "elemental upgrade --logfile /usr/local/upgrade_tmp/elemental-upgrade.log --directory /tmp/capi-inplace-rootfs --config-dir /usr/local/upgrade_tmp/elemental-config --debug") {
		t.Errorf("the host's elemental did not run: %q", host.commandLines())
	}
	if hostHas(t, host, releaseElementalPath+" version") {
		t.Error("the release's elemental was run with --elemental set")
	}
}

func TestOSInstallKeepsMultipathdOffLonghornDisks(t *testing.T) {
	host := osNode(t, "Harvester v1.5.0")
	installOn(t, host).expect(t, ExitOK)
	got, there := readHost(t, host, "/oem/99_disable_lh_multipathd.yaml")
	if !there {
		t.Fatal("/oem/99_disable_lh_multipathd.yaml was not written")
	}
	var config struct {
		Stages struct {
			Initramfs []struct {
				Directories []struct{ Path string } `json:"directories"`
				Files       []struct {
					Path, Content string
					Permissions   int
				} `json:"files"`
			} `json:"initramfs"`
		} `json:"stages"`
	}
	if err := yaml.Unmarshal([]byte(got), &config); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, got)
	}
	files := map[string]string{}
	var dirs []string
	for _, stage := range config.Stages.Initramfs {
		for _, d := range stage.Directories {
			dirs = append(dirs, d.Path)
		}
		for _, f := range stage.Files {
			files[f.Path] = f.Content
			if f.Permissions != 0o644 {
				t.Errorf("%s has permissions %o, want 644", f.Path, f.Permissions)
			}
		}
	}
	if len(dirs) != 1 || dirs[0] != "/etc/multipath/conf.d" {
		t.Errorf("directories %v, want /etc/multipath/conf.d", dirs)
	}
	blacklist := strings.Join(strings.Fields(files["/etc/multipath/conf.d/99-longhorn.conf"]), " ")
	if blacklist != `blacklist { device { vendor "IET" product "VIRTUAL-DISK" } }` {
		t.Errorf("the multipath blacklist is %q, want Longhorn's iSCSI disks (IET VIRTUAL-DISK)", blacklist)
	}
	unit := files["/etc/systemd/system/multipathd.service"]
	for _, line := range []string{"ExecStart=/usr/sbin/multipathd -d -s", "ConditionKernelCommandLine=!nompath", "WantedBy=sysinit.target"} {
		if !strings.Contains(unit, line+"\n") {
			t.Errorf("the multipathd unit lacks %q:\n%s", line, unit)
		}
	}
}

// containerGlibcHost is a SLE Micro 5.5 host on which the release's elemental finds its C
// library only while this container's /lib64 is bound over the host's, as in Harvester's
// upgrade container (upgrade_node.sh upgrade_os at v1.7.0 to v1.7.3: `chroot $HOST_DIR
// /tmp/elemental version 2>&1 | grep 'GLIBC.*not found'`, then `mount -o bind /lib64
// $HOST_DIR/lib64`, for v1.7.2 on also /lib; fact 81). The repository holds target.
func containerGlibcHost(t *testing.T, target string) (*fakeHost, *fileServer) {
	t.Helper()
	host := osNode(t, "Harvester v1.6.1")
	for _, dir := range []string{"/lib64", "/lib"} {
		if err := os.MkdirAll(host.Path(dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	host.tools[releaseElementalPath] = func(c Command, _ []byte) ([]byte, error) {
		host.mu.Lock()
		m, ok := host.mounts[host.Path("/lib64")]
		host.mu.Unlock()
		if !ok || m.fstype != "bind" || m.image != "/lib64" {
			return nil, commandError(c, errors.New("exit status 1"), []byte("/tmp/elemental: /lib64/libc.so.6: version `GLIBC_2.38' not found (required by /tmp/elemental)"))
		}
		if len(c.Args) == 1 && c.Args[0] == "version" {
			return []byte("v2.2.1\n"), nil
		}
		return host.tools["elemental"](c, nil)
	}
	release := strings.ReplaceAll(releaseYAML, "v1.6.0", target)
	srv := newFileServer(t, map[string][]byte{
		"/harvester-iso/harvester-release.yaml": []byte(release),
		"/harvester-iso/rootfs.squashfs":        []byte("new root file system"),
	})
	return host, srv
}

func TestOSInstallBindsThisContainersLibrariesAsTheRelease(t *testing.T) {
	for _, tc := range []struct {
		target string
		binds  []string
	}{
		{"v1.7.1", []string{"/lib64"}},         // v1.7.0, v1.7.1: /lib64 only
		{"v1.7.3", []string{"/lib64", "/lib"}}, // v1.7.2, v1.7.3: /lib too (ARM)
	} {
		t.Run(tc.target, func(t *testing.T) {
			host, srv := containerGlibcHost(t, tc.target)
			r := runNode(t, host, nil, "os-upgrade", "--repository-url="+srv.URL+"/harvester-iso", "--version="+tc.target,
				"--rke2-settings=false", "--glibc-libraries=container")
			r.expect(t, ExitOK)
			if want := "binding the release's upgrade image's " + strings.Join(tc.binds, " and ") + " over the host's"; !strings.Contains(r.stdout, want) {
				t.Errorf("stdout %q does not say %q", r.stdout, want)
			}
			var binds []string
			for _, m := range host.mountHistory {
				if m.fstype == "bind" {
					if m.target != host.Path(m.image) {
						t.Errorf("bound %s over %s, want this container's directory over the host's same one", m.image, m.target)
					}
					binds = append(binds, m.image)
				}
			}
			if !slices.Equal(binds, tc.binds) {
				t.Errorf("bound %q, want %q", binds, tc.binds)
			}
			for _, dir := range []string{"/lib64", "/lib"} {
				if mounted, _ := host.Mounted(host.Path(dir)); mounted {
					t.Errorf("%s left bound after elemental", dir)
				}
			}
			// Nothing bound through the host's mount tool: the new OS image's libraries
			// stay out.
			for _, l := range host.commandLines() {
				if strings.HasPrefix(l, "mount -o bind") {
					t.Errorf("ran %q", l)
				}
			}
			if !hostHas(t, host, releaseElementalPath+" upgrade --logfile /usr/local/upgrade_tmp/elemental-upgrade.log --directory /tmp/capi-inplace-rootfs --config-dir /usr/local/upgrade_tmp/elemental-config --debug") {
				t.Errorf("elemental upgrade did not run: %q", host.commandLines())
			}
		})
	}
}

func TestOSInstallBindsNothingWhenTheHostRunsTheReleaseElemental(t *testing.T) {
	host := osNode(t, "Harvester v1.7.1")
	installOn(t, host, "--glibc-libraries=container").expect(t, ExitOK)
	for _, m := range host.mountHistory {
		if m.fstype == "bind" {
			t.Errorf("bound %s over %s for an elemental the host runs", m.image, m.target)
		}
	}
}

func TestOSUpgradeRefusesAnUnknownLibrarySource(t *testing.T) {
	host := osNode(t, "Harvester v1.6.1")
	installOn(t, host, "--glibc-libraries=host").expect(t, ExitUsage, `--glibc-libraries "host": give new-os or container`)
	if len(host.commandLines()) != 0 {
		t.Errorf("ran %q", host.commandLines())
	}
}

func TestReleaseLibraryDirs(t *testing.T) {
	for target, want := range map[string][]string{
		"v1.7.0": {"/lib64"}, "v1.7.1": {"/lib64"}, "v1.7.2": {"/lib64", "/lib"}, "v1.7.3": {"/lib64", "/lib"},
		"v1.7.10": {"/lib64", "/lib"}, "v1.8.0": {"/lib64"}, "v1.8.2": {"/lib64"}, "": {"/lib64"},
	} {
		if got := releaseLibraryDirs(target); !slices.Equal(got, want) {
			t.Errorf("releaseLibraryDirs(%q) = %q, want %q", target, got, want)
		}
	}
}
