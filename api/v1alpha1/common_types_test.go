package v1alpha1_test

import (
	"strings"
	"testing"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

func TestParseUpdaterReference(t *testing.T) {
	tests := []struct {
		in      string
		want    inplacev1.UpdaterReference
		wantErr string
	}{
		{in: "HarvesterUpgrader/default", want: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"}},
		{in: " JobUpdater/kubeadm-nodes ", want: inplacev1.UpdaterReference{Kind: "JobUpdater", Name: "kubeadm-nodes"}},
		{in: "HarvesterUpgrader.harvester.inplace.cluster.x-k8s.io/default",
			want: inplacev1.UpdaterReference{APIGroup: "harvester.inplace.cluster.x-k8s.io", Kind: "HarvesterUpgrader", Name: "default"}},
		{in: "HarvesterUpgrader", wantErr: "is not of the form Kind/name"},
		{in: "/default", wantErr: "is not of the form Kind/name"},
		{in: "HarvesterUpgrader/", wantErr: "is not of the form Kind/name"},
		{in: "a/b/c", wantErr: "is not of the form Kind/name"},
		{in: "HarvesterUpgrader/Default_1", wantErr: `name "Default_1" is not a valid object name`},
		{in: "9Upgrader/default", wantErr: `kind "9Upgrader" must start with a letter`},
		{in: "Upgrader.Bad_Group/default", wantErr: `API group "Bad_Group" is not valid`},
	}
	for _, tt := range tests {
		got, err := inplacev1.ParseUpdaterReference(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseUpdaterReference(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseUpdaterReference(%q) unexpected error: %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseUpdaterReference(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if back, err := inplacev1.ParseUpdaterReference(got.String()); err != nil || back != got {
			t.Errorf("round trip of %q through String() gave %+v, %v", tt.in, back, err)
		}
	}
}
