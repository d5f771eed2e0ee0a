package nodeprogram

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// packageManager is the node's package manager, found by the tools the host has: apt
// (Debian, Ubuntu) or dnf5, dnf or yum (Fedora, RHEL, CentOS), as the Kubernetes
// documentation's tabs for the community repositories pkgs.k8s.io have them.
type packageManager struct {
	// tool is apt-get, dnf5, dnf or yum.
	tool string
	// repoFile is the host file that defines the Kubernetes repository.
	repoFile string
}

func (p packageManager) apt() bool { return p.tool == "apt-get" }

// The repository files of the Kubernetes documentation ("Changing the Kubernetes package
// repository").
const (
	aptRepoFile = "/etc/apt/sources.list.d/kubernetes.list"
	rpmRepoFile = "/etc/yum.repos.d/kubernetes.repo"
)

// detectPackageManager looks for apt-get, dnf5, dnf and yum, in that order, in the
// host's PATH. dnf5 comes before dnf: where dnf is DNF5 (Fedora 41 and later) dnf5 is
// there too, and DNF5 takes --setopt=disable_excludes= instead of --disableexcludes=.
func detectPackageManager(env *Env, repoFile string) (packageManager, error) {
	for _, tool := range []string{"apt-get", "dnf5", "dnf", "yum"} {
		if !hostHasTool(env.host(), tool) {
			continue
		}
		p := packageManager{tool: tool, repoFile: repoFile}
		if p.repoFile == "" {
			p.repoFile = rpmRepoFile
			if p.apt() {
				p.repoFile = aptRepoFile
			}
		}
		return p, nil
	}
	return packageManager{}, fmt.Errorf("the host has none of apt-get, dnf5, dnf or yum in %s: --source packages needs the node's package manager; use --source url or dir", hostPATH)
}

// hostHasTool tells whether the host's PATH holds an entry named name. A symbolic link
// counts without being followed: its target is a host path, not one of this program.
func hostHasTool(h Host, name string) bool {
	for _, dir := range filepath.SplitList(hostPATH) {
		if _, err := os.Lstat(h.Path(path.Join(dir, name))); err == nil {
			return true
		}
	}
	return false
}

// pkgsRepoMinor is the minor release in a pkgs.k8s.io repository URL: the deb line of
// kubernetes.list, the baseurl and gpgkey of kubernetes.repo. The documentation's other
// host names (pkgs.kubernetes.io, packages.kubernetes.io) have the same paths.
var pkgsRepoMinor = regexp.MustCompile(`(core:/stable:/)(v[0-9]+\.[0-9]+)(/(?:deb|rpm)/)`)

// switchRepository points the Kubernetes repository at the minor release of v, as
// "Changing the Kubernetes package repository" does by hand: every
// core:/stable:/vX.Y/ of the file becomes v's minor. The file is replaced atomically and
// keeps its mode; a file already at v's minor is left alone.
func switchRepository(env *Env, p packageManager, v kubeVersion) error {
	file := env.host().Path(p.repoFile)
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read the Kubernetes package repository: %w; --source packages needs the community repositories (pkgs.k8s.io) set up as the Kubernetes documentation does, or --repo-file", err)
	}
	found := pkgsRepoMinor.FindAllSubmatch(data, -1)
	if len(found) == 0 {
		return fmt.Errorf("%s names no pkgs.k8s.io repository (core:/stable:/vX.Y/): the node does not use the community package repositories; switch it to them, or use --source url or dir", p.repoFile)
	}
	from := string(found[0][2])
	updated := pkgsRepoMinor.ReplaceAll(data, []byte("${1}"+v.minorString()+"${3}"))
	if string(updated) == string(data) {
		env.say("%s already names the %s repository\n", p.repoFile, v.minorString())
		return nil
	}
	info, err := os.Stat(file)
	if err != nil {
		return err
	}
	partial := file + partialSuffix
	if err := os.WriteFile(partial, updated, info.Mode().Perm()); err != nil {
		return fmt.Errorf("write %s: %w", p.repoFile, err)
	}
	if err := os.Rename(partial, file); err != nil {
		_ = os.Remove(partial)
		return fmt.Errorf("replace %s: %w", p.repoFile, err)
	}
	env.say("switched %s from the %s to the %s repository\n", p.repoFile, from, v.minorString())
	return nil
}

// installPackages installs the named packages at exactly v, as the Kubernetes
// documentation does:
//
//	apt:  apt-mark unhold P...; apt-get update; apt-get install -y P=1.35.2-*...; apt-mark hold P...
//	dnf:  dnf makecache; dnf install -y P-1.35.2-*... --disableexcludes=kubernetes
//	dnf5: dnf5 makecache; dnf5 install -y P-1.35.2-*... --setopt=disable_excludes=kubernetes
//
// The packages are held (apt) or excluded (the repository's exclude= line) so that no
// routine upgrade of the node moves them; --disableexcludes lifts that for this install
// only. If the install fails after apt-mark unhold, the packages are held again, so the
// node is left as it was. A package manager that fails is ExitFailed with its own words:
// its exit status does not tell a network failure from a repository without the version.
func installPackages(ctx context.Context, env *Env, p packageManager, v kubeVersion, names ...string) error {
	h := env.host()
	var specs []string
	for _, name := range names {
		if p.apt() {
			specs = append(specs, name+"="+v.packageVersion()+"-*")
		} else {
			specs = append(specs, name+"-"+v.packageVersion()+"-*")
		}
	}
	if !p.apt() {
		if _, err := h.Run(ctx, Command{Name: p.tool, Args: []string{"makecache"}}); err != nil {
			return fmt.Errorf("refresh the package index: %w", err)
		}
		excludes := "--disableexcludes=kubernetes"
		if p.tool == "dnf5" {
			excludes = "--setopt=disable_excludes=kubernetes"
		}
		args := append(append([]string{"install", "-y"}, specs...), excludes)
		if _, err := h.Run(ctx, Command{Name: p.tool, Args: args}); err != nil {
			return fmt.Errorf("install %s: %w", strings.Join(specs, " "), err)
		}
		env.say("installed %s\n", strings.Join(specs, " "))
		return nil
	}
	aptEnv := []string{"DEBIAN_FRONTEND=noninteractive"}
	if _, err := h.Run(ctx, Command{Name: "apt-mark", Args: append([]string{"unhold"}, names...), Env: aptEnv}); err != nil {
		return fmt.Errorf("unhold %s: %w", strings.Join(names, " "), err)
	}
	hold := func() error {
		_, err := h.Run(ctx, Command{Name: "apt-mark", Args: append([]string{"hold"}, names...), Env: aptEnv})
		return err
	}
	if _, err := h.Run(ctx, Command{Name: "apt-get", Args: []string{"update"}, Env: aptEnv}); err != nil {
		_ = hold()
		return fmt.Errorf("refresh the package index: %w", err)
	}
	if _, err := h.Run(ctx, Command{Name: "apt-get", Args: append([]string{"install", "-y"}, specs...), Env: aptEnv}); err != nil {
		_ = hold()
		return fmt.Errorf("install %s: %w", strings.Join(specs, " "), err)
	}
	if err := hold(); err != nil {
		return fmt.Errorf("hold %s after installing them: %w", strings.Join(names, " "), err)
	}
	env.say("installed and held %s\n", strings.Join(specs, " "))
	return nil
}
