package install

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"
)

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	cmd  string
	args string
}

func parseDockerfile(data string) []instruction {
	var out []instruction
	var current strings.Builder
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if current.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			current.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		current.WriteString(trimmed)
		cmd, args, _ := strings.Cut(current.String(), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		current.Reset()
	}
	return out
}

var _ = Describe("The Dockerfile", func() {
	// No container engine runs on the build machines, so the Dockerfile is checked by
	// reading it: its stages, the build it runs, the user and the entrypoint.
	var steps []instruction

	BeforeEach(func() {
		data, err := os.ReadFile(filepath.Join(env.RepoRoot, "Dockerfile"))
		Expect(err).NotTo(HaveOccurred())
		steps = parseDockerfile(string(data))
	})

	It("builds in a Go stage and ships a distroless non-root stage", func() {
		var froms []string
		for _, s := range steps {
			if s.cmd == "FROM" {
				froms = append(froms, s.args)
			}
		}
		Expect(froms).To(HaveLen(2))
		Expect(froms[0]).To(MatchRegexp(`^golang:\$\{GO_VERSION\} AS builder$`))
		Expect(froms[1]).To(Equal("gcr.io/distroless/static:nonroot"))
	})

	It("runs the Makefile's own build, static, with the version and Go proxy as build arguments", func() {
		var runs, argNames []string
		for _, s := range steps {
			switch s.cmd {
			case "RUN":
				runs = append(runs, s.args)
			case "ARG":
				name, _, _ := strings.Cut(s.args, "=")
				argNames = append(argNames, name)
			}
		}
		Expect(argNames).To(ContainElements("VERSION", "GOPROXY", "GOSUMDB", "IMG"))
		// IMG, when given, is the image the binary names as its node image
		// (--harvester-node-image's default), the image being built.
		Expect(runs).To(ContainElement("make build VERSION=${VERSION} ${IMG:+IMG=${IMG}}"))

		makefile, err := os.ReadFile(filepath.Join(env.RepoRoot, "Makefile"))
		Expect(err).NotTo(HaveOccurred())
		build := regexp.MustCompile(`(?m)^build:.*\n\t(.*)$`).FindStringSubmatch(string(makefile))
		Expect(build).To(HaveLen(2), "no recipe for build in the Makefile")
		Expect(build[1]).To(ContainSubstring("CGO_ENABLED=0 $(GO) build -trimpath"))
		Expect(build[1]).To(ContainSubstring("-o $(BIN)/capi-inplace ."))
	})

	It("copies only the binary, runs as the nonroot user and starts the manager", func() {
		last := map[string]string{}
		for _, s := range steps {
			last[s.cmd] = s.args
		}
		Expect(last["COPY"]).To(Equal("--from=builder /workspace/bin/capi-inplace /capi-inplace"))
		Expect(last["USER"]).To(Equal("65532:65532"))
		Expect(last["ENTRYPOINT"]).To(Equal(`["/capi-inplace"]`))
	})
})

var _ = Describe("tilt-provider.yaml", func() {
	type providerConfig struct {
		Name   string `json:"name"`
		Config struct {
			Image               string   `json:"image"`
			LiveReloadDeps      []string `json:"live_reload_deps"`
			Label               string   `json:"label"`
			KustomizeFolder     string   `json:"kustomize_folder"`
			AdditionalResources []string `json:"additional_resources"`
			ResourceDeps        []string `json:"resource_deps"`
		} `json:"config"`
	}

	It("builds the image the manifests deploy, from paths that exist, after Cluster API, and adds the ExtensionConfig", func() {
		data, err := os.ReadFile(filepath.Join(env.RepoRoot, "tilt-provider.yaml"))
		Expect(err).NotTo(HaveOccurred())
		var p providerConfig
		Expect(yaml.UnmarshalStrict(data, &p)).To(Succeed())
		Expect(p.Name).To(Equal("capi-inplace"))
		Expect(p.Config.ResourceDeps).To(ContainElement("capi_controller"))

		objs := kustomizeBuild(p.Config.KustomizeFolder)
		dep := findObject(objs, "Deployment", "capi-inplace-controller-manager")
		containers, _, _ := unstructuredSlice(dep.Object, "spec", "template", "spec", "containers")
		Expect(containers[0]).To(HaveKeyWithValue("image", HavePrefix(p.Config.Image+":")))
		for _, o := range objs {
			Expect(o.GetKind()).NotTo(Equal("ExtensionConfig"), "the ExtensionConfig comes from additional_resources, after Cluster API runs")
		}

		for _, dep := range append(append([]string{}, p.Config.LiveReloadDeps...), p.Config.AdditionalResources...) {
			_, err := os.Stat(filepath.Join(env.RepoRoot, dep))
			Expect(err).NotTo(HaveOccurred(), "tilt-provider.yaml names %s, which does not exist", dep)
		}
		Expect(p.Config.AdditionalResources).To(ContainElement("config/extensionconfig/extensionconfig.yaml"))
	})
})
