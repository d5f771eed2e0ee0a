package nodeprogram

import (
	"os"
	"strings"
	"testing"
)

// What each unit writes is checked against Harvester's upgrade_node.sh (v1.8.2,
// command_pre_drain and command_post_drain; shared/facts/harvester-release-steps.md facts
// 49 and 51), written out here from the facts, not read from the code under test.

func readHost(t *testing.T, host *fakeHost, p string) (string, bool) {
	t.Helper()
	data, err := os.ReadFile(host.Path(p))
	if os.IsNotExist(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(data), true
}

func TestRKE2SettingsPreDrain(t *testing.T) {
	host := serverNode(t)
	host.write(t, "/var/lib/rancher/rke2/server/manifests/rke2-canal-config.yaml", "apiVersion: helm.cattle.io/v1\nkind: HelmChartConfig\n")
	r := runNode(t, host, nil, "rke2-settings", "--stage=pre-drain", "--host-root=/host", "--repository-url=http://repo.example", "--version=v1.8.1")
	r.expect(t, ExitOK, "capi-inplace node rke2-settings: done")
	if _, there := readHost(t, host, "/var/lib/rancher/rke2/server/manifests/rke2-canal-config.yaml"); there {
		t.Error("rke2-canal-config.yaml is still in RKE2's server manifests")
	}
	if _, there := readHost(t, host, "/var/lib/rancher/rke2/server/manifests/rke2-multus.yaml"); !there {
		t.Error("another manifest was removed")
	}
	got, _ := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/40-disable-charts.yaml")
	if want := "disable:\n- rke2-snapshot-controller\n- rke2-snapshot-controller-crd\n- rke2-snapshot-validation-webhook\n"; got != want {
		t.Errorf("40-disable-charts.yaml is %q, want %q", got, want)
	}
	for _, postDrain := range []string{"99-max-pods.yaml", "99-z00-harvester-reserved-resources.yaml", "91-harvester-cdi.yaml"} {
		if _, there := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/"+postDrain); there {
			t.Errorf("pre-drain wrote %s, a post-drain setting", postDrain)
		}
	}
	if lines := host.commandLines(); len(lines) != 0 {
		t.Errorf("ran %q: pre-drain runs nothing on the host", lines)
	}
	// Again (the Job ran twice): the same files, the canal config still absent.
	r = runNode(t, host, nil, "rke2-settings", "--stage=pre-drain")
	r.expect(t, ExitOK)
	if !strings.Contains(r.stdout, "rke2-canal-config.yaml is absent") {
		t.Errorf("second run said %q", r.stdout)
	}
}

func TestRKE2SettingsPostDrain(t *testing.T) {
	host := newFakeHost(t)
	host.tools["nproc"] = func(Command, []byte) ([]byte, error) { return []byte("8\n"), nil }
	host.write(t, "/etc/rancher/rke2/config.yaml.d/99-max-pods.yaml", "kubelet-arg:\n- \"max-pods=110\"\n")
	host.write(t, "/etc/rancher/rke2/config.yaml.d/91-harvester-cdi.yaml", "# the user's\n\"nonroot-devices\": false\n")
	r := runNode(t, host, nil, "rke2-settings", "--stage=post-drain")
	r.expect(t, ExitOK, "done")

	want := map[string]string{
		// Always overwritten.
		"/etc/rancher/rke2/config.yaml.d/99-max-pods.yaml": "kubelet-arg:\n- \"max-pods=200\"\n",
		// 8 CPUs, 200 pods: 60 + 10 + 10 + 4*2.5 + 400 = 490m reserved; twice that split
		// 2:3 in shell integer arithmetic: 490*2*2/5 = 392, 490*2*3/5 = 588.
		"/etc/rancher/rke2/config.yaml.d/99-z00-harvester-reserved-resources.yaml": "kubelet-arg+:\n- \"system-reserved=cpu=392m\"\n- \"kube-reserved=cpu=588m\"\n",
		// Only if absent: the user's is kept.
		"/etc/rancher/rke2/config.yaml.d/91-harvester-cdi.yaml": "# the user's\n\"nonroot-devices\": false\n",
		"/oem/91_cleanup_kubelet.yaml":                          "name: Cleanup Kubelet\nstages:\n    initramfs:\n        - commands:\n            - rm -f /var/lib/kubelet/cpu_manager_state\n",
	}
	for p, w := range want {
		if got, _ := readHost(t, host, p); got != w {
			t.Errorf("%s is %q, want %q", p, got, w)
		}
	}
	if _, there := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/40-disable-charts.yaml"); there {
		t.Error("post-drain wrote 40-disable-charts.yaml, a pre-drain setting")
	}
	if lines := host.commandLines(); len(lines) != 1 || lines[0] != "nproc" {
		t.Errorf("ran %q, want nproc only", lines)
	}

	// A reservation already there is kept, even when the CPUs changed.
	host.tools["nproc"] = func(Command, []byte) ([]byte, error) { return []byte("64\n"), nil }
	runNode(t, host, nil, "rke2-settings", "--stage=post-drain").expect(t, ExitOK)
	if got, _ := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/99-z00-harvester-reserved-resources.yaml"); got != want["/etc/rancher/rke2/config.yaml.d/99-z00-harvester-reserved-resources.yaml"] {
		t.Errorf("the reservation was rewritten: %q", got)
	}
	// Absent CDI file: written.
	if err := os.Remove(host.Path("/etc/rancher/rke2/config.yaml.d/91-harvester-cdi.yaml")); err != nil {
		t.Fatal(err)
	}
	runNode(t, host, nil, "rke2-settings", "--stage=post-drain").expect(t, ExitOK)
	if got, _ := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/91-harvester-cdi.yaml"); got != "# handle the permission issue of Longhorn for CDI\n\"nonroot-devices\": true\n" {
		t.Errorf("91-harvester-cdi.yaml is %q", got)
	}
}

func TestReservedMilliCPU(t *testing.T) {
	// The release's calculateCPUReservedInMilliCPU, case by case (fact 51).
	for _, tc := range []struct{ cores, pods, want int }{
		{1, 200, 60 + 400}, {2, 200, 70 + 400}, {4, 200, 80 + 400}, {5, 200, 82 + 400}, {64, 200, 80 + 60*250/100 + 400},
		{4, 110, 80}, {0, 200, 0}, {4, 0, 0},
	} {
		if got := reservedMilliCPU(tc.cores, tc.pods); got != tc.want {
			t.Errorf("%d cores, %d pods: %dm, want %dm", tc.cores, tc.pods, got, tc.want)
		}
	}
}

func TestRKE2SettingsRefusesAnUnknownStage(t *testing.T) {
	host := newFakeHost(t)
	for _, args := range [][]string{{"rke2-settings"}, {"rke2-settings", "--stage=during-drain"}} {
		r := runNode(t, host, nil, args...)
		r.expect(t, ExitUsage, "--stage must be pre-drain or post-drain")
	}
	if lines := host.commandLines(); len(lines) != 0 {
		t.Errorf("ran %q", lines)
	}
}

func TestRKE2SettingsNamesTheUnitThatFailed(t *testing.T) {
	host := newFakeHost(t)
	host.tools["nproc"] = func(Command, []byte) ([]byte, error) { return []byte("many\n"), nil }
	r := runNode(t, host, nil, "rke2-settings", "--stage=post-drain")
	r.expect(t, ExitFailed, "set_reserved_resource: the host's nproc said \"many\"")
	if got, _ := readHost(t, host, "/etc/rancher/rke2/config.yaml.d/99-max-pods.yaml"); got == "" {
		t.Error("the unit before the failed one did not run")
	}
}
