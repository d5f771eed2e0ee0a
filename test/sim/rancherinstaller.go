package sim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// rancherChartFiles is the simulated Rancher chart: the parts of rancher/rancher's chart
// that Harvester's upgrade reads and changes (its Deployment's image, features and
// replicas) and one more object, which each chart version renders anew (rancher-config).
// Chart.yaml is written per version by RancherChart.
//
//go:embed rancher-chart
var rancherChartFiles embed.FS

// RancherChart is the simulated Rancher chart of Rancher version (v2.13.3), packaged as
// `helm package` packages it and as Rancher's installer image ships it
// (rancher-<version>.tgz: a gzipped tar of rancher/Chart.yaml, values.yaml, templates/),
// with chart version 2.13.3 and app version v2.13.3, as Rancher's charts are versioned.
func RancherChart(version string) ([]byte, error) {
	chartVersion := strings.TrimPrefix(version, "v")
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: "rancher/" + name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	chartYAML := fmt.Sprintf("apiVersion: v2\nname: rancher\ndescription: the simulated Rancher chart (capi-inplace test/sim)\nversion: %s\nappVersion: %s\n", chartVersion, version)
	if err := add("Chart.yaml", []byte(chartYAML)); err != nil {
		return nil, err
	}
	err := fs.WalkDir(rancherChartFiles, "rancher-chart", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := rancherChartFiles.ReadFile(p)
		if err != nil {
			return err
		}
		return add(strings.TrimPrefix(p, "rancher-chart/"), data)
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// HelmBinary is the helm the simulated Rancher installer image ships: the real helm,
// built from its Go module by `make test-binaries` into the test binaries' directory
// (KUBEBUILDER_ASSETS, else the checkout's bin/k8s, as test/testenv finds kube-apiserver),
// as Rancher's installer image ships the helm of Rancher's build.
func HelmBinary() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := testenv.RepoRoot()
		if err != nil {
			return "", fmt.Errorf("KUBEBUILDER_ASSETS is not set, and no checkout to find bin/k8s in (make test-binaries builds helm there): %w", err)
		}
		dir = filepath.Join(root, "bin", "k8s")
	}
	p := filepath.Join(dir, "helm")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no helm in %s (make test-binaries builds it): %w", dir, err)
	}
	return p, nil
}

var (
	installerTag   = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)
	installerMu    sync.Mutex
	installerCache = map[string]string{}
)

// DefaultRancherInstallers is what ClusterUpgradeJobs pulls for Rancher's installer image
// by default: a tag vX.Y.Z of an image whose repository is system-agent-installer-rancher
// (or a mirror of it) holds, at its root, helm (HelmBinary) and rancher-X.Y.Z.tgz
// (RancherChart), as Rancher's package/Dockerfile.installer builds it FROM scratch; the
// image's directory is returned. Any other image cannot be pulled.
func DefaultRancherInstallers(image string) (string, bool) {
	repo, tag, ok := strings.Cut(image, ":")
	isInstaller := repo == "system-agent-installer-rancher" || strings.HasSuffix(repo, "/system-agent-installer-rancher")
	if !ok || !isInstaller || !installerTag.MatchString(tag) {
		return "", false
	}
	installerMu.Lock()
	defer installerMu.Unlock()
	if dir, ok := installerCache[tag]; ok {
		return dir, true
	}
	helm, err := HelmBinary()
	if err != nil {
		return "", false
	}
	chart, err := RancherChart(tag)
	if err != nil {
		return "", false
	}
	dir, err := os.MkdirTemp("", "rancher-installer-"+tag+"-")
	if err != nil {
		return "", false
	}
	if os.Symlink(helm, filepath.Join(dir, "helm")) != nil || os.WriteFile(filepath.Join(dir, "rancher-"+strings.TrimPrefix(tag, "v")+".tgz"), chart, 0o644) != nil {
		return "", false
	}
	installerCache[tag] = dir
	return dir, true
}

// RancherChartConfig is the ConfigMap every simulated Rancher chart renders besides the
// Deployment; its data "chart" names the chart that rendered it (rancher-2.13.3).
var RancherChartConfig = client.ObjectKey{Namespace: rancher.CattleSystem, Name: "rancher-config"}

// seedRancherRelease installs Rancher as Harvester's installer does, through Helm: it
// stores revision 1 of the Helm release cattle-system/rancher, deployed, with values as
// rancherd gives them (the legacy rancherImage / rancherImageTag, the features, and
// values of its own that every upgrade must keep, and install's: replicas, antiAffinity)
// and as its manifest the objects the
// simulated chart of that version renders from them, which it creates: dep (given its
// labels here) and rancher-config. Helm's storage is its Secret driver's (helm
// pkg/storage/driver/secrets.go: type helm.sh/release.v1, labels owner, name, status,
// version; data release the release JSON, gzipped, base64-encoded), so the real helm
// reads and upgrades it.
func seedRancherRelease(ctx context.Context, c client.Client, version, features string, install map[string]any, dep *appsv1.Deployment) error {
	old := &corev1.SecretList{}
	if err := c.List(ctx, old, client.InNamespace(rancher.CattleSystem), client.MatchingLabels{"owner": "helm", "name": "rancher"}); err != nil {
		return err
	}
	for i := range old.Items {
		if err := client.IgnoreNotFound(c.Delete(ctx, &old.Items[i])); err != nil {
			return err
		}
	}
	dep.Labels = map[string]string{"app": "rancher"}
	values := map[string]any{
		"rancherImage": imageRepository(dep.Spec.Template.Spec.Containers[0].Image), "rancherImageTag": version,
		"useBundledSystemChart": true, "noDefaultAdmin": false,
	}
	for k, v := range install {
		values[k] = v
	}
	if features != "" {
		values["features"] = features
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: RancherChartConfig.Namespace, Name: RancherChartConfig.Name, Labels: map[string]string{"app": "rancher"}},
		Data:       map[string]string{"chart": "rancher-" + strings.TrimPrefix(version, "v")},
	}
	var manifest strings.Builder
	for _, o := range []struct {
		source string
		obj    client.Object
		gvk    metav1.TypeMeta
	}{
		{"configmap.yaml", cm, metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}},
		{"deployment.yaml", dep, metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}},
	} {
		raw, err := json.Marshal(o.obj)
		if err != nil {
			return err
		}
		m := map[string]any{}
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		m["apiVersion"], m["kind"] = o.gvk.APIVersion, o.gvk.Kind
		delete(m, "status")
		meta, _ := m["metadata"].(map[string]any)
		delete(meta, "creationTimestamp")
		out, err := yaml.Marshal(m)
		if err != nil {
			return err
		}
		fmt.Fprintf(&manifest, "---\n# Source: %s\n%s", path.Join("rancher/templates", o.source), out)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	rel := map[string]any{
		"name": "rancher", "namespace": rancher.CattleSystem, "version": 1,
		"info": map[string]any{"first_deployed": now, "last_deployed": now, "status": "deployed", "description": "Install complete"},
		"chart": map[string]any{"metadata": map[string]any{
			"apiVersion": "v2", "name": "rancher", "version": strings.TrimPrefix(version, "v"), "appVersion": version,
		}},
		"config":   values,
		"manifest": manifest.String(),
	}
	raw, err := json.Marshal(rel)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(raw); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rancher.CattleSystem, Name: "sh.helm.release.v1.rancher.v1",
			Labels: map[string]string{"owner": "helm", "name": "rancher", "status": "deployed", "version": strconv.Itoa(1)},
		},
		Type: corev1.SecretType(rancher.HelmReleaseType),
		Data: map[string][]byte{"release": []byte(base64.StdEncoding.EncodeToString(buf.Bytes()))},
	}
	if err := c.Create(ctx, secret); err != nil {
		return fmt.Errorf("store the Helm release %s/rancher: %w", rancher.CattleSystem, err)
	}
	// Helm marks what it owns (pkg/action/validate.go: the managed-by label and the
	// release annotations it sets on every object it creates).
	for _, o := range []client.Object{cm, dep} {
		l := o.GetLabels()
		l["app.kubernetes.io/managed-by"] = "Helm"
		o.SetLabels(l)
		a := o.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a["meta.helm.sh/release-name"], a["meta.helm.sh/release-namespace"] = "rancher", rancher.CattleSystem
		o.SetAnnotations(a)
	}
	return recreate(ctx, c, cm)
}
