package clusterupgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// Rancher's Helm release, which Harvester's installer (rancherd) installs and every release
// upgrades (harvester-release-steps.md fact 16).
const (
	rancherRelease = "rancher"
	// RancherInstallerDir is where the cluster upgrade Job's init containers put the files
	// of Rancher's installer image (helm and the chart), and where its program reads them.
	RancherInstallerDir = "/rancher-installer"
	// rancherDescriptionPrefix starts the description of the Helm revision this upgrade
	// makes (helm upgrade --description), followed by the plan: a run that resumes knows
	// by it that the revision is its own.
	rancherDescriptionPrefix = "capi-inplace upgrade plan "
)

// upgradeRancher brings Rancher to the release's version and features the way the release
// does (upgrade_rancher, facts 16 and 41 at v1.7.3 and v1.8.2): with the helm and the
// Rancher chart of Rancher's own system-agent-installer-rancher image (RancherInstaller,
// put there by the Job's init containers), `helm get values rancher`, the values the
// release changes, `helm upgrade rancher <chart> -f values`. It is skipped when the
// server-version Setting already says the version, and the upgrade itself when the
// values already name it (a run that resumes after its helm upgrade only waits). Before
// the upgrade it waits for the Cluster API Cluster fleet-local/local as the target
// release's wait_capi_cluster does (16.3, fact 40, capicluster.go), deletes Rancher's
// chart repositories (16.4) and records fleet-controller's API server (16.5); after it,
// it waits for the rancher Deployment's rollout and server-version (16.9).
//
// The values changed, as the script changes them: `replicas: -2` on a three-node cluster
// with a witness (16.2: at most two Rancher pods, see rancherValues), `features` to the release's list (RancherFeatures, fact 42), the
// image tag to the target; for a release from v1.8.0 on, legacy rancherImage /
// rancherImageTag values become image.repository / image.tag / image.pullPolicy (16.7,
// fact 41), while v1.7 releases set rancherImageTag. RancherImage, when set, replaces the
// repository (a mirror); the script has no such value. Every other value the user set
// stays, as `helm get values` returns them.
//
// Unlike the script, the upgrade runs without helm's --wait: the rollout of the rancher
// Deployment and server-version, which the script also waits for after helm, are what
// this waits for, each with its own message.
func (r *runner) upgradeRancher(ctx context.Context) (StepState, string, error) {
	target := r.in.RancherVersion
	setting := &managementv3.Setting{}
	if err := r.c.Get(ctx, serverVersionKey, setting); err != nil {
		return "", "", fmt.Errorf("read Rancher's Setting %s: %w", rancher.ServerVersionSetting, err)
	}
	newest, err := rancher.NewestHelmRelease(ctx, r.c, rancher.CattleSystem, rancherRelease)
	if err != nil {
		return "", "", err
	}
	ours := newest != nil && newest.Info.Description == rancherDescriptionPrefix+r.in.Plan
	if setting.Effective() == target {
		return r.already(StepUpgradeRancher, fmt.Sprintf("Rancher's server-version is already %s", target), ours)
	}
	if newest == nil {
		return "", "", fmt.Errorf("no Helm release %s/%s: Rancher was not installed by Helm as Harvester installs it (rancherd); upgrade Rancher by hand to %s and run the upgrade again", rancher.CattleSystem, rancherRelease, target)
	}
	h, err := r.rancherHelm()
	if err != nil {
		return "", "", err
	}
	defer h.close()
	values, err := h.values(ctx)
	if err != nil {
		return "", "", err
	}
	current, legacy := rancherTag(values)
	if current == "" {
		return "", "", fmt.Errorf("the values of the Helm release %s/%s name no Rancher version (neither rancherImageTag nor image.tag), as the release's script also requires: set it with helm to the version Rancher runs and run the upgrade again", rancher.CattleSystem, rancherRelease)
	}
	chart := filepath.Base(h.chart)
	did := fmt.Sprintf("values already at %s (an earlier run's helm upgrade)", target)
	if current != target {
		if err := r.waitCAPIClusterBeforeRancher(ctx); err != nil {
			return "", "", err
		}
		if err := r.rancherValues(ctx, values, legacy); err != nil {
			return "", "", err
		}
		if err := r.deleteRancherChartRepos(ctx); err != nil {
			return "", "", err
		}
		if err := r.saveFleetAPIServer(ctx); err != nil {
			return "", "", err
		}
		if err := h.upgrade(ctx, values, rancherDescriptionPrefix+r.in.Plan); err != nil {
			return "", "", err
		}
		did = fmt.Sprintf("helm upgrade with %s; ClusterRepos %s, %s, %s and Setting %s deleted before, for the new Rancher to create from its own charts",
			chart, rancher.RancherChartsRepo, rancher.RancherRKE2ChartsRepo, rancher.RancherPartnerChartsRepo, rancher.ChartDefaultBranchSetting)
	}
	image, err := r.renderedRancherImage(ctx, values)
	if err != nil {
		return "", "", err
	}
	if err := r.waitRollout(ctx, rancherKey, "rancher", image); err != nil {
		return "", "", err
	}
	err = r.poll(ctx, fmt.Sprintf("Rancher's Setting %s to say %s", rancher.ServerVersionSetting, target),
		"Rancher sets it when it starts at the new version: look at Rancher's logs (kubectl -n cattle-system logs deploy/rancher)",
		func(ctx context.Context) (bool, string, error) {
			s := &managementv3.Setting{}
			if err := r.c.Get(ctx, serverVersionKey, s); err != nil {
				return false, "", fmt.Errorf("read Rancher's Setting %s: %w", rancher.ServerVersionSetting, err)
			}
			return s.Effective() == target, "server-version " + s.Effective(), nil
		})
	if err != nil {
		return "", "", err
	}
	features, _ := values["features"].(string)
	if features == "" {
		features = "as they were"
	}
	return StateDone, fmt.Sprintf("Rancher runs %s (image %s, features %s; %s)", target, image, features, did), nil
}

// rancherValues changes Rancher's Helm values as the release's script does before its
// helm upgrade (see upgradeRancher).
func (r *runner) rancherValues(ctx context.Context, values map[string]any, legacy bool) error {
	target := r.in.RancherVersion
	witness, total, err := r.witnessNodes(ctx)
	if err != nil {
		return err
	}
	// 16.2 (harvester commit f8a7092, upgrade_manifests.sh from v1.6.0 on): every node
	// counted, any witness among them. Rancher's chart renders a negative replicas -N as
	// the annotation management.cattle.io/scale-available "N" and no replicas of its own,
	// and Rancher keeps the Deployment at N replicas or as many as there are nodes,
	// whichever is fewer (rancher chart/templates/deployment.yaml,
	// pkg/controllers/dashboard/scaleavailable/scale.go). rancherd installs Rancher with
	// -3 and a required anti-affinity (rancher/rancherd pkg/rancher/run.go) and Harvester's
	// witness promotion annotates the Deployment "2"; the chart's -3 would ask again for a
	// third Rancher pod, which the witness (tainted etcd NoExecute) cannot run, and the
	// rollout would never end. Like the other values, it stays in Rancher's Helm release
	// whatever the upgrade's outcome: Rancher is not downgraded, so nothing is recorded
	// for the plan's restore.
	if witness > 0 && total == 3 {
		values["replicas"] = -2
	}
	if r.in.RancherFeatures != "" {
		values["features"] = r.in.RancherFeatures
	}
	if legacy && convertsLegacyRancherImage(r.in.HarvesterVersion) {
		repo := "rancher/rancher"
		delete(values, "rancherImage")
		delete(values, "rancherImagePullPolicy")
		delete(values, "rancherImageTag")
		img, _ := values["image"].(map[string]any)
		if img == nil {
			img = map[string]any{}
		}
		img["pullPolicy"], img["repository"] = "IfNotPresent", repo
		values["image"] = img
		legacy = false
	}
	if legacy {
		values["rancherImageTag"] = target
		if r.in.RancherImage != "" {
			values["rancherImage"] = r.in.RancherImage
		}
		return nil
	}
	img, _ := values["image"].(map[string]any)
	if img == nil {
		img = map[string]any{}
	}
	img["tag"] = target
	if r.in.RancherImage != "" {
		img["repository"] = r.in.RancherImage
	}
	values["image"] = img
	return nil
}

// convertsLegacyRancherImage says whether the release's upgrade_rancher turns legacy
// rancherImage* values into image.* ones: from v1.8.0 on (fact 41; v1.7.3's sets
// rancherImageTag).
func convertsLegacyRancherImage(harvesterVersion string) bool {
	v, err := version.ParseSemantic(harvesterVersion)
	return err == nil && !v.LessThan(version.MustParseSemantic("v1.8.0"))
}

// rancherTag is the Rancher version Rancher's values name, and whether they name it the
// legacy way (rancherImageTag), as the script reads it.
func rancherTag(values map[string]any) (string, bool) {
	if t, ok := values["rancherImageTag"].(string); ok && t != "" {
		return t, true
	}
	if img, ok := values["image"].(map[string]any); ok {
		if t, ok := img["tag"].(string); ok {
			return t, false
		}
	}
	return "", false
}

// rancherRepository is the image repository the values give Rancher, as Rancher's chart
// renders it (rancherImage, or image.repository; the chart's default rancher/rancher).
func rancherRepository(values map[string]any) string {
	if repo, ok := values["rancherImage"].(string); ok && repo != "" {
		return repo
	}
	if img, ok := values["image"].(map[string]any); ok {
		if repo, ok := img["repository"].(string); ok && repo != "" {
			return repo
		}
	}
	return "rancher/rancher"
}

// renderedRancherImage is the image the chart rendered into the rancher Deployment: the
// values' repository (the chart may put systemDefaultRegistry in front of it) at the
// target tag. A Deployment that runs another tag, or another repository, was not
// rendered from these values: someone else changed it.
func (r *runner) renderedRancherImage(ctx context.Context, values map[string]any) (string, error) {
	dep := &appsv1.Deployment{}
	if err := r.c.Get(ctx, rancherKey, dep); err != nil {
		return "", fmt.Errorf("read Rancher's Deployment %s: %w", rancherKey, err)
	}
	ctr, err := container(dep, "rancher")
	if err != nil {
		return "", err
	}
	repo := rancherRepository(values)
	if !strings.HasSuffix(ctr.Image, "/"+repo+":"+r.in.RancherVersion) && ctr.Image != repo+":"+r.in.RancherVersion {
		return "", fmt.Errorf("the Deployment %s runs image %s, not %s:%s that Rancher's Helm values name: someone else changed it; find out who and run the upgrade again", rancherKey, ctr.Image, repo, r.in.RancherVersion)
	}
	return ctr.Image, nil
}

// witnessNodes counts the witness nodes and all nodes, as the script does.
func (r *runner) witnessNodes(ctx context.Context) (witness, total int, err error) {
	nodes := &corev1.NodeList{}
	if err := r.c.List(ctx, nodes); err != nil {
		return 0, 0, fmt.Errorf("list the nodes (a three-node cluster with a witness runs Rancher with replicas -2): %w", err)
	}
	for _, n := range nodes.Items {
		if n.Labels[LabelWitnessNode] == "true" {
			witness++
		}
	}
	return witness, len(nodes.Items), nil
}

// rancherHelm is the helm of Rancher's installer image, with its Rancher chart.
type rancherHelm struct {
	helm, chart, kubeconfig string
	// home holds helm's cache, configuration and data directories and the values file:
	// the Job's root filesystem is read-only, its /tmp an emptyDir.
	home string
}

// rancherHelm finds helm and the one Rancher chart in RancherInstaller.
func (r *runner) rancherHelm() (*rancherHelm, error) {
	dir := r.in.RancherInstaller
	if dir == "" {
		return nil, errors.New("no Rancher chart to upgrade Rancher with: the Job's init containers copy helm and the chart out of Rancher's system-agent-installer-rancher image into --rancher-installer, which is not set; run the Job the Harvester updater writes")
	}
	helm := filepath.Join(dir, "helm")
	if _, err := os.Stat(helm); err != nil {
		return nil, fmt.Errorf("no helm in %s, where the Job's init container copies Rancher's installer image's /helm: %w", dir, err)
	}
	charts, err := filepath.Glob(filepath.Join(dir, "rancher-*.tgz"))
	if err != nil || len(charts) != 1 {
		return nil, fmt.Errorf("expected exactly one Rancher chart rancher-<version>.tgz in %s (from Rancher's installer image), found %d: check images.rancherInstaller of the HarvesterUpgrader", dir, len(charts))
	}
	home, err := os.MkdirTemp("", "helm-")
	if err != nil {
		return nil, fmt.Errorf("a directory for helm's files: %w", err)
	}
	return &rancherHelm{helm: helm, chart: charts[0], kubeconfig: r.in.Kubeconfig, home: home}, nil
}

func (h *rancherHelm) close() { _ = os.RemoveAll(h.home) }

// run runs helm with args in namespace and returns its standard output.
func (h *rancherHelm) run(ctx context.Context, namespace string, args ...string) ([]byte, error) {
	args = append(args, "--namespace", namespace)
	if h.kubeconfig != "" {
		args = append(args, "--kubeconfig", h.kubeconfig)
	}
	cmd := exec.CommandContext(ctx, h.helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// values is `helm get values rancher`: the values the user (here: rancherd and earlier
// upgrades) set, not the chart's defaults.
func (h *rancherHelm) values(ctx context.Context) (map[string]any, error) {
	out, err := h.run(ctx, rancher.CattleSystem, "get", "values", rancherRelease, "--output", "json")
	if err != nil {
		return nil, fmt.Errorf("read Rancher's Helm values: %w", err)
	}
	values := map[string]any{}
	if err := json.Unmarshal(out, &values); err != nil {
		return nil, fmt.Errorf("read Rancher's Helm values: not JSON: %w", err)
	}
	if values == nil {
		values = map[string]any{}
	}
	return values, nil
}

// upgrade is `helm upgrade rancher <chart> -f <values>` with description.
func (h *rancherHelm) upgrade(ctx context.Context, values map[string]any, description string) error {
	raw, err := json.Marshal(values)
	if err != nil {
		return err
	}
	file := filepath.Join(h.home, "values.json") // JSON is YAML
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		return fmt.Errorf("write Rancher's values for helm: %w", err)
	}
	if _, err := h.run(ctx, rancher.CattleSystem, "upgrade", rancherRelease, h.chart, "--values", file, "--description", description); err != nil {
		return fmt.Errorf("upgrade Rancher: %w", err)
	}
	return nil
}
