package sim

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
)

// harvesterUpgradeImage is what the simulated release upgrade image ships under
// /usr/local/share (harvester-node-upgrade.md fact 4; Harvester's package/upgrade/Dockerfile
// copies extra_manifests and addons there): an add-on file per add-on that upgrade_addon
// brings along (harvester-release-steps.md fact 29), shaped as harvester/addons generates
// them (pkg/templates/*.yaml: repo, version, chart, enabled false, valuesContent), and
// extra_manifests/cdi/cdi.yaml (fact 22), in the real release the CDI CRD, here a
// CustomResourceDefinition of the same name with its schema left open. The versions are
// the fixture's own, chosen to differ from what the specs seed.
//
//go:embed harvester-upgrade
var harvesterUpgradeImage embed.FS

// HarvesterUpgradeFiles is the simulated upgrade image's /usr/local/share: addons/ and
// extra_manifests/.
func HarvesterUpgradeFiles() fs.FS {
	sub, err := fs.Sub(harvesterUpgradeImage, "harvester-upgrade")
	if err != nil {
		panic(err) // the embedded directory is part of this package
	}
	return sub
}

// WriteHarvesterUpgradeFiles writes HarvesterUpgradeFiles into dir, which must not hold
// them yet, as the cluster upgrade Job's init container copies them.
func WriteHarvesterUpgradeFiles(dir string) error {
	return os.CopyFS(dir, HarvesterUpgradeFiles())
}

// DefaultReleaseImages is what ClusterUpgradeJobs pulls by default: any tag of an image
// whose repository is harvester-upgrade (rancher/harvester-upgrade or a mirror of it)
// holds HarvesterUpgradeFiles; any other image cannot be pulled.
func DefaultReleaseImages(image string) (fs.FS, bool) {
	repo := image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	if repo == "harvester-upgrade" || strings.HasSuffix(repo, "/harvester-upgrade") {
		return HarvesterUpgradeFiles(), true
	}
	return nil, false
}

// ReleaseAddon is the add-on file addons/<name>.yaml of HarvesterUpgradeFiles.
func ReleaseAddon(name string) (*harvesterapi.Addon, error) {
	raw, err := fs.ReadFile(HarvesterUpgradeFiles(), "addons/"+name+".yaml")
	if err != nil {
		return nil, err
	}
	a := &harvesterapi.Addon{}
	if err := yaml.Unmarshal(raw, a); err != nil {
		return nil, fmt.Errorf("the simulated release's add-on file %s: %w", name, err)
	}
	return a, nil
}
