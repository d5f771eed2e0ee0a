package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
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

// previewResult is the time to compute an UpgradePreview of a 3 control plane + 3 worker
// cluster, one row per updater.
type previewResult struct {
	rows []previewRow
}

// previewRow is one updater's preview of its 3+3 cluster.
type previewRow struct {
	updater    string
	cluster    string
	iterations int
	lat        latencies
	summary    string
	// reads and workloadReads are the requests per computation to the management and to
	// the workload API server, by verb and resource (cached reads are not requests).
	reads, workloadReads map[string]float64
}

// worst is the highest p99 of the rows.
func (r *previewResult) worst() time.Duration {
	var out time.Duration
	for _, row := range r.rows {
		out = max(out, row.lat.p99)
	}
	return out
}

// runPreviewBench times the preview of a 3+3 cluster with the test's external updater
// (runExternalPreview) and with the Harvester updater (runHarvesterPreview).
func runPreviewBench(ctx context.Context, b *bench) (*previewResult, error) {
	res := &previewResult{}
	for _, run := range []func(context.Context, *bench) (previewRow, error){runExternalPreview, runHarvesterPreview} {
		row, err := run(ctx, b)
		if err != nil {
			return res, fmt.Errorf("%s: %w", row.updater, err)
		}
		res.rows = append(res.rows, row)
		b.printf("   %s, %s, %d computations: p50 %s ms, p99 %s ms, max %s ms; reads per computation: management %s, workload %s (%s)\n",
			row.updater, row.cluster, row.iterations, ms(row.lat.p50), ms(row.lat.p99), ms(row.lat.max), describeReads(row.reads), describeReads(row.workloadReads), row.summary)
	}
	return res, nil
}

// runExternalPreview creates a simulated 3+3 cluster (test/fixtures: a KubeadmControlPlane
// and a MachineDeployment of 3 Machines each, with Ready Nodes, and an external updater)
// and times Reconciler.Compute, which reads from a synced cache as the manager does and
// calls the run's code: the version checks, both CanUpdate hooks, the order, every
// preflight check of every machine and the estimate.
func runExternalPreview(ctx context.Context, b *bench) (previewRow, error) {
	row := previewRow{updater: "test updater", cluster: "3+3 Machines with Ready Nodes (test/fixtures)", iterations: b.cfg.previewIterations}
	ns, err := fixtures.Namespace(ctx, b.client, "preview")
	if err != nil {
		return row, err
	}
	if _, err := fixtures.Cluster(ctx, b.client, ns, "harvester", "cp", nil); err != nil {
		return row, err
	}
	if _, _, err := fixtures.ControlPlane(ctx, b.client, ns, "harvester", "cp", "v1.33.3+rke2r1", 3, false); err != nil {
		return row, err
	}
	if _, _, err := fixtures.MachineDeployment(ctx, b.client, ns, "harvester", "workers", "v1.33.3+rke2r1", 3); err != nil {
		return row, err
	}
	if err := fixtures.ExternalUpdater(ctx, b.client, ns); err != nil {
		return row, err
	}
	cache, err := b.env.StartCache(ctx)
	if err != nil {
		return row, err
	}
	defer cache.Stop()
	counter := newRequestCounter()
	cached, err := client.New(counter.wrap(managerRESTConfig(b.env.Config)), client.Options{Scheme: b.env.Scheme, Cache: &client.CacheOptions{Reader: cache}})
	if err != nil {
		return row, err
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
	if err := warmPreview(ctx, r, p, func(st inplacev1.UpgradePreviewStatus) error {
		if st.InPlace != 6 {
			return fmt.Errorf("%d machines in place, not 6", st.InPlace)
		}
		return nil
	}); err != nil {
		return row, err
	}
	counter.reset()
	if err := timePreview(ctx, r, p, &row); err != nil {
		return row, err
	}
	row.reads = perPreview(counter.snapshot(), row.iterations)
	return row, nil
}

// warmPreview computes the preview until ready says it shows what the bench built (the
// caches show every Machine, the workload cluster answers), and a few rounds more.
func warmPreview(ctx context.Context, r *preview.Reconciler, p *inplacev1.UpgradePreview, ready func(inplacev1.UpgradePreviewStatus) error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := r.Compute(ctx, p)
		if err != nil {
			return err
		}
		notYet := ready(st)
		if notYet == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the preview of the 3+3 cluster is not what the bench built: %w (%s; %s)", notYet, st.Summary, st.Message)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 3 {
		if _, err := r.Compute(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// timePreview computes the preview row.iterations times, one after the other.
func timePreview(ctx context.Context, r *preview.Reconciler, p *inplacev1.UpgradePreview, row *previewRow) error {
	samples := make([]time.Duration, 0, row.iterations)
	for range row.iterations {
		start := time.Now()
		st, err := r.Compute(ctx, p)
		if err != nil {
			return err
		}
		samples = append(samples, time.Since(start))
		row.summary = st.Summary
	}
	row.lat = summarize(samples)
	return nil
}

// perPreview divides the reads (GET, LIST) of counts by n.
func perPreview(counts map[string]int, n int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range counts {
		if strings.HasPrefix(k, "GET ") || strings.HasPrefix(k, "LIST ") {
			out[k] = float64(v) / float64(n)
		}
	}
	return out
}

// totalReads is the sum of reads.
func totalReads(reads map[string]float64) float64 {
	var t float64
	for _, v := range reads {
		t += v
	}
	return t
}

// describeReads is the total and its largest parts, "12.0 (LIST pods 6.00, ...)".
func describeReads(reads map[string]float64) string {
	if len(reads) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(reads))
	for k := range reads {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if reads[keys[i]] != reads[keys[j]] {
			return reads[keys[i]] > reads[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, reads[k]))
	}
	return fmt.Sprintf("%.1f (%s)", totalReads(reads), strings.Join(parts, ", "))
}

// renderPreview writes the preview section.
func (r *report) renderPreview(w io.Writer, full bool) {
	if r.preview == nil {
		return
	}
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("## 7. UpgradePreview of a 3+3 cluster\n\n")
	if full {
		p("The time `preview.Reconciler.Compute` takes for a Cluster of 3 control plane and 3 worker Machines, reading from a synced cache as the manager does: ")
		p("the version checks, CanUpdateMachine per control plane machine and CanUpdateMachineSet per MachineSet, the order, every preflight check of every machine, ")
		p("the updater's disruption preview of every node where it gives one, and the estimate. Nothing is written. Two updaters: the test's external updater on ")
		p("test/fixtures' Machines with Ready Nodes (no disruption preview, no workload cluster of its own), and the Harvester updater wired as `main.go` wires it ")
		p("on a simulated Harvester cluster of its own workload API server, built like the demo's: Rancher provisions the 6 nodes, KubeVirt runs the demo's 3 VMs ")
		p("on the workers (two live-migratable, one with a PCI device), a database pod on each worker under a PodDisruptionBudget that allows no disruption, ")
		p("a Longhorn v2 instance manager under its own budget on each node, and 3 Longhorn v2 volumes with replicas on the workers. Reads are the requests per ")
		p("computation to each API server, counted on the clients' transports (GET and LIST; cached reads are not requests).\n\n")
	}
	p("| updater | cluster | computations | p50 ms | p99 ms | max ms | management reads | workload reads | target |\n|---|---|---:|---:|---:|---:|---|---|---|\n")
	for _, row := range r.preview.rows {
		p("| %s | %s | %d | %s | %s | %s | %.1f | %s | p99 under %s: %s |\n", row.updater, row.cluster, row.iterations, ms(row.lat.p50), ms(row.lat.p99), ms(row.lat.max),
			totalReads(row.reads), describeReads(row.workloadReads), targetPreview, yesNo(row.lat.p99 < targetPreview))
	}
	p("\n")
}
