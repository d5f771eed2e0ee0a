package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/scenario"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
)

// TestDemoViaHook runs the demo's whole flow, as `make demo ARGS=--via=hook` does, on a
// small cluster with fast simulated steps, and checks from the simulators' own records
// that it did what it printed: every node upgraded exactly once, never more nodes down
// than allowed.
func TestDemoViaHook(t *testing.T) {
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	cfg := defaultConfig()
	cfg.via, cfg.workers, cfg.maxUnavailable = viaHook, 3, 2
	cfg.stepDelay, cfg.pollInterval, cfg.timeout = 300*time.Millisecond, 100*time.Millisecond, 3*time.Minute
	// --preview: the manager computes the preview (a few seconds) before the run starts.
	cfg.preview, cfg.previewWait = true, time.Minute

	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 0 {
		t.Fatalf("the demo ended with exit code %d, error %v; its output:\n%s", res.exitCode(), err, out.String())
	}
	for _, want := range []string{"6/6 nodes upgraded", "NODE  ", "All 6 nodes reached Kubernetes " + scenario.ToVersion,
		"kubectl inplace preview -n demo harvester " + scenario.ToVersion} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	// The preview the manager computed, as the plugin prints it: every machine in place,
	// and the VM with a PCI device predicted to be stopped.
	for _, want := range []string{"UpgradePreview demo/harvester-", "Phase:       Ready", "6 in place, 0 replaced, 0 refused",
		"VM vms/gpu-1 is stopped and restarted after the node"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the preview does not say %q:\n%s", want, out.String())
		}
	}

	// Each node's line of what ran on its host: the release's pre-drain settings, then the
	// OS install, then its reboot.
	for _, node := range cfg.nodeNames() {
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), node+": ") && strings.Contains(l, "os-upgrade") {
				line = l
			}
		}
		pre, osUp, reboot := strings.Index(line, "rke2-settings --stage=pre-drain"), strings.Index(line, "os-upgrade"), strings.Index(line, "reboot at ")
		if pre < 0 || osUp < pre || reboot < osUp || strings.Count(line, "reboot at ") != 1 {
			t.Errorf("the output does not show node %s's pre-drain settings, OS install and one reboot, in that order: %q", node, line)
		}
	}

	// The settings the release changes for the nodes, as the demo's watch saw them on the
	// workload cluster: changed for the run and given back (the multus skip file from the
	// SUC simulator's record of the three servers).
	for _, want := range []string{
		scenario.SettingWorkloadUpdateMethods + `: before ["LiveMigrate"], during the run [], at the end ["LiveMigrate"] (restored)`,
		scenario.SettingReplicaReplenishment + ": before 600, during the run 1800, at the end 600 (restored)",
		scenario.SettingDescheduler + ": before true, during the run false, at the end true (restored)",
		scenario.SettingMultusFailurePolicy + ": before (unset), during the run abort, at the end abort (kept, as the release keeps it)",
		"setting            " + scenario.SettingReplicaReplenishment + ": 600 → 1800",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	// The skip file goes on and off the servers by SUC Plans whose Jobs run at once: the
	// counts between are as the watch happened to sample them.
	skipLine := ""
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), scenario.SettingMultusSkip+": ") {
			skipLine = l
		}
	}
	for _, want := range []string{": before on 0 of 3 servers, during the run ", "on 3 of 3 servers", ", at the end on 0 of 3 servers (restored)"} {
		if !strings.Contains(skipLine, want) {
			t.Errorf("the skip file's line does not say %q: %q", want, skipLine)
		}
	}
	held, restored := false, false
	for _, c := range res.checks {
		held = held || strings.HasPrefix(c.Name, "while nodes were upgraded, KubeVirt's workloadUpdateMethods was []") && !strings.Contains(c.Name, "no node was upgraded")
		restored = restored || strings.HasPrefix(c.Name, "the settings changed for the nodes") && !strings.Contains(c.Name, "not judged")
	}
	if !held || !restored {
		t.Errorf("the settings were not checked over the run (held for the nodes %t, restored %t): %v", held, restored, res.checks)
	}

	runs := scenario.RunsPerNode(res.record.Runs())
	var cp, workers []string
	for _, node := range cfg.nodeNames() {
		for _, kind := range scenario.PlanKinds {
			want := 1
			if kind == "rke2" {
				want = 0 // Rancher provisions the demo's RKE2: its planner restarts it (the invariants check how)
			}
			if got := runs[node][kind]; got != want {
				t.Errorf("node %s ran its %s Plan %d times, want %d", node, kind, got, want)
			}
		}
		if strings.Contains(node, "-"+scenario.ControlPlaneName+"-") {
			cp = append(cp, node)
		} else {
			workers = append(workers, node)
		}
	}
	if len(cp) != 3 || len(workers) != 3 {
		t.Fatalf("control plane %v and workers %v: want 3 of each", cp, workers)
	}
	downs := res.record.DownLog()
	if got := scenario.MaxDownAtOnce(downs, cp); got != 1 {
		t.Errorf("%d control plane nodes were down at once, want exactly 1 (one at a time, and each went down)", got)
	}
	if got := scenario.MaxDownAtOnce(downs, workers); got < 1 || got > cfg.maxUnavailable {
		t.Errorf("%d workers were down at once, want from 1 to maxUnavailable %d", got, cfg.maxUnavailable)
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("invariant broken: %s: %s", c.Name, c.Detail)
		}
	}
}

// TestConfigRefusesUnknownNodes checks that a mistyped --fail is refused before anything
// is started.
func TestConfigRefusesUnknownNodes(t *testing.T) {
	cfg := defaultConfig()
	for name, ok := range map[string]bool{"demo-cp-1": true, "cp-3": true, "workers-3": true, "demo-workers-4": false, "cp-4": false, "nope": false} {
		cfg.fail = name
		if err := cfg.validate(); (err == nil) != ok {
			t.Errorf("--fail=%s: validate() = %v, want accepted %v", name, err, ok)
		}
	}
	cfg.fail, cfg.gateRedAt = "", "workers-9"
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "--gate-red-at=workers-9") {
		t.Errorf("--gate-red-at=workers-9 was not refused by name: %v", err)
	}
	cfg.gateRedAt, cfg.via = "workers-1", viaCAPI
	if err := cfg.validate(); err == nil {
		t.Error("--gate-red-at with --via=capi was not refused")
	}
	cfg.gateRedAt, cfg.via = "", viaHook
	cfg.from = "v1.5.0"
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "--from=v1.5.0") || !strings.Contains(err.Error(), "v1.6.1") {
		t.Errorf("--from=v1.5.0 was not refused with the releases there are: %v", err)
	}
	cfg.from = "v1.6.1"
	if err := cfg.validate(); err != nil || cfg.hop().ToRelease != "v1.7.1" {
		t.Errorf("--from=v1.6.1: validate() = %v, hop %v; want the hop to v1.7.1", err, cfg.hop())
	}
	cfg.from = scenario.DefaultHop.FromRelease
	cfg.fail, cfg.via = "", "kubectl"
	if err := cfg.validate(); err == nil {
		t.Error("--via=kubectl was accepted")
	}
}

// TestDemoViaCAPI runs `make demo ARGS=--via=capi` as a user would with Cluster API's
// controllers built: Cluster API's own core, KCP, CABPK and CAPD (in-memory) controllers
// roll a spec.topology.version bump out, and the test checks from the watches of Machines
// and NodeUpdates, the recorded hook calls and the workload Nodes that every machine was
// kept and updated in place, as the demo printed. One set of Cluster API's controllers
// runs per machine (CAPD's fixed ports): this waits for another (test/capie2e) to end.
func TestDemoViaCAPI(t *testing.T) {
	capiDemoRun(t)
	cfg := defaultConfig()
	cfg.via, cfg.workers = viaCAPI, 2
	cfg.stepDelay, cfg.timeout = time.Second, 10*time.Minute

	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 0 {
		t.Fatalf("the demo ended with exit code %d, error %v; its output:\n%s", res.exitCode(), err, out.String())
	}
	for _, want := range []string{
		"Cluster API's own controllers", "sigs.k8s.io/cluster-api v1.14.", "sigs.k8s.io/cluster-api/test v1.14.",
		`kubectl patch cluster -n demo demo --type merge -p '{"spec":{"topology":{"version":"v1.36.3"}}}'`,
		"Cluster API asked CanUpdateMachineSet for MachineDeployment", "capi-inplace answered with patches that make it in place",
		"Cluster API called UpdateMachine for ", "answered done, after ",
		"5/5 machines upgraded", "MACHINE  ", "$ kubectl get machines -n demo",
		"All 5 machines were updated in place to Kubernetes v1.36.3 by Cluster API's own controllers",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FALLBACK") {
		t.Errorf("the output says it played Cluster API in-process:\n%s", out.String())
	}

	r := res.capi
	if r == nil {
		t.Fatal("the run did not go through Cluster API's controllers")
	}
	if len(r.before) != 5 || strings.Join(r.before, ",") != strings.Join(r.after, ",") {
		t.Errorf("machines before the bump %v, after %v: want the same 5", r.before, r.after)
	}
	if len(r.deleted) != 0 {
		t.Errorf("Cluster API deleted machines %v: not in place", r.deleted)
	}
	for _, m := range r.before {
		if got := r.nodeUpdates[m]; got != 1 {
			t.Errorf("machine %s had %d NodeUpdates, want 1", m, got)
		}
		if got := r.kubelets[m]; got != capiToVersion {
			t.Errorf("the node of machine %s runs kubelet %q, want %s", m, got, capiToVersion)
		}
	}
	if r.hookCalls["canupdatemachineset"] < 1 || r.hookCalls["canupdatemachine"] < 3 || r.hookCalls["updatemachine"] < 5 {
		t.Errorf("Cluster API's hook calls %v: want CanUpdateMachineSet, CanUpdateMachine for each of 3 control plane machines and UpdateMachine for each of 5", r.hookCalls)
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("check failed: %s: %s", c.Name, c.Detail)
		}
	}
}

// TestResolveFail checks how --fail names a machine of a Cluster API-provisioned Cluster,
// whose names are generated: by name, by node, or as cp-N / workers-N.
func TestResolveFail(t *testing.T) {
	machine := func(name string, cp bool) clusterv1.Machine {
		m := clusterv1.Machine{}
		m.Name, m.Status.NodeRef.Name = name, "node-"+name
		if cp {
			m.Labels = map[string]string{clusterv1.MachineControlPlaneLabel: ""}
		}
		return m
	}
	d := &realCAPI{before: []clusterv1.Machine{machine("demo-a", true), machine("demo-b", true), machine("demo-md-0-x", false), machine("demo-md-0-y", false)}}
	for name, want := range map[string]string{
		"cp-2": "demo-b", "demo-cp-1": "demo-a", "workers-2": "demo-md-0-y", "demo-md-0-x": "demo-md-0-x", "node-demo-md-0-y": "demo-md-0-y",
		"cp-3": "", "workers-0": "", "nope": "",
	} {
		got, err := d.resolveFail(name)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("resolveFail(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
}

// TestDemoGateRedAt runs the demo with --gate-red-at: the health gate turns red while the
// first worker is upgraded, the workers' task pauses after it and starts no other node
// while the gate is red, and resumes by itself once it is green; every node is upgraded.
func TestDemoGateRedAt(t *testing.T) {
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	cfg := defaultConfig()
	// One control plane node and two workers, one at a time: the pause holds the second.
	cfg.via, cfg.controlPlane, cfg.workers, cfg.maxUnavailable = viaAnnotation, 1, 2, 1
	cfg.stepDelay, cfg.pollInterval, cfg.timeout = 300*time.Millisecond, 100*time.Millisecond, 6*time.Minute
	cfg.gateRedAt = "workers-1"

	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 0 {
		t.Fatalf("the demo ended with exit code %d, error %v; its output:\n%s", res.exitCode(), err, out.String())
	}
	for _, want := range []string{"3/3 nodes upgraded", "health gate demo-health made red", "paused: ", "health gate demo-health made green again", "resumed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	gateChecked := false
	for _, c := range res.checks {
		gateChecked = gateChecked || strings.HasPrefix(c.Name, "health gate "+demoGateName)
		if !c.OK {
			t.Errorf("invariant broken: %s: %s", c.Name, c.Detail)
		}
	}
	if !gateChecked {
		t.Errorf("the demo did not check its health gate: %v", res.checks)
	}
}

// TestDemoFromV16 runs the demo on the v1.6.1 to v1.7.1 hop (--from v1.6.1) on one
// control plane node and one worker: each node's line of what ran on its host names the
// os Plan's node migrations, as the node program runs them for the previous version the
// Plan gives it, the release's upgrade image it ran in with its libraries bound for the
// release's elemental, and exactly one reboot after them.
func TestDemoFromV16(t *testing.T) {
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	cfg := defaultConfig()
	// No Longhorn v2 volume: on one worker it would have a single replica, which the
	// SingleReplicaVolumes preflight check rightly holds.
	cfg.via, cfg.controlPlane, cfg.workers, cfg.from, cfg.longhornV2 = viaAnnotation, 1, 1, "v1.6.1", false
	cfg.stepDelay, cfg.pollInterval, cfg.timeout = 300*time.Millisecond, 100*time.Millisecond, 3*time.Minute

	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 0 {
		t.Fatalf("the demo ended with exit code %d, error %v; its output:\n%s", res.exitCode(), err, out.String())
	}
	for _, want := range []string{"Harvester v1.6.1 -> v1.7.1, Kubernetes v1.33.5+rke2r1 -> v1.34.3+rke2r3",
		"2/2 nodes upgraded", "All 2 nodes reached Kubernetes v1.34.3+rke2r3 and Harvester v1.7.1",
		scenario.SettingReplicaReplenishment + ": before 600, during the run 1800, at the end 600 (restored)",
		// No descheduler add-on on a v1.6 cluster (fact 36): the upgrade creates it from
		// the release's files, disabled as the release ships it (fact 29).
		scenario.SettingDescheduler + ": before (unset), during the run false, at the end false (created by the upgrade)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	migrations := "os-upgrade --previous-version=v1.6.1 --glibc-libraries=container in rancher/harvester-upgrade:v1.7.1 " +
		"[node migrations: generate_networkmanager_config: persistent paths, generate_networkmanager_config, generate_networkmanager_config: DHCP client id, generate_hostname_persistance; " + //nolint:misspell // the release script's own function name
		"elemental with the container's /lib64 (GLIBC)]"
	for _, node := range cfg.nodeNames() {
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), node+": ") && strings.Contains(l, "os-upgrade") {
				line = l
			}
		}
		at, reboot := strings.Index(line, migrations), strings.Index(line, "reboot at ")
		if at < 0 || reboot < at || strings.Count(line, "reboot at ") != 1 || strings.Count(line, "os-upgrade") != 1 {
			t.Errorf("node %s's line does not show the hop's node migrations in its os-upgrade, then exactly one reboot: %q", node, line)
		}
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("invariant broken: %s: %s", c.Name, c.Detail)
		}
	}
}

// A failed node's line says the node's own words first: the NodeUpdate's message without
// the nodeupdater's "step S: " (the line names the step), then its reason.
func TestFailureText(t *testing.T) {
	for _, tc := range []struct{ reason, message, want string }{
		{"PlanJobFailed", "step OSUpgrade: elemental upgrade failed with return code: 33 (container upgrade of pod p exited with code 1); SUC job j ...",
			"elemental upgrade failed with return code: 33 (container upgrade of pod p exited with code 1); SUC job j ... (PlanJobFailed)"},
		{"Timeout", "the node did not come back: step Drain: x", "the node did not come back: step Drain: x (Timeout)"},
		{"", "step Drain: x", "x"},
		{"Aborted", "", "Aborted"},
	} {
		if got := failureText(tc.reason, tc.message); got != tc.want {
			t.Errorf("failureText(%q, %q) = %q, want %q", tc.reason, tc.message, got, tc.want)
		}
	}
}

// A run that ends with the UpgradePlan held says what holds the cluster in the plan's own
// words, and why the settings are not back: the plan has not ended. Nothing when nothing
// holds it.
func TestPlanHeld(t *testing.T) {
	var out bytes.Buffer
	v := newView(&out, false)
	v.planHeld(&outcome{})
	if out.Len() != 0 {
		t.Errorf("nothing holds the plan, yet:\n%s", out.String())
	}
	hold := "node demo-workers-2 failed at OSUpgrade: elemental upgrade failed with return code: 33; to go on: retry the node (...) or end the plan (...), which gives every setting back"
	v.planHeld(&outcome{planHold: hold, planStanding: "UpgradePlan demo/harvester-v1-8-1 is held in NodeUpgrading"})
	want := "\nWhat holds the cluster: UpgradePlan demo/harvester-v1-8-1 is held in NodeUpgrading; it has not ended, so the settings above keep the roll's values until it does. The plan says:\n  " + hold + "\n"
	if out.String() != want {
		t.Errorf("got:\n%q\nwant:\n%q", out.String(), want)
	}
}

// TestDemoFailureHeld runs `make demo ARGS="--via=hook --fail demo-workers-2"` as a new
// user would: the OS upgrade of demo-workers-2 fails. The demo exits non-zero, every
// safety check still holds, the failure says the node's own words first, and the end
// says what holds the cluster (the UpgradePlan, held in NodeUpgrading, in its own words)
// and that the settings are not restored yet because the plan has not ended.
func TestDemoFailureHeld(t *testing.T) {
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	cfg := defaultConfig()
	cfg.via, cfg.fail = viaHook, "demo-workers-2"
	res, out := runEndingEarly(t, cfg)
	words := "elemental upgrade failed with return code: 33 (failure injected by --fail) (container upgrade of pod "
	plan := "UpgradePlan demo/harvester-v1-8-1 is held in NodeUpgrading"
	for _, want := range []string{
		"demo-workers-2     FAILED at OSUpgrade: " + words,
		"\ndemo-workers-2 failed at OSUpgrade: " + words,
		scenario.SettingWorkloadUpdateMethods + `: before ["LiveMigrate"], during the run [], at the end [] (not restored yet: ` + plan + ", and gives it back when it ends)",
		scenario.SettingReplicaReplenishment + ": before 600, during the run 1800, at the end 1800 (not restored yet: " + plan,
		"What holds the cluster: " + plan + "; it has not ended, so the settings above keep the roll's values until it does. The plan says:\n  " + res.planHold + "\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	if !strings.HasPrefix(res.planHold, "node demo-workers-2 failed") || !strings.Contains(res.planHold, "elemental upgrade failed with return code: 33") {
		t.Errorf("the plan's Degraded condition does not name the failed node in its own words: %q", res.planHold)
	}
	for _, want := range []string{"until the plan ends; to go on: retry the node (", "harvester.inplace.cluster.x-k8s.io/allow-deletion=true", "which gives every setting back"} {
		if !strings.Contains(res.planHold, want) {
			t.Errorf("the plan's Degraded condition does not say the ways on (%q): %q", want, res.planHold)
		}
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("invariant broken: %s: %s", c.Name, c.Detail)
		}
	}
}

// TestDemoAbortAtPreDrain runs the demo with --abort-at on the second control plane node:
// the task is aborted once Rancher has taken the node (cordoned it and asked for its
// pre-drain hook), and the run ends settled, as its safety checks say: Rancher's drain of
// the node withdrawn, no node cordoned, no RKE2 restart outside a NodeUpdate (issue #52).
func TestDemoAbortAtPreDrain(t *testing.T) {
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts two API servers and the manager")
	}
	cfg := defaultConfig()
	cfg.via, cfg.abortAt = viaHook, "demo-cp-2"
	res, out := runEndingEarly(t, cfg)
	for _, want := range []string{
		"aborted (spec.phase Abort) while Rancher waits at demo-cp-2's pre-drain hook",
		"✔ Rancher's roll settled: no node left cordoned, no drain of Rancher's waiting at a hook nobody answers",
		"✔ the abort at demo-cp-2's pre-drain hook ended settled",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("invariant broken: %s: %s", c.Name, c.Detail)
		}
	}
}

// runEndingEarly runs the demo with cfg at quick steps and wants it to end early: exit
// code 1, not every node upgraded. It returns the outcome and the output.
func runEndingEarly(t *testing.T, cfg config) (*outcome, *bytes.Buffer) {
	t.Helper()
	cfg.stepDelay, cfg.pollInterval, cfg.timeout = 300*time.Millisecond, 100*time.Millisecond, 3*time.Minute
	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 1 || res.upgraded {
		t.Fatalf("the demo ended with exit code %d, error %v, every node upgraded %t; want exit code 1; its output:\n%s", res.exitCode(), err, res.upgraded, out.String())
	}
	return res, &out
}

// capiDemoRun marks a whole run of the demo on Cluster API's own controllers and fails
// it when they are not built.
func capiDemoRun(t *testing.T) {
	t.Helper()
	testsuite.WholeRun(t)
	if testing.Short() {
		t.Skip("starts an API server, Cluster API's controllers and the manager")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := capienv.Built(root); err != nil {
		t.Fatalf("this test runs the demo on Cluster API's own controllers: %v", err)
	}
}

// TestDemoViaCAPIWithKubeadm is `make demo ARGS="--via=capi --updater=kubeadm"`: the same
// rollout on Cluster API's own controllers, with the KubeadmUpdater and the simulated
// kubeadm nodes, showing each node's kubeadm phases.
func TestDemoViaCAPIWithKubeadm(t *testing.T) {
	capiDemoRun(t)
	cfg := defaultConfig()
	cfg.via, cfg.updater, cfg.workers = viaCAPI, updaterKubeadm, 2
	cfg.stepDelay, cfg.timeout = time.Second, 10*time.Minute

	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out, false)
	if err != nil || res.exitCode() != 0 {
		t.Fatalf("the demo ended with exit code %d, error %v; its output:\n%s", res.exitCode(), err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		"updater               KubeadmUpdater/kubeadm, named on the Cluster",
		"capi-inplace created NodeUpdate ", "(updater KubeadmUpdater/kubeadm)",
		"kubeadm phases per node (NodeUpdate status.steps)",
		"Fetch Succeeded, Upgrade Succeeded, Drain Succeeded, Kubelet Succeeded, Uncordon Succeeded   kubeadm upgrade node",
		"All 5 machines were updated in place to Kubernetes v1.36.3 by Cluster API's own controllers",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the output does not say %q:\n%s", want, text)
		}
	}
	// Live: the step lines. Uncordon waits out each restarted kubelet (--step-delay), so
	// every node shows it; a Job's step may end between two samples of the demo, so of
	// those only some show, and at least one must.
	if got := strings.Count(text, "step Uncordon: waiting for node "); got < 5 {
		t.Errorf("the live output shows %d nodes waiting in step Uncordon, want 5:\n%s", got, text)
	}
	jobs := strings.Count(text, "step Fetch: ") + strings.Count(text, "step Upgrade: ") + strings.Count(text, "step Kubelet: ")
	if jobs == 0 {
		t.Errorf("the live output shows no Fetch, Upgrade or Kubelet step:\n%s", text)
	}
	if got := strings.Count(text, "Uncordon Succeeded   kubeadm upgrade node"); got != 5 {
		t.Errorf("the summary lists the kubeadm phases of %d nodes, want 5:\n%s", got, text)
	}
	for _, c := range res.checks {
		if !c.OK {
			t.Errorf("check failed: %s: %s", c.Name, c.Detail)
		}
	}
	if len(res.checks) < 7 {
		t.Errorf("%d checks, want the 5 of every run and the 2 of the KubeadmUpdater", len(res.checks))
	}
}

// TestUpdaterFlag: --updater=kubeadm is refused where it cannot apply.
func TestUpdaterFlag(t *testing.T) {
	testsuite.Unit(t)
	for _, tc := range []struct {
		via, updater, want string
	}{
		{viaAnnotation, updaterKubeadm, "--updater=kubeadm works with --via=capi only"},
		{viaHook, updaterKubeadm, "--updater=kubeadm works with --via=capi only"},
		{viaCAPI, "harvester", "--updater=harvester: must be external or kubeadm"},
		{viaCAPI, updaterKubeadm, ""},
		{viaAnnotation, updaterExternal, ""},
	} {
		cfg := defaultConfig()
		cfg.via, cfg.updater = tc.via, tc.updater
		err := cfg.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("--via=%s --updater=%s: %v", tc.via, tc.updater, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("--via=%s --updater=%s: error %v, want %q", tc.via, tc.updater, err, tc.want)
		}
	}
}
