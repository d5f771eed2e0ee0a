package inplacectl

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the printers' output")

// golden compares out with testdata/name, or rewrites it with -update. The golden files
// are what docs/kubectl-inplace.md shows as example output.
func golden(t *testing.T, name string, out []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s (go test ./internal/inplacectl -run %s -update writes it): %v", path, t.Name(), err)
	}
	if !bytes.Equal(out, want) {
		t.Errorf("the output differs from %s (rerun with -update if the change is meant):\n--- got\n%s\n--- want\n%s", path, out, want)
	}
}

// lineWith returns the one line of out that contains every one of words, or fails.
func lineWith(t *testing.T, out string, words ...string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			return l
		}
	}
	t.Errorf("no line holds all of %q:\n%s", words, out)
	return ""
}

func TestPrintPreview(t *testing.T) {
	var buf bytes.Buffer
	if err := PrintPreview(&buf, samplePreview()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	golden(t, "preview.txt", buf.Bytes())

	for _, tc := range []struct {
		name  string
		words []string
	}{
		{"header names the cluster and version", []string{"Cluster harvester to v1.35.6+rke2r1"}},
		{"counts", []string{"3 in place, 1 replaced, 1 refused, 1 at target; 1 held"}},
		{"estimate and its source", []string{"1h12m0s", "the median of 9 past NodeUpdates"}},
		{"not fail-closed", []string{"Fail-closed: no"}},
		{"table header in order", []string{"ORDER", "MACHINE", "NODE", "TARGET", "OUTCOME", "HOLDS", "VMS MIGRATE/STOP", "PDB-BLOCKED", "DEGRADED VOLS", "ESTIMATE", "REASON"}},
		{"first node: one VM migrates, one stops", []string{"1 ", "harvester-cp-1", "demo-cp-1", "InPlace", "1/1", "24m0s"}},
		{"held node: its failing check, a PDB-blocked pod, a degraded volume", []string{"2 ", "harvester-workers-1", "UpdaterChecks/LonghornVolumesHealthy", "0/0  ", "  1  "}},
		{"replaced, with why", []string{"harvester-workers-3", "Replaced", "no updater covers"}},
		{"refused, with why", []string{"harvester-gpu-1", "Refused", "fail-closed"}},
		{"at target", []string{"harvester-witness-1", "AtTarget"}},
		{"migrating VM and where", []string{"VM vms/web-1 live-migrates: to demo-cp-2 or demo-cp-3"}},
		{"stopped VM and why", []string{"VM vms/gpu-1 is stopped", "PCI device"}},
		{"blocking pod and its PDB", []string{"pod apps/db-0 blocks the drain (PodDisruptionBudget db)"}},
		{"degraded volume", []string{"volume pvc-db degrades: its only healthy replica is on demo-workers-1"}},
		{"failing check with its message", []string{"held by UpdaterChecks/LonghornVolumesHealthy: volume pvc-db has 1 healthy replica of 3"}},
		{"order reason", []string{"demo-workers-1 (machine harvester-workers-1, goes 2nd: spec.nodeOrder)"}},
	} {
		t.Run(tc.name, func(t *testing.T) { lineWith(t, out, tc.words...) })
	}
	// The table keeps the preview's order: in place by order, then the others.
	if a, b := strings.Index(out, "harvester-cp-1 "), strings.Index(out, "harvester-witness-1 "); a < 0 || b < a {
		t.Errorf("the table is not in the preview's order:\n%s", out)
	}
	if strings.Contains(lineWith(t, out, "harvester-workers-1", "InPlace"), "NodeReady") {
		t.Error("HOLDS lists a check that passed")
	}
}

func TestPrintPreviewFailed(t *testing.T) {
	p := &inplacev1.UpgradePreview{}
	p.Namespace, p.Name, p.Spec.ClusterName, p.Spec.Version = "demo", "nope-v1", "nope", "v1"
	p.Status.Phase, p.Status.Message = inplacev1.PreviewPhaseFailed, `Cluster demo/nope not found`
	var buf bytes.Buffer
	if err := PrintPreview(&buf, p); err != nil {
		t.Fatal(err)
	}
	lineWith(t, buf.String(), "Phase:", "Failed")
	lineWith(t, buf.String(), "Message:", "Cluster demo/nope not found")
	if strings.Contains(buf.String(), "ORDER") {
		t.Errorf("a preview without machines prints a table:\n%s", buf.String())
	}
	err := PreviewFailure(p)
	if err == nil || !strings.Contains(err.Error(), "Cluster demo/nope not found") {
		t.Errorf("PreviewFailure = %v, want the preview's message", err)
	}
	if err := PreviewFailure(samplePreview()); err != nil {
		t.Errorf("PreviewFailure of a Ready preview = %v", err)
	}
}

func TestPrintObject(t *testing.T) {
	for _, format := range []string{OutputYAML, OutputJSON} {
		var buf bytes.Buffer
		if err := PrintObject(&buf, samplePreview(), format); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"UpgradePreview", "inplace.cluster.x-k8s.io/v1alpha1", "harvester-workers-1", "LonghornVolumesHealthy"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("-o %s does not hold %q:\n%s", format, want, buf.String())
			}
		}
	}
	if err := ValidOutput("wide"); err == nil || !strings.Contains(err.Error(), "table, yaml and json") {
		t.Errorf("ValidOutput(wide) = %v, want the formats named", err)
	}
}

func TestPrintStatus(t *testing.T) {
	var buf bytes.Buffer
	if err := PrintStatus(&buf, sampleStatus()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	golden(t, "status.txt", buf.Bytes())
	for _, tc := range []struct {
		name  string
		words []string
	}{
		{"cascade annotations", []string{"in-place-upgrade-to:", "v1.35.6+rke2r1"}},
		{"cascade status", []string{"in-place-upgrade-status:", "failed"}},
		{"cascade progress", []string{"in-place-upgrade-progress:", "1/4"}},
		{"cascade message", []string{"in-place-upgrade-message:", "harvester-workers-2 failed"}},
		{"control plane task, done", []string{"UpgradeTask harvester-cp-v1.35.6: KubeadmControlPlane/harvester-cp", "Completed, 1/1 upgraded, for 20m0s"}},
		{"workers task with counts", []string{"MachineDeployment/harvester-workers", "InProgress, 0/3 upgraded (1 in progress, 1 waiting, 1 failed)", "for 19m0s"}},
		{"current nodes", []string{"now upgrading: demo-workers-1"}},
		{"Degraded condition with message", []string{"Degraded (NodeFailed): node demo-workers-2 failed"}},
		{"upgraded machine with its time", []string{"harvester-cp-1", "Upgraded", "Succeeded", "took 19m0s"}},
		{"running machine: step n/m, how long, what it does", []string{"harvester-workers-1", "InProgress", "OSUpgrade (4/5)", "7m0s", "waiting for SUC Plan"}},
		{"held machine and why", []string{"harvester-workers-3", "Waiting", " held: Availability: 1 node(s) of the target already unavailable"}},
		{"failed machine in the table", []string{"harvester-workers-2", "Failed", "Failed at OSUpgrade", "took 6m0s"}},
		{"failure with the node's own error", []string{"machine harvester-workers-2 (node demo-workers-2) of MachineDeployment/harvester-workers: StepFailed: elemental upgrade failed with return code: 33", "step OSUpgrade", "12m0s ago"}},
	} {
		t.Run(tc.name, func(t *testing.T) { lineWith(t, out, tc.words...) })
	}
	if strings.Contains(out, "Paused (") {
		t.Errorf("a Paused condition that is False is shown:\n%s", out)
	}
	if strings.Index(out, "KubeadmControlPlane/") > strings.Index(out, "MachineDeployment/harvester-workers:") {
		t.Errorf("the control plane's task is not first:\n%s", out)
	}
}

// TestPrintStatusHolds checks the words of a waiting machine: the controller's own "held
// by" is not repeated, and a machine of a task that ended is not held, just not started.
func TestPrintStatusHolds(t *testing.T) {
	for _, tc := range []struct {
		phase         inplacev1.TaskPhase
		message, want string
	}{
		{inplacev1.TaskPhaseInProgress, "held by NodeReady: node not Ready", "  held by NodeReady: node not Ready"},
		{inplacev1.TaskPhaseInProgress, "NodeReady: node not Ready", "  held: NodeReady: node not Ready"},
		{inplacev1.TaskPhaseFailed, "not started: the task stopped after machine workers-2 failed", "  not started: the task stopped"},
	} {
		st := sampleStatus()
		st.Tasks[1].Status.Phase = tc.phase
		st.Tasks[1].Status.Machines[2].Message = tc.message
		var buf bytes.Buffer
		if err := PrintStatus(&buf, st); err != nil {
			t.Fatal(err)
		}
		line := lineWith(t, buf.String(), "harvester-workers-3", "Waiting")
		if !strings.Contains(line, tc.want) || strings.Count(line, "held") > 1 {
			t.Errorf("task %s, message %q: the machine's line is %q, want %q", tc.phase, tc.message, line, tc.want)
		}
	}
}

func TestPrintStatusWithoutTasks(t *testing.T) {
	var buf bytes.Buffer
	if err := PrintStatus(&buf, &UpgradeStatus{Namespace: "demo", Cluster: "harvester"}); err != nil {
		t.Fatal(err)
	}
	lineWith(t, buf.String(), "in-place-upgrade annotations: none")
	lineWith(t, buf.String(), "No UpgradeTask for Cluster demo/harvester")
}

func TestPreviewName(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"harvester", "v1.35.6+rke2r1"}: "harvester-v1.35.6-rke2r1",
		{"My_Cluster", "V1.36.0"}:       "my-cluster-v1.36.0",
	} {
		if got := PreviewName(in[0], in[1]); got != want {
			t.Errorf("PreviewName(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
	if got := PreviewName(strings.Repeat("a", 300), "v1"); len(got) > 253 {
		t.Errorf("PreviewName of a long name is %d characters, more than a name may have", len(got))
	}
}

func TestNewestPerTarget(t *testing.T) {
	st := sampleStatus()
	old := st.Tasks[1].DeepCopy()
	old.Name, old.CreationTimestamp = "harvester-workers-old", *ago(50 * 60e9)
	other := st.Tasks[0].DeepCopy()
	other.Name, other.Spec.ClusterName = "other-cp", "other"
	got := newestPerTarget([]inplacev1.UpgradeTask{*old, st.Tasks[1], *other, st.Tasks[0]}, "harvester")
	if len(got) != 2 || got[0].Name != "harvester-cp-v1.35.6" || got[1].Name != "harvester-workers-v1.35.6" {
		var names []string
		for _, t := range got {
			names = append(names, t.Name)
		}
		t.Errorf("newestPerTarget kept %v, want the control plane's then the newest workers' task of cluster harvester", names)
	}
}
