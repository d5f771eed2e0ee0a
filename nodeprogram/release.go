package nodeprogram

import (
	"context"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"
)

// release is the part of the repository's harvester-release.yaml the node program reads
// (facts, fact 18).
type release struct {
	Harvester  string `json:"harvester"`
	OS         string `json:"os"`
	Kubernetes string `json:"kubernetes"`
}

// bundleMetadata is bundle/metadata.yaml (facts, fact 19): image lists and their archives,
// with paths relative to bundle/ that start with "/".
type bundleMetadata struct {
	Images struct {
		Common []imageArchive `json:"common"`
		RKE2   []imageArchive `json:"rke2"`
		Agent  []imageArchive `json:"agent"`
	} `json:"images"`
}

type imageArchive struct {
	List    string `json:"list"`
	Archive string `json:"archive"`
}

// repository is the release repository served over HTTP: the ISO's content under a base
// URL such as http://<repo service>/harvester-iso (facts, fact 17).
type repository struct {
	env  *Env
	base string
}

func newRepository(env *Env, base string) (*repository, error) {
	if base == "" {
		return nil, usagef("--repository-url is required: the base URL of the release repository, e.g. http://upgrade-repo.harvester-system/harvester-iso")
	}
	if err := checkHTTPURL("--repository-url", base); err != nil {
		return nil, err
	}
	return &repository{env: env, base: strings.TrimSuffix(base, "/")}, nil
}

func (r *repository) url(path string) string { return r.base + "/" + strings.TrimPrefix(path, "/") }

// open GETs a file of the repository.
func (r *repository) open(ctx context.Context, path string) (io.ReadCloser, error) {
	return fetch(ctx, r.env, r.url(path))
}

func (r *repository) read(ctx context.Context, path string, into any) error {
	body, err := r.open(ctx, path)
	if err != nil {
		return err
	}
	defer body.Close() //nolint:errcheck // read only
	data, err := io.ReadAll(io.LimitReader(body, 16<<20))
	if err != nil {
		return retryf("read %s: %w", r.url(path), err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%s is not valid YAML: %w", r.url(path), err)
	}
	return nil
}

// release reads harvester-release.yaml and checks it names what the node program needs,
// and, when wantVersion is set, that it is that release.
func (r *repository) release(ctx context.Context, wantVersion string) (release, error) {
	var rel release
	if err := r.read(ctx, "harvester-release.yaml", &rel); err != nil {
		return rel, fmt.Errorf("read the release metadata: %w", err)
	}
	if rel.Harvester == "" || rel.OS == "" {
		return rel, fmt.Errorf("%s names no harvester version or os: is --repository-url the repository of a Harvester release?", r.url("harvester-release.yaml"))
	}
	if wantVersion != "" && rel.Harvester != wantVersion {
		return rel, fmt.Errorf("the repository at %s holds release %s, not %s: point --repository-url at the repository of %s", r.base, rel.Harvester, wantVersion, wantVersion)
	}
	return rel, nil
}

// imageList reads an image list: one image reference a line; blank lines and # comments
// are skipped.
func (r *repository) imageList(ctx context.Context, path string) ([]string, error) {
	body, err := r.open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer body.Close() //nolint:errcheck // read only
	data, err := io.ReadAll(io.LimitReader(body, 16<<20))
	if err != nil {
		return nil, retryf("read %s: %w", r.url(path), err)
	}
	var images []string
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			images = append(images, line)
		}
	}
	return images, nil
}
