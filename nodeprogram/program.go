// Package nodeprogram is the node side of the built-in updaters: the subcommands that a
// Harvester cluster's SUC Plans and repository Deployment, and the KubeadmUpdater's Jobs,
// run on a node (`capi-inplace node ...`). For Harvester it does what Harvester's own node
// upgrade does on a host (shared/facts/harvester-node-upgrade.md, sections C, D1 and D3)
// without Harvester's Upgrade object; for kubeadm, the per-node steps of Kubernetes'
// documented kubeadm upgrade (docs/kubeadm-node-program.md). It works through a small Host
// interface so that every subcommand is tested on a temporary host root.
package nodeprogram

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Exit codes of every subcommand. SUC and the repository Deployment only tell zero from
// non-zero; the codes are for a person reading `kubectl get pod -o yaml` and for scripts.
// Binary is the capi-inplace image's binary (its entrypoint, Dockerfile). The Harvester
// updater's Plans and repository name it as their command, so that they run the node
// program whatever entrypoint a mirrored image was given.
const Binary = "/capi-inplace"

const (
	// ExitOK: the work is done (or was already done).
	ExitOK = 0
	// ExitFailed: the work failed in a way that running again will not fix (a checksum
	// mismatch, a repository of another release, a host tool that refused). The
	// termination message says what to fix.
	ExitFailed = 1
	// ExitUsage: the command line is wrong (unknown subcommand, missing or malformed flag).
	ExitUsage = 2
	// ExitRetry: not done yet, for a reason that should pass (the leader has not finished
	// downloading, the repository did not answer). Running the same command again later is
	// the remedy; a Job's backoff does exactly that.
	ExitRetry = 3
)

// maxTerminationMessage is the most Kubernetes keeps of a termination message (4096 bytes).
const maxTerminationMessage = 4096

// Env is what a subcommand gets from the world outside its flags.
type Env struct {
	// Host is the node the subcommand works on.
	Host Host
	// HTTP fetches from the repository and the release URLs.
	HTTP *http.Client
	// Stdout and Stderr receive progress lines and usage.
	Stdout, Stderr io.Writer
	// Now and Sleep are the clock, replaced in tests.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	// Identity names this process in the leader lock (the pod name in a cluster).
	Identity string
	// Client returns the client of the cluster the program runs in (cluster-upgrade).
	// Default: the in-cluster configuration of the pod's service account.
	Client func() (client.Client, error)
	// KubeadmClusterConfiguration returns the ClusterConfiguration document of a kubeadm
	// cluster (ConfigMap kube-system/kubeadm-config, key ClusterConfiguration), read with
	// the kubeconfig file kubeconfig, a path as this program sees it (`kubeadm upgrade`
	// on a control plane node reads it to choose between apply and node). Default: a
	// client built from that file.
	KubeadmClusterConfiguration func(ctx context.Context, kubeconfig string) (string, error)

	// The flags every subcommand accepts, before or after its name.
	hostRoot       string
	terminationLog string
}

// host is the node to work on: Host, or the node's root at --host-root.
func (e *Env) host() Host {
	if e.Host == nil {
		e.Host = NewChrootHost(e.hostRoot)
	}
	return e.Host
}

// bindGlobal adds the flags every subcommand accepts to fs.
func (e *Env) bindGlobal(fs *flag.FlagSet) {
	fs.StringVar(&e.hostRoot, "host-root", e.hostRoot, "where the node's root filesystem is mounted in this container; host commands run with it as their root")
	fs.StringVar(&e.terminationLog, "termination-log", e.terminationLog, "file the outcome is written to, which Kubernetes shows as the container's termination message; empty writes none")
}

// command is one subcommand: its name, a one-line summary for `node --help`, and run,
// which parses its own flags.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *Env, args []string) error
}

func commands() []command {
	return []command{
		{name: "repository download", summary: "provide the release ISO, checked against its SHA-512: copied from a ready peer, else downloaded from the release URL (one leader per shared volume)", run: runDownload},
		{name: "repository mount", summary: "loop-mount the downloaded ISO read-only for the repository's web server", run: runMount},
		{name: "preload", summary: "import the release's container images from the repository into the node's containerd", run: runPreload},
		{name: "remove-archives", summary: "after the RKE2 upgrade, remove the RKE2 image archives preload placed for RKE2 to import", run: runRemoveArchives},
		{name: "remove-images", summary: "once every node runs the release, remove the previous release's images it no longer lists from the node's containerd", run: runRemoveImages},
		{name: "rke2-restart-guard", summary: "place (or with --remove take away) the runtime drop-in that stops rancher-system-agent from restarting RKE2 when it installs a new machine plan", run: runRestartGuard},
		{name: "rke2-restart", summary: "take the restart guard off and restart rke2-server or rke2-agent, starting the RKE2 that rancher-system-agent installed under the guard", run: runRKE2Restart},
		{name: "rke2-manifest-skip", summary: "place (or with --remove take away) rke2-multus.yaml.skip in RKE2's server manifests, so that RKE2 restarting at a new version does not re-deploy multus", run: runManifestSkip},
		{name: "rke2-settings", summary: "write the release's RKE2 and kubelet settings of one stage of the node's upgrade (--stage pre-drain or post-drain)", run: runRKE2Settings},
		{name: "os-upgrade", summary: "install the release's operating system from the repository and schedule the reboot", run: runOSUpgrade},
		{name: "copy-files", summary: "copy files of this container's image into a directory (the cluster upgrade Job takes Rancher's chart and helm out of an image without a shell with it)", run: runCopyFiles},
		{name: "kubeadm fetch", summary: "put the target kubeadm, kubelet and kubectl where the next kubeadm phases take them (packages, a checksummed URL or a directory) and install kubeadm", run: runKubeadmFetch},
		{name: "kubeadm upgrade", summary: "run `kubeadm upgrade apply` on the first control plane node, `kubeadm upgrade node` on every other node", run: runKubeadmUpgrade},
		{name: "kubeadm kubelet", summary: "install the target kubelet and kubectl, reload systemd and restart the kubelet (after the node is drained)", run: runKubeadmKubelet},
		{name: "cluster-upgrade", summary: "upgrade Rancher, the chart repository and Harvester's charts (run in a Job, not on a node)", run: runClusterUpgrade},
	}
}

// Subcommands are the names of the node program's subcommands, such as "preload" or
// "repository download": what a Plan or a repository pod may run as `node <name>`.
func Subcommands() []string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return names
}

// Main runs `capi-inplace node <args>` and returns the process exit code. terminationLog
// problems are reported on stderr but never change the exit code.
func Main(ctx context.Context, args []string, env *Env) int {
	env.hostRoot, env.terminationLog = "/host", "/dev/termination-log"
	global := flag.NewFlagSet("capi-inplace node", flag.ContinueOnError)
	global.SetOutput(env.Stderr)
	env.bindGlobal(global)
	global.Usage = func() { usage(env.Stderr, global) }
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	rest := global.Args()
	cmd, cmdArgs, ok := lookup(rest)
	if !ok {
		if len(rest) == 0 {
			env.complain("capi-inplace node: name a subcommand\n")
		} else {
			env.complain("capi-inplace node: unknown subcommand %q\n", strings.Join(rest, " "))
		}
		usage(env.Stderr, global)
		writeTermination(env, fmt.Sprintf("capi-inplace node: unknown or missing subcommand in %q; run `capi-inplace node --help` for the list", strings.Join(args, " ")))
		return ExitUsage
	}
	if env.HTTP == nil {
		env.HTTP = &http.Client{}
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Sleep == nil {
		env.Sleep = sleep
	}

	err := cmd.run(ctx, env, cmdArgs)
	code, message := outcome(cmd.name, err)
	if code == ExitUsage && errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	env.complain("%s\n", message)
	writeTermination(env, message)
	return code
}

func lookup(args []string) (command, []string, bool) {
	for _, c := range commands() {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && slicesEqual(args[:len(words)], words) {
			return c, args[len(words):], true
		}
	}
	return command{}, nil, false
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func usage(w io.Writer, global *flag.FlagSet) {
	var b strings.Builder
	b.WriteString("Usage: capi-inplace node <subcommand> [flags]\n\nSubcommands (each has --help):\n")
	cs := commands()
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	for _, c := range cs {
		fmt.Fprintf(&b, "  %-22s %s\n", c.name, c.summary)
	}
	b.WriteString("\nExit codes: 0 done, 1 failed (the message says what to fix), 2 bad usage, 3 not done yet (run again later).\n\nFlags of every subcommand:\n")
	_, _ = io.WriteString(w, b.String())
	global.PrintDefaults()
}

// outcome maps a subcommand's error to its exit code and its termination message.
func outcome(name string, err error) (int, string) {
	prefix := "capi-inplace node " + name
	if err == nil {
		return ExitOK, prefix + ": done"
	}
	var u *usageError
	var r *retryError
	switch {
	case errors.As(err, &u), errors.Is(err, flag.ErrHelp):
		return ExitUsage, fmt.Sprintf("%s: %v", prefix, err)
	case errors.As(err, &r):
		return ExitRetry, fmt.Sprintf("%s: not done yet: %v", prefix, err)
	default:
		return ExitFailed, fmt.Sprintf("%s: failed: %v", prefix, err)
	}
}

func writeTermination(env *Env, message string) {
	path := env.terminationLog
	if path == "" {
		return
	}
	if len(message) > maxTerminationMessage {
		message = message[:maxTerminationMessage-3] + "..."
	}
	if err := os.WriteFile(path, []byte(message), 0o644); err != nil {
		env.complain("capi-inplace node: write termination message to %s: %v\n", path, err)
	}
}

// usageError is a command line that cannot be run: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// retryError is a condition that should pass by itself: exit code 3.
type retryError struct{ err error }

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

func retryf(format string, args ...any) error {
	return &retryError{err: fmt.Errorf(format, args...)}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newFlagSet is a subcommand's flag set: errors are returned, never exit the process.
func newFlagSet(env *Env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("capi-inplace node "+name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	env.bindGlobal(fs)
	return fs
}

// parseFlags parses a subcommand's flags and refuses positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments %q; every input is a flag (see --help)", fs.Args())
	}
	return nil
}

// say writes a progress line to standard output. Lost output must not fail the work.
func (e *Env) say(format string, args ...any) { _, _ = fmt.Fprintf(e.Stdout, format, args...) }

// complain writes to standard error.
func (e *Env) complain(format string, args ...any) { _, _ = fmt.Fprintf(e.Stderr, format, args...) }
