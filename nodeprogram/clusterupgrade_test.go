package nodeprogram

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
)

var clusterUpgradeArgs = []string{
	"cluster-upgrade", "--plan=up-1", "--harvester-version=v1.6.0", "--previous-version=v1.5.1", "--harvester-chart-version=1.6.0",
	"--rancher-version=v2.12.0", "--progress-namespace=harvester-system", "--progress-name=up-1-progress",
	"--poll-interval=10ms", "--timeout=5s",
}

// runClusterUpgradeWith runs `node cluster-upgrade args` with newClient as the cluster.
func runClusterUpgradeWith(t *testing.T, newClient func() (client.Client, error), args ...string) result {
	t.Helper()
	termination := filepath.Join(t.TempDir(), "termination-log")
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), append([]string{"--termination-log=" + termination}, args...),
		&Env{Host: newFakeHost(t), Stdout: &stdout, Stderr: &stderr, Client: newClient})
	data, err := os.ReadFile(termination)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String(), termination: string(data)}
}

func TestClusterUpgradeFlags(t *testing.T) {
	unreachable := func() (client.Client, error) { return nil, errors.New("no route to host") }
	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{name: "every flag given: the client is asked for", args: clusterUpgradeArgs, code: ExitRetry, want: []string{"not done yet: reach the API server: no route to host"}},
		{name: "nothing given", args: []string{"cluster-upgrade"}, code: ExitUsage,
			want: []string{"--plan is required", `--harvester-version ""`, "--previous-version is required", `--harvester-chart-version ""`, `--rancher-version ""`, `--progress-name ""`}},
		{name: "a chart version with a v", args: append(append([]string(nil), clusterUpgradeArgs...), "--harvester-chart-version=v1.6.0"), code: ExitUsage,
			want: []string{`--harvester-chart-version "v1.6.0" must be a chart version`}},
		{name: "a cluster repo image without tag", args: append(append([]string(nil), clusterUpgradeArgs...), "--cluster-repo-image=rancher/harvester-cluster-repo"), code: ExitUsage,
			want: []string{"--cluster-repo-image"}},
		{name: "unknown flag", args: append(append([]string(nil), clusterUpgradeArgs...), "--version=v1.6.0"), code: ExitUsage, want: []string{"flag provided but not defined: -version"}},
		{name: "positional argument", args: append(append([]string(nil), clusterUpgradeArgs...), "now"), code: ExitUsage, want: []string{`unexpected arguments ["now"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runClusterUpgradeWith(t, unreachable, tt.args...)
			r.expect(t, tt.code, tt.want...)
		})
	}
}

// The program runs clusterupgrade.Run with the client it was given: on an empty cluster
// the first sub-step that needs a Harvester object fails reading the harvester
// ManagedChart, and the progress ConfigMap the flags name records it.
func TestClusterUpgradeRunsWithTheGivenClient(t *testing.T) {
	s, err := ClusterScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).Build()
	r := runClusterUpgradeWith(t, func() (client.Client, error) { return c, nil }, clusterUpgradeArgs...)
	r.expect(t, ExitFailed, "cluster upgrade step DisableKubeVirtWorkloadUpdates", "read ManagedChart fleet-local/harvester")
	steps, err := clusterupgrade.ReadProgress(context.Background(), c, client.ObjectKey{Namespace: "harvester-system", Name: "up-1-progress"})
	if err != nil {
		t.Fatal(err)
	}
	var failed *clusterupgrade.StepProgress
	for i := range steps {
		if steps[i].State == clusterupgrade.StateFailed {
			failed = &steps[i]
			break
		}
	}
	if failed == nil || failed.Name != clusterupgrade.StepDisableKubeVirtWorkloadUpdates || !strings.Contains(failed.Message, "fleet-local/harvester") {
		t.Errorf("progress %+v, want DisableKubeVirtWorkloadUpdates Failed naming fleet-local/harvester", steps)
	}
	if !strings.Contains(r.stdout, "DisableKubeVirtWorkloadUpdates: started") {
		t.Errorf("stdout %q does not log the sub-step", r.stdout)
	}
}

// The Job the builder makes carries arguments the subcommand parses back into the same
// input.
func TestClusterUpgradeJobArgumentsParse(t *testing.T) {
	in := clusterupgrade.Input{HarvesterVersion: "v1.6.0", PreviousVersion: "v1.7.1", KubeVirtVersion: "v1.6.0-150700.3.5.1", HarvesterChartVersion: "1.6.0", RancherVersion: "v2.12.0", RancherImage: "registry.local:5000/rancher/rancher"}
	job := clusterupgrade.Job(clusterupgrade.JobInput{Plan: "up-1", Image: "capi-inplace:dev", UpgradeImage: "rancher/harvester-upgrade:v1.6.0", Input: in})
	args := job.Spec.Template.Spec.Containers[0].Args
	if len(args) < 2 || args[0] != "node" || args[1] != "cluster-upgrade" {
		t.Fatalf("Job args %q do not run `node cluster-upgrade`", args)
	}
	r := runClusterUpgradeWith(t, func() (client.Client, error) { return nil, errors.New("stop here") }, args[1:]...)
	r.expect(t, ExitRetry, "stop here")
	got, p, err := clusterupgrade.ParseArgs(args[2:])
	if err != nil {
		t.Fatal(err)
	}
	if got.Plan != "up-1" || got.RancherImage != in.RancherImage || got.PreviousVersion != in.PreviousVersion || got.KubeVirtVersion != in.KubeVirtVersion || got.ClusterRepoImage != "rancher/harvester-cluster-repo:v1.6.0" || got.Timeout <= 0 {
		t.Errorf("parsed input %+v", got)
	}
	// The release's files: copied by the first init container from the release's upgrade
	// image into the volume the program reads them from; Rancher's helm and chart by the
	// next two, the node program copied into a volume and run in Rancher's installer
	// image, which has no shell.
	pod := job.Spec.Template.Spec
	if len(pod.InitContainers) != 3 || pod.InitContainers[0].Image != "rancher/harvester-upgrade:v1.6.0" || len(pod.InitContainers[0].VolumeMounts) != 1 ||
		pod.InitContainers[0].VolumeMounts[0].MountPath != clusterupgrade.ReleaseFilesDir {
		t.Fatalf("init containers %+v, want first one of the release's upgrade image writing %s", pod.InitContainers, clusterupgrade.ReleaseFilesDir)
	}
	program, installer := pod.InitContainers[1], pod.InitContainers[2]
	if program.Image != "capi-inplace:dev" || strings.Join(program.Args, " ") != "node copy-files --to=/rancher-installer --file=/capi-inplace" {
		t.Errorf("init container %s runs %s %q, want the node image copying its program", program.Name, program.Image, program.Args)
	}
	if installer.Image != "rancher/system-agent-installer-rancher:v2.12.0" || installer.Command[0] != "/rancher-installer/capi-inplace" ||
		strings.Join(installer.Args, " ") != "node copy-files --to=/rancher-installer --file=/helm --file=/rancher-*.tgz" {
		t.Errorf("init container %s runs %s %q %q, want Rancher's installer image of the release's Rancher running the copied program", installer.Name, installer.Image, installer.Command, installer.Args)
	}
	mounted := map[string]corev1.VolumeMount{}
	for _, m := range pod.Containers[0].VolumeMounts {
		mounted[m.MountPath] = m
	}
	if m, ok := mounted[clusterupgrade.ReleaseFilesDir]; got.ReleaseFiles != clusterupgrade.ReleaseFilesDir || !ok || !m.ReadOnly || m.Name != pod.InitContainers[0].VolumeMounts[0].Name {
		t.Errorf("--release-files %q with mounts %+v, want %s mounted read-only from the init container's volume", got.ReleaseFiles, mounted, clusterupgrade.ReleaseFilesDir)
	}
	if m, ok := mounted[clusterupgrade.RancherInstallerDir]; got.RancherInstaller != clusterupgrade.RancherInstallerDir || !ok || !m.ReadOnly || m.Name != installer.VolumeMounts[0].Name {
		t.Errorf("--rancher-installer %q with mounts %+v, want %s mounted read-only from the installer's volume", got.RancherInstaller, mounted, clusterupgrade.RancherInstallerDir)
	}
	if _, ok := mounted["/tmp"]; !ok {
		t.Errorf("mounts %+v: helm needs a writable /tmp under the read-only root", mounted)
	}
	if p.ConfigMap != clusterupgrade.ProgressKey("harvester-system", "up-1") {
		t.Errorf("progress ConfigMap %s, want %s", p.ConfigMap, clusterupgrade.ProgressKey("harvester-system", "up-1"))
	}
}
