package clusterupgrade

import (
	"reflect"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

func TestBumpTimeoutAlwaysChangesIt(t *testing.T) {
	for cur, want := range map[int]int{0: 600, 599: 600, 600: 601, 799: 800, 800: 600, 900: 600} {
		if got := bumpTimeout(cur); got != want || got == cur {
			t.Errorf("bumpTimeout(%d) = %d, want %d (and a change)", cur, got, want)
		}
	}
}

func TestArgsRoundTrip(t *testing.T) {
	in := Input{Plan: "up-1", HarvesterVersion: "v1.6.0", PreviousVersion: "v1.5.1", KubeVirtVersion: "v1.5.0-150600.5.21.3", HarvesterChartVersion: "1.6.0", RancherVersion: "v2.12.0",
		RancherImage: "rancher/rancher", ClusterRepoImage: "mirror.local/rancher/harvester-cluster-repo:v1.6.0",
		RancherFeatures: "multi-cluster-management=false,turtles=false",
		RancherDependencies: releases.RancherDependencies{
			Fleet:          releases.ChartApp{Chart: "107.0.0+up0.13.0", App: "0.13.0"},
			FleetCRD:       releases.ChartApp{Chart: "107.0.0+up0.13.0", App: "0.13.0"},
			RancherWebhook: releases.ChartApp{Chart: "107.0.0+up0.8.0", App: "0.8.0"},
		},
		PollInterval: time.Second, ChartFailAfter: time.Minute, AddonUpgradeWait: 2 * time.Minute, Timeout: time.Hour}
	p := Progress{}
	p.ConfigMap.Namespace, p.ConfigMap.Name = "harvester-system", "up-1-progress"
	got, gotP, err := ParseArgs(Args(in, p))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in) || gotP.ConfigMap != p.ConfigMap {
		t.Errorf("round trip of %+v %s gave %+v %s", in, p.ConfigMap, got, gotP.ConfigMap)
	}
}

func TestRancherInputsAreChecked(t *testing.T) {
	base := Input{Plan: "up-1", HarvesterVersion: "v1.6.0", PreviousVersion: "v1.5.1", HarvesterChartVersion: "1.6.0", RancherVersion: "v2.12.0"}
	for name, tc := range map[string]struct {
		mutate func(*Input)
		want   string
	}{
		"features not flags":    {func(in *Input) { in.RancherFeatures = "turtles" }, `--rancher-features "turtles"`},
		"features with a space": {func(in *Input) { in.RancherFeatures = "a=true, b=false" }, "--rancher-features"},
		"one dependency only":   {func(in *Input) { in.RancherDependencies.Fleet.Chart = "107.0.0" }, "give all six"},
		"a dependency with a slash": {func(in *Input) {
			in.RancherDependencies = releases.RancherDependencies{Fleet: releases.ChartApp{Chart: "a/b", App: "1"}, FleetCRD: releases.ChartApp{Chart: "1", App: "1"}, RancherWebhook: releases.ChartApp{Chart: "1", App: "1"}}
		}, `--fleet-chart-version "a/b"`},
	} {
		in := base
		tc.mutate(&in)
		err := in.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %q", name, err, tc.want)
		}
	}
	if err := base.Validate(); err != nil {
		t.Errorf("without features and dependencies: %v", err)
	}
}

func TestJobShape(t *testing.T) {
	job := Job(JobInput{Plan: strings.Repeat("p", 60), Image: "capi-inplace:dev", Input: Input{HarvesterVersion: "v1.6.0"}})
	if len(job.Name) > 63 || !strings.HasPrefix(job.Name, strings.Repeat("p", 50)) {
		t.Errorf("Job name %q is not a SafeConcatName of the plan", job.Name)
	}
	if job.Namespace != DefaultNamespace || job.Spec.Template.Spec.ServiceAccountName != DefaultServiceAccount {
		t.Errorf("Job in %s as %s", job.Namespace, job.Spec.Template.Spec.ServiceAccountName)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if c.Name != "apply" || c.Command[0] != "/capi-inplace" || c.Args[1] != "cluster-upgrade" {
		t.Errorf("container %s runs %v %v", c.Name, c.Command, c.Args)
	}
	if *job.Spec.ActiveDeadlineSeconds != int64(DefaultActiveDeadline/time.Second) || *job.Spec.BackoffLimit != DefaultBackoffLimit {
		t.Errorf("deadline %d, backoff %d", *job.Spec.ActiveDeadlineSeconds, *job.Spec.BackoffLimit)
	}
	if job.Labels[LabelUpgradePlan] != strings.Repeat("p", 60) || job.Spec.Template.Labels[LabelComponent] != ComponentClusterUpgrade {
		t.Errorf("labels %v / %v", job.Labels, job.Spec.Template.Labels)
	}
	if !ptr.Deref(job.Spec.Template.Spec.SecurityContext.RunAsNonRoot, false) {
		t.Error("the pod may run as root")
	}
}

func TestJobState(t *testing.T) {
	job := &batchv1.Job{}
	job.Namespace, job.Name = "harvester-system", "up-cluster-upgrade"
	if done, failed, msg := JobState(job); done || failed || !strings.Contains(msg, "not started") {
		t.Errorf("new Job: %t %t %q", done, failed, msg)
	}
	job.Status.Active = 1
	if done, failed, msg := JobState(job); done || failed || !strings.Contains(msg, "running") {
		t.Errorf("running Job: %t %t %q", done, failed, msg)
	}
	failedJob := job.DeepCopy()
	failedJob.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "ManagedChart fleet-local/harvester failed"}}
	if done, failed, msg := JobState(failedJob); done || !failed || !strings.Contains(msg, "ManagedChart fleet-local/harvester failed") {
		t.Errorf("failed Job: %t %t %q", done, failed, msg)
	}
	job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	if done, failed, _ := JobState(job); !done || failed {
		t.Errorf("complete Job: %t %t", done, failed)
	}
}

func TestRefreshesRancherCharts(t *testing.T) {
	for target, want := range map[string]bool{
		"v1.6.1": false, "v1.7.0": false, "v1.7.1": false, "v1.7.2": true, "v1.7.3": true,
		"v1.8.0": false, "v1.8.1": true, "v1.8.2": true, "v1.9.0": true, "v2.0.0": true, "latest": false,
	} {
		if got := refreshesRancherCharts(target); got != want {
			t.Errorf("refreshesRancherCharts(%s) = %t, want %t (fact 40)", target, got, want)
		}
	}
}
