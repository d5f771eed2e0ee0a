package nodeprogram

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// kubeadmNode is a fake node of a kubeadm cluster: kubeadm, kubelet and kubectl in
// /usr/bin, each a file whose content names its version (fakeBinary), which the
// stand-ins of kubeadm and kubelet report; the node's package manager (apt or dnf) with
// the pkgs.k8s.io repository of the installed minor; systemctl, uname; and the cluster's
// ClusterConfiguration, which `kubeadm upgrade apply` moves to its version as the real
// one does once the control plane runs it (kubeadm's upload-config phase).
//
// The stand-ins follow the documented behaviour of the real tools: apt-get refuses to
// change a held package with -y (apt's "Held packages were changed and -y was used
// without --allow-change-held-packages"); a pkgs.k8s.io repository serves only its own
// minor release (kubernetes.io "Changing the Kubernetes package repository"), so an
// install of another minor is "not found" until the repository is switched and the
// index refreshed; dnf does not see packages of the repository's exclude= line without
// --disableexcludes=kubernetes; `kubeadm upgrade apply` without --yes asks and gets no
// answer; systemctl in a chroot ignores requests without SYSTEMD_OFFLINE=0.
type kubeadmNode struct {
	*fakeHost
	t *testing.T

	// cluster is the ClusterConfiguration's kubernetesVersion; clusterReads counts the
	// reads of it.
	cluster      string
	clusterReads int
	// held are the packages apt-mark holds; indexed is the minor of the repository the
	// package index was last refreshed from.
	held    map[string]bool
	indexed string
	// running is the content of the kubelet binary the kubelet unit was last started
	// with; active whether the unit runs.
	running string
	active  bool
	// failures answers a command line with an error instead of its stand-in (a nil
	// error: success, without the stand-in doing anything).
	failures map[string]error
	// kubeadmStdout is what `kubeadm upgrade` prints.
	kubeadmStdout string
}

// fakeBinary is the content of a fake Kubernetes binary of a version.
func fakeBinary(name, version string) string { return "fake " + name + " " + version + "\n" }

const (
	fromVersion = "v1.34.3"
	toVersion   = "v1.35.2"
)

// newKubeadmNode is a node at fromVersion using the package manager pm ("apt", "dnf",
// "dnf5" or "" for none), in a cluster whose ClusterConfiguration is at cluster.
func newKubeadmNode(t *testing.T, pm, cluster string) *kubeadmNode {
	t.Helper()
	n := &kubeadmNode{fakeHost: newFakeHost(t), t: t, cluster: cluster, held: map[string]bool{}, failures: map[string]error{}, active: true}
	for _, name := range kubeBinaries {
		n.write(t, "/usr/bin/"+name, fakeBinary(name, fromVersion))
	}
	n.running = fakeBinary("kubelet", fromVersion)
	n.write(t, defaultAdminKubeconfig, "apiVersion: v1\nkind: Config\n")
	switch pm {
	case "apt":
		n.write(t, "/usr/bin/apt-get", "")
		n.write(t, "/usr/bin/apt-mark", "")
		n.write(t, aptRepoFile, "deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.gpg] https://pkgs.k8s.io/core:/stable:/v1.34/deb/ /\n")
		n.held = map[string]bool{"kubeadm": true, "kubelet": true, "kubectl": true}
		n.tool("apt-mark", n.aptMark)
		n.tool("apt-get", n.aptGet)
	case "dnf", "dnf5":
		n.write(t, "/usr/bin/"+pm, "")
		n.write(t, rpmRepoFile, "[kubernetes]\nname=Kubernetes\nbaseurl=https://pkgs.k8s.io/core:/stable:/v1.34/rpm/\nenabled=1\ngpgcheck=1\ngpgkey=https://pkgs.k8s.io/core:/stable:/v1.34/rpm/repodata/repomd.xml.key\nexclude=kubelet kubeadm kubectl cri-tools kubernetes-cni\n")
		n.tool(pm, n.dnf(pm))
	}
	n.tool("/usr/bin/kubeadm", n.kubeadm)
	n.tool("/usr/bin/kubelet", n.kubelet)
	n.tool("systemctl", n.systemctl)
	n.tool("uname", func(c Command) (string, error) {
		if !slices.Equal(c.Args, []string{"-m"}) {
			return "", errors.New("uname: unexpected arguments")
		}
		return "x86_64\n", nil
	})
	return n
}

// tool registers a stand-in; a failure set for the command line answers instead.
func (n *kubeadmNode) tool(name string, run func(c Command) (string, error)) {
	n.tools[name] = func(c Command, _ []byte) ([]byte, error) {
		if err, ok := n.failures[c.String()]; ok {
			return nil, err
		}
		out, err := run(c)
		return []byte(out), err
	}
}

// exitError is a host command's non-zero exit, as ChrootHost reports it (an
// *exec.ExitError wrapped with the command and its standard error).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }
func (e exitError) ExitCode() int { return e.code }

func hostFailure(c Command, code int, stderr string) error {
	return fmt.Errorf("host command `%s`: %w: %s", c, exitError{code: code}, stderr)
}

// binaryVersion is the version the fake binary at the host path p holds.
func (n *kubeadmNode) binaryVersion(p string) string {
	data, err := os.ReadFile(n.Path(p))
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(data))
	return fields[len(fields)-1]
}

func (n *kubeadmNode) kubeadm(c Command) (string, error) {
	version := n.binaryVersion("/usr/bin/kubeadm")
	switch {
	case slices.Equal(c.Args, []string{"version", "-o", "short"}):
		return version + "\n", nil
	case len(c.Args) >= 3 && c.Args[0] == "upgrade" && c.Args[1] == "apply":
		if !slices.Contains(c.Args, "--yes") {
			return "", hostFailure(c, 1, "won't proceed; the user didn't answer (Y|n) in order to continue")
		}
		if c.Args[2] != version {
			return "", hostFailure(c, 1, fmt.Sprintf("[upgrade/version] FATAL: the version argument is invalid due to these errors: Specified version to upgrade to %q is higher than the kubeadm version %q", c.Args[2], version))
		}
		n.cluster = version
		return n.kubeadmStdout + "[upgrade/successful] SUCCESS! Your cluster was upgraded to \"" + version + "\". Enjoy!\n", nil
	case len(c.Args) >= 2 && c.Args[0] == "upgrade" && c.Args[1] == "node":
		return n.kubeadmStdout + "[upgrade] The configuration for this node was successfully upgraded!\n", nil
	}
	return "", hostFailure(c, 1, "unknown command")
}

func (n *kubeadmNode) kubelet(c Command) (string, error) {
	if !slices.Equal(c.Args, []string{"--version"}) {
		return "", hostFailure(c, 1, "unexpected arguments")
	}
	return "Kubernetes " + n.binaryVersion("/usr/bin/kubelet") + "\n", nil
}

func (n *kubeadmNode) systemctl(c Command) (string, error) {
	if !slices.Contains(c.Env, "SYSTEMD_OFFLINE=0") {
		return "", hostFailure(c, 0, "Running in chroot, ignoring request.")
	}
	switch {
	case slices.Equal(c.Args, []string{"daemon-reload"}):
		return "", nil
	case slices.Equal(c.Args, []string{"restart", "kubelet"}):
		data, err := os.ReadFile(n.Path("/usr/bin/kubelet"))
		if err != nil {
			return "", err
		}
		n.running, n.active = string(data), true
		return "", nil
	case slices.Equal(c.Args, []string{"is-active", "--quiet", "kubelet"}):
		if !n.active {
			return "", hostFailure(c, 3, "")
		}
		return "", nil
	}
	return "", hostFailure(c, 1, "Unknown command verb "+c.Args[0])
}

func (n *kubeadmNode) aptMark(c Command) (string, error) {
	if len(c.Args) < 2 || (c.Args[0] != "hold" && c.Args[0] != "unhold") {
		return "", hostFailure(c, 100, "E: Invalid operation")
	}
	for _, p := range c.Args[1:] {
		n.held[p] = c.Args[0] == "hold"
	}
	return "", nil
}

var repoMinor = regexp.MustCompile(`core:/stable:/(v[0-9]+\.[0-9]+)/`)

// refreshIndex reads the repository's minor from its file, as apt-get update and
// dnf makecache read the repository the file names.
func (n *kubeadmNode) refreshIndex(file string) {
	data, _ := os.ReadFile(n.Path(file))
	m := repoMinor.FindSubmatch(data)
	n.indexed = ""
	if m != nil {
		n.indexed = string(m[1])
	}
}

// installPackage writes the package's binary if the refreshed repository serves its
// version.
func (n *kubeadmNode) installPackage(c Command, name, version string) error {
	minor := "v" + version[:strings.LastIndex(version, ".")]
	if minor != n.indexed {
		return hostFailure(c, 100, fmt.Sprintf("E: Version '%s-*' for '%s' was not found", version, name))
	}
	return os.WriteFile(n.Path("/usr/bin/"+name), []byte(fakeBinary(name, "v"+version)), 0o755)
}

func (n *kubeadmNode) aptGet(c Command) (string, error) {
	switch {
	case slices.Equal(c.Args, []string{"update"}):
		n.refreshIndex(aptRepoFile)
		return "", nil
	case len(c.Args) > 2 && c.Args[0] == "install" && c.Args[1] == "-y":
		for _, spec := range c.Args[2:] {
			name, version, ok := strings.Cut(strings.TrimSuffix(spec, "-*"), "=")
			if !ok {
				return "", hostFailure(c, 100, "E: Unable to locate package "+spec)
			}
			if n.held[name] {
				return "", hostFailure(c, 100, "E: Held packages were changed and -y was used without --allow-change-held-packages.")
			}
			if err := n.installPackage(c, name, version); err != nil {
				return "", err
			}
		}
		return "", nil
	}
	return "", hostFailure(c, 100, "E: Invalid operation "+c.Args[0])
}

func (n *kubeadmNode) dnf(tool string) func(Command) (string, error) {
	excludes := "--disableexcludes=kubernetes"
	if tool == "dnf5" {
		excludes = "--setopt=disable_excludes=kubernetes"
	}
	return func(c Command) (string, error) {
		switch {
		case slices.Equal(c.Args, []string{"makecache"}):
			n.refreshIndex(rpmRepoFile)
			return "", nil
		case len(c.Args) > 2 && c.Args[0] == "install" && c.Args[1] == "-y":
			specs := c.Args[2:]
			if specs[len(specs)-1] != excludes {
				return "", hostFailure(c, 1, "Error: Unable to find a match: "+strings.Join(specs, " ")+" (excluded by the repository's exclude=)")
			}
			for _, spec := range specs[:len(specs)-1] {
				spec = strings.TrimSuffix(spec, "-*")
				i := strings.LastIndex(spec, "-")
				if err := n.installPackage(c, spec[:i], spec[i+1:]); err != nil {
					return "", err
				}
			}
			return "", nil
		}
		return "", hostFailure(c, 1, "No such command: "+c.Args[0])
	}
}

// readCluster is the node's Env.KubeadmClusterConfiguration: the kubeadm-config
// ConfigMap's ClusterConfiguration, read with the host's admin.conf.
func (n *kubeadmNode) readCluster(_ context.Context, kubeconfig string) (string, error) {
	n.clusterReads++
	if _, err := os.Stat(kubeconfig); err != nil {
		return "", err
	}
	return "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: " + n.cluster + "\n", nil
}

// run runs `capi-inplace node <args>` on the node, as runNode does, with the node's
// cluster.
func (n *kubeadmNode) run(args ...string) result {
	n.t.Helper()
	termination := filepath.Join(n.t.TempDir(), "termination-log")
	var stdout, stderr bytes.Buffer
	env := &Env{
		Host: n, Stdout: &stdout, Stderr: &stderr, Identity: "pod-" + n.t.Name(),
		Now:                         func() time.Time { return time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC) },
		Sleep:                       func(context.Context, time.Duration) error { return nil },
		KubeadmClusterConfiguration: n.readCluster,
	}
	code := Main(context.Background(), append([]string{"--termination-log=" + termination}, args...), env)
	data, err := os.ReadFile(termination)
	if err != nil && !os.IsNotExist(err) {
		n.t.Fatal(err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String(), termination: string(data)}
}

// newCommands are the command lines run since the count mark.
func (n *kubeadmNode) newCommands(mark int) []string { return n.commandLines()[mark:] }

// expectBinaries fails unless each named binary in /usr/bin is at version.
func (n *kubeadmNode) expectBinaries(version string, names ...string) {
	n.t.Helper()
	for _, name := range names {
		if got := n.binaryVersion("/usr/bin/" + name); got != version {
			n.t.Errorf("/usr/bin/%s is %s, want %s", name, got, version)
		}
	}
}

func sha256Of(data string) string {
	sum := sha256.Sum256([]byte(data))
	return hex.EncodeToString(sum[:])
}

// releaseServer serves the fake binaries of toVersion for amd64 in dl.k8s.io's layout.
func releaseServer(t *testing.T) *fileServer {
	t.Helper()
	files := map[string][]byte{}
	for _, name := range kubeBinaries {
		files["/release/"+toVersion+"/bin/linux/amd64/"+name] = []byte(fakeBinary(name, toVersion))
	}
	return newFileServer(t, files)
}

// releaseSums are the --sha256 flags of the fake binaries of toVersion.
func releaseSums(names ...string) []string {
	var flags []string
	for _, name := range names {
		flags = append(flags, "--sha256="+name+"="+sha256Of(fakeBinary(name, toVersion)))
	}
	return flags
}

// imageDir is a directory of this container into which an init container copied the
// binaries of toVersion.
func imageDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range kubeBinaries {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(fakeBinary(name, toVersion)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
