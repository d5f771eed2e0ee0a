package nodeprogram

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Host is every action the node program takes on a node. The real one (ChrootHost) runs
// the host's own tools with the host's root as their root; tests use a temporary
// directory and stand-in tools.
type Host interface {
	// Path is where the host's file p (an absolute path on the host) is seen by this program.
	Path(p string) string
	// Run runs a host command with the host's root as its root and returns its standard
	// output. A non-zero exit is an error that carries the command's standard error.
	Run(ctx context.Context, cmd Command) ([]byte, error)
	// LoopMount attaches image to a loop device read-only and mounts it read-only on
	// target with the file system type fstype; both paths are as this program sees them.
	LoopMount(image, target, fstype string) error
	// BindMount binds source, a directory of this program's own root (its container's,
	// not the host's), over target (as this program sees it): what `mount -o bind` does.
	BindMount(source, target string) error
	// Unmount detaches what is mounted on target (as this program sees it).
	Unmount(target string) error
	// Mounted tells whether something is mounted on target (as this program sees it).
	Mounted(target string) (bool, error)
}

// Command is a command run on the host.
type Command struct {
	// Name is the program, an absolute path on the host or a name looked up in the host's
	// PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin).
	Name string
	Args []string
	// Env is added to a minimal environment (PATH).
	Env []string
	// Stdin, when set, is the command's standard input.
	Stdin io.Reader
}

func (c Command) String() string { return strings.Join(append([]string{c.Name}, c.Args...), " ") }

// hostPATH is the PATH host commands are looked up in and run with.
const hostPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ChrootHost is the host of a privileged container that mounts the node's root at Root.
// Commands are the host's own binaries, started with Root as their root directory
// (chroot(2) in the child only): the image needs no tools of its own, and a command
// links against the host's libraries. They stay in this container's namespaces, so a
// Plan's pod needs hostPID only for tools that talk to host processes (systemd-run
// talks to systemd over its socket under /run, which is part of the host root).
type ChrootHost struct {
	Root string
}

// NewChrootHost is the host whose root is mounted at root ("/" when this program runs on
// the host itself).
func NewChrootHost(root string) *ChrootHost { return &ChrootHost{Root: filepath.Clean(root)} }

// Path implements Host.
func (h *ChrootHost) Path(p string) string { return filepath.Join(h.Root, p) }

// Run implements Host.
func (h *ChrootHost) Run(ctx context.Context, c Command) ([]byte, error) {
	path, err := h.lookPath(c.Name)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, path, c.Args...)
	cmd.Args[0] = c.Name
	cmd.Env = append([]string{"PATH=" + hostPATH}, c.Env...)
	cmd.Stdin = c.Stdin
	cmd.Dir = "/"
	if h.Root != "/" {
		cmd.SysProcAttr = chrootAttr(h.Root)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), commandError(c, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// lookPath finds a command's binary on the host and returns its path on the host.
func (h *ChrootHost) lookPath(name string) (string, error) {
	candidates := []string{name}
	if !strings.HasPrefix(name, "/") {
		candidates = nil
		for _, dir := range filepath.SplitList(hostPATH) {
			candidates = append(candidates, filepath.Join(dir, name))
		}
	}
	for _, c := range candidates {
		if h.exists(c) {
			return c, nil
		}
	}
	return "", fmt.Errorf("the host has no %s (looked in %s under %s): is --host-root the node's root?", name, strings.Join(candidates, ", "), h.Root)
}

// exists tells whether the host path p names a file, following symbolic links as the
// host does: an absolute link target is under Root, not this container's root (RKE2's
// /var/lib/rancher/rke2/bin is such a link, to data/<version>/bin).
func (h *ChrootHost) exists(p string) bool {
	resolved := "/"
	pending := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
	for hops := 0; len(pending) > 0; {
		name := pending[0]
		pending = pending[1:]
		next := filepath.Join(resolved, name)
		info, err := os.Lstat(h.Path(next))
		if err != nil {
			return false
		}
		if info.Mode()&os.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if hops++; hops > 40 {
			return false
		}
		target, err := os.Readlink(h.Path(next))
		if err != nil {
			return false
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(resolved, target)
		}
		pending = append(strings.Split(strings.TrimPrefix(filepath.Clean(target), "/"), "/"), pending...)
		resolved = "/"
	}
	return true
}

// LoopMount implements Host.
func (h *ChrootHost) LoopMount(image, target, fstype string) error {
	return loopMount(image, target, fstype)
}

// BindMount implements Host.
func (h *ChrootHost) BindMount(source, target string) error { return bindMount(source, target) }

// Unmount implements Host.
func (h *ChrootHost) Unmount(target string) error { return unmount(target) }

// Mounted implements Host.
func (h *ChrootHost) Mounted(target string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close() //nolint:errcheck // read only
	return mountedIn(f, target)
}

// mountedIn tells whether mountinfo (proc(5) format) lists a mount point at target.
func mountedIn(mountinfo io.Reader, target string) (bool, error) {
	target = filepath.Clean(target)
	s := bufio.NewScanner(mountinfo)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == target {
			return true, nil
		}
	}
	return false, s.Err()
}

// unescapeMountPath undoes the octal escapes (\040 for a space) of mountinfo paths.
func unescapeMountPath(p string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(p)
}

func commandError(c Command, err error, stderr []byte) error {
	msg := strings.TrimSpace(string(stderr))
	if len(msg) > 1000 {
		msg = "..." + msg[len(msg)-1000:]
	}
	if msg == "" {
		return fmt.Errorf("host command `%s`: %w", c, err)
	}
	return fmt.Errorf("host command `%s`: %w: %s", c, err, msg)
}
