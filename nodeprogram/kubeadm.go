package nodeprogram

// The node side of the kubeadm updater: `node kubeadm fetch`, `node kubeadm upgrade` and
// `node kubeadm kubelet`, the per-node steps of Kubernetes' documented kubeadm upgrade
// (kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/ and
// .../upgrading-linux-nodes/): get the target kubeadm; `kubeadm upgrade apply` on the
// first control plane node, `kubeadm upgrade node` on every other node; then, once the
// manager has drained the node, the kubelet and kubectl, `systemctl daemon-reload` and a
// restart of the kubelet. docs/kubeadm-node-program.md is the operator's description.

import (
	"bytes"
	"flag"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// Where the kubeadm phases keep things on the host.
const (
	// kubeadmStageRoot holds, per version, the downloaded or copied binaries once their
	// checksum is verified (<root>/<version>/<binary>), and the kubelet restart marker.
	kubeadmStageRoot = "/var/lib/capi-inplace/kubeadm"
	// defaultKubeBinDir is where the Kubernetes packages install kubeadm, kubelet and
	// kubectl, and where the kubelet unit of those packages starts the kubelet from.
	defaultKubeBinDir = "/usr/bin"
	// defaultAdminKubeconfig is kubeadm's own default for `kubeadm upgrade`.
	defaultAdminKubeconfig = "/etc/kubernetes/admin.conf"
	// defaultBinaryURLTemplate is the layout of the Kubernetes release binaries on
	// dl.k8s.io (kubernetes.io/releases/download/).
	defaultBinaryURLTemplate = "https://dl.k8s.io/release/{{.Version}}/bin/linux/{{.Arch}}/{{.Binary}}"
)

// kubeBinaries are the three binaries of a kubeadm node, in the order they are staged.
var kubeBinaries = []string{"kubeadm", "kubelet", "kubectl"}

// The kinds of --source.
const (
	sourcePackages = "packages"
	sourceURL      = "url"
	sourceDir      = "dir"
)

// kubeVersion is a released Kubernetes version, vMAJOR.MINOR.PATCH.
type kubeVersion struct{ major, minor, patch int }

var kubeVersionPattern = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// parseKubeVersion reads a version such as v1.35.2. Pre-releases are refused: the
// package repositories and dl.k8s.io paths the phases build are those of releases.
func parseKubeVersion(s string) (kubeVersion, bool) {
	m := kubeVersionPattern.FindStringSubmatch(s)
	if m == nil {
		return kubeVersion{}, false
	}
	var v kubeVersion
	for i, p := range []*int{&v.major, &v.minor, &v.patch} {
		n, err := strconv.Atoi(m[i+1])
		if err != nil {
			return kubeVersion{}, false
		}
		*p = n
	}
	return v, true
}

func (v kubeVersion) String() string { return fmt.Sprintf("v%d.%d.%d", v.major, v.minor, v.patch) }

// packageVersion is the version as the Kubernetes packages spell it, without the v.
func (v kubeVersion) packageVersion() string {
	return fmt.Sprintf("%d.%d.%d", v.major, v.minor, v.patch)
}

// minorString is the minor release, v1.35, as the package repositories name theirs.
func (v kubeVersion) minorString() string { return fmt.Sprintf("v%d.%d", v.major, v.minor) }

func (v kubeVersion) compare(o kubeVersion) int {
	for _, d := range []int{v.major - o.major, v.minor - o.minor, v.patch - o.patch} {
		if d != 0 {
			return d
		}
	}
	return 0
}

// versionFlag binds --version, the target Kubernetes version every phase needs.
func versionFlag(fs *flag.FlagSet, s *string) {
	fs.StringVar(s, "version", "", "the target Kubernetes version, vMAJOR.MINOR.PATCH such as v1.35.2 (required)")
}

func requireKubeVersion(s string) (kubeVersion, error) {
	if s == "" {
		return kubeVersion{}, usagef("--version is required: the target Kubernetes version, such as v1.35.2")
	}
	v, ok := parseKubeVersion(s)
	if !ok {
		return kubeVersion{}, usagef("--version %q is not a released Kubernetes version: want vMAJOR.MINOR.PATCH, such as v1.35.2", s)
	}
	return v, nil
}

// sha256Flags is --sha256 BINARY=HEX, repeated: the expected SHA-256 of each binary.
type sha256Flags map[string]string

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

func (f sha256Flags) String() string {
	var parts []string
	for _, name := range kubeBinaries {
		if sum, ok := f[name]; ok {
			parts = append(parts, name+"="+sum)
		}
	}
	return strings.Join(parts, ",")
}

func (f sha256Flags) Set(s string) error {
	name, sum, ok := strings.Cut(s, "=")
	if !ok || !slices.Contains(kubeBinaries, name) {
		return fmt.Errorf("want BINARY=HEX with BINARY one of %s, got %q", strings.Join(kubeBinaries, ", "), s)
	}
	if !sha256Hex.MatchString(sum) {
		return fmt.Errorf("the SHA-256 of %s must be 64 hex digits, got %q", name, sum)
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("the SHA-256 of %s is given twice", name)
	}
	f[name] = strings.ToLower(sum)
	return nil
}

// binarySource is where a phase takes the Kubernetes binaries from: --source and the
// flags of each kind. fetch and kubelet take the same flags, so that the manager runs
// both with one set.
type binarySource struct {
	kind        string
	urlTemplate string
	sums        sha256Flags
	arch        string
	dir         string
	binDir      string
	repoFile    string

	tmpl *template.Template
}

func (s *binarySource) bind(fs *flag.FlagSet) {
	s.sums = sha256Flags{}
	fs.StringVar(&s.kind, "source", "", "where the binaries come from: packages (the node's apt or dnf/yum, from pkgs.k8s.io), url (downloaded, SHA-256 checked) or dir (copied into this container from an image) (required)")
	fs.StringVar(&s.urlTemplate, "url-template", defaultBinaryURLTemplate, "with --source url: the URL of each binary, a Go template with {{.Version}}, {{.Arch}} and {{.Binary}}")
	fs.Var(s.sums, "sha256", "BINARY=HEX, the SHA-256 of kubeadm, kubelet or kubectl; repeat for each. Required for every binary the phase takes with --source url; checked when given with --source dir")
	fs.StringVar(&s.arch, "arch", "", "with --source url: the architecture in the URL (amd64, arm64); default: the host's, from `uname -m`")
	fs.StringVar(&s.dir, "dir", "", "with --source dir: the directory of this container the binaries were copied into (by an init container)")
	fs.StringVar(&s.binDir, "bin-dir", defaultKubeBinDir, "the host directory of kubeadm, kubelet and kubectl: where url and dir install them, and where the phases run them from (keep the default with --source packages: the packages install there)")
	fs.StringVar(&s.repoFile, "repo-file", "", "with --source packages: the host file of the Kubernetes package repository; default /etc/apt/sources.list.d/kubernetes.list (apt) or /etc/yum.repos.d/kubernetes.repo (dnf, yum)")
}

// validate checks the flags of the source for a phase that takes the binaries needed.
func (s *binarySource) validate(needed []string) error {
	if err := absHostDir("--bin-dir", s.binDir); err != nil {
		return err
	}
	switch s.kind {
	case "":
		return usagef("--source is required: packages, url or dir")
	case sourcePackages:
		if len(s.sums) > 0 || s.dir != "" || s.arch != "" || s.urlTemplate != defaultBinaryURLTemplate {
			return usagef("--source packages takes no --sha256, --dir, --arch or --url-template: the package manager checks the packages' signatures")
		}
		if s.repoFile != "" {
			return absHostDir("--repo-file", s.repoFile)
		}
		return nil
	case sourceURL:
		if s.dir != "" || s.repoFile != "" {
			return usagef("--source url takes no --dir or --repo-file")
		}
		var missing []string
		for _, name := range needed {
			if s.sums[name] == "" {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return usagef("--source url needs the SHA-256 of %s: add --sha256 %s=<64 hex digits> for each (dl.k8s.io publishes it as <binary>.sha256 next to each binary)",
				strings.Join(missing, ", "), missing[0])
		}
		if s.arch != "" && !archName.MatchString(s.arch) {
			return usagef("--arch %q is not an architecture name such as amd64 or arm64", s.arch)
		}
		return s.parseTemplate()
	case sourceDir:
		if s.dir == "" {
			return usagef("--source dir needs --dir: the directory of this container the binaries were copied into")
		}
		if s.arch != "" || s.urlTemplate != defaultBinaryURLTemplate || s.repoFile != "" {
			return usagef("--source dir takes no --arch, --url-template or --repo-file")
		}
		return nil
	default:
		return usagef("--source %q is not one of packages, url, dir", s.kind)
	}
}

// archName is an architecture as release paths name them (amd64, arm64, ppc64le).
var archName = regexp.MustCompile(`^[a-z0-9_]+$`)

// urlFields are what --url-template may use.
type urlFields struct{ Version, Arch, Binary string }

func (s *binarySource) parseTemplate() error {
	t, err := template.New("url").Option("missingkey=error").Parse(s.urlTemplate)
	if err != nil {
		return usagef("--url-template is not a valid Go template: %v", err)
	}
	s.tmpl = t
	u, err := s.url(urlFields{Version: "v1.0.0", Arch: "amd64", Binary: "kubeadm"})
	if err != nil {
		return usagef("--url-template: %v (the fields are {{.Version}}, {{.Arch}} and {{.Binary}})", err)
	}
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return usagef("--url-template must give an http:// or https:// URL, gives %q", redactURL(u))
	}
	return nil
}

func (s *binarySource) url(f urlFields) (string, error) {
	var b bytes.Buffer
	if err := s.tmpl.Execute(&b, f); err != nil {
		return "", err
	}
	return b.String(), nil
}

// absHostDir refuses a host path that is not absolute.
func absHostDir(flagName, p string) error {
	if !path.IsAbs(p) {
		return usagef("%s %q must be an absolute path on the host", flagName, p)
	}
	return nil
}

// stagedPath is the host path of a verified binary of version v.
func stagedPath(v kubeVersion, name string) string {
	return path.Join(kubeadmStageRoot, v.String(), name)
}

// tail is the end of s, at most n bytes, marked when cut.
func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
