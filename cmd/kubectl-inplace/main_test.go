package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// TestPlugin runs the plugin's commands, with a kubeconfig as a user would, against a real
// API server with capi-inplace's CRDs. No UpgradePreview controller runs here: the test
// plays it (playPreviewController), writing the status the controller would, so what is
// tested is the plugin's side: create or refresh, wait for the refresh, print, exit codes.
func TestPlugin(t *testing.T) {
	env := testenv.ForTest(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns, err := fixtures.Namespace(ctx, env.Client, "plugin")
	if err != nil {
		t.Fatal(err)
	}
	annotations := map[string]string{
		inplacev1.UpgradeToAnnotation: "v1.35.6+rke2r1", inplacev1.UpgradeStatusAnnotation: inplacev1.UpgradeStatusInProgress,
		inplacev1.UpgradeProgressAnnotation: "1/3",
	}
	if _, err := fixtures.Cluster(ctx, env.Client, ns, "harvester", "harvester-cp", annotations); err != nil {
		t.Fatal(err)
	}
	controller := playPreviewController(ctx, t, env.Client, ns)
	plugin := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		code = run(ctx, append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	t.Run("preview creates the UpgradePreview, waits for it and prints it", func(t *testing.T) {
		code, out, stderr := plugin("preview", "harvester", "v1.35.6+rke2r1")
		if code != 0 {
			t.Fatalf("exit code %d, stderr %s", code, stderr)
		}
		for _, want := range []string{"UpgradePreview " + ns + "/harvester-v1.35.6-rke2r1: Cluster harvester to v1.35.6+rke2r1", "Phase:       Ready", "ORDER  MACHINE", "harvester-workers-1", "held by Availability: 1 of 3 nodes down"} {
			if !strings.Contains(out, want) {
				t.Errorf("the output does not say %q:\n%s", want, out)
			}
		}
		if got := controller.computations("harvester-v1.35.6-rke2r1"); got != 1 {
			t.Errorf("the preview was computed %d times, want 1", got)
		}
	})

	t.Run("preview again refreshes the same UpgradePreview with the new options", func(t *testing.T) {
		code, out, stderr := plugin("preview", "harvester", "v1.35.6+rke2r1", "--node-order", "b,a", "--pause-nodes", "c", "--max-unavailable", "2", "-o", "yaml")
		if code != 0 {
			t.Fatalf("exit code %d, stderr %s", code, stderr)
		}
		if !strings.Contains(out, "kind: UpgradePreview") || !strings.Contains(out, "observedRefresh:") {
			t.Errorf("-o yaml does not print the object:\n%s", out)
		}
		p := &inplacev1.UpgradePreview{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "harvester-v1.35.6-rke2r1"}, p); err != nil {
			t.Fatal(err)
		}
		if strings.Join(p.Spec.NodeOrder, ",") != "b,a" || strings.Join(p.Spec.PauseNodes, ",") != "c" || p.Spec.MaxUnavailable.String() != "2" {
			t.Errorf("the spec is %+v, want nodeOrder b,a, pauseNodes c, maxUnavailable 2", p.Spec)
		}
		if got := controller.computations(p.Name); got != 2 {
			t.Errorf("the preview was computed %d times, want 2 (the refresh annotation changed)", got)
		}
		list := &inplacev1.UpgradePreviewList{}
		if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
			t.Errorf("%d UpgradePreviews (error %v), want the one refreshed", len(list.Items), err)
		}
	})

	t.Run("KUBECONFIG is honoured and --name names the preview", func(t *testing.T) {
		t.Setenv("KUBECONFIG", kubeconfig)
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"preview", "--namespace=" + ns, "--name", "mine", "harvester", "v1.35.6"}, &out, &errOut)
		if code != 0 || !strings.Contains(out.String(), "UpgradePreview "+ns+"/mine:") {
			t.Errorf("exit code %d, stderr %s, output:\n%s", code, errOut.String(), out.String())
		}
	})

	t.Run("a failed preview prints its message and exits 1", func(t *testing.T) {
		code, out, stderr := plugin("preview", "harvester", failingVersion)
		if code != 1 || !strings.Contains(out, "Phase:       Failed") || !strings.Contains(stderr, "no updater is configured") {
			t.Errorf("exit code %d, stdout:\n%s\nstderr: %s", code, out, stderr)
		}
	})

	t.Run("a cluster that does not exist is named, with what to do", func(t *testing.T) {
		code, _, stderr := plugin("preview", "nope", "v1.35.6")
		if code != 1 || !strings.Contains(stderr, `no Cluster "nope" in namespace "`+ns+`"`) || !strings.Contains(stderr, "kubectl get clusters -A") {
			t.Errorf("exit code %d, stderr: %s", code, stderr)
		}
	})

	t.Run("a preview nobody computes times out and says why", func(t *testing.T) {
		code, _, stderr := plugin("preview", "harvester", ignoredVersion, "--wait", "1s")
		if code != 1 || !strings.Contains(stderr, "was not computed within 1s") || !strings.Contains(stderr, "is the capi-inplace manager running") {
			t.Errorf("exit code %d, stderr: %s", code, stderr)
		}
	})

	t.Run("bad command lines exit 2 and say what is wrong", func(t *testing.T) {
		for _, args := range [][]string{
			{"preview", "harvester"}, {"preview", "harvester", "v1", "-o", "wide"}, {"preview", "harvester", "v1", "--max-unavailable", "0"},
			{"preview", "harvester", "v1", "--max-unavailable", "two"}, {"status"}, {"preview", "harvester", "v1", "--no-such-flag"}, {"upgrade", "harvester"},
		} {
			code, _, stderr := plugin(args...)
			if code != 2 || !strings.HasPrefix(stderr, "error: ") {
				t.Errorf("%q: exit code %d, stderr %q; want 2 and an error", args, code, stderr)
			}
		}
	})

	createUpgrade(ctx, t, env.Client, ns)
	createHeldPlans(ctx, t, env.Client, ns)

	t.Run("status shows tasks, machines, steps and failures", func(t *testing.T) {
		code, out, stderr := plugin("status", "harvester")
		if code != 0 {
			t.Fatalf("exit code %d, stderr %s", code, stderr)
		}
		for _, want := range []string{
			"in-place-upgrade-to:       v1.35.6+rke2r1", "in-place-upgrade-progress: 1/3",
			"UpgradeTask workers-v1.35.6: MachineDeployment/workers to v1.35.6+rke2r1: InProgress, 1/3 upgraded",
			"Degraded (NodeFailed): node w-2 failed",
			"OSUpgrade (2/3)", "held: Availability: 1 of 3 nodes down",
			"machine workers-2 (node w-2) of MachineDeployment/workers: StepFailed: elemental upgrade failed with return code: 33",
			// The Cluster's UpgradePlan, held by the failed node, in the plan's own words.
			"\nUpgradePlan harvester-v1-8-1: Harvester v1.8.1: NodeUpgrading, 1/3 nodes run the release\n  held in NodeUpgrading: " + heldPlanMessage + "\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the output does not say %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "workers-old") {
			t.Errorf("the superseded task is shown:\n%s", out)
		}
		if strings.Contains(out, "other-v1-8-1") {
			t.Errorf("another Cluster's UpgradePlan is shown:\n%s", out)
		}
	})

	t.Run("status --watch redraws until interrupted", func(t *testing.T) {
		watchCtx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
		defer cancel()
		var out, errOut bytes.Buffer
		code := run(watchCtx, []string{"--kubeconfig", kubeconfig, "-n", ns, "status", "harvester", "-w"}, &out, &errOut)
		if code != 0 || strings.Count(out.String(), "UpgradeTask workers-v1.35.6") < 2 {
			t.Errorf("exit code %d, stderr %s; want at least 2 screens:\n%s", code, errOut.String(), out.String())
		}
	})

	t.Run("status of a cluster that does not exist", func(t *testing.T) {
		code, _, stderr := plugin("status", "nope")
		if code != 1 || !strings.Contains(stderr, `no Cluster "nope"`) {
			t.Errorf("exit code %d, stderr %s", code, stderr)
		}
	})
}

// Versions the stand-in controller answers specially.
const (
	failingVersion = "v9.9.9"  // computed as Failed
	ignoredVersion = "v1.99.0" // never computed
)

// previewController stands in for capi-inplace's UpgradePreview controller, which lives
// on another branch: like it, it computes a preview once per new value of the refresh
// annotation and records the value in status.observedRefresh. What it writes is fixed.
type previewController struct {
	mu    sync.Mutex
	count map[string]int
}

func (p *previewController) computations(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count[name]
}

func playPreviewController(ctx context.Context, t *testing.T, c client.Client, ns string) *previewController {
	p := &previewController{count: map[string]int{}}
	go func() {
		for ctx.Err() == nil {
			list := &inplacev1.UpgradePreviewList{}
			if err := c.List(ctx, list, client.InNamespace(ns)); err == nil {
				for i := range list.Items {
					p.compute(ctx, t, c, &list.Items[i])
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return p
}

func (p *previewController) compute(ctx context.Context, t *testing.T, c client.Client, u *inplacev1.UpgradePreview) {
	token := u.Annotations[inplacev1.RefreshAnnotation]
	if token == u.Status.ObservedRefresh || u.Spec.Version == ignoredVersion {
		return
	}
	now := metav1.Now()
	u.Status = inplacev1.UpgradePreviewStatus{Phase: inplacev1.PreviewPhaseReady, ObservedRefresh: token, ComputedTime: &now, InPlace: 2, Held: 1,
		Machines: []inplacev1.PreviewMachine{
			{Name: "harvester-workers-1", NodeName: "w-1", Outcome: inplacev1.MachineOutcomeInPlace, Order: 1},
			{Name: "harvester-workers-2", NodeName: "w-2", Outcome: inplacev1.MachineOutcomeInPlace, Order: 2, WouldHold: true,
				Preflight: []inplacev1.PreflightCheckStatus{{Name: "Availability", Message: "1 of 3 nodes down"}}},
		}}
	if u.Spec.Version == failingVersion {
		u.Status = inplacev1.UpgradePreviewStatus{Phase: inplacev1.PreviewPhaseFailed, ObservedRefresh: token, ComputedTime: &now,
			Message: "no updater is configured for Cluster harvester: annotate it with inplace.cluster.x-k8s.io/updater"}
	}
	if err := c.Status().Update(ctx, u); err != nil {
		if ctx.Err() == nil {
			t.Logf("the stand-in preview controller could not write %s: %v (it tries again)", u.Name, err)
		}
		return
	}
	p.mu.Lock()
	p.count[u.Name]++
	p.mu.Unlock()
}

// createUpgrade writes a running upgrade as capi-inplace's controllers would leave it: a
// MachineDeployment's task with one machine upgraded, one failed, one held, their
// NodeUpdates, and an older task of the same MachineDeployment that was superseded.
func createUpgrade(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	updater := inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}
	ago := func(d time.Duration) *metav1.Time { tm := metav1.NewTime(time.Now().Add(-d)); return &tm }
	for _, name := range []string{"workers-old", "workers-v1.35.6"} {
		task := &inplacev1.UpgradeTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: inplacev1.UpgradeTaskSpec{ClusterName: "harvester", Version: "v1.35.6+rke2r1", UpdaterRef: updater,
				MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"}},
		}
		must(t, c.Create(ctx, task))
		task.Status = inplacev1.UpgradeTaskStatus{Phase: inplacev1.TaskPhaseInProgress, Total: 3, Upgraded: 1, Failed: 1, Waiting: 1, Progress: "1/3", StartTime: ago(5 * time.Minute),
			Machines: []inplacev1.MachineUpgradeStatus{
				{Name: "workers-1", NodeName: "w-1", State: inplacev1.MachineStateInProgress, Order: 1, NodeUpdate: "nu-1"},
				{Name: "workers-2", NodeName: "w-2", State: inplacev1.MachineStateFailed, Order: 2, NodeUpdate: "nu-2"},
				{Name: "workers-3", NodeName: "w-3", State: inplacev1.MachineStateWaiting, Order: 3, Message: "Availability: 1 of 3 nodes down"},
			},
			Conditions: []metav1.Condition{{Type: inplacev1.DegradedCondition, Status: metav1.ConditionTrue, Reason: inplacev1.NodeFailedReason, Message: "node w-2 failed", LastTransitionTime: metav1.Now()}},
		}
		must(t, c.Status().Update(ctx, task))
		time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of a second: the second task is newer
	}
	for i, st := range []inplacev1.NodeUpdateStatus{
		{Phase: inplacev1.NodeUpdatePhaseInProgress, StartTime: ago(time.Minute), CurrentStep: "OSUpgrade", Steps: []inplacev1.NodeUpdateStep{
			{Name: "Drain", State: inplacev1.StepStateSucceeded}, {Name: "OSUpgrade", State: inplacev1.StepStateRunning, StartTime: ago(30 * time.Second)}, {Name: "Finish", State: inplacev1.StepStatePending},
		}},
		{Phase: inplacev1.NodeUpdatePhaseFailed, StartTime: ago(3 * time.Minute), CompletionTime: ago(2 * time.Minute), CurrentStep: "OSUpgrade",
			FailureReason: inplacev1.StepFailedReason, FailureMessage: "elemental upgrade failed with return code: 33"},
	} {
		nu := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("nu-%d", i+1)},
			Spec: inplacev1.NodeUpdateSpec{ClusterName: "harvester", MachineName: fmt.Sprintf("workers-%d", i+1), NodeName: fmt.Sprintf("w-%d", i+1),
				Version: "v1.35.6+rke2r1", UpdaterRef: updater},
		}
		must(t, c.Create(ctx, nu))
		nu.Status = st
		must(t, c.Status().Update(ctx, nu))
	}
}

// heldPlanMessage is what the UpgradePlan's Degraded condition says when a failed node
// holds it (upgradeplan's heldByFailedNodes).
const heldPlanMessage = "node w-2 failed at OSUpgrade: elemental upgrade failed with return code: 33; the cluster keeps the roll's settings (the descheduler add-on off) until the plan ends; " +
	"to go on: retry the node (kubectl annotate cluster -n demo harvester inplace.cluster.x-k8s.io/failure-budget-reset=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite, then kubectl annotate machinedeployment -n demo workers inplace.cluster.x-k8s.io/in-place-upgrade-to=v1.35.6+rke2r1 --overwrite) " +
	"or end the plan (kubectl annotate upgradeplan -n demo harvester-v1-8-1 harvester.inplace.cluster.x-k8s.io/allow-deletion=true, then kubectl delete upgradeplan -n demo harvester-v1-8-1), which gives every setting back"

// createHeldPlans writes the Cluster's UpgradePlan as the Harvester adapter leaves it when
// a failed node holds it in NodeUpgrading, and an UpgradePlan of another Cluster.
func createHeldPlans(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	for _, cluster := range []string{"harvester", "other"} {
		plan := &harvesterv1.UpgradePlan{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-v1-8-1"},
			Spec:       harvesterv1.UpgradePlanSpec{ClusterName: cluster, UpgraderName: "default", Version: "v1.8.1"},
		}
		must(t, c.Create(ctx, plan))
		plan.Status = harvesterv1.UpgradePlanStatus{Phase: harvesterv1.UpgradePlanNodeUpgrading, Upgraded: "1/3", Message: heldPlanMessage,
			Conditions: []metav1.Condition{{Type: harvesterv1.UpgradePlanDegraded, Status: metav1.ConditionTrue, Reason: "Held", Message: heldPlanMessage, LastTransitionTime: metav1.Now()}}}
		must(t, c.Status().Update(ctx, plan))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
