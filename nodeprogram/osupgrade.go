package nodeprogram

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Host paths os-upgrade uses. /run is a tmpfs on the host: the markers there are gone
// after the reboot, which is when they stop being true.
const (
	osReleasePath      = "/etc/os-release"
	rootfsMountPoint   = "/tmp/capi-inplace-rootfs"
	installedMarker    = "/run/capi-inplace/os-installed"
	rebootMarker       = "/run/capi-inplace/reboot-scheduled"
	rebootUnit         = "capi-inplace-reboot"
	passiveImage       = "/run/initramfs/cos-state/cOS/passive.img"
	staticPodManifests = "/var/lib/rancher/rke2/agent/pod-manifests"
)

// elementalConfig is the configuration Harvester's upgrade_os gives elemental: a 3 GiB
// system image (facts, fact 27).
const elementalConfig = "upgrade:\n  system:\n    size: 3072\n"

type osUpgradeOptions struct {
	repositoryURL string
	version       string
	workDir       string
	elemental     string
	rebootDelay   time.Duration
	reboot        bool
	rke2Settings  bool
	// previous is the Harvester release the nodes ran when the upgrade started: the
	// release's node migrations are keyed on it (hopMigrations).
	previous string
	// libraries says whose C library a release's elemental the host cannot run gets:
	// librariesNewOS or librariesContainer (releaseElemental).
	libraries string
	// target is the release the repository holds (harvester-release.yaml's harvester):
	// which library directories the release binds depends on it (releaseLibraryDirs).
	target string
}

// The sources of the C library a release's elemental runs with when the host's is too
// old (--glibc-libraries).
const (
	// librariesNewOS: the new OS image's /lib64 and /lib, the libraries elemental is
	// built with.
	librariesNewOS = "new-os"
	// librariesContainer: this container's own /lib64 (and /lib where the release binds
	// it), as Harvester's upgrade_os binds its upgrade container's: the Plan runs this
	// program in the release's upgrade image on the hop that needs it.
	librariesContainer = "container"
)

// runOSUpgrade does what Harvester's upgrade_os and reboot_if_job_succeed do (facts,
// facts 27 and 28): nothing when the node already runs the release's OS; otherwise
// install it with elemental from the repository's rootfs.squashfs, then schedule the
// reboot on the host a while after this program has exited, so that the Job is recorded
// as succeeded before the node goes down.
func runOSUpgrade(ctx context.Context, env *Env, args []string) error {
	var o osUpgradeOptions
	fs := newFlagSet(env, "os-upgrade")
	fs.StringVar(&o.repositoryURL, "repository-url", "", "base URL of the release repository (required), e.g. http://upgrade-repo.harvester-system/harvester-iso")
	fs.StringVar(&o.version, "version", "", "the Harvester release the repository must hold (e.g. v1.6.0); empty accepts any")
	fs.StringVar(&o.workDir, "work-dir", "/usr/local/upgrade_tmp", "host directory for the downloaded rootfs.squashfs, elemental's configuration and its log (on the persistent disk: the squashfs is large)")
	fs.StringVar(&o.elemental, "elemental", "", "the elemental to run: empty runs the release's own, from the new OS image (as Harvester does since v1.5.2); else a name looked up in the host's PATH or an absolute host path")
	fs.DurationVar(&o.rebootDelay, "reboot-delay", time.Minute, "how long after the install the host reboots; time for this container to exit and for its Job to be recorded as succeeded")
	fs.BoolVar(&o.reboot, "reboot", true, "schedule the reboot (false leaves it to someone else; the new OS runs only after one)")
	fs.StringVar(&o.previous, "previous-version", "", "the Harvester release the nodes ran when the upgrade started (the plan's previousVersion, e.g. v1.6.1): the release's node migrations of the hop from it run before the OS install; empty runs none")
	fs.StringVar(&o.libraries, "glibc-libraries", librariesNewOS, "when the host's C library is too old for the release's elemental (GLIBC_... not found): bind \""+librariesNewOS+"\" (the new OS image's /lib64 and /lib) or \""+librariesContainer+"\" (this container's /lib64, and /lib where the target release binds it, as Harvester's upgrade_os binds its upgrade image's; the Plan runs this program in that image) over the host's while elemental runs")
	fs.BoolVar(&o.rke2Settings, "rke2-settings", true, "first write the release's post-drain RKE2 and kubelet settings (rke2-settings --stage=post-drain), which the reboot applies, as Harvester's post-drain does before its OS upgrade")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	repo, err := newRepository(env, o.repositoryURL)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(o.workDir) {
		return usagef("--work-dir %q must be an absolute path on the host", o.workDir)
	}
	if o.libraries != librariesNewOS && o.libraries != librariesContainer {
		return usagef("--glibc-libraries %q: give %s or %s", o.libraries, librariesNewOS, librariesContainer)
	}
	if o.rebootDelay < 10*time.Second {
		return usagef("--reboot-delay %s is too short for the Job to be recorded as succeeded first: give 10s or more", o.rebootDelay)
	}
	rel, err := repo.release(ctx, o.version)
	if err != nil {
		return err
	}
	o.target = rel.Harvester
	running, err := prettyName(env.host().Path(osReleasePath))
	if err != nil {
		return err
	}
	if o.rke2Settings {
		if err := applyRKE2Settings(ctx, env, stagePostDrain); err != nil {
			return err
		}
	}
	if running == rel.OS {
		// The release's post-drain runs the hop's node migrations before upgrade_os and
		// its version check (upgrade_node.sh command_post_drain; fact 53): a node already
		// on the release's OS gets them too, with its own harvester-installer, the
		// release's since it runs the release's OS.
		if err := hopMigrations(ctx, env, o.previous, installerInImage); err != nil {
			return err
		}
		env.say("the node already runs %s: nothing to install, no reboot\n", rel.OS)
		return nil
	}
	installed, err := os.ReadFile(env.host().Path(installedMarker))
	switch {
	case err == nil && strings.TrimSpace(string(installed)) == rel.OS:
		env.say("%s is already installed and waits for the reboot (the node runs %s)\n", rel.OS, running)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("read %s on the host: %w", installedMarker, err)
	default:
		env.say("installing %s over %s\n", rel.OS, running)
		if err := installOS(ctx, env, o, repo); err != nil {
			return err
		}
		if err := writeHostFile(env.host(), installedMarker, rel.OS+"\n"); err != nil {
			return err
		}
	}
	if !o.reboot {
		env.say("%s installed; --reboot=false: the node runs it after its next reboot\n", rel.OS)
		return nil
	}
	return scheduleReboot(ctx, env, o.rebootDelay)
}

// prettyName is PRETTY_NAME of an os-release file (os-release(5)), the value Harvester
// compares with the release's os.
func prettyName(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read the host's %s (is --host-root the node's root?): %w", osReleasePath, err)
	}
	defer f.Close() //nolint:errcheck // read only
	s := bufio.NewScanner(f)
	for s.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(s.Text()), "=")
		if !ok || key != "PRETTY_NAME" {
			continue
		}
		if unquoted, err := strconv.Unquote(value); err == nil {
			return unquoted, nil
		}
		return strings.Trim(value, `'"`), nil
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("read the host's %s: %w", osReleasePath, err)
	}
	return "", fmt.Errorf("the host's %s has no PRETTY_NAME: cannot tell which OS it runs", osReleasePath)
}

// installOS downloads rootfs.squashfs, mounts it and runs `elemental upgrade` from it on
// the host, as upgrade_os does.
func installOS(ctx context.Context, env *Env, o osUpgradeOptions, repo *repository) error {
	squashfs := filepath.Join(o.workDir, "rootfs.squashfs")
	configDir := filepath.Join(o.workDir, "elemental-config")
	if err := os.MkdirAll(env.host().Path(configDir), 0o755); err != nil {
		return fmt.Errorf("create %s on the host: %w", configDir, err)
	}
	if err := placeFile(ctx, env, repo, "rootfs.squashfs", o.workDir); err != nil {
		return err
	}
	// The squashfs is as large as the OS: it goes once elemental has copied it.
	defer os.Remove(env.host().Path(squashfs)) //nolint:errcheck // best effort; the next run overwrites it
	if err := writeHostFile(env.host(), filepath.Join(configDir, "config.yaml"), elementalConfig); err != nil {
		return err
	}

	mountPoint := env.host().Path(rootfsMountPoint)
	if err := os.MkdirAll(mountPoint, 0o755); err != nil {
		return fmt.Errorf("create %s on the host: %w", rootfsMountPoint, err)
	}
	if mounted, err := env.host().Mounted(mountPoint); err != nil {
		return err
	} else if mounted {
		// Left by a run that was killed: its squashfs may be another download.
		if err := env.host().Unmount(mountPoint); err != nil {
			return err
		}
	}
	if err := env.host().LoopMount(env.host().Path(squashfs), mountPoint, "squashfs"); err != nil {
		return fmt.Errorf("mount the new OS image: %w", err)
	}
	defer env.host().Unmount(mountPoint) //nolint:errcheck // best effort; the reboot clears it too

	// The hop's node migrations, right before upgrade_os as the release's post-drain runs
	// them; they take the release's own harvester-installer from the new OS image.
	if err := hopMigrations(ctx, env, o.previous, filepath.Join(rootfsMountPoint, installerInImage)); err != nil {
		return err
	}

	// The state partition first (upgrade_os: cleanup_incomplete_state_file,
	// sparsify_passive_img, check_and_mount_state).
	if err := prepareStatePartition(ctx, env); err != nil {
		return err
	}
	elemental, unbind, cleanup, err := releaseElemental(ctx, env, o)
	if err != nil {
		return err
	}
	defer cleanup()
	logFile := filepath.Join(o.workDir, "elemental-upgrade.log")
	_, err = env.host().Run(ctx, Command{Name: elemental, Args: []string{
		"upgrade", "--logfile", logFile, "--directory", rootfsMountPoint, "--config-dir", configDir, "--debug",
	}})
	unbind()
	if err != nil {
		return fmt.Errorf("install the OS (elemental's log is %s on the node): %w", logFile, err)
	}
	// Then what the new OS needs to boot as the release boots it.
	return patchBoot(ctx, env, o.version)
}

// rebootLostAfter is how long past its time a scheduled reboot is taken as lost when
// this boot still runs (the marker lives under /run, which the reboot clears).
const rebootLostAfter = 2 * time.Minute

// scheduleReboot asks the host's systemd to reboot after delay, once: a transient timer
// that outlives this container. Like Harvester, it removes RKE2's static pod manifests
// first, so that RKE2 writes them anew for the upgraded node when it starts. A reboot
// scheduled before whose time has long passed on the same boot did not come (its timer
// stopped or lost; nodes left unrebooted after their upgrade's node Job:
// harvester/harvester#6022, #7457): it is scheduled again, the old timer stopped first.
func scheduleReboot(ctx context.Context, env *Env, delay time.Duration) error {
	if data, err := os.ReadFile(env.host().Path(rebootMarker)); err == nil {
		at, perr := time.Parse(time.RFC3339, strings.TrimSpace(string(data)))
		if perr != nil || env.Now().Before(at.Add(rebootLostAfter)) {
			env.say("the reboot is already scheduled\n")
			return nil
		}
		env.say("the reboot scheduled for %s did not come and this boot still runs: scheduling it again\n", at.Format(time.RFC3339))
		// Either may find nothing: the timer gone, or the service never failed.
		_, _ = env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"stop", rebootUnit + ".timer"}})
		_, _ = env.host().Run(ctx, Command{Name: "systemctl", Args: []string{"reset-failed", rebootUnit + ".timer", rebootUnit + ".service"}})
	}
	script := fmt.Sprintf("rm -f %s/*; systemctl reboot", staticPodManifests)
	if _, err := env.host().Run(ctx, Command{Name: "systemd-run", Args: []string{
		"--unit=" + rebootUnit, "--description=capi-inplace: reboot into the upgraded OS",
		fmt.Sprintf("--on-active=%ds", int(delay.Seconds())), "/bin/sh", "-c", script,
	}}); err != nil {
		return fmt.Errorf("schedule the reboot (the OS is installed; reboot the node to finish): %w", err)
	}
	if err := writeHostFile(env.host(), rebootMarker, env.Now().Add(delay).UTC().Format(time.RFC3339)+"\n"); err != nil {
		return err
	}
	env.say("the node reboots in %s\n", delay)
	return nil
}

// writeHostFile writes a small file on the host, creating its directory.
func writeHostFile(h Host, hostPath, content string) error {
	p := h.Path(hostPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("create %s on the host: %w", filepath.Dir(hostPath), err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		return fmt.Errorf("write %s on the host: %w", hostPath, err)
	}
	return nil
}
