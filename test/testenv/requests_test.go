package testenv

import "testing"

func TestParseRequestCounts(t *testing.T) {
	metrics := []byte(`# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="longhorn.io",resource="settings",scope="resource",subresource="",verb="GET",version="v1beta2"} 7.0
apiserver_request_duration_seconds_count{verb="LIST",resource="nodes"} 99
`)
	got := parseRequestCounts(metrics)
	want := RequestCounts{"LIST nodes": 15, "PATCH nodes/status": 2, "GET settings": 7}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if got.Total() != 24 {
		t.Errorf("Total: got %v, want 24", got.Total())
	}
}
