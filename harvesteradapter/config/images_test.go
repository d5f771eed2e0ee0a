package config

import (
	"testing"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/fixtures"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

func TestResolveImages(t *testing.T) {
	u := Reader{NodeImage: "ghcr.io/capi-inplace/capi-inplace:v0.4.0", Version: "v0.4.0"}
	for _, tc := range []struct{ in, want, reason string }{
		{in: "", want: "ghcr.io/capi-inplace/capi-inplace:v0.4.0"},
		{in: "registry.local:5000/capi-inplace", want: "registry.local:5000/capi-inplace:v0.4.0"},
		{in: "registry.local:5000/capi-inplace:v0.3.9", want: "registry.local:5000/capi-inplace:v0.3.9"},
		{in: "registry.local/capi-inplace@sha256:0123", want: "registry.local/capi-inplace@sha256:0123"},
	} {
		cfg := fixtures.Upgrader()
		cfg.Spec.Images.Node = tc.in
		if err := u.ResolveImages(cfg); err != nil || cfg.Spec.Images.Node != tc.want {
			t.Errorf("images.node %q resolves to %q, %v; want %q", tc.in, cfg.Spec.Images.Node, err, tc.want)
		}
	}
	cfg := fixtures.Upgrader()
	cfg.Spec.Images.Node = ""
	if err := (Reader{}).ResolveImages(cfg); err == nil {
		t.Errorf("no images.node and no manager node image: resolved to %q", cfg.Spec.Images.Node)
	} else if p, ok := nodeupdater.AsPermanent(err); !ok || p.Reason != "NoNodeImage" {
		t.Errorf("error %v, want the permanent NoNodeImage", err)
	}
	for _, bad := range []string{"", "ghcr.io/capi-inplace/capi-inplace", "localhost:5000/capi-inplace", "a b:v1"} {
		if CheckNodeImage(bad) == nil {
			t.Errorf("--harvester-node-image %q accepted", bad)
		}
	}
	for _, good := range []string{"ghcr.io/capi-inplace/capi-inplace:dev", "localhost:5000/capi-inplace:v0.4.0", "r.example/c@sha256:00"} {
		if err := CheckNodeImage(good); err != nil {
			t.Errorf("--harvester-node-image %q refused: %v", good, err)
		}
	}
}
