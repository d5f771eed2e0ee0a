package main

import (
	"context"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/preview"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// targetPreview bounds the computation of an UpgradePreview of a 3+3 cluster (issue #35).
const targetPreview = time.Second

// previewResult is the time to compute an UpgradePreview of a simulated 3 control plane +
// 3 worker cluster.
type previewResult struct {
	iterations int
	lat        latencies
	summary    string
}

// runPreviewBench creates a simulated 3+3 cluster (test/fixtures: a KubeadmControlPlane
// and a MachineDeployment of 3 Machines each, with Ready Nodes, and an external updater)
// and times Reconciler.Compute, which reads from a synced cache as the manager does and
// calls the run's code: the version checks, both CanUpdate hooks, the order, every
// preflight check of every machine and the estimate.
func runPreviewBench(ctx context.Context, b *bench) (*previewResult, error) {
	ns, err := fixtures.Namespace(ctx, b.client, "preview")
	if err != nil {
		return nil, err
	}
	if _, err := fixtures.Cluster(ctx, b.client, ns, "harvester", "cp", nil); err != nil {
		return nil, err
	}
	if _, _, err := fixtures.ControlPlane(ctx, b.client, ns, "harvester", "cp", "v1.33.3+rke2r1", 3, false); err != nil {
		return nil, err
	}
	if _, _, err := fixtures.MachineDeployment(ctx, b.client, ns, "harvester", "workers", "v1.33.3+rke2r1", 3); err != nil {
		return nil, err
	}
	if err := fixtures.ExternalUpdater(ctx, b.client, ns); err != nil {
		return nil, err
	}
	cache, err := b.env.StartCache(ctx)
	if err != nil {
		return nil, err
	}
	defer cache.Stop()
	cached, err := client.New(b.env.Config, client.Options{Scheme: b.env.Scheme, Cache: &client.CacheOptions{Reader: cache}})
	if err != nil {
		return nil, err
	}
	registry := nodeupdater.NewRegistry()
	r := &preview.Reconciler{
		Client: cached, Workload: upgradetask.SameCluster{Management: cached}, Registry: registry,
		Hooks: &extension.InPlaceHooks{Client: cached, Registry: registry},
	}
	p := &inplacev1.UpgradePreview{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec: inplacev1.UpgradePreviewSpec{ClusterName: "harvester", Version: "v1.34.1+rke2r1",
			UpdaterRef: &inplacev1.UpdaterReference{Kind: "ExternalUpgrader", Name: "default"}},
	}
	// Until the cache shows every Machine, and a few rounds to warm up.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := r.Compute(ctx, p)
		if err != nil {
			return nil, err
		}
		if st.InPlace == 6 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the preview of the 3+3 cluster shows %q, not 6 machines in place: %s", st.Summary, st.Message)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res := &previewResult{iterations: b.cfg.previewIterations}
	samples := make([]time.Duration, 0, res.iterations)
	for range res.iterations {
		start := time.Now()
		st, err := r.Compute(ctx, p)
		if err != nil {
			return nil, err
		}
		samples = append(samples, time.Since(start))
		res.summary = st.Summary
	}
	res.lat = summarize(samples)
	b.printf("   preview of 3+3 machines, %d computations: p50 %s ms, p99 %s ms, max %s ms (%s)\n", res.iterations, ms(res.lat.p50), ms(res.lat.p99), ms(res.lat.max), res.summary)
	return res, nil
}

// renderPreview writes the preview section.
func (r *report) renderPreview(w io.Writer, full bool) {
	if r.preview == nil {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 7. UpgradePreview of a 3+3 cluster\n\n")
	if full {
		p("The time `preview.Reconciler.Compute` takes for a simulated Cluster of 3 control plane and 3 worker Machines (test/fixtures, with Ready Nodes and an ")
		p("external updater), reading from a synced cache as the manager does: the version checks, CanUpdateMachine per control plane machine and ")
		p("CanUpdateMachineSet per MachineSet, the order, every preflight check of every machine, and the estimate. Nothing is written.\n\n")
	}
	p("| machines | computations | p50 ms | p99 ms | max ms | target |\n|---|---|---|---|---|---|\n")
	p("| 3+3 | %d | %s | %s | %s | p99 under %s: %s |\n\n", r.preview.iterations, ms(r.preview.lat.p50), ms(r.preview.lat.p99), ms(r.preview.lat.max), targetPreview, yesNo(r.preview.lat.p99 < targetPreview))
}
