package nodeprogram

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestUsage(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		code        int
		termination string // "" means no termination message is written
		stderr      string
	}{
		{name: "help lists the subcommands", args: []string{"--help"}, code: ExitOK, stderr: "repository download"},
		{name: "no subcommand", args: nil, code: ExitUsage, termination: "unknown or missing subcommand", stderr: "name a subcommand"},
		{name: "unknown subcommand", args: []string{"reboot"}, code: ExitUsage, termination: "capi-inplace node --help", stderr: `unknown subcommand "reboot"`},
		{name: "half a subcommand", args: []string{"repository"}, code: ExitUsage, termination: "unknown or missing subcommand"},
		{name: "subcommand help", args: []string{"preload", "--help"}, code: ExitOK, stderr: "-repository-url"},
		{name: "unknown flag", args: []string{"preload", "--repo=x"}, code: ExitUsage, termination: "flag provided but not defined: -repo"},
		{name: "positional argument", args: []string{"os-upgrade", "--repository-url=http://r", "now"}, code: ExitUsage, termination: `unexpected arguments ["now"]`},
		{name: "missing required flag", args: []string{"preload"}, code: ExitUsage, termination: "--repository-url is required"},
		{name: "bad URL", args: []string{"preload", "--repository-url=repo.local"}, code: ExitUsage, termination: `"repo.local" must be an http:// or https:// URL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runNode(t, newFakeHost(t), nil, tt.args...)
			r.expect(t, tt.code)
			if tt.termination == "" && r.termination != "" {
				t.Errorf("termination message %q written for %v", r.termination, tt.args)
			}
			if tt.termination != "" && !strings.Contains(r.termination, tt.termination) {
				t.Errorf("termination message %q does not contain %q", r.termination, tt.termination)
			}
			if !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tt.stderr)
			}
		})
	}
}

func TestGlobalFlagsAfterTheSubcommand(t *testing.T) {
	host := newFakeHost(t)
	termination := filepath.Join(t.TempDir(), "msg")
	code := Main(context.Background(), []string{"repository", "mount", "--termination-log=" + termination, "--image=" + filepath.Join(host.root, "missing.iso")},
		&Env{Host: host, Stdout: io.Discard, Stderr: io.Discard, Now: time.Now})
	if code != ExitRetry {
		t.Fatalf("exit code %d, want %d", code, ExitRetry)
	}
	data, err := os.ReadFile(termination)
	if err != nil {
		t.Fatalf("the termination log given after the subcommand was not written: %v", err)
	}
	if !strings.Contains(string(data), "has no ready flag yet") {
		t.Errorf("termination message %q", data)
	}
}

func TestTerminationMessageIsCutToWhatKubernetesKeeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "msg")
	writeTermination(&Env{terminationLog: path, Stderr: os.Stderr}, strings.Repeat("x", 5000))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != maxTerminationMessage || !strings.HasSuffix(string(data), "...") {
		t.Errorf("termination message of %d bytes ending %q, want %d ending ...", len(data), data[len(data)-5:], maxTerminationMessage)
	}
}

func TestChrootHostRunsHostCommands(t *testing.T) {
	// Root "/" runs without chroot(2), so this needs no privileges; it checks the lookup
	// in the host's PATH, the environment, standard input and the error on failure.
	h := NewChrootHost("/")
	out, err := h.Run(context.Background(), Command{Name: "sh", Args: []string{"-c", `read line; echo "$line $GREETING"`}, Env: []string{"GREETING=world"}, Stdin: strings.NewReader("hello\n")})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "hello world\n" {
		t.Errorf("output %q", out)
	}
	_, err = h.Run(context.Background(), Command{Name: "sh", Args: []string{"-c", "echo broken >&2; exit 3"}})
	if err == nil || !strings.Contains(err.Error(), "exit status 3: broken") || !strings.Contains(err.Error(), "`sh -c echo broken >&2; exit 3`") {
		t.Errorf("error %v, want the command, its exit status and its stderr", err)
	}
	root := NewChrootHost(t.TempDir())
	_, err = root.Run(context.Background(), Command{Name: "elemental"})
	if err == nil || !strings.Contains(err.Error(), "the host has no elemental") {
		t.Errorf("error %v, want a missing host tool named", err)
	}
}

func TestMountedIn(t *testing.T) {
	mountinfo := `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
97 22 7:0 / /srv/www/htdocs/harvester\040iso ro,relatime shared:50 - iso9660 /dev/loop0 ro
`
	for target, want := range map[string]bool{
		"/srv/www/htdocs/harvester iso":  true,
		"/srv/www/htdocs/harvester iso/": true,
		"/srv/www/htdocs":                false,
		"/":                              true,
	} {
		got, err := mountedIn(strings.NewReader(mountinfo), target)
		if err != nil || got != want {
			t.Errorf("mountedIn(%q) = %v, %v; want %v", target, got, err, want)
		}
	}
}

func TestChrootHostFollowsHostSymlinksUnderItsRoot(t *testing.T) {
	root := t.TempDir()
	// RKE2's layout: bin is an absolute link into data/<version>/bin, which only resolves
	// under the host root.
	data := filepath.Join(root, "var/lib/rancher/rke2/data/v1.33.3-rke2r1-abc/bin")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "ctr"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/var/lib/rancher/rke2/data/v1.33.3-rke2r1-abc/bin", filepath.Join(root, "var/lib/rancher/rke2/bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../var/lib/rancher/rke2/bin/ctr", filepath.Join(root, "usr/bin/ctr")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	h := NewChrootHost(root)
	for p, want := range map[string]bool{
		"/var/lib/rancher/rke2/bin/ctr":    true,
		"/usr/bin/ctr":                     true,
		"/var/lib/rancher/rke2/bin/crictl": false,
		"/loop":                            false,
	} {
		if got := h.exists(p); got != want {
			t.Errorf("exists(%q) = %v, want %v", p, got, want)
		}
	}
	if got, err := h.lookPath("ctr"); err != nil || got != "/usr/bin/ctr" {
		t.Errorf("lookPath(ctr) = %q, %v", got, err)
	}
}
