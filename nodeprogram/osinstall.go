package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// The OS install as Harvester's upgrade_os does it around `elemental upgrade`
// (package/upgrade/upgrade_node.sh at v1.8.2; shared/facts/harvester-release-steps.md
// fact 54, harvester-node-upgrade.md fact 27): the state partition made ready first, the
// release's own elemental, and the boot settings of the release afterwards.
const (
	// stateDir is where the COS_STATE partition, which holds the active and passive
	// images, is mounted read-only.
	stateDir  = "/run/initramfs/cos-state"
	stateFile = stateDir + "/state.yaml"
	// multipathStateDir is where elemental looks for COS_STATE when it sits on a
	// multipath device mapper (check_and_mount_state).
	multipathStateDir = "/run/cos/state"
	// releaseElementalInImage is the elemental of the new OS image, which Harvester's
	// upgrade image takes from the release's base OS image (fact 54.3).
	releaseElementalInImage = "/usr/bin/elemental"

	grubEnv         = "/oem/grubenv"
	grubCustom      = "/oem/grubcustom"
	harvesterConfig = "/oem/harvester.config"
	sftpConfig      = "/etc/ssh/sshd_config.d/sftp.conf"
	kernelArgsKey   = "third_party_kernel_args"
)

// prepareStatePartition does what upgrade_os does to the state partition before
// elemental (fact 54.2): a state.yaml without a label (left by an interrupted install,
// harvester#4526) is moved aside, and the holes of the passive image are freed
// (harvester#7457, #7518), both with the partition remounted read-write for the time it
// takes; and where COS_STATE sits on a multipath device mapper, it is mounted where
// elemental looks for it.
func prepareStatePartition(ctx context.Context, env *Env) error {
	h := env.host()
	incomplete, err := incompleteStateFile(h)
	if err != nil {
		return err
	}
	_, passiveErr := os.Lstat(h.Path(passiveImage))
	if incomplete || passiveErr == nil {
		if _, err := h.Run(ctx, Command{Name: "mount", Args: []string{"-o", "rw,remount", stateDir}}); err != nil {
			return fmt.Errorf("remount the state partition %s read-write: %w", stateDir, err)
		}
		err := fixStatePartition(ctx, env, incomplete, passiveErr == nil)
		if _, roErr := h.Run(ctx, Command{Name: "mount", Args: []string{"-o", "ro,remount", stateDir}}); roErr != nil && err == nil {
			err = fmt.Errorf("remount the state partition %s read-only again: %w", stateDir, roErr)
		}
		if err != nil {
			return err
		}
	}
	out, err := h.Run(ctx, Command{Name: "blkid", Args: []string{"-L", "COS_STATE"}})
	if err != nil {
		// No device labelled COS_STATE that blkid can name: not on multipath.
		env.say("blkid -L COS_STATE found no device (%v): COS_STATE is not on a multipath device\n", err)
		return nil
	}
	if !strings.Contains(string(out), "mapper") {
		return nil
	}
	if err := os.MkdirAll(h.Path(multipathStateDir), 0o755); err != nil {
		return fmt.Errorf("create %s on the host: %w", multipathStateDir, err)
	}
	if _, err := h.Run(ctx, Command{Name: "mount", Args: []string{"-L", "COS_STATE", multipathStateDir}}); err != nil {
		return fmt.Errorf("mount COS_STATE (on %s) at %s for elemental: %w", strings.TrimSpace(string(out)), multipathStateDir, err)
	}
	env.say("COS_STATE is on %s: mounted at %s\n", strings.TrimSpace(string(out)), multipathStateDir)
	return nil
}

// incompleteStateFile tells whether state.yaml exists without a label in its state
// section (the script's `yq '.state | has("label")'`).
func incompleteStateFile(h Host) (bool, error) {
	data, err := os.ReadFile(h.Path(stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s on the host: %w", stateFile, err)
	}
	var doc struct {
		State map[string]any `json:"state"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return true, nil //nolint:nilerr // a state.yaml that does not parse is as incomplete as one without a label
	}
	_, labelled := doc.State["label"]
	return !labelled, nil
}

func fixStatePartition(ctx context.Context, env *Env, incomplete, passive bool) error {
	h := env.host()
	if incomplete {
		data, err := os.ReadFile(h.Path(stateFile))
		if err != nil {
			return fmt.Errorf("read %s on the host: %w", stateFile, err)
		}
		if err := os.WriteFile(h.Path(stateFile+".bak"), data, 0o644); err != nil {
			return fmt.Errorf("keep %s as %s.bak: %w", stateFile, stateFile, err)
		}
		if err := os.Remove(h.Path(stateFile)); err != nil {
			return fmt.Errorf("remove the incomplete %s: %w", stateFile, err)
		}
		env.say("moved the incomplete %s (no label) to %s.bak\n", stateFile, stateFile)
	}
	if passive {
		if _, err := h.Run(ctx, Command{Name: "fallocate", Args: []string{"--dig-holes", passiveImage}}); err != nil {
			return fmt.Errorf("free space in the passive image: %w", err)
		}
	}
	return nil
}

// releaseElemental is the elemental that installs the OS: by default the release's own,
// copied from the mounted new OS image to the work directory on the host, as Harvester
// runs the release's (copied from its upgrade image to the host's /tmp) since v1.5.2
// (fact 54.3); or the one --elemental names. A release's elemental that cannot run on
// the host's C library (GLIBC ... not found: an SL Micro 6.1 build on a SLE Micro 5.5
// host, the v1.6 to v1.7 hop) runs, as Harvester v1.7 runs it (fact 54.4, commit
// e62990d), with a newer /lib64 (and /lib) bound over the host's, in this container's
// mount namespace only: with --glibc-libraries=container this container's, as Harvester
// binds its upgrade container's (`mount -o bind /lib64 $HOST_DIR/lib64`; the Plan runs
// this program in the release's upgrade image on that hop), the directories the target
// release binds (releaseLibraryDirs); else the new OS image's /lib64 and /lib, the
// libraries elemental is built with. unbind takes them away (right after elemental, before any other host tool runs);
// cleanup unbinds if that was not done and removes the copy.
func releaseElemental(ctx context.Context, env *Env, o osUpgradeOptions) (elemental string, unbind, cleanup func(), err error) {
	nothing := func() {}
	if o.elemental != "" {
		return o.elemental, nothing, nothing, nil
	}
	h := env.host()
	src := filepath.Join(rootfsMountPoint, releaseElementalInImage)
	data, err := os.ReadFile(h.Path(src))
	if err != nil {
		return "", nothing, nothing, fmt.Errorf("read the release's elemental in the new OS image (%s on the host): %w; --elemental=elemental runs the host's instead", src, err)
	}
	dst := filepath.Join(o.workDir, "elemental")
	if err := os.WriteFile(h.Path(dst), data, 0o755); err != nil {
		return "", nothing, nothing, fmt.Errorf("copy the release's elemental to %s on the host: %w", dst, err)
	}
	var bound []string
	unbind = func() {
		// In the order bound, as the release unbinds: /lib64 first, then /lib.
		for len(bound) > 0 {
			dir := bound[0]
			var err error
			if o.libraries == librariesContainer {
				err = h.Unmount(h.Path(dir))
			} else {
				_, err = h.Run(ctx, Command{Name: "umount", Args: []string{dir}})
			}
			if err != nil {
				env.complain("unbind the %s from the host's %s: %v\n", librarySource(o.libraries), dir, err)
			}
			bound = bound[1:]
		}
	}
	cleanup = func() { unbind(); _ = os.Remove(h.Path(dst)) }
	out, err := h.Run(ctx, Command{Name: dst, Args: []string{"version"}})
	if err != nil {
		glibc := glibcMissing(string(out) + err.Error())
		if glibc == "" {
			cleanup()
			return "", nothing, nothing, fmt.Errorf("run the release's elemental (%s version): %w", dst, err)
		}
		dirs := []string{"/lib64", "/lib"}
		if o.libraries == librariesContainer {
			dirs = releaseLibraryDirs(o.target)
		}
		env.say("the host's C library is too old for the release's elemental (%s): binding the %s %s over the host's while it runs\n", glibc, librarySource(o.libraries), strings.Join(dirs, " and "))
		for _, dir := range dirs {
			var err error
			if o.libraries == librariesContainer {
				err = h.BindMount(dir, h.Path(dir))
			} else {
				_, err = h.Run(ctx, Command{Name: "mount", Args: []string{"-o", "bind", filepath.Join(rootfsMountPoint, dir), dir}})
			}
			if err != nil {
				cleanup()
				return "", nothing, nothing, fmt.Errorf("bind the %s %s over the host's: %w", librarySource(o.libraries), dir, err)
			}
			bound = append(bound, dir)
		}
		if out, err := h.Run(ctx, Command{Name: dst, Args: []string{"version"}}); err != nil {
			cleanup()
			why := glibcMissing(string(out) + err.Error())
			if why == "" {
				why = err.Error()
			}
			return "", nothing, nothing, fmt.Errorf("the release's elemental cannot run on this host even with the %s %s bound over the host's: %s", librarySource(o.libraries), strings.Join(dirs, " and "), why)
		}
	}
	env.say("installing with the release's elemental, from the new OS image\n")
	return dst, unbind, cleanup, nil
}

// librarySource names where the bound libraries come from, for messages.
func librarySource(libraries string) string {
	if libraries == librariesContainer {
		return "release's upgrade image's"
	}
	return "new OS image's"
}

// releaseLibraryDirs are the directories of its upgrade container that the release
// binds over the host's for its elemental (upgrade_node.sh upgrade_os, GLIBC workaround,
// harvester commit e62990d; harvester-release-steps.md fact 81): /lib64 alone at v1.7.0,
// v1.7.1 and v1.8.x; /lib64 and /lib (for ARM) at v1.7.2 and v1.7.3, and v1.7 patches
// after those are taken to keep it.
func releaseLibraryDirs(target string) []string {
	if m := v17Patch.FindStringSubmatch(target); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n >= 2 {
			return []string{"/lib64", "/lib"}
		}
	}
	return []string{"/lib64"}
}

var v17Patch = regexp.MustCompile(`^v1\.7\.([0-9]+)$`)

var glibcNotFound = regexp.MustCompile(`GLIBC[^ ]* not found[^\n]*`)

// glibcMissing is the dynamic loader's complaint about a missing GLIBC version, or "".
func glibcMissing(output string) string {
	return glibcNotFound.FindString(output)
}

// patchBoot does what upgrade_os does after elemental (fact 54.5 and 54.6): /oem/grubenv
// and /oem/grubcustom created when missing (some firmware searches for them for half an
// hour); in the kernel arguments Harvester adds (grubenv's third_party_kernel_args),
// multipath=off unless the node uses external storage or an argument names multipath
// already, and ifname=<name>:<mac> for each en* NIC not pinned yet (its permanent address
// for a bond's slave), so that a new driver's naming cannot rename the interfaces the
// network configuration names (harvester PR #9877); the boot configuration that keeps
// multipathd off Longhorn's iSCSI disks (lhMultipathdConfig); the sftp-server path of SL
// Micro 6. target is the release being installed: v1.7.0 sets no NIC pins (its
// upgrade_os has no set_nic_names_by_mac_address), so neither does this for it; empty
// (a run by hand that accepts any release) pins.
func patchBoot(ctx context.Context, env *Env, target string) error {
	h := env.host()
	if exists, err := hostFileExists(h, grubEnv); err != nil {
		return err
	} else if !exists {
		if _, err := h.Run(ctx, Command{Name: "grub2-editenv", Args: []string{grubEnv, "create"}}); err != nil {
			return fmt.Errorf("create %s: %w", grubEnv, err)
		}
	}
	if exists, err := hostFileExists(h, grubCustom); err != nil {
		return err
	} else if !exists {
		if err := writeHostFile(h, grubCustom, ""); err != nil {
			return err
		}
	}
	if err := setKernelArgs(ctx, env, target); err != nil {
		return err
	}
	if err := writeHostFile(h, lhMultipathdFile, lhMultipathdConfig()); err != nil {
		return err
	}
	data, err := os.ReadFile(h.Path(sftpConfig))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read %s on the host: %w", sftpConfig, err)
	default:
		fixed := strings.ReplaceAll(string(data), "/usr/lib/ssh/sftp-server", "/usr/libexec/ssh/sftp-server")
		if fixed != string(data) {
			if err := writeHostFile(h, sftpConfig, fixed); err != nil {
				return err
			}
		}
	}
	return nil
}

// setKernelArgs adds multipath=off and the NIC pins to third_party_kernel_args, in one
// write, when something is to be added; no pins for target v1.7.0 (see patchBoot).
func setKernelArgs(ctx context.Context, env *Env, target string) error {
	h := env.host()
	out, err := h.Run(ctx, Command{Name: "grub2-editenv", Args: []string{grubEnv, "list"}})
	if err != nil {
		return fmt.Errorf("read %s: %w", grubEnv, err)
	}
	var current string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, kernelArgsKey+"="); ok {
			current = v
		}
	}
	args := strings.Fields(current)
	external, err := externalStorage(h)
	if err != nil {
		return err
	}
	if !external && !strings.Contains(current, "multipath") {
		args = append(args, "multipath=off")
	}
	if target != "v1.7.0" {
		pins, err := nicPins(h, current)
		if err != nil {
			return err
		}
		args = append(args, pins...)
	}
	if strings.Join(args, " ") == strings.Join(strings.Fields(current), " ") {
		return nil
	}
	if _, err := h.Run(ctx, Command{Name: "grub2-editenv", Args: []string{grubEnv, "set", kernelArgsKey + "=" + strings.Join(args, " ")}}); err != nil {
		return fmt.Errorf("set %s in %s: %w", kernelArgsKey, grubEnv, err)
	}
	env.say("%s: %s\n", kernelArgsKey, strings.Join(args, " "))
	return nil
}

// externalStorage reads os.externalstorage.enabled of the node's Harvester configuration
// (false when absent).
func externalStorage(h Host) (bool, error) {
	data, err := os.ReadFile(h.Path(harvesterConfig))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s on the host: %w", harvesterConfig, err)
	}
	var cfg struct {
		OS struct {
			ExternalStorage struct {
				Enabled bool `json:"enabled"`
			} `json:"externalstorage"`
		} `json:"os"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return false, fmt.Errorf("read %s on the host: %w", harvesterConfig, err)
	}
	return cfg.OS.ExternalStorage.Enabled, nil
}

// nicPins are ifname=<name>:<mac> for each en* interface of the host whose address has
// no ifname= in current yet (set_nic_names_by_mac_address, v1.7.1 on; bond slaves by
// their permanent address, v1.7.2 on).
func nicPins(h Host, current string) ([]string, error) {
	dir := h.Path("/sys/class/net")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the host's network interfaces: %w", err)
	}
	var pins []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "en") {
			continue
		}
		mac, err := os.ReadFile(filepath.Join(dir, name, "address"))
		if err != nil {
			continue // no address: nothing to pin
		}
		if perm, err := os.ReadFile(filepath.Join(dir, name, "bonding_slave", "perm_hwaddr")); err == nil {
			mac = perm
		}
		addr := strings.TrimSpace(string(mac))
		if regexp.MustCompile(`ifname=\S+:` + regexp.QuoteMeta(addr) + `(\s|$)`).MatchString(current) {
			continue
		}
		pins = append(pins, "ifname="+name+":"+addr)
	}
	return pins, nil
}

// lhMultipathdFile is the cloud-init (yip) configuration upgrade_os writes on every node
// since v1.7.0, after elemental (fact 54.5; upgrade_node.sh upgrade_os at v1.7.0 to
// v1.8.2, harvester commit 7ef7891 "change kernel arguments and create directives for
// disabling multipathd for longhorn volumes"): at each boot it keeps multipathd from
// claiming the iSCSI disks Longhorn's v1 engine exposes (vendor IET, product
// VIRTUAL-DISK), and installs the release's multipathd unit.
const lhMultipathdFile = "/oem/99_disable_lh_multipathd.yaml"

// lhMultipathdConfig is that configuration: in the initramfs stage, the directory
// /etc/multipath/conf.d, a blacklist of Longhorn's disks in it, and the multipathd
// service unit the release writes (socket activation left out, started from sysinit).
func lhMultipathdConfig() string {
	blacklist := "blacklist { \n  device { \n    vendor \"IET\" \n    product \"VIRTUAL-DISK\"\n  }\n}\n"
	unit := strings.Join([]string{
		"[Unit]",
		"Description=Device-Mapper Multipath Device Controller",
		"Before=lvm2-activation-early.service",
		"Before=local-fs-pre.target blk-availability.service shutdown.target",
		"Wants=systemd-udevd-kernel.socket modprobe@dm_multipath.service",
		"After=systemd-udevd-kernel.socket modprobe@dm_multipath.service",
		"After=multipathd.socket systemd-remount-fs.service",
		"Before=initrd-cleanup.service",
		"DefaultDependencies=no",
		"Conflicts=shutdown.target",
		"Conflicts=initrd-cleanup.service",
		"ConditionKernelCommandLine=!nompath",
		"ConditionVirtualization=!container",
		"",
		"[Service]",
		"Type=notify",
		"NotifyAccess=main",
		"ExecStart=/usr/sbin/multipathd -d -s",
		"ExecReload=/usr/sbin/multipathd reconfigure",
		"TasksMax=infinity",
		"LimitRTPRIO=10",
		"CPUWeight=1000",
		"",
		"[Install]",
		"WantedBy=sysinit.target",
		"",
	}, "\n")
	config := map[string]any{
		"name": "disable longhorn multipathing",
		"stages": map[string]any{"initramfs": []any{
			map[string]any{"directories": []any{map[string]any{"path": "/etc/multipath/conf.d", "permissions": 0o644, "owner": 0, "group": 0}}},
			map[string]any{"files": []any{
				map[string]any{"path": "/etc/multipath/conf.d/99-longhorn.conf", "content": blacklist, "permissions": 0o644, "owner": 0, "group": 0},
				map[string]any{"path": "/etc/systemd/system/multipathd.service", "content": unit, "permissions": 0o644, "owner": 0, "group": 0},
			}},
		}},
	}
	out, err := yaml.Marshal(config)
	if err != nil {
		panic(fmt.Sprintf("marshal %s: %v", lhMultipathdFile, err)) // a constant map: cannot fail
	}
	return string(out)
}
