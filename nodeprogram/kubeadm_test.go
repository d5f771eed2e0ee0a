package nodeprogram

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The host commands of each phase, in the order of Kubernetes' kubeadm upgrade
// (kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/): kubeadm
// first, then `kubeadm upgrade apply` or `node`, then (after the manager's drain)
// kubelet and kubectl, daemon-reload and the kubelet's restart.
var (
	aptFetch = []string{
		"apt-mark unhold kubeadm", "apt-get update", "apt-get install -y kubeadm=1.35.2-*", "apt-mark hold kubeadm",
		"/usr/bin/kubeadm version -o short",
	}
	aptKubelet = []string{
		"apt-mark unhold kubelet kubectl", "apt-get update", "apt-get install -y kubelet=1.35.2-* kubectl=1.35.2-*", "apt-mark hold kubelet kubectl",
		"/usr/bin/kubelet --version", "systemctl daemon-reload", "systemctl restart kubelet",
	}
	dnfFetch = []string{
		"dnf makecache", "dnf install -y kubeadm-1.35.2-* --disableexcludes=kubernetes",
		"/usr/bin/kubeadm version -o short",
	}
	dnfKubelet = []string{
		"dnf makecache", "dnf install -y kubelet-1.35.2-* kubectl-1.35.2-* --disableexcludes=kubernetes",
		"/usr/bin/kubelet --version", "systemctl daemon-reload", "systemctl restart kubelet",
	}
	dnf5Fetch = []string{
		"dnf5 makecache", "dnf5 install -y kubeadm-1.35.2-* --setopt=disable_excludes=kubernetes",
		"/usr/bin/kubeadm version -o short",
	}
	dnf5Kubelet = []string{
		"dnf5 makecache", "dnf5 install -y kubelet-1.35.2-* kubectl-1.35.2-* --setopt=disable_excludes=kubernetes",
		"/usr/bin/kubelet --version", "systemctl daemon-reload", "systemctl restart kubelet",
	}
	// url downloads all three binaries in fetch (the host's architecture first); kubelet
	// finds them staged.
	urlFetch      = []string{"uname -m", "/usr/bin/kubeadm version -o short"}
	dirFetch      = []string{"/usr/bin/kubeadm version -o short"}
	stagedKubelet = []string{"/usr/bin/kubelet --version", "systemctl daemon-reload", "systemctl restart kubelet"}

	upgradeApply = []string{"/usr/bin/kubeadm version -o short", "/usr/bin/kubeadm upgrade apply v1.35.2 --yes"}
	upgradeNode  = []string{"/usr/bin/kubeadm version -o short", "/usr/bin/kubeadm upgrade node"}
)

// kubeadmSource is one kind of --source, on a node made for it.
type kubeadmSource struct {
	name    string
	pm      string
	fetch   []string
	kubelet []string
	// flags gives the phases' source flags; fetch and kubelet take the same.
	flags func(t *testing.T) []string
}

func kubeadmSources() []kubeadmSource {
	packages := func(*testing.T) []string { return []string{"--source=packages"} }
	return []kubeadmSource{
		{name: "apt", pm: "apt", fetch: aptFetch, kubelet: aptKubelet, flags: packages},
		{name: "dnf", pm: "dnf", fetch: dnfFetch, kubelet: dnfKubelet, flags: packages},
		{name: "dnf5", pm: "dnf5", fetch: dnf5Fetch, kubelet: dnf5Kubelet, flags: packages},
		{name: "url", fetch: urlFetch, kubelet: stagedKubelet, flags: func(t *testing.T) []string {
			srv := releaseServer(t)
			return append([]string{"--source=url", "--url-template=" + srv.URL + "/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"}, releaseSums(kubeBinaries...)...)
		}},
		{name: "dir", fetch: dirFetch, kubelet: stagedKubelet, flags: func(t *testing.T) []string {
			return []string{"--source=dir", "--dir=" + imageDir(t)}
		}},
	}
}

func TestKubeadmNodeUpgradeRunsTheDocumentedSequence(t *testing.T) {
	roles := []struct {
		name    string
		role    string
		cluster string // the ClusterConfiguration's version when the node starts
		upgrade []string
		reads   int
	}{
		{name: "first control plane node", role: "control-plane", cluster: fromVersion, upgrade: upgradeApply, reads: 1},
		{name: "other control plane node", role: "control-plane", cluster: toVersion, upgrade: upgradeNode, reads: 1},
		// A worker never reads the ClusterConfiguration: here it would say the control
		// plane is not upgraded yet, and the worker still runs `upgrade node`.
		{name: "worker", role: "worker", cluster: fromVersion, upgrade: upgradeNode, reads: 0},
	}
	for _, src := range kubeadmSources() {
		for _, role := range roles {
			t.Run(src.name+"/"+role.name, func(t *testing.T) {
				n := newKubeadmNode(t, src.pm, role.cluster)
				flags := src.flags(t)

				n.run(append([]string{"kubeadm", "fetch", "--version=" + toVersion}, flags...)...).expect(t, ExitOK, "kubeadm fetch: done")
				n.expectBinaries(toVersion, "kubeadm")
				n.expectBinaries(fromVersion, "kubelet", "kubectl")

				n.run("kubeadm", "upgrade", "--version="+toVersion, "--role="+role.role).expect(t, ExitOK, "kubeadm upgrade: done")
				if n.clusterReads != role.reads {
					t.Errorf("the ClusterConfiguration was read %d times, want %d", n.clusterReads, role.reads)
				}
				if n.running != fakeBinary("kubelet", fromVersion) {
					t.Errorf("the kubelet was restarted before the kubelet phase")
				}

				// The manager cordons and drains the node here.
				r := n.run(append([]string{"kubeadm", "kubelet", "--version=" + toVersion}, flags...)...)
				r.expect(t, ExitOK, "kubeadm kubelet: done")
				n.expectBinaries(toVersion, kubeBinaries...)
				if n.running != fakeBinary("kubelet", toVersion) {
					t.Errorf("the kubelet unit runs %q, want the kubelet %s", n.running, toVersion)
				}

				want := slices.Concat(src.fetch, role.upgrade, src.kubelet)
				if got := n.commandLines(); !slices.Equal(got, want) {
					t.Errorf("host commands\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
				if src.pm == "apt" {
					for _, p := range kubeBinaries {
						if !n.held[p] {
							t.Errorf("%s is not held after the upgrade", p)
						}
					}
				}
			})
		}
	}
}

func TestKubeadmFetchSwitchesThePackageRepositoryToTheTargetMinor(t *testing.T) {
	for _, pm := range []string{"apt", "dnf"} {
		t.Run(pm, func(t *testing.T) {
			n := newKubeadmNode(t, pm, fromVersion)
			file := aptRepoFile
			if pm == "dnf" {
				file = rpmRepoFile
			}
			if err := os.Chmod(n.Path(file), 0o600); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(n.Path(file))
			n.run("kubeadm", "fetch", "--version="+toVersion, "--source=packages").expect(t, ExitOK)
			after, err := os.ReadFile(n.Path(file))
			if err != nil {
				t.Fatal(err)
			}
			want := strings.ReplaceAll(string(before), "core:/stable:/v1.34/", "core:/stable:/v1.35/")
			if string(after) != want || strings.Contains(string(after), "v1.34") {
				t.Errorf("%s is\n%s\nwant\n%s", file, after, want)
			}
			if info, _ := os.Stat(n.Path(file)); info.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %v, want its own 0600 kept", file, info.Mode().Perm())
			}
		})
	}
}

func TestKubeadmFetchRefusesANodeWithoutTheCommunityRepositories(t *testing.T) {
	n := newKubeadmNode(t, "apt", fromVersion)
	n.write(t, aptRepoFile, "deb https://apt.kubernetes.io/ kubernetes-xenial main\n")
	n.run("kubeadm", "fetch", "--version="+toVersion, "--source=packages").
		expect(t, ExitFailed, "names no pkgs.k8s.io repository", "use --source url or dir")
	if lines := n.commandLines(); len(lines) != 0 {
		t.Errorf("host commands %q ran", lines)
	}

	none := newKubeadmNode(t, "", fromVersion)
	none.run("kubeadm", "fetch", "--version="+toVersion, "--source=packages").
		expect(t, ExitFailed, "none of apt-get, dnf5, dnf or yum", "use --source url or dir")
}

func TestKubeadmUpgradeRunAgainAfterApplyRunsUpgradeNode(t *testing.T) {
	n := newKubeadmNode(t, "apt", fromVersion)
	n.run("kubeadm", "fetch", "--version="+toVersion, "--source=packages").expect(t, ExitOK)
	mark := len(n.commandLines())
	n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=control-plane").expect(t, ExitOK)
	// The Job ran again (its pod was lost after kubeadm succeeded): apply is done, the
	// cluster's ClusterConfiguration says so, and the node runs `upgrade node`.
	r := n.run("kubeadm", "upgrade", "--version="+toVersion, "--role=control-plane")
	r.expect(t, ExitOK)
	if want := slices.Concat(upgradeApply, upgradeNode); !slices.Equal(n.newCommands(mark), want) {
		t.Errorf("host commands %q, want %q", n.newCommands(mark), want)
	}
	if !strings.Contains(r.stdout, "already at v1.35.2") {
		t.Errorf("stdout %q does not say why apply is not run", r.stdout)
	}
}

func TestKubeadmRunAgainDownloadsNothingAndRestartsNothing(t *testing.T) {
	n := newKubeadmNode(t, "", toVersion)
	srv := releaseServer(t)
	flags := append([]string{"--source=url", "--url-template=" + srv.URL + "/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"}, releaseSums(kubeBinaries...)...)
	fetch := append([]string{"kubeadm", "fetch", "--version=" + toVersion}, flags...)
	kubelet := append([]string{"kubeadm", "kubelet", "--version=" + toVersion}, flags...)

	n.run(fetch...).expect(t, ExitOK)
	n.run(kubelet...).expect(t, ExitOK)
	mark := len(n.commandLines())
	n.running = "" // anything the second run starts shows here

	r := n.run(fetch...)
	r.expect(t, ExitOK)
	r = n.run(kubelet...)
	r.expect(t, ExitOK)
	for _, name := range kubeBinaries {
		if c := srv.count("/release/" + toVersion + "/bin/linux/amd64/" + name); c != 1 {
			t.Errorf("%s was downloaded %d times, want once", name, c)
		}
	}
	want := []string{"/usr/bin/kubeadm version -o short", "/usr/bin/kubelet --version", "systemctl is-active --quiet kubelet"}
	if got := n.newCommands(mark); !slices.Equal(got, want) {
		t.Errorf("the second runs ran %q, want %q", got, want)
	}
	if n.running != "" {
		t.Errorf("the kubelet was restarted again")
	}
	if !strings.Contains(r.stdout, "not restarting it again") {
		t.Errorf("stdout %q", r.stdout)
	}

	// A kubelet that stopped since is started again.
	n.active = false
	n.run(kubelet...).expect(t, ExitOK)
	if n.running != fakeBinary("kubelet", toVersion) || !n.active {
		t.Errorf("an inactive kubelet unit was not restarted")
	}
}

func TestKubeadmKubeletRestartsAgainWhenTheBinaryChanged(t *testing.T) {
	n := newKubeadmNode(t, "apt", toVersion)
	n.run("kubeadm", "kubelet", "--version="+toVersion, "--source=packages").expect(t, ExitOK)
	// Another build of the same version was installed since (a package rebuild).
	n.write(t, "/usr/bin/kubelet", "fake kubelet rebuilt "+toVersion+"\n")
	n.failures["apt-get install -y kubelet=1.35.2-* kubectl=1.35.2-*"] = nil // apt keeps it: already the newest
	mark := len(n.commandLines())
	n.run("kubeadm", "kubelet", "--version="+toVersion, "--source=packages").expect(t, ExitOK)
	if got := n.newCommands(mark); !slices.Contains(got, "systemctl restart kubelet") {
		t.Errorf("host commands %q: a changed kubelet binary was not restarted", got)
	}
}
