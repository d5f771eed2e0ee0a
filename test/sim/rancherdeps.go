package sim

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rancher/wrangler/v3/pkg/genericcondition"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

// Rancher's system charts. Rancher installs rancher-webhook, fleet-crd and fleet itself,
// with Helm, at the versions its build pins (rancher pkg/settings rancher-webhook-version,
// fleet-version), when it starts at a new version; a Harvester release names those
// versions in its metadata's rancherDependencies and waits for them after upgrading
// Rancher (harvester-release-steps.md fact 16.11; lib.sh detect_repo). The simulator
// plays that: once Rancher runs at a version (server-version written), each system chart
// whose newest Helm revision is not the one the version pins gets a new revision,
// pending-upgrade, which after SystemChartDelay is deployed (the previous deployed one
// superseded) and rolls the chart's Deployment (fleet-controller, rancher-webhook) to the
// new app version. Helm stores each revision as helm pkg/storage/driver/secrets.go does:
// Secret sh.helm.release.v1.<name>.v<revision>, type helm.sh/release.v1, labels owner,
// name, status, version, data "release" the release as JSON, gzipped, base64
// (util.go encodeRelease).

// DefaultRancherDependencies are the system chart versions the simulated Rancher
// rancherVersion pins: test values derived from the version (the facts do not name each
// Rancher's), so that a release metadata and the simulator can agree.
func DefaultRancherDependencies(rancherVersion string) releases.RancherDependencies {
	v, err := version.ParseGeneric(rancherVersion)
	if err != nil {
		return releases.RancherDependencies{}
	}
	minor, patch := v.Minor(), v.Patch()
	fleet := releases.ChartApp{Chart: fmt.Sprintf("1%02d.0.%d+up0.%d.%d", minor, patch, minor, patch), App: fmt.Sprintf("0.%d.%d", minor, patch)}
	return releases.RancherDependencies{
		Fleet:          fleet,
		FleetCRD:       fleet,
		RancherWebhook: releases.ChartApp{Chart: fmt.Sprintf("1%02d.0.%d+up0.%d.%d", minor, patch, minor-4, patch), App: fmt.Sprintf("0.%d.%d", minor-4, patch)},
	}
}

// systemChart is one of Rancher's system charts: its Helm release and the Deployment it
// runs (none for fleet-crd).
type systemChart struct {
	namespace, name string
	deployment      string
	image           string
	want            func(releases.RancherDependencies) releases.ChartApp
}

var systemCharts = []systemChart{
	{rancher.CattleSystem, rancher.RancherWebhookChart, rancher.RancherWebhookChart, "rancher/rancher-webhook", func(d releases.RancherDependencies) releases.ChartApp { return d.RancherWebhook }},
	{rancher.FleetNamespace, rancher.FleetCRDChart, "", "", func(d releases.RancherDependencies) releases.ChartApp { return d.FleetCRD }},
	{rancher.FleetNamespace, rancher.FleetChart, rancher.FleetControllerDeploy, "rancher/fleet", func(d releases.RancherDependencies) releases.ChartApp { return d.Fleet }},
}

// helmRelease is the part of Helm's release JSON the simulator writes.
type helmRelease struct {
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Version   int             `json:"version"`
	Info      helmReleaseInfo `json:"info"`
	Chart     struct {
		Metadata struct {
			Name       string `json:"name"`
			Version    string `json:"version"`
			AppVersion string `json:"appVersion"`
		} `json:"metadata"`
	} `json:"chart"`
}

type helmReleaseInfo struct {
	Status       string `json:"status"`
	LastDeployed string `json:"last_deployed"`
}

func helmReleaseSecret(sc systemChart, revision int, want releases.ChartApp, status string) (*corev1.Secret, error) {
	return helmReleaseSecretAt(sc, revision, want, status, time.Now())
}

func helmReleaseSecretAt(sc systemChart, revision int, want releases.ChartApp, status string, at time.Time) (*corev1.Secret, error) {
	rel := helmRelease{Name: sc.name, Namespace: sc.namespace, Version: revision, Info: helmReleaseInfo{Status: status, LastDeployed: at.UTC().Format(time.RFC3339Nano)}}
	rel.Chart.Metadata.Name, rel.Chart.Metadata.Version, rel.Chart.Metadata.AppVersion = sc.name, want.Chart, want.App
	raw, err := json.Marshal(rel)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(raw); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: sc.namespace, Name: fmt.Sprintf("sh.helm.release.v1.%s.v%d", sc.name, revision),
			Labels: map[string]string{"owner": "helm", "name": sc.name, "status": status, "version": strconv.Itoa(revision)},
		},
		Type: corev1.SecretType(rancher.HelmReleaseType),
		Data: map[string][]byte{"release": []byte(base64.StdEncoding.EncodeToString(buf.Bytes()))},
	}, nil
}

// StoreStuckSystemChart stores, over the newest revision of Rancher's system chart
// release (fleet, fleet-crd or rancher-webhook), a revision of chart at want left
// pending-upgrade since since: what an upgrade that died mid-way (Rancher restarted while
// its helm ran) leaves, and what the release's wait_helm_release rolls back once after 5
// minutes (fact 16.11). While it is there, the simulated Rancher upgrades nothing over
// it, as helm refuses to.
func StoreStuckSystemChart(ctx context.Context, c client.Client, release string, want releases.ChartApp, since time.Time) error {
	for _, sc := range systemCharts {
		if sc.name != release {
			continue
		}
		_, newest, err := systemChartRevisions(ctx, c, sc)
		if err != nil {
			return err
		}
		s, err := helmReleaseSecretAt(sc, newest+1, want, "pending-upgrade", since)
		if err != nil {
			return err
		}
		return c.Create(ctx, s)
	}
	return fmt.Errorf("%s is not one of Rancher's system charts", release)
}

// systemChartRevisions are the stored revisions of sc's release, by revision.
func systemChartRevisions(ctx context.Context, c client.Client, sc systemChart) (map[int]*corev1.Secret, int, error) {
	list := &corev1.SecretList{}
	if err := c.List(ctx, list, client.InNamespace(sc.namespace), client.MatchingLabels{"owner": "helm", "name": sc.name}); err != nil {
		return nil, 0, err
	}
	out := map[int]*corev1.Secret{}
	newest := 0
	for i := range list.Items {
		v, err := strconv.Atoi(list.Items[i].Labels["version"])
		if err != nil {
			continue
		}
		out[v] = &list.Items[i]
		newest = max(newest, v)
	}
	return out, newest, nil
}

// seedSystemCharts stores revision 1 of each system chart of deps, deployed, and creates
// the charts' Deployments rolled out at their app versions.
func seedSystemCharts(ctx context.Context, c client.Client, deps releases.RancherDependencies) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rancher.FleetNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", rancher.FleetNamespace, err)
	}
	for _, sc := range systemCharts {
		old := &corev1.SecretList{}
		if err := c.List(ctx, old, client.InNamespace(sc.namespace), client.MatchingLabels{"owner": "helm", "name": sc.name}); err != nil {
			return err
		}
		for i := range old.Items {
			if err := c.Delete(ctx, &old.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		s, err := helmReleaseSecret(sc, 1, sc.want(deps), "deployed")
		if err != nil {
			return err
		}
		if err := c.Create(ctx, s); err != nil {
			return fmt.Errorf("store the Helm release %s/%s: %w", sc.namespace, sc.name, err)
		}
		if sc.deployment == "" {
			continue
		}
		dep := seedDeployment(sc.deployment, sc.deployment, sc.image+":v"+sc.want(deps).App, 1)
		dep.Namespace = sc.namespace
		if err := recreate(ctx, c, dep); err != nil {
			return err
		}
		if err := rollOut(ctx, c, client.ObjectKeyFromObject(dep)); err != nil {
			return err
		}
	}
	return nil
}

// upgradeSystemCharts is what Rancher running at rancherVersion does to its system
// charts (see above).
func (r *Rancher) upgradeSystemCharts(ctx context.Context, rancherVersion string) error {
	r.mu.Lock()
	settled := r.systemChartsSettledAt == rancherVersion
	r.mu.Unlock()
	if settled {
		return nil // Rancher installs its charts when it starts at a version, not again
	}
	if r.startedAt != rancherVersion {
		// Rancher starts at this version.
		if err := ensureRancherChartRepos(ctx, r.Client, rancherVersion); err != nil {
			return err
		}
		r.startedAt = rancherVersion
	}
	if ok, err := r.chartsIndexed(ctx, rancherVersion); err != nil || !ok {
		return err // "Failed to find system chart fleet": nothing upgraded
	}
	deps := r.dependencies(rancherVersion)
	var errs []error
	pending := false
	defer func() {
		if !pending && errors.Join(errs...) == nil {
			r.mu.Lock()
			r.systemChartsSettledAt = rancherVersion
			r.mu.Unlock()
		}
	}()
	for _, sc := range systemCharts {
		want := sc.want(deps)
		if want.Chart == "" {
			continue
		}
		revs, newest, err := systemChartRevisions(ctx, r.Client, sc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cur := revs[newest]
		if cur != nil && cur.Labels["status"] == "deployed" && r.revisionIs(cur, want) {
			continue
		}
		pending = true
		if cur != nil && !r.revisionIs(cur, want) && strings.HasPrefix(cur.Labels["status"], "pending-") {
			// Another revision is pending (an upgrade that died): helm refuses to upgrade
			// over it ("another operation (install/upgrade/rollback) is in progress",
			// helm pkg/action/upgrade.go prepareUpgrade, errPending) until it is rolled
			// back, which the release's wait_helm_release does after 5 minutes (fact 16.11).
			continue
		}
		if cur == nil || !r.revisionIs(cur, want) {
			s, err := helmReleaseSecret(sc, newest+1, want, "pending-upgrade")
			if err == nil {
				err = client.IgnoreAlreadyExists(r.Client.Create(ctx, s))
			}
			errs = append(errs, err)
			continue
		}
		if !r.due(fmt.Sprintf("systemchart/%s/%d", sc.name, newest), orDefault(r.SystemChartDelay, 100*time.Millisecond)) {
			continue
		}
		errs = append(errs, r.deploySystemChart(ctx, sc, revs, newest, want))
	}
	return errors.Join(errs...)
}

// revisionIs says whether the stored revision s is the chart at want.
func (r *Rancher) revisionIs(s *corev1.Secret, want releases.ChartApp) bool {
	rel, err := rancher.DecodeHelmRelease(s.Data["release"])
	return err == nil && rel.Chart.Metadata.Version == want.Chart && rel.Chart.Metadata.AppVersion == want.App
}

// deploySystemChart marks revision newest deployed (and the deployed one before it
// superseded) and sets the chart's Deployment to the new app version.
func (r *Rancher) deploySystemChart(ctx context.Context, sc systemChart, revs map[int]*corev1.Secret, newest int, want releases.ChartApp) error {
	if sc.name == rancher.FleetChart {
		// The new fleet chart renders fleet-controller's configuration without the
		// cluster's API server (fleet.go). Helm applies a chart's objects before it
		// records the revision deployed (helm pkg/action/upgrade.go: the release is
		// stored as deployed after its resources are updated), so the configuration is
		// there by the time the release says deployed.
		if err := r.setFleetAPIServer(ctx, "", ""); err != nil {
			return err
		}
	}
	for v, s := range revs {
		if v != newest && s.Labels["status"] == "deployed" {
			s.Labels["status"] = "superseded"
			if err := r.Client.Update(ctx, s); err != nil {
				return err
			}
		}
	}
	deployed, err := helmReleaseSecret(sc, newest, want, "deployed")
	if err != nil {
		return err
	}
	cur := revs[newest]
	cur.Labels, cur.Data = deployed.Labels, deployed.Data
	if err := r.Client.Update(ctx, cur); err != nil {
		return err
	}
	r.mu.Lock()
	if r.systemChartDeployed == nil {
		r.systemChartDeployed = map[string]time.Time{}
	}
	r.systemChartDeployed[sc.name+"@"+want.Chart] = time.Now()
	r.mu.Unlock()
	if sc.deployment == "" {
		return nil
	}
	dep := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sc.namespace, Name: sc.deployment}, dep); err != nil {
		return client.IgnoreNotFound(err)
	}
	image := sc.image + ":v" + want.App
	if dep.Spec.Template.Spec.Containers[0].Image == image {
		return nil
	}
	dep.Spec.Template.Spec.Containers[0].Image = image
	return r.Client.Update(ctx, dep)
}

func (r *Rancher) dependencies(rancherVersion string) releases.RancherDependencies {
	if r.Dependencies != nil {
		return r.Dependencies(rancherVersion)
	}
	return DefaultRancherDependencies(rancherVersion)
}

// SystemChartDeployedAt is when the simulator deployed the system chart name (fleet,
// fleet-crd, rancher-webhook) at chart version chart; zero if it did not.
func (r *Rancher) SystemChartDeployedAt(name, chart string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.systemChartDeployed[name+"@"+chart]
}

// ChartVersionSeenAt is when the simulator first saw the ManagedChart name (in
// fleet-local) ask for version; zero if it did not.
func (r *Rancher) ChartVersionSeenAt(name, version string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chartVersionSeen[name+"@"+version]
}

func (r *Rancher) noteChartVersion(name, version string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.chartVersionSeen == nil {
		r.chartVersionSeen = map[string]time.Time{}
	}
	if _, ok := r.chartVersionSeen[name+"@"+version]; !ok {
		r.chartVersionSeen[name+"@"+version] = time.Now()
	}
}

// RancherDependenciesYAML is the rancherDependencies block of a harvester-release.yaml
// naming what the simulated Rancher rancherVersion installs (DefaultRancherDependencies),
// in the metadata's own layout (lib.sh detect_repo reads .rancherDependencies.<chart>.chart
// and .app).
func RancherDependenciesYAML(rancherVersion string) string {
	d := DefaultRancherDependencies(rancherVersion)
	var b strings.Builder
	fmt.Fprintf(&b, "# test values: what the simulated Rancher %s installs (sim.DefaultRancherDependencies)\nrancherDependencies:\n", rancherVersion)
	for _, c := range []struct {
		name string
		v    releases.ChartApp
	}{{"fleet", d.Fleet}, {"fleet-crd", d.FleetCRD}, {"rancher-webhook", d.RancherWebhook}} {
		fmt.Fprintf(&b, "  %s:\n    chart: %s\n    app: %s\n", c.name, c.v.Chart, c.v.App)
	}
	return b.String()
}

// Rancher's own chart repositories (harvester-release-steps.md fact 16.4). Rancher creates
// the ClusterRepos rancher-charts, rancher-rke2-charts and rancher-partner-charts, and its
// Setting chart-default-branch, when it starts and they are missing, indexed from the
// charts its build bundles (BundledChartsCommit). One that already exists keeps the index
// it has: an upgraded Rancher does not bring an old ClusterRepo's commit up to its own
// (rancher/rancher#36914, harvester#2011: "spec.gitBranch is dev-v2.6, but the
// status.commit still shows the old commit"), and then it finds no fleet chart as new as
// it requires ("Failed to find system chart fleet ... available chart version ... is less
// than the min version") and upgrades none of its system charts; the simulator does the
// same, so that Rancher's charts wait for ever unless the release's deletion came first.

var rancherChartRepos = []string{rancher.RancherChartsRepo, rancher.RancherRKE2ChartsRepo, rancher.RancherPartnerChartsRepo}

// BundledChartsCommit is the commit of the charts a simulated Rancher version bundles.
func BundledChartsCommit(rancherVersion string) string {
	return "bundled-charts-of-" + rancherVersion
}

func chartDefaultBranch(rancherVersion string) string {
	v, err := version.ParseGeneric(rancherVersion)
	if err != nil {
		return "release-v2"
	}
	return fmt.Sprintf("release-v%d.%d", v.Major(), v.Minor())
}

// ensureRancherChartRepos creates what Rancher at rancherVersion creates when it starts
// and finds missing (see above), the repositories downloaded.
func ensureRancherChartRepos(ctx context.Context, c client.Client, rancherVersion string) error {
	for _, name := range rancherChartRepos {
		repo := &catalogv1.ClusterRepo{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       catalogv1.RepoSpec{GitRepo: "https://git.rancher.io/" + strings.TrimPrefix(name, "rancher-"), GitBranch: chartDefaultBranch(rancherVersion)},
		}
		if err := c.Create(ctx, repo); apierrors.IsAlreadyExists(err) {
			continue
		} else if err != nil {
			return err
		}
		repo.Status.Commit = BundledChartsCommit(rancherVersion)
		repo.Status.DownloadTime = metav1.Now()
		repo.Status.Conditions = []genericcondition.GenericCondition{{Type: "Downloaded", Status: corev1.ConditionTrue}}
		if err := c.Status().Update(ctx, repo); err != nil {
			return err
		}
	}
	setting := &managementv3.Setting{ObjectMeta: metav1.ObjectMeta{Name: rancher.ChartDefaultBranchSetting}, Value: chartDefaultBranch(rancherVersion)}
	return client.IgnoreAlreadyExists(c.Create(ctx, setting))
}

// chartsIndexed says whether Rancher at rancherVersion finds its system charts: its
// rancher-charts ClusterRepo is indexed at the charts it bundles.
func (r *Rancher) chartsIndexed(ctx context.Context, rancherVersion string) (bool, error) {
	repo := &catalogv1.ClusterRepo{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: rancher.RancherChartsRepo}, repo); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return repo.Status.Commit == BundledChartsCommit(rancherVersion), nil
}
