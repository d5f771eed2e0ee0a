package capienv_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// TestProvision starts Cluster API's controllers against a test API server and provisions
// a ClusterClass cluster of the in-memory backend: the harness every real-CAPI spec uses.
func TestProvision(t *testing.T) {
	ctx := context.Background()
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	workDir := t.TempDir()
	if d := os.Getenv("CAPIENV_WORKDIR"); d != "" {
		workDir = d
	}
	capi, err := capienv.Start(ctx, env, workDir, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(capi.Logs(60))
		}
		if err := capi.Stop(); err != nil {
			t.Error(err)
		}
	})
	ns, err := fixtures.Namespace(ctx, env.Client, "provision")
	if err != nil {
		t.Fatal(err)
	}
	if err := capienv.CreateClasses(ctx, env.Client, ns); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := capienv.CreateCluster(ctx, env.Client, ns, "c1", capienv.ClusterShape{Version: "v1.35.2", ControlPlane: 1, Workers: 1}, nil); err != nil {
		t.Fatal(err)
	}
	machines, err := capienv.WaitProvisioned(ctx, env.Client, ns, "c1", 2, "v1.35.2", 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("provisioned %d machines in %s", len(machines), time.Since(start))
	versions, err := capienv.KubeletVersions(ctx, env.Client, env.Scheme, ns, "c1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("workload nodes: %v", versions)
	_ = os.Getenv
}
