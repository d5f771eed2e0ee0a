// Package clusterupgrade is the cluster-level part of a Harvester upgrade, run once per
// cluster and release in a Job on the workload cluster (`capi-inplace node
// cluster-upgrade`): what Harvester's upgrade_manifests.sh does to Rancher, the local
// provisioning Cluster, the chart repository and Harvester's ManagedCharts
// (shared/facts/harvester-node-upgrade.md, facts 40 to 42; the upgrade-toolkit runs the
// same script in its ClusterUpgrade phase, fact 51). It is a short list of named
// sub-steps (StepNames), each of which looks at the cluster first and does nothing when
// its work is already done, so a Job that is run again (a retry, a new pod after a node
// went away) resumes where the last one stopped. Each sub-step's state is written to a
// ConfigMap the caller names (ReadProgress reads it back).
//
// It does less than the script; what it leaves out is listed in Run's comment.
package clusterupgrade

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

// Input is everything the cluster upgrade needs to know; the Job carries each of it as a
// flag (Args), so the Job is self-contained.
type Input struct {
	// Plan names the upgrade (the UpgradePlan); it is written into the annotations of the
	// ManagedCharts, as Harvester writes its Upgrade's name (fact 41.13).
	Plan string
	// HarvesterVersion is the release upgraded to, such as v1.6.0.
	HarvesterVersion string
	// PreviousVersion is the Harvester release the nodes ran when the upgrade started
	// (the UpgradePlan's status.previousVersion), such as v1.7.1: what every
	// release-specific sub-step keys on, exactly as the release's script keys on its
	// Upgrade's status.previousVersion (harvester-release-steps.md facts 1 and 2).
	PreviousVersion string
	// KubeVirtVersion is the KubeVirt version the release ships (its metadata's
	// kubevirt), which WaitKubeVirt waits for (fact 23.5); empty when the release
	// metadata names none, and then that wait is Skipped.
	KubeVirtVersion string
	// HarvesterChartVersion is the version of the harvester and harvester-crd charts of
	// the release (its metadata's harvesterChart), such as 1.6.0.
	HarvesterChartVersion string
	// MonitoringChartVersion and LoggingChartVersion are the versions of the
	// rancher-monitoring and rancher-logging charts of the release (its metadata's
	// monitoringChart and loggingChart), to which the rancher-monitoring-crd and
	// rancher-logging-crd ManagedCharts are brought (fact 27); empty skips that chart.
	MonitoringChartVersion string
	LoggingChartVersion    string
	// LoggingEventRouterImage is the eventrouter image of the release (its metadata's
	// loggingChartHarvesterEventRouter), written into the rancher-logging add-on's event
	// tailer when its values name one (fact 29); empty leaves it.
	LoggingEventRouterImage string
	// RancherVersion is the Rancher version of the release, such as v2.12.0.
	RancherVersion string
	// RancherFeatures is the `features` value the release runs Rancher with
	// (releases.RancherFeatures, harvester-release-steps.md fact 42), set with Rancher's
	// upgrade as its container's CATTLE_FEATURES; empty leaves Rancher's features as they
	// are.
	RancherFeatures string
	// RancherDependencies are the versions of the charts Rancher installs itself (the
	// release metadata's rancherDependencies), which WaitRancherDependencies waits for
	// (fact 16.11); all six versions or none (then that wait is left out).
	RancherDependencies releases.RancherDependencies
	// RancherImage is the repository of Rancher's image; empty keeps the repository the
	// rancher Deployment already runs (a mirror stays a mirror) and changes its tag.
	RancherImage string
	// ClusterRepoImage is the harvester-cluster-repo image of the release; the default
	// (DefaultClusterRepoImage) is rancher/harvester-cluster-repo:<HarvesterVersion>.
	ClusterRepoImage string
	// ReleaseFiles is a directory holding the files the release's upgrade image
	// (rancher/harvester-upgrade:<release>) ships under /usr/local/share: addons/ (one
	// Addon per file, fact 29) and extra_manifests/cdi/ (fact 22). The Job's init
	// container copies them there (ReleaseFilesDir); empty skips ApplyExtraManifests and
	// UpgradeAddons, saying so.
	ReleaseFiles string
	// RancherInstaller is a directory holding the files of Rancher's installer image
	// (rancher/system-agent-installer-rancher:<RancherVersion>): helm and the Rancher
	// chart rancher-<version>.tgz, with which UpgradeRancher runs `helm upgrade rancher`
	// as the release does (fact 16.1). The Job's init containers copy them there
	// (RancherInstallerDir); without it Rancher cannot be upgraded and that sub-step
	// fails, saying so.
	RancherInstaller string
	// Kubeconfig is the kubeconfig file helm uses; empty uses the pod's service account,
	// as in the Job. Only a run outside a pod (a test) sets it.
	Kubeconfig string

	// PollInterval is how often a wait looks again. Default 5s, as wait_managed_chart
	// (fact 42).
	PollInterval time.Duration
	// ChartFailAfter is how long a ManagedChart may report a failed apply before the
	// upgrade gives up on it (Fleet retries Helm meanwhile). Default 5m.
	ChartFailAfter time.Duration
	// FleetBundlesWait bounds the wait for Fleet's bundles at the end, which never fails
	// the upgrade (fact 31: wait_for_fleet_bundles 9, nine looks ten seconds apart).
	// Default 90s.
	FleetBundlesWait time.Duration
	// HelmPendingRollbackAfter is how long a revision of one of Rancher's system charts
	// may stay pending, at another chart than the release's, before WaitRancherDependencies
	// rolls the release back once to its last deployed revision, so that Rancher can
	// upgrade it (wait_helm_release, fact 16.11). Default 5m, as the script.
	HelmPendingRollbackAfter time.Duration
	// AddonUpgradeWait bounds, for each add-on UpgradeAddons changed that was enabled and
	// deployed before (rancher-monitoring, rancher-logging), the wait for Harvester to
	// report it AddonDeploySuccessful again, which never fails the upgrade (fact 29:
	// wait_for_addon_upgrade_deployment, sixty looks five seconds apart). Default 300s.
	AddonUpgradeWait time.Duration
	// CAPIStableFor is how long, for a target from v1.8.1 on, the Cluster API Cluster
	// fleet-local/local must stay Provisioned at its generation before and after Rancher's
	// upgrade (wait_capi_cluster, facts 16.3, 16.14 and 40: 30 s, looking every 5 s).
	// Default 30s, as the release, whatever PollInterval is; shorter only for simulated
	// clusters.
	CAPIStableFor time.Duration
	// Timeout bounds the whole run; 0 leaves it to the caller's context.
	Timeout time.Duration

	// Clock is the time the run records and measures with. Default the real clock.
	Clock clock.WithTicker
}

// Progress is where the run reports how far it got.
type Progress struct {
	// ConfigMap is the ConfigMap on the workload cluster that holds each sub-step's
	// state; Run creates it when it is missing.
	ConfigMap client.ObjectKey
	// Log receives a line per thing done or waited for; nil writes nothing.
	Log io.Writer
}

// DefaultClusterRepoImage is the image of harvester-cluster-repo of a release (fact 41.11).
func DefaultClusterRepoImage(harvesterVersion string) string {
	return "rancher/harvester-cluster-repo:" + harvesterVersion
}

const (
	defaultPollInterval     = 5 * time.Second
	defaultChartFailAfter   = 5 * time.Minute
	defaultFleetBundlesWait = 90 * time.Second
	defaultPendingRollback  = 5 * time.Minute
	defaultAddonUpgradeWait = 300 * time.Second
	// defaultCAPIStableFor is the release's wait_capi_cluster window (fact 40).
	defaultCAPIStableFor = 30 * time.Second
)

func (in Input) withDefaults() Input {
	if in.ClusterRepoImage == "" && in.HarvesterVersion != "" {
		in.ClusterRepoImage = DefaultClusterRepoImage(in.HarvesterVersion)
	}
	if in.PollInterval <= 0 {
		in.PollInterval = defaultPollInterval
	}
	if in.ChartFailAfter <= 0 {
		in.ChartFailAfter = defaultChartFailAfter
	}
	if in.FleetBundlesWait <= 0 {
		in.FleetBundlesWait = defaultFleetBundlesWait
	}
	if in.HelmPendingRollbackAfter <= 0 {
		in.HelmPendingRollbackAfter = defaultPendingRollback
	}
	if in.AddonUpgradeWait <= 0 {
		in.AddonUpgradeWait = defaultAddonUpgradeWait
	}
	if in.CAPIStableFor <= 0 {
		in.CAPIStableFor = defaultCAPIStableFor
	}
	if in.Clock == nil {
		in.Clock = clock.RealClock{}
	}
	return in
}

var (
	// releaseVersion is a Harvester or Rancher release: v1.6.0, v1.6.0-rc1, v2.12.0-alpha5.
	releaseVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
	// chartVersion is a Helm chart version: 1.6.0, 1.6.0-rc1 (no leading v).
	chartVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	// imageRef is an image reference with a tag or digest.
	imageRef = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9_.-]*|@sha256:[a-f0-9]{64})$`)
	// plainVersion is a version as a release's metadata names it (KubeVirt's, a chart's
	// app version): no spaces, no slashes.
	plainVersion = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]{0,127}$`)
	// rancherFeatures is a comma-separated list of Rancher feature flags, name=true|false.
	rancherFeatures = regexp.MustCompile(`^[a-z0-9-]+=(true|false)(,[a-z0-9-]+=(true|false))*$`)
	// imageRepo is an image repository without tag or digest.
	imageRepo = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?(:[0-9]+/[a-z0-9._/-]*[a-z0-9])?$`)
)

// Validate says what is wrong with the input, every problem at once, or nil.
func (in Input) Validate() error {
	var errs []error
	if in.Plan == "" {
		errs = append(errs, errors.New("--plan is required: the name of the upgrade plan this run belongs to"))
	} else if msgs := validation.IsDNS1123Subdomain(in.Plan); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--plan %q is not a valid object name: %s", in.Plan, strings.Join(msgs, "; ")))
	}
	if !releaseVersion.MatchString(in.HarvesterVersion) {
		errs = append(errs, fmt.Errorf("--harvester-version %q must be a release such as v1.6.0", in.HarvesterVersion))
	}
	if in.PreviousVersion == "" {
		errs = append(errs, errors.New("--previous-version is required: the Harvester release the nodes ran when the upgrade started (the UpgradePlan's status.previousVersion), such as v1.7.1"))
	} else if !releaseVersion.MatchString(in.PreviousVersion) {
		errs = append(errs, fmt.Errorf("--previous-version %q must be a release such as v1.7.1 (the UpgradePlan's status.previousVersion)", in.PreviousVersion))
	}
	if in.KubeVirtVersion != "" && !plainVersion.MatchString(in.KubeVirtVersion) {
		errs = append(errs, fmt.Errorf("--kubevirt-version %q must be a KubeVirt version such as v1.6.0 (the release metadata's kubevirt), or empty", in.KubeVirtVersion))
	}
	if !chartVersion.MatchString(in.HarvesterChartVersion) {
		errs = append(errs, fmt.Errorf("--harvester-chart-version %q must be a chart version such as 1.6.0 (the release metadata's harvesterChart)", in.HarvesterChartVersion))
	}
	for _, c := range []struct{ flag, value, field string }{
		{"monitoring-chart-version", in.MonitoringChartVersion, "monitoringChart"},
		{"logging-chart-version", in.LoggingChartVersion, "loggingChart"},
	} {
		if c.value != "" && !chartVersion.MatchString(c.value) {
			errs = append(errs, fmt.Errorf("--%s %q must be a chart version such as 105.1.2+up61.3.2 (the release metadata's %s), or empty", c.flag, c.value, c.field))
		}
	}
	if !releaseVersion.MatchString(in.RancherVersion) {
		errs = append(errs, fmt.Errorf("--rancher-version %q must be a Rancher release such as v2.12.0", in.RancherVersion))
	}
	if in.RancherFeatures != "" && !rancherFeatures.MatchString(in.RancherFeatures) {
		errs = append(errs, fmt.Errorf("--rancher-features %q must be Rancher feature flags such as multi-cluster-management=false,turtles=false, or empty", in.RancherFeatures))
	}
	errs = append(errs, validateDependencies(in.RancherDependencies)...)
	if in.RancherImage != "" && !imageRepo.MatchString(in.RancherImage) {
		errs = append(errs, fmt.Errorf("--rancher-image %q must be an image repository without tag, such as rancher/rancher", in.RancherImage))
	}
	if in.ClusterRepoImage != "" && !imageRef.MatchString(in.ClusterRepoImage) {
		errs = append(errs, fmt.Errorf("--cluster-repo-image %q must be an image with a tag or digest, such as rancher/harvester-cluster-repo:v1.6.0", in.ClusterRepoImage))
	}
	if in.RancherInstaller != "" && !strings.HasPrefix(in.RancherInstaller, "/") {
		errs = append(errs, fmt.Errorf("--rancher-installer %q must be an absolute directory, such as %s", in.RancherInstaller, RancherInstallerDir))
	}
	if in.ReleaseFiles != "" && !strings.HasPrefix(in.ReleaseFiles, "/") {
		errs = append(errs, fmt.Errorf("--release-files %q must be an absolute directory, such as %s", in.ReleaseFiles, ReleaseFilesDir))
	}
	if in.PollInterval < 0 || in.ChartFailAfter < 0 || in.FleetBundlesWait < 0 || in.AddonUpgradeWait < 0 || in.HelmPendingRollbackAfter < 0 || in.CAPIStableFor < 0 || in.Timeout < 0 {
		errs = append(errs, errors.New("--poll-interval, --chart-fail-after, --fleet-bundles-wait, --addon-upgrade-wait, --helm-pending-rollback-after, --capi-stable-for and --timeout must not be negative"))
	}
	return errors.Join(errs...)
}

// dependencyFlag is one chart of RancherDependencies as flags.
type dependencyFlag struct {
	name, flag string
	chart, app *string
}

func dependencyFlags(d *releases.RancherDependencies) []dependencyFlag {
	return []dependencyFlag{
		{rancher.FleetChart, "fleet", &d.Fleet.Chart, &d.Fleet.App},
		{rancher.FleetCRDChart, "fleet-crd", &d.FleetCRD.Chart, &d.FleetCRD.App},
		{rancher.RancherWebhookChart, "rancher-webhook", &d.RancherWebhook.Chart, &d.RancherWebhook.App},
	}
}

// validateDependencies checks that all six versions or none are given, each well formed.
func validateDependencies(d releases.RancherDependencies) []error {
	var errs []error
	given := 0
	for _, f := range dependencyFlags(&d) {
		for _, v := range []struct{ flag, value string }{{f.flag + "-chart-version", *f.chart}, {f.flag + "-app-version", *f.app}} {
			if v.value == "" {
				continue
			}
			given++
			if !plainVersion.MatchString(v.value) {
				errs = append(errs, fmt.Errorf("--%s %q must be a version such as 107.0.0+up0.13.0 or v0.13.0 (the release metadata's rancherDependencies)", v.flag, v.value))
			}
		}
	}
	if given != 0 && given != 6 {
		errs = append(errs, errors.New("--fleet-, --fleet-crd- and --rancher-webhook-chart-version and -app-version: give all six (the release metadata's rancherDependencies) or none"))
	}
	return errs
}

// Validate says what is wrong with where progress goes, or nil.
func (p Progress) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(p.ConfigMap.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--progress-namespace %q: %s", p.ConfigMap.Namespace, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Subdomain(p.ConfigMap.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--progress-name %q: %s", p.ConfigMap.Name, strings.Join(msgs, "; ")))
	}
	return errors.Join(errs...)
}

// BindFlags adds the flags of `capi-inplace node cluster-upgrade` to fs, writing into in
// and p. Args is their inverse.
func BindFlags(fs *flag.FlagSet, in *Input, p *Progress) {
	fs.StringVar(&in.Plan, "plan", in.Plan, "name of the upgrade plan (recorded on the charts)")
	fs.StringVar(&in.HarvesterVersion, "harvester-version", in.HarvesterVersion, "Harvester release upgraded to, such as v1.6.0")
	fs.StringVar(&in.PreviousVersion, "previous-version", in.PreviousVersion, "Harvester release the nodes ran when the upgrade started, such as v1.7.1 (required)")
	fs.StringVar(&in.KubeVirtVersion, "kubevirt-version", in.KubeVirtVersion, "KubeVirt version of the release (its metadata's kubevirt); empty skips the wait for KubeVirt")
	fs.StringVar(&in.HarvesterChartVersion, "harvester-chart-version", in.HarvesterChartVersion, "version of the harvester and harvester-crd charts, such as 1.6.0")
	fs.StringVar(&in.MonitoringChartVersion, "monitoring-chart-version", in.MonitoringChartVersion, "version of the rancher-monitoring charts (the release metadata's monitoringChart); empty leaves rancher-monitoring-crd as it is")
	fs.StringVar(&in.LoggingChartVersion, "logging-chart-version", in.LoggingChartVersion, "version of the rancher-logging charts (the release metadata's loggingChart); empty leaves rancher-logging-crd as it is")
	fs.StringVar(&in.LoggingEventRouterImage, "logging-eventrouter-image", in.LoggingEventRouterImage, "eventrouter image of the release (its metadata's loggingChartHarvesterEventRouter) for the rancher-logging add-on's event tailer; empty leaves it")
	fs.StringVar(&in.RancherVersion, "rancher-version", in.RancherVersion, "Rancher release of the Harvester release, such as v2.12.0")
	fs.StringVar(&in.RancherFeatures, "rancher-features", in.RancherFeatures, "Rancher's features value the release runs it with (CATTLE_FEATURES); empty leaves them")
	for _, d := range dependencyFlags(&in.RancherDependencies) {
		fs.StringVar(d.chart, d.flag+"-chart-version", *d.chart, "chart version of "+d.name+" (the release metadata's rancherDependencies)")
		fs.StringVar(d.app, d.flag+"-app-version", *d.app, "app version of "+d.name+" (the release metadata's rancherDependencies)")
	}
	fs.StringVar(&in.RancherImage, "rancher-image", in.RancherImage, "Rancher image repository; empty keeps the rancher Deployment's")
	fs.StringVar(&in.ClusterRepoImage, "cluster-repo-image", in.ClusterRepoImage, "harvester-cluster-repo image; default rancher/harvester-cluster-repo:<harvester-version>")
	fs.StringVar(&in.ReleaseFiles, "release-files", in.ReleaseFiles, "directory with the release upgrade image's addons/ and extra_manifests/; empty skips the add-ons and extra manifests")
	fs.StringVar(&in.RancherInstaller, "rancher-installer", in.RancherInstaller, "directory with helm and the Rancher chart of Rancher's system-agent-installer-rancher image; empty leaves Rancher un-upgradable")
	fs.StringVar(&in.Kubeconfig, "kubeconfig", in.Kubeconfig, "kubeconfig file helm uses; empty uses the pod's service account")
	fs.DurationVar(&in.PollInterval, "poll-interval", in.PollInterval, "how often waits look again (default 5s)")
	fs.DurationVar(&in.ChartFailAfter, "chart-fail-after", in.ChartFailAfter, "how long a ManagedChart may report a failed apply before the upgrade fails (default 5m)")
	fs.DurationVar(&in.FleetBundlesWait, "fleet-bundles-wait", in.FleetBundlesWait, "how long to wait at the end for Fleet's bundles to be ready, never failing (default 90s)")
	fs.DurationVar(&in.HelmPendingRollbackAfter, "helm-pending-rollback-after", in.HelmPendingRollbackAfter, "how long a revision of Rancher's fleet, fleet-crd or rancher-webhook chart may stay pending at another chart before it is rolled back once (default 5m)")
	fs.DurationVar(&in.AddonUpgradeWait, "addon-upgrade-wait", in.AddonUpgradeWait, "how long to wait for each changed add-on that was deployed to be deployed again, never failing (default 5m0s)")
	fs.DurationVar(&in.CAPIStableFor, "capi-stable-for", in.CAPIStableFor, "for a target from v1.8.1 on, how long the Cluster API Cluster fleet-local/local must stay Provisioned at its generation before and after Rancher's upgrade (default 30s, as the release; shorter only for simulated clusters)")
	fs.DurationVar(&in.Timeout, "timeout", in.Timeout, "bound on the whole run; 0 is none")
	fs.StringVar(&p.ConfigMap.Namespace, "progress-namespace", p.ConfigMap.Namespace, "namespace of the progress ConfigMap")
	fs.StringVar(&p.ConfigMap.Name, "progress-name", p.ConfigMap.Name, "name of the progress ConfigMap")
}

// Args are the flags that BindFlags parses back into in and p (zero values left out).
func Args(in Input, p Progress) []string {
	var args []string
	add := func(name, value string) {
		if value != "" {
			args = append(args, "--"+name+"="+value)
		}
	}
	dur := func(name string, d time.Duration) {
		if d != 0 {
			add(name, d.String())
		}
	}
	add("plan", in.Plan)
	add("harvester-version", in.HarvesterVersion)
	add("previous-version", in.PreviousVersion)
	add("kubevirt-version", in.KubeVirtVersion)
	add("harvester-chart-version", in.HarvesterChartVersion)
	add("monitoring-chart-version", in.MonitoringChartVersion)
	add("logging-chart-version", in.LoggingChartVersion)
	add("logging-eventrouter-image", in.LoggingEventRouterImage)
	add("rancher-version", in.RancherVersion)
	add("rancher-features", in.RancherFeatures)
	for _, d := range dependencyFlags(&in.RancherDependencies) {
		add(d.flag+"-chart-version", *d.chart)
		add(d.flag+"-app-version", *d.app)
	}
	add("rancher-image", in.RancherImage)
	add("cluster-repo-image", in.ClusterRepoImage)
	add("release-files", in.ReleaseFiles)
	add("rancher-installer", in.RancherInstaller)
	add("kubeconfig", in.Kubeconfig)
	dur("poll-interval", in.PollInterval)
	dur("chart-fail-after", in.ChartFailAfter)
	dur("fleet-bundles-wait", in.FleetBundlesWait)
	dur("helm-pending-rollback-after", in.HelmPendingRollbackAfter)
	dur("addon-upgrade-wait", in.AddonUpgradeWait)
	dur("capi-stable-for", in.CAPIStableFor)
	dur("timeout", in.Timeout)
	add("progress-namespace", p.ConfigMap.Namespace)
	add("progress-name", p.ConfigMap.Name)
	return args
}

// ParseArgs parses the flags of `capi-inplace node cluster-upgrade` (without those two
// words) and checks them. The test simulator's Job runner uses it to run a Job's
// arguments as the node program would.
func ParseArgs(args []string) (Input, Progress, error) {
	var in Input
	var p Progress
	fs := flag.NewFlagSet("cluster-upgrade", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	BindFlags(fs, &in, &p)
	if err := fs.Parse(args); err != nil {
		return in, p, err
	}
	if fs.NArg() > 0 {
		return in, p, fmt.Errorf("unexpected arguments %q; every input is a flag", fs.Args())
	}
	return in, p, errors.Join(in.Validate(), p.Validate())
}
