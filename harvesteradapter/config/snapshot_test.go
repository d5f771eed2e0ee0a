package config

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

func TestSnapshotConfig(t *testing.T) {
	cfg, nu := fixtures.Upgrader(), fixtures.NodeUpdate("node-1")
	cfg.Generation = 4
	got, err := Take(nu, cfg)
	if err != nil || got != cfg {
		t.Fatalf("first snapshot: %v, %v", got, err)
	}
	if nu.Status.UpdaterConfig == nil || !strings.Contains(string(nu.Status.UpdaterConfig.Raw), `"generation":4`) {
		t.Fatalf("status.updaterConfig %v does not record the generation", nu.Status.UpdaterConfig)
	}

	edited := fixtures.Upgrader()
	edited.Spec.Release.Version = "v1.7.0"
	got, err = Take(nu, edited)
	if err != nil || got.Spec.Release.Version != "v1.6.0" || got.Generation != 4 || got.Namespace != nu.Namespace {
		t.Errorf("a started node keeps its configuration: got %+v, %v", got, err)
	}

	nu.Status.UpdaterConfig = &runtime.RawExtension{Raw: []byte(`{"kind":"SomethingElse"}`)}
	if _, err := Take(nu, edited); err == nil {
		t.Errorf("a snapshot of another kind is accepted")
	} else if p, ok := nodeupdater.AsPermanent(err); !ok || p.Reason != "InvalidUpdaterConfig" {
		t.Errorf("error %v, want the permanent InvalidUpdaterConfig", err)
	}
}

// A node keeps the node image it started with when the manager is upgraded (a new
// version, another --harvester-node-image) while the node is upgraded: its Plans are not
// rewritten, so SUC does not replace their Jobs (fact 49).
func TestSnapshotKeepsTheNodeImageAcrossAManagerUpgrade(t *testing.T) {
	nu := fixtures.NodeUpdate("node-1")
	before := Reader{NodeImage: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Version: "v0.4.0"}
	cfg := fixtures.Upgrader()
	cfg.Spec.Images.Node = ""
	if err := before.ResolveImages(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := Take(nu, cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(nu.Status.UpdaterConfig.Raw), `"node":"ghcr.io/capi-inplace/capi-inplace:v0.4.0"`) {
		t.Fatalf("status.updaterConfig %s does not record the resolved node image", nu.Status.UpdaterConfig.Raw)
	}
	started := suc.NodePlan(cfg, nu, suc.PlanOS, "http://repo.example")

	after := Reader{NodeImage: "ghcr.io/capi-inplace/capi-inplace:v0.5.0", Version: "v0.5.0"}
	live := fixtures.Upgrader()
	live.Spec.Images.Node = ""
	if err := after.ResolveImages(live); err != nil {
		t.Fatal(err)
	}
	got, err := Take(nu, live)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Images.Node != "ghcr.io/capi-inplace/capi-inplace:v0.4.0" {
		t.Errorf("after the manager's upgrade the node runs %s, not the image it started with", got.Spec.Images.Node)
	}
	if again := suc.NodePlan(got, nu, suc.PlanOS, "http://repo.example"); !equality.Semantic.DeepEqual(again.Spec, started.Spec) {
		t.Errorf("the node's OS Plan changed with the manager: %+v, was %+v", again.Spec.Upgrade, started.Spec.Upgrade)
	}
	fresh := fixtures.NodeUpdate("node-2")
	if got, err := Take(fresh, live); err != nil || got.Spec.Images.Node != "ghcr.io/capi-inplace/capi-inplace:v0.5.0" {
		t.Errorf("a node that starts after the manager's upgrade runs %v (%v), want the new manager's image", got, err)
	}
}

// A snapshot recorded by a manager from before images.node names no node image: the node
// fails plainly instead of getting its running Plans rewritten.
func TestSnapshotWithoutANodeImage(t *testing.T) {
	nu := fixtures.NodeUpdate("node-1")
	nu.Status.UpdaterConfig = &runtime.RawExtension{Raw: []byte(`{"kind":"HarvesterUpgrader","name":"default","generation":1,"spec":{"release":{"version":"v1.6.0"},"images":{"osUpgrade":"rancher/harvester-upgrade"}}}`)}
	if _, err := Take(nu, fixtures.Upgrader()); err == nil {
		t.Errorf("a snapshot without a node image is accepted")
	} else if p, ok := nodeupdater.AsPermanent(err); !ok || p.Reason != "InvalidUpdaterConfig" || !strings.Contains(p.Error(), "names no node image") {
		t.Errorf("error %v, want the permanent InvalidUpdaterConfig naming the missing node image", err)
	}
}

func TestCheckConfigDrainTimeout(t *testing.T) {
	cfg := fixtures.Upgrader()
	cfg.Spec.Drain.Timeout = ptr.To(intstr.FromString("2h"))
	if err := Check(cfg); err == nil || !strings.Contains(err.Error(), "drain.timeout 2h0m0s is longer than timeouts.drain 1h0m0s, the drain Job's deadline") {
		t.Errorf("a drain timeout past the drain Job's deadline: %v", err)
	}
}
