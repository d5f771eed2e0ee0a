package harvesteradapter

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

func TestSnapshotConfig(t *testing.T) {
	cfg, nu := testUpgrader(), testNodeUpdate("node-1")
	cfg.Generation = 4
	got, err := snapshotConfig(nu, cfg)
	if err != nil || got != cfg {
		t.Fatalf("first snapshot: %v, %v", got, err)
	}
	if nu.Status.UpdaterConfig == nil || !strings.Contains(string(nu.Status.UpdaterConfig.Raw), `"generation":4`) {
		t.Fatalf("status.updaterConfig %v does not record the generation", nu.Status.UpdaterConfig)
	}

	edited := testUpgrader()
	edited.Spec.Release.Version = "v1.7.0"
	got, err = snapshotConfig(nu, edited)
	if err != nil || got.Spec.Release.Version != "v1.6.0" || got.Generation != 4 || got.Namespace != nu.Namespace {
		t.Errorf("a started node keeps its configuration: got %+v, %v", got, err)
	}

	nu.Status.UpdaterConfig = &runtime.RawExtension{Raw: []byte(`{"kind":"SomethingElse"}`)}
	if _, err := snapshotConfig(nu, edited); err == nil {
		t.Errorf("a snapshot of another kind is accepted")
	} else if p, ok := nodeupdater.AsPermanent(err); !ok || p.Reason != "InvalidUpdaterConfig" {
		t.Errorf("error %v, want the permanent InvalidUpdaterConfig", err)
	}
}
