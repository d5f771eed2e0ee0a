package nodeprogram

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestKubeadmFetchChecksumMismatchNamesTheBinaryAndInstallsNothing(t *testing.T) {
	n := newKubeadmNode(t, "", fromVersion)
	srv := releaseServer(t)
	srv.files["/release/"+toVersion+"/bin/linux/amd64/kubelet"] = []byte("a kubelet of another build\n")
	// Credentials in the URL's userinfo and query never reach a message.
	tmpl := strings.Replace(srv.URL, "http://", "http://builder:s3cret@", 1) + "/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}?token=t0ken"
	args := append([]string{"kubeadm", "fetch", "--version=" + toVersion, "--source=url", "--url-template=" + tmpl}, releaseSums(kubeBinaries...)...)
	r := n.run(args...)
	r.expect(t, ExitFailed,
		"kubelet downloaded from "+srv.URL+"/release/v1.35.2/bin/linux/amd64/kubelet ",
		"SHA-256 "+sha256Of("a kubelet of another build\n"),
		"not the expected "+sha256Of(fakeBinary("kubelet", toVersion)),
		"nothing was installed")
	for _, secret := range []string{"s3cret", "t0ken", "builder"} {
		if strings.Contains(r.termination+r.stdout+r.stderr, secret) {
			t.Errorf("the output shows %q of the URL:\n%s\n%s", secret, r.termination, r.stdout)
		}
	}
	if got := n.commandLines(); !slices.Equal(got, []string{"uname -m"}) {
		t.Errorf("host commands %q after the mismatch, want only uname -m before it", got)
	}
	n.expectBinaries(fromVersion, kubeBinaries...)
	if _, err := os.Stat(n.Path(stagedPath(kubeVersion{1, 35, 2}, "kubelet"))); !os.IsNotExist(err) {
		t.Errorf("the mismatching kubelet is staged: %v", err)
	}
	if _, err := os.Stat(n.Path(stagedPath(kubeVersion{1, 35, 2}, "kubelet") + partialSuffix)); !os.IsNotExist(err) {
		t.Errorf("the partial download was left: %v", err)
	}
}

func TestKubeadmFetchDirChecksumMismatch(t *testing.T) {
	n := newKubeadmNode(t, "", fromVersion)
	dir := imageDir(t)
	wrong := strings.Repeat("ab", 32)
	n.run("kubeadm", "fetch", "--version="+toVersion, "--source=dir", "--dir="+dir, "--sha256=kubeadm="+wrong).
		expect(t, ExitFailed, "kubeadm in "+dir+" has SHA-256 "+sha256Of(fakeBinary("kubeadm", toVersion)), "not the expected "+wrong)
	n.expectBinaries(fromVersion, "kubeadm")
	if got := n.commandLines(); len(got) != 0 {
		t.Errorf("host commands %q", got)
	}
}

func TestKubeadmFetchDownloadFailures(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		code   int
		want   string
	}{
		{name: "not found is permanent", status: 404, code: ExitFailed, want: "404 Not Found: check --url-template, --version and --arch"},
		{name: "a failing server is retried", status: 503, code: ExitRetry, want: "not done yet: download kubeadm from"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newKubeadmNode(t, "", fromVersion)
			srv := releaseServer(t)
			srv.statuses["/release/"+toVersion+"/bin/linux/amd64/kubeadm"] = tt.status
			args := append([]string{"kubeadm", "fetch", "--version=" + toVersion, "--source=url", "--url-template=" + srv.URL + "/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"}, releaseSums(kubeBinaries...)...)
			n.run(args...).expect(t, tt.code, tt.want)
			n.expectBinaries(fromVersion, "kubeadm")
		})
	}
	n := newKubeadmNode(t, "", fromVersion)
	srv := releaseServer(t)
	srv.Close()
	args := append([]string{"kubeadm", "fetch", "--version=" + toVersion, "--source=url", "--arch=arm64", "--url-template=" + srv.URL + "/{{.Arch}}/{{.Binary}}"}, releaseSums(kubeBinaries...)...)
	n.run(args...).expect(t, ExitRetry, "download kubeadm from "+srv.URL+"/arm64/kubeadm")
	if got := n.commandLines(); len(got) != 0 {
		t.Errorf("host commands %q: --arch given, uname must not run", got)
	}
}

func TestKubeadmFetchPackageInstallRefused(t *testing.T) {
	n := newKubeadmNode(t, "apt", fromVersion)
	install := "apt-get install -y kubeadm=1.35.2-*"
	n.failures[install] = hostFailure(Command{Name: "apt-get", Args: []string{"install", "-y", "kubeadm=1.35.2-*"}}, 100,
		"E: Version '1.35.2-*' for 'kubeadm' was not found")
	r := n.run("kubeadm", "fetch", "--version="+toVersion, "--source=packages")
	r.expect(t, ExitFailed, "E: Version '1.35.2-*' for 'kubeadm' was not found")
	// Nothing runs after the refusal but the hold apt-mark unhold took away.
	want := []string{"apt-mark unhold kubeadm", "apt-get update", install, "apt-mark hold kubeadm"}
	if got := n.commandLines(); !slices.Equal(got, want) {
		t.Errorf("host commands %q, want %q", got, want)
	}
	if !n.held["kubeadm"] {
		t.Error("kubeadm is left unheld")
	}
	n.expectBinaries(fromVersion, "kubeadm")

	// The kubelet phase likewise: refused, the kubelet is neither checked nor restarted.
	n = newKubeadmNode(t, "dnf", fromVersion)
	n.failures["dnf install -y kubelet-1.35.2-* kubectl-1.35.2-* --disableexcludes=kubernetes"] = hostFailure(Command{Name: "dnf"}, 1,
		"Error: GPG check FAILED")
	n.run("kubeadm", "kubelet", "--version="+toVersion, "--source=packages").expect(t, ExitFailed, "Error: GPG check FAILED")
	if got := n.commandLines(); slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, "systemctl") }) {
		t.Errorf("host commands %q: systemctl ran after the refused install", got)
	}
	if n.running != fakeBinary("kubelet", fromVersion) {
		t.Error("the kubelet was restarted")
	}
}

func TestKubeadmUpgradeApplyFailureCarriesKubeadmsWordsAndExitCode(t *testing.T) {
	n := newKubeadmNode(t, "apt", fromVersion)
	n.run("kubeadm", "fetch", "--version="+toVersion, "--source=packages").expect(t, ExitOK)
	apply := Command{Name: "/usr/bin/kubeadm", Args: []string{"upgrade", "apply", toVersion, "--yes"}}
	n.failures[apply.String()] = hostFailure(apply, 3,
		"[ERROR CoreDNSUnsupportedPlugins]: start version '1.11.3' not supported\nerror execution phase preflight: [preflight] Some fatal errors occurred")
	mark := len(n.commandLines())
	r := n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=control-plane")
	r.expect(t, ExitFailed, "failed with exit code 3", "[ERROR CoreDNSUnsupportedPlugins]: start version '1.11.3' not supported", "the kubelet was not touched")
	if got := n.newCommands(mark); !slices.Equal(got, upgradeApply) {
		t.Errorf("host commands %q, want %q", got, upgradeApply)
	}
	if n.cluster != fromVersion {
		t.Fatalf("the failed apply moved the cluster to %s", n.cluster)
	}
	// Run again once the cause is fixed: the cluster is still below the target, so this
	// is still the first control plane node and apply runs again (never `upgrade node`,
	// which would leave the control plane at the old version).
	delete(n.failures, apply.String())
	mark = len(n.commandLines())
	n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=control-plane").expect(t, ExitOK)
	if got := n.newCommands(mark); !slices.Equal(got, upgradeApply) {
		t.Errorf("host commands %q, want %q", got, upgradeApply)
	}
}

func TestKubeadmUpgradeFailureMessageStaysWithinTheTerminationMessage(t *testing.T) {
	n := newKubeadmNode(t, "", toVersion)
	n.write(t, "/usr/bin/kubeadm", fakeBinary("kubeadm", toVersion))
	node := Command{Name: "/usr/bin/kubeadm", Args: []string{"upgrade", "node"}}
	long := strings.Repeat("[upgrade/staticpods] waiting for the kubelet to restart the component\n", 200)
	n.tools[node.Name] = func(c Command, _ []byte) ([]byte, error) {
		if c.String() != node.String() {
			out, err := n.kubeadm(c)
			return []byte(out), err
		}
		return []byte(long + "[upgrade] last line of stdout"), hostFailure(c, 1, long+"timed out waiting for the condition")
	}
	r := n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=worker")
	r.expect(t, ExitFailed, "failed with exit code 1", "timed out waiting for the condition", "[upgrade] last line of stdout", "run `node kubeadm upgrade` again")
	if len(r.termination) >= maxTerminationMessage {
		t.Errorf("termination message of %d bytes was cut at Kubernetes' limit", len(r.termination))
	}
}

func TestKubeadmKubeletRestartFailure(t *testing.T) {
	n := newKubeadmNode(t, "apt", toVersion)
	restart := Command{Name: "systemctl", Args: []string{"restart", "kubelet"}}
	n.failures[restart.String()] = hostFailure(restart, 1,
		"Job for kubelet.service failed because the control process exited with error code.\nSee \"systemctl status kubelet.service\" and \"journalctl -xeu kubelet.service\" for details.")
	n.run("kubeadm", "kubelet", "--version="+toVersion, "--source=packages").
		expect(t, ExitFailed, "Job for kubelet.service failed because the control process exited with error code.", "journalctl -xeu kubelet")
	if got := n.commandLines(); !slices.Equal(got, aptKubelet) || got[len(got)-1] != restart.String() {
		t.Errorf("host commands %q, want %q ending with the failed restart", got, aptKubelet)
	}
	if _, err := os.Stat(n.Path(kubeletRestartedMarker(kubeVersion{1, 35, 2}))); !os.IsNotExist(err) {
		t.Fatalf("a failed restart was recorded as done: %v", err)
	}
	// Run again once fixed: the restart is done, since none was recorded.
	delete(n.failures, restart.String())
	n.run("kubeadm", "kubelet", "--version="+toVersion, "--source=packages").expect(t, ExitOK)
	if n.running != fakeBinary("kubelet", toVersion) {
		t.Error("the kubelet was not restarted on the run after the failed restart")
	}
}

func TestKubeadmKubeletOfAnotherVersionIsNotRestarted(t *testing.T) {
	n := newKubeadmNode(t, "", toVersion)
	// The directory holds kubelet v1.35.1, and no --sha256 pins it.
	dir := imageDir(t)
	if err := os.WriteFile(dir+"/kubelet", []byte(fakeBinary("kubelet", "v1.35.1")), 0o755); err != nil {
		t.Fatal(err)
	}
	n.run("kubeadm", "kubelet", "--version="+toVersion, "--source=dir", "--dir="+dir).
		expect(t, ExitFailed, `reports version "v1.35.1", not v1.35.2`, "the kubelet was not restarted")
	if got := n.commandLines(); !slices.Equal(got, []string{"/usr/bin/kubelet --version"}) {
		t.Errorf("host commands %q", got)
	}
}

func TestKubeadmUpgradeRefusesWhatKubeadmRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		cluster string
		want    []string
	}{
		{name: "two minors up", cluster: "v1.33.5", want: []string{"the cluster runs v1.33.5", "upgrade to a v1.34.x first", "kubeadm v1.35.2 would refuse with: this version of kubeadm only supports deploying clusters with the control plane version >= 1.34.0. Current version: v1.33.5"}},
		{name: "a minor down", cluster: "v1.36.0", want: []string{"the cluster runs v1.36.0", "does not downgrade", "at least v1.36.0"}},
		{name: "a patch down", cluster: "v1.35.3", want: []string{"does not downgrade"}},
		{name: "another major", cluster: "v2.35.2", want: []string{"within one major version"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newKubeadmNode(t, "apt", tt.cluster)
			n.write(t, "/usr/bin/kubeadm", fakeBinary("kubeadm", toVersion))
			n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=control-plane").expect(t, ExitFailed, tt.want...)
			if got := n.commandLines(); len(got) != 0 {
				t.Errorf("host commands %q ran before the refusal", got)
			}
		})
	}
}

func TestKubeadmUpgradeNeedsTheFetchedKubeadm(t *testing.T) {
	n := newKubeadmNode(t, "apt", fromVersion)
	n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=worker").
		expect(t, ExitFailed, `/usr/bin/kubeadm reports version "v1.34.3", not v1.35.2`, "run `capi-inplace node kubeadm fetch --version v1.35.2` on this node first")
	if got := n.commandLines(); !slices.Equal(got, []string{"/usr/bin/kubeadm version -o short"}) {
		t.Errorf("host commands %q", got)
	}
}

func TestKubeadmBadInput(t *testing.T) {
	sums := releaseSums(kubeBinaries...)
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "fetch without version", args: []string{"kubeadm", "fetch", "--source=packages"}, code: ExitUsage, want: "--version is required: the target Kubernetes version, such as v1.35.2"},
		{name: "upgrade without version", args: []string{"kubeadm", "upgrade", "--role=worker"}, code: ExitUsage, want: "--version is required"},
		{name: "kubelet without version", args: []string{"kubeadm", "kubelet", "--source=packages"}, code: ExitUsage, want: "--version is required"},
		{name: "version without v", args: []string{"kubeadm", "fetch", "--version=1.35.2", "--source=packages"}, code: ExitUsage, want: `--version "1.35.2" is not a released Kubernetes version: want vMAJOR.MINOR.PATCH`},
		{name: "minor only", args: []string{"kubeadm", "upgrade", "--version=v1.35", "--role=worker"}, code: ExitUsage, want: "want vMAJOR.MINOR.PATCH"},
		{name: "pre-release", args: []string{"kubeadm", "kubelet", "--version=v1.36.0-rc.1", "--source=packages"}, code: ExitUsage, want: "not a released Kubernetes version"},
		{name: "no source", args: []string{"kubeadm", "fetch", "--version=v1.35.2"}, code: ExitUsage, want: "--source is required: packages, url or dir"},
		{name: "unknown source", args: []string{"kubeadm", "fetch", "--version=v1.35.2", "--source=image"}, code: ExitUsage, want: `--source "image" is not one of packages, url, dir`},
		{name: "no role", args: []string{"kubeadm", "upgrade", "--version=v1.35.2"}, code: ExitUsage, want: `--role "": want control-plane or worker`},
		{name: "url without any sha256", args: []string{"kubeadm", "fetch", "--version=v1.35.2", "--source=url"}, code: ExitUsage, want: "--source url needs the SHA-256 of kubeadm, kubelet, kubectl: add --sha256 kubeadm=<64 hex digits>"},
		{name: "url without kubectl's sha256", args: append([]string{"kubeadm", "fetch", "--version=v1.35.2", "--source=url"}, sums[:2]...), code: ExitUsage, want: "needs the SHA-256 of kubectl"},
		{name: "kubelet phase needs kubelet's sha256", args: append([]string{"kubeadm", "kubelet", "--version=v1.35.2", "--source=url"}, sums[0], sums[2]), code: ExitUsage, want: "needs the SHA-256 of kubelet: add --sha256 kubelet="},
		{name: "short sha256", args: []string{"kubeadm", "fetch", "--version=v1.35.2", "--source=url", "--sha256=kubeadm=abc"}, code: ExitUsage, want: "the SHA-256 of kubeadm must be 64 hex digits"},
		{name: "sha256 of another binary", args: []string{"kubeadm", "fetch", "--version=v1.35.2", "--source=url", "--sha256=kube-proxy=" + strings.Repeat("a", 64)}, code: ExitUsage, want: "BINARY one of kubeadm, kubelet, kubectl"},
		{name: "bad template", args: append([]string{"kubeadm", "fetch", "--version=v1.35.2", "--source=url", "--url-template=https://x/{{.Os}}"}, sums...), code: ExitUsage, want: "the fields are {{.Version}}, {{.Arch}} and {{.Binary}}"},
		{name: "template not http", args: append([]string{"kubeadm", "fetch", "--version=v1.35.2", "--source=url", "--url-template=ftp://x/{{.Binary}}"}, sums...), code: ExitUsage, want: "must give an http:// or https:// URL"},
		{name: "dir without --dir", args: []string{"kubeadm", "fetch", "--version=v1.35.2", "--source=dir"}, code: ExitUsage, want: "--source dir needs --dir"},
		{name: "packages with sha256", args: append([]string{"kubeadm", "fetch", "--version=v1.35.2", "--source=packages"}, sums[0]), code: ExitUsage, want: "--source packages takes no --sha256"},
		{name: "relative bin-dir", args: []string{"kubeadm", "upgrade", "--version=v1.35.2", "--role=worker", "--bin-dir=usr/bin"}, code: ExitUsage, want: "must be an absolute path on the host"},
		{name: "bad unit", args: []string{"kubeadm", "kubelet", "--version=v1.35.2", "--source=packages", "--unit=a b"}, code: ExitUsage, want: "is not a systemd unit name"},
		{name: "positional version", args: []string{"kubeadm", "upgrade", "v1.35.2"}, code: ExitUsage, want: "every input is a flag"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newKubeadmNode(t, "apt", fromVersion)
			n.run(tt.args...).expect(t, tt.code, tt.want)
			if got := n.commandLines(); len(got) != 0 {
				t.Errorf("host commands %q ran on bad input", got)
			}
			if n.clusterReads != 0 {
				t.Error("the cluster was read on bad input")
			}
		})
	}
}

func TestKubeadmURLSourceMapsTheHostArchitecture(t *testing.T) {
	n := newKubeadmNode(t, "", fromVersion)
	n.tool("uname", func(Command) (string, error) { return "aarch64\n", nil })
	files := map[string][]byte{}
	for _, name := range kubeBinaries {
		files["/v1.35.2/arm64/"+name] = []byte(fakeBinary(name, toVersion))
	}
	srv := newFileServer(t, files)
	args := append([]string{"kubeadm", "fetch", "--version=" + toVersion, "--source=url", "--url-template=" + srv.URL + "/{{.Version}}/{{.Arch}}/{{.Binary}}"}, releaseSums(kubeBinaries...)...)
	n.run(args...).expect(t, ExitOK)
	n.expectBinaries(toVersion, "kubeadm")

	n = newKubeadmNode(t, "", fromVersion)
	n.tool("uname", func(Command) (string, error) { return "s390x\n", nil })
	n.run(args...).expect(t, ExitFailed, `the host's architecture "s390x"`, "pass --arch")
}
