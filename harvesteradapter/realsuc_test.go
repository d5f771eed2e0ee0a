//go:build realsuc

package harvesteradapter_test

// A by-hand check of test/sim's SUC against the real System Upgrade Controller, never
// part of make test or CI (SUC's root module is not served by the module proxy; it is
// built from a checkout): `make check-real-suc REAL_SUC_SRC=<checkout>`. Both run on one
// API server, each in its own namespace with a node of its own, and get the Plans the
// Harvester updater writes. The check asserts that they build the same Job for every
// Plan kind, resolve the same Plan status, label the node the same way when a Job
// completes, report a failed Job the same way, and replace a failed Job once its Plan
// changes (shared/facts/suc.md, facts 16, 25 to 29, 45, 46, 48).

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// side is one SUC: the real one or the simulator, with its namespace and node.
type side struct {
	name, namespace, node string
}

var sides = [2]side{{"real SUC", "cattle-system", "node-a"}, {"simulator", "sim-system", "node-b"}}

func TestRealSUC(t *testing.T) {
	bin := os.Getenv("REAL_SUC")
	if bin == "" {
		t.Fatal("REAL_SUC must name a system-upgrade-controller binary (make check-real-suc builds one)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := testenv.Start()
	require(t, err)
	defer func() { _ = e.Stop() }()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require(t, e.WriteKubeconfig(kubeconfig))
	c := e.Client

	rec := sim.NewRecord()
	kubelet := &sim.Kubelet{Client: c, Record: rec}
	for _, s := range sides {
		require(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.namespace}}))
		require(t, c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "system-upgrade-controller", Namespace: s.namespace}}))
		_, err := kubelet.CreateNode(ctx, s.node, "v1.35.6+rke2r1", nil)
		require(t, err)
	}

	log, err := os.Create(filepath.Join(t.TempDir(), "suc.log"))
	require(t, err)
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", kubeconfig)
	cmd.Env = append(os.Environ(), "SYSTEM_UPGRADE_CONTROLLER_NAMESPACE="+sides[0].namespace,
		"SYSTEM_UPGRADE_CONTROLLER_NAME=system-upgrade-controller", "SYSTEM_UPGRADE_CONTROLLER_NODE_NAME="+sides[0].node)
	cmd.Stdout, cmd.Stderr = log, log
	procguard.Guard(cmd) // SUC ends with this test binary, even a killed one
	require(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill() }()
	// The simulator's Jobs never run on their own here: the test finishes them.
	suc := &sim.SUC{Client: c, Namespace: sides[1].namespace, Kubelet: kubelet, Record: rec, JobDuration: time.Hour, Interval: 50 * time.Millisecond}
	go func() { _ = suc.Run(ctx) }()

	for _, kind := range []string{"preload", "drain", "rke2", "os"} {
		var plans [2]*sucv1.Plan
		var jobs [2]*batchv1.Job
		for i, s := range sides {
			plans[i] = harvesteradapter.PlanForNode(&harvesteradapter.Updater{Version: "v0.4.0"}, upgraderFor(s), nodeUpdateFor(s), kind, "http://repo.example")
			require(t, c.Create(ctx, plans[i]))
		}
		for i, s := range sides {
			// Wait for the Job un-paused (fact 28: created with parallelism 0, set to 1
			// once the node is applying), so that both are compared in the same state.
			jobs[i] = waitForJob(ctx, t, c, s, plans[i].Name, func(j *batchv1.Job) bool {
				return j.Spec.Parallelism != nil && *j.Spec.Parallelism == 1
			})
			plans[i] = get(ctx, t, c, plans[i])
		}
		for i, s := range sides {
			// Fact 24: apply-<plan>-on-<node>-with-<hash>, cut by wrangler's SafeConcatName.
			if want := sim.SafeConcatName("apply", plans[i].Name, "on", s.node, "with", plans[i].Status.LatestHash); jobs[i].Name != want {
				t.Errorf("%s: %s named its Job %q, SafeConcatName gives %q", kind, s.name, jobs[i].Name, want)
			}
		}
		if d := cmp.Diff(comparableJob(t, jobs[0], sides[0], plans[0].Name), comparableJob(t, jobs[1], sides[1], plans[1].Name)); d != "" {
			t.Errorf("%s: the Jobs differ (real SUC -, simulator +):\n%s", kind, d)
		}
		if d := cmp.Diff(comparableStatus(plans[0]), comparableStatus(plans[1])); d != "" {
			t.Errorf("%s: the Plan statuses differ (real SUC -, simulator +):\n%s", kind, d)
		}

		failed := kind == "os"
		for i := range sides {
			finishJob(ctx, t, c, jobs[i], failed)
		}
		time.Sleep(5 * time.Second)
		var labels [2]string
		for i, s := range sides {
			node := &corev1.Node{}
			require(t, c.Get(ctx, client.ObjectKey{Name: s.node}, node))
			labels[i] = node.Labels["plan.upgrade.cattle.io/"+plans[i].Name]
			plans[i] = get(ctx, t, c, plans[i])
		}
		if failed && (labels[0] != "" || labels[1] != "") {
			t.Errorf("%s: a failed Job labelled the node: real %q, simulator %q", kind, labels[0], labels[1])
		}
		if !failed && (labels[0] != plans[0].Status.LatestHash || labels[1] != plans[1].Status.LatestHash) {
			t.Errorf("%s: a completed Job should label the node with the Plan's hash: real %q, simulator %q, hash %q", kind, labels[0], labels[1], plans[0].Status.LatestHash)
		}
		if d := cmp.Diff(comparableStatus(plans[0]), comparableStatus(plans[1])); d != "" {
			t.Errorf("%s: after the Job ended the Plan statuses differ (real SUC -, simulator +):\n%s", kind, d)
		}
		if !failed {
			continue
		}
		// A failed Job stays until its TTL; a change of the Plan (an annotation is enough)
		// replaces it with a new Job (facts 45, 48).
		for i := range sides {
			p := get(ctx, t, c, plans[i])
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations["example.com/touched"] = "1"
			require(t, c.Update(ctx, p))
		}
		for i, s := range sides {
			old := jobs[i].UID
			waitForJob(ctx, t, c, s, plans[i].Name, func(j *batchv1.Job) bool { return j.UID != old })
		}
	}
}

func upgraderFor(s side) *harvesterv1.HarvesterUpgrader {
	return &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"},
		Spec: harvesterv1.HarvesterUpgraderSpec{
			Release:                 harvesterv1.Release{Version: "v1.8.2", RepositoryURL: "http://repo.example"},
			Images:                  harvesterv1.Images{RKE2Upgrade: "rancher/rke2-upgrade", Node: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Kubectl: "rancher/kubectl:v1.30.3"},
			SystemUpgradeController: harvesterv1.SystemUpgradeController{Namespace: s.namespace, ServiceAccountName: "system-upgrade-controller"},
		},
	}
}

func nodeUpdateFor(s side) *inplacev1.NodeUpdate {
	return &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Name: "nu-" + s.node, Namespace: "default", UID: "0b1c7a52-3d8e-4f0a-9b9e-0d5f3c6a7e21"},
		Spec:       inplacev1.NodeUpdateSpec{ClusterName: "hv", MachineName: "m-" + s.node, NodeName: s.node, Version: "v1.35.6+rke2r2"},
	}
}

// comparableJob is a Job without what differs by construction between the two sides:
// server-set metadata, status, and wrangler's apply bookkeeping (objectset hash and
// applied annotations, which the simulator writes in its own form because nothing reads
// them); the side's namespace, node and Plan name are written alike.
func comparableJob(t *testing.T, j *batchv1.Job, s side, plan string) map[string]any {
	t.Helper()
	j = j.DeepCopy()
	j.ObjectMeta = metav1.ObjectMeta{Labels: j.Labels, Annotations: j.Annotations}
	j.Status = batchv1.JobStatus{}
	j.Spec.Selector = nil
	delete(j.Labels, "objectset.rio.cattle.io/hash")
	delete(j.Annotations, "objectset.rio.cattle.io/applied")
	delete(j.Spec.Template.Labels, "batch.kubernetes.io/controller-uid")
	delete(j.Spec.Template.Labels, "controller-uid")
	// The Job's name, which these two labels repeat, is checked on its own (jobNamed).
	delete(j.Spec.Template.Labels, "batch.kubernetes.io/job-name")
	delete(j.Spec.Template.Labels, "job-name")
	data, err := json.Marshal(j)
	require(t, err)
	text := strings.NewReplacer(plan, "<plan>", s.node, "<node>", s.namespace, "<namespace>").Replace(string(data))
	out := map[string]any{}
	require(t, json.Unmarshal([]byte(text), &out))
	return out
}

// comparableStatus is a Plan status without times and with the node named alike.
func comparableStatus(p *sucv1.Plan) sucv1.PlanStatus {
	st := p.Status.DeepCopy()
	for i := range st.Conditions {
		st.Conditions[i].LastUpdateTime = ""
		st.Conditions[i].LastTransitionTime = ""
		st.Conditions[i].Message = ""
	}
	for i := range st.Applying {
		st.Applying[i] = "<node>"
	}
	return *st
}

func waitForJob(ctx context.Context, t *testing.T, c client.Client, s side, plan string, ok func(*batchv1.Job) bool) *batchv1.Job {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		list := &batchv1.JobList{}
		require(t, c.List(ctx, list, client.InNamespace(s.namespace), client.MatchingLabels{"upgrade.cattle.io/plan": plan}))
		for i := range list.Items {
			if ok(&list.Items[i]) {
				return &list.Items[i]
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: no Job of Plan %s as awaited within 60s", s.name, plan)
	return nil
}

// finishJob ends a Job as the Job controller would: Complete, or Failed past its deadline.
func finishJob(ctx context.Context, t *testing.T, c client.Client, job *batchv1.Job, failed bool) {
	t.Helper()
	// Real SUC writes the same Job (its finalizer, its labels) while the spec does: a write
	// that loses the optimistic-lock race reads the Job again and writes the ending again,
	// as the Job controller it stands for does.
	require(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		j := &batchv1.Job{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), j); err != nil {
			return err
		}
		now := metav1.Now()
		if j.Status.StartTime == nil {
			j.Status.StartTime = &now
		}
		j.Status.Active, j.Status.Ready, j.Status.Terminating = 0, nil, nil
		cond := func(t batchv1.JobConditionType, reason string) batchv1.JobCondition {
			return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, LastTransitionTime: now, LastProbeTime: now}
		}
		if failed {
			j.Status.Failed = 1
			j.Status.Conditions = []batchv1.JobCondition{cond(batchv1.JobFailureTarget, "DeadlineExceeded"), cond(batchv1.JobFailed, "DeadlineExceeded")}
		} else {
			j.Status.Succeeded = 1
			j.Status.CompletionTime = &now
			j.Status.Conditions = []batchv1.JobCondition{cond(batchv1.JobSuccessCriteriaMet, ""), cond(batchv1.JobComplete, "")}
		}
		return c.Status().Update(ctx, j)
	}))
}

func get(ctx context.Context, t *testing.T, c client.Client, p *sucv1.Plan) *sucv1.Plan {
	t.Helper()
	out := &sucv1.Plan{}
	require(t, c.Get(ctx, client.ObjectKeyFromObject(p), out))
	return out
}

func require(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
