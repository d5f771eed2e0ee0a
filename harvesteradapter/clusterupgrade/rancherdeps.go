package clusterupgrade

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

// systemChart is one of the Helm releases Rancher installs itself, at the version the
// release metadata names.
type systemChart struct {
	namespace, name string
	want            releases.ChartApp
}

func (in Input) systemCharts() []systemChart {
	d := in.RancherDependencies
	return []systemChart{
		{rancher.FleetNamespace, rancher.FleetChart, d.Fleet},
		{rancher.FleetNamespace, rancher.FleetCRDChart, d.FleetCRD},
		{rancher.CattleSystem, rancher.RancherWebhookChart, d.RancherWebhook},
	}
}

// waitRancherDependencies is the rest of upgrade_rancher after Rancher runs at the new
// version (harvester-release-steps.md fact 16.11 to 16.13): Rancher, once upgraded,
// upgrades the charts it installs itself (fleet, fleet-crd, rancher-webhook; rancher
// pkg/settings rancher-webhook-version and fleet-version), and the release waits for
// their Helm releases at the versions its metadata names (wait_helm_release: the newest
// revision's chart and app version, deployed), then for the rollouts of rancher,
// fleet-controller and rancher-webhook, and creates the empty Secret
// cattle-system/stv-aggregation when it is missing. Without these waits the chart patches
// that follow land while Fleet's controller is replaced (fact 16, "if the waits are
// skipped"). Skipped, as in the script, when Rancher was already at the release's
// version (UpgradeRancher Skipped).
//
// Releases from v1.7.2 and v1.8.1 on first force a refresh of the rancher-charts
// ClusterRepo's index (force_refresh_clusterrepo, fact 16.10 and fact 40; absent in
// v1.8.0), and so does this for those targets.
//
// A release whose newest revision has stayed pending at another chart for more than
// HelmPendingRollbackAfter is rolled back once, with the helm of Rancher's installer
// image, to its last deployed revision, as the script does: helm upgrades nothing over a
// pending revision, so Rancher could never install the release's chart. The local fleet-agent's redeploy and the waits for the local Fleet
// cluster that follow (16.14 to 16.16) are the next sub-step, SettleFleetAgent.
func (r *runner) waitRancherDependencies(ctx context.Context) (StepState, string, error) {
	if r.prior[StepWaitRancherDependencies].State == StateDone {
		return StateDone, "Rancher's charts were deployed at the release's versions (done by an earlier run)", nil
	}
	if r.current[StepUpgradeRancher].State == StateSkipped {
		return StateSkipped, fmt.Sprintf("Rancher was already at %s: the release waits for Rancher's own charts only after it upgraded Rancher", r.in.RancherVersion), nil
	}
	refreshed := ""
	if refreshesRancherCharts(r.in.HarvesterVersion) {
		if err := r.forceRefresh(ctx, rancher.RancherChartsRepo); err != nil {
			return "", "", err
		}
		refreshed = "ClusterRepo " + rancher.RancherChartsRepo + " refreshed; "
	}
	var done []string
	if r.in.RancherDependencies.Complete() {
		for _, sc := range r.in.systemCharts() {
			if err := r.waitHelmRelease(ctx, sc); err != nil {
				return "", "", err
			}
			done = append(done, fmt.Sprintf("%s %s-%s (%s)", sc.name, sc.name, sc.want.Chart, sc.want.App))
		}
	}
	deployments := []client.ObjectKey{
		rancherKey,
		{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerDeploy},
		{Namespace: rancher.CattleSystem, Name: rancher.RancherWebhookChart},
	}
	for _, key := range deployments {
		if err := r.waitRolledOut(ctx, key); err != nil {
			return "", "", err
		}
	}
	created, err := r.ensureSTVAggregation(ctx)
	if err != nil {
		return "", "", err
	}
	msg := refreshed + "Helm releases not checked: the release metadata names no rancherDependencies"
	if len(done) > 0 {
		msg = refreshed + "Helm releases deployed: " + strings.Join(done, ", ")
	}
	msg += "; Deployments rancher, fleet-controller and rancher-webhook rolled out; Secret cattle-system/stv-aggregation " + created
	return StateDone, msg, nil
}

// waitHelmRelease waits until the newest revision of sc's Helm release is its chart at
// the wanted versions, deployed (wait_helm_release, fact 16.11).
func (r *runner) waitHelmRelease(ctx context.Context, sc systemChart) error {
	chartRef := sc.name + "-" + sc.want.Chart
	what := fmt.Sprintf("Helm release %s/%s to be %s (app %s), deployed", sc.namespace, sc.name, chartRef, sc.want.App)
	remedy := fmt.Sprintf("Rancher installs it once it runs at %s; look at `helm -n %s history %s` and Rancher's logs. A revision pending at another chart for more than %s is rolled back once to the last deployed revision, as the release's script does; a revision pending at the release's chart is Rancher's own upgrade under way", r.in.RancherVersion, sc.namespace, sc.name, r.in.HelmPendingRollbackAfter)
	rolledBack := false
	return r.poll(ctx, what, remedy, func(ctx context.Context) (bool, string, error) {
		rel, err := rancher.NewestHelmRelease(ctx, r.c, sc.namespace, sc.name)
		if err != nil {
			return false, "", err
		}
		if rel == nil {
			return false, "no revision stored", nil
		}
		status := fmt.Sprintf("revision %d: %s (app %s) %s", rel.Version, rel.ChartRef(), rel.Chart.Metadata.AppVersion, rel.Info.Status)
		wanted := rel.ChartRef() == chartRef && rel.Chart.Metadata.AppVersion == sc.want.App
		if strings.HasPrefix(rel.Info.Status, "pending-") && rel.Info.LastDeployed != "" {
			status += " since " + rel.Info.LastDeployed
			since, err := time.Parse(time.RFC3339Nano, rel.Info.LastDeployed)
			if !wanted && !rolledBack && err == nil && r.in.Clock.Since(since) > r.in.HelmPendingRollbackAfter {
				rolledBack = true
				status += "; " + r.rollBackHelmRelease(ctx, sc.namespace, sc.name, rel.Version)
			}
		}
		return wanted && rel.Info.Status == "deployed", status, nil
	})
}

// rollBackHelmRelease rolls the Helm release namespace/name back to its last deployed
// revision with helm rollback --wait, as wait_helm_release does once for a stuck
// revision (fact 16.11), and says what it did. As in the script, a release without a
// deployed revision, or a rollback that fails, is only reported, and the wait goes on.
func (r *runner) rollBackHelmRelease(ctx context.Context, namespace, name string, stuck int) string {
	list := &corev1.SecretList{}
	if err := r.c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{"owner": "helm", "name": name, "status": "deployed"}); err != nil {
		return fmt.Sprintf("could not look for a deployed revision to roll back to: %v", err)
	}
	last := 0
	for _, s := range list.Items {
		if v, err := strconv.Atoi(s.Labels["version"]); err == nil && v > last {
			last = v
		}
	}
	if last == 0 {
		return "no deployed revision to roll back to"
	}
	h, err := r.rancherHelm()
	if err != nil {
		return fmt.Sprintf("not rolled back to revision %d: %v", last, err)
	}
	defer h.close()
	if _, err := h.run(ctx, namespace, "rollback", name, strconv.Itoa(last), "--wait"); err != nil {
		return fmt.Sprintf("the rollback from revision %d to %d failed: %v", stuck, last, err)
	}
	r.logf("Helm release %s/%s rolled back from its stuck revision %d to revision %d", namespace, name, stuck, last)
	return fmt.Sprintf("rolled back from revision %d to revision %d", stuck, last)
}

// ensureSTVAggregation creates the empty Secret cattle-system/stv-aggregation when it is
// missing, so that Rancher's system-agent-upgrader plan becomes ready (fact 16.13).
func (r *runner) ensureSTVAggregation(ctx context.Context) (string, error) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: rancher.CattleSystem, Name: rancher.STVAggregationSecret}}
	err := r.c.Create(ctx, s)
	switch {
	case err == nil:
		return "created", nil
	case apierrors.IsAlreadyExists(err):
		return "present", nil
	default:
		return "", fmt.Errorf("create the Secret %s/%s: %w", rancher.CattleSystem, rancher.STVAggregationSecret, err)
	}
}

// refreshesRancherCharts says whether the release target refreshes the rancher-charts
// index after Rancher's upgrade: v1.7.2 and later v1.7 releases, v1.8.1 and later, and
// every later minor (fact 40).
func refreshesRancherCharts(target string) bool {
	v, err := version.ParseGeneric(target)
	if err != nil {
		return false
	}
	switch {
	case v.Major() != 1:
		return v.Major() > 1
	case v.Minor() == 7:
		return v.Patch() >= 2
	case v.Minor() == 8:
		return v.Patch() >= 1
	default:
		return v.Minor() > 8
	}
}

// forceRefresh asks Rancher to download the index of the ClusterRepo name again and
// waits until it did, as force_refresh_clusterrepo does (fact 16.10): once the repository
// exists and was downloaded, spec.forceUpdate is set to a second after its last
// download, and the index counts as refreshed when status.downloadTime reaches it.
func (r *runner) forceRefresh(ctx context.Context, name string) error {
	key := client.ObjectKey{Name: name}
	var last metav1.Time
	err := r.poll(ctx, fmt.Sprintf("ClusterRepo %s to exist and have downloaded its index", name), "Rancher creates it when it starts; look at Rancher's logs",
		func(ctx context.Context) (bool, string, error) {
			repo := &catalogv1.ClusterRepo{}
			if err := r.c.Get(ctx, key, repo); apierrors.IsNotFound(err) {
				return false, "not found", nil
			} else if err != nil {
				return false, "", fmt.Errorf("read ClusterRepo %s: %w", name, err)
			}
			last = repo.Status.DownloadTime
			return !last.IsZero(), "no downloadTime yet", nil
		})
	if err != nil {
		return err
	}
	force := metav1.NewTime(last.Truncate(time.Second).Add(time.Second))
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"forceUpdate":%q}}`, force.UTC().Format(time.RFC3339))))
	if err := r.c.Patch(ctx, &catalogv1.ClusterRepo{ObjectMeta: metav1.ObjectMeta{Name: name}}, patch); err != nil {
		return fmt.Errorf("set spec.forceUpdate of ClusterRepo %s: %w", name, err)
	}
	return r.waitIndexDownloaded(ctx, name, &force, "Rancher downloads it; look at the ClusterRepo's conditions and Rancher's logs")
}
