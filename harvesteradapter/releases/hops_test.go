package releases

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestCheckHop(t *testing.T) {
	tests := []struct {
		name             string
		previous, target string
		reason           Refusal // "" means supported
		want             []string
	}{
		{name: "v1.7 to v1.8, the newest GA hop", previous: "v1.7.1", target: "v1.8.1"},
		{name: "v1.7.0, the oldest v1.8 installs over (fact 3)", previous: "v1.7.0", target: "v1.8.0"},
		{name: "patch inside v1.8", previous: "v1.8.0", target: "v1.8.1"},
		{name: "patch inside v1.7", previous: "v1.7.0", target: "v1.7.1"},
		{name: "already at the target: nothing moves", previous: "v1.8.1", target: "v1.8.1"},

		{name: "v1.6 to v1.7, its node migrations performed (fact 53)", previous: "v1.6.1", target: "v1.7.1"},
		{name: "v1.6.0 to v1.7.0", previous: "v1.6.0", target: "v1.7.0"},
		{name: "skips v1.7", previous: "v1.6.1", target: "v1.8.1", reason: RefusedSkipsMinor,
			want: []string{"Harvester v1.6.1 -> v1.8.1", "skips a minor", "facts 3, 4"}},
		{name: "skips several minors", previous: "v1.4.3", target: "v1.8.1", reason: RefusedSkipsMinor},
		{name: "across majors", previous: "v0.3.0", target: "v1.7.1", reason: RefusedSkipsMinor},
		{name: "an older hop not in the table", previous: "v1.5.0", target: "v1.6.0", reason: RefusedUnsupported,
			want: []string{"Harvester v1.5.0 -> v1.6.0", "Harvester v1.6.0 is not a release capi-inplace upgrades to"}},
		{name: "a formal release of a minor the table does not reach", previous: "v1.8.1", target: "v1.9.0", reason: RefusedUnsupported},
		{name: "a release candidate target", previous: "v1.8.1", target: "v1.9.0-rc6", reason: RefusedPreRelease,
			want: []string{"the target v1.9.0-rc6 is a pre-release", "formal GA releases"}},
		{name: "a release candidate of a supported minor", previous: "v1.7.1", target: "v1.8.1-rc1", reason: RefusedPreRelease},
		{name: "a target without the v", previous: "v1.7.1", target: "1.8.1", reason: RefusedNotARelease},
		{name: "a target with build metadata", previous: "v1.7.1", target: "v1.8.1+dev", reason: RefusedNotARelease},
		{name: "a target that is no version", previous: "v1.7.1", target: "latest", reason: RefusedNotARelease},
		{name: "a pre-release previous version (fact 2)", previous: "v1.7.1-rc2", target: "v1.8.1", reason: RefusedPreRelease,
			want: []string{"the nodes run v1.7.1-rc2, not a formal release", "silently be skipped (fact 2)"}},
		{name: "a pre-release of the target's minor", previous: "v1.8.0-rc1", target: "v1.8.1", reason: RefusedPreRelease},
		{name: "a previous version the guard does not match (fact 2)", previous: "v1.7.10", target: "v1.8.1", reason: RefusedUnrecognised,
			want: []string{`^v1\.7\.[0-9]$`, "v1.7.10 does not"}},
		{name: "a previous version that is no version", previous: "", target: "v1.8.1", reason: RefusedNotARelease},
		{name: "a downgrade across minors", previous: "v1.8.1", target: "v1.7.1", reason: RefusedDowngrade,
			want: []string{"newer than v1.7.1: a downgrade is not possible"}},
		{name: "a patch downgrade", previous: "v1.8.1", target: "v1.8.0", reason: RefusedDowngrade},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckHop(tt.previous, tt.target)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("CheckHop(%q, %q) = %v, want nil", tt.previous, tt.target, err)
				}
				return
			}
			var he *HopError
			if !errors.As(err, &he) {
				t.Fatalf("CheckHop(%q, %q) = %v, want a *HopError", tt.previous, tt.target, err)
			}
			if he.Reason != tt.reason {
				t.Errorf("reason = %s, want %s (%v)", he.Reason, tt.reason, err)
			}
			// Every refusal names the supported hops.
			want := append([]string{"capi-inplace supports v1.6.x -> v1.7.x, v1.7.x -> v1.8.x, v1.7.a -> v1.7.b (a < b), v1.8.a -> v1.8.b (a < b) (docs/harvester.md"}, tt.want...)
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestCheckTarget(t *testing.T) {
	for _, v := range []string{"v1.7.0", "v1.7.1", "v1.8.0", "v1.8.1", "v1.8.12"} {
		if err := CheckTarget(v); err != nil {
			t.Errorf("CheckTarget(%q) = %v", v, err)
		}
	}
	for _, v := range []string{"v1.6.1", "v1.9.0", "v1.9.0-rc6", "v1.8.1-rc1", "1.8.1", "v2.8.1", ""} {
		err := CheckTarget(v)
		if err == nil || !strings.Contains(err.Error(), "give a formal release of v1.7.x or v1.8.x") {
			t.Errorf("CheckTarget(%q) = %v, want a refusal naming v1.7.x and v1.8.x", v, err)
		}
	}
}

// TestHopTable: the table holds what fact 57 says of the two newest GA minors, each
// migration with its source, every one performed.
func TestHopTable(t *testing.T) {
	names := func(ms []Migration) []string {
		var out []string
		for _, m := range ms {
			if m.Source == "" || m.IfSkipped == "" {
				t.Errorf("migration %s lacks its source or what breaks without it", m.Name)
			}
			out = append(out, m.Name)
		}
		return out
	}
	want := map[string][2]string{
		"v1.6.x -> v1.7.x":         {"MigrateLonghornV1beta1CRDs", "GenerateNetworkManagerConfig GenerateHostnameOverride BindNewerLibrariesForElemental"},
		"v1.7.x -> v1.8.x":         {"PreserveOvercommitConfig CleanCAPILegacyWebhooks", ""},
		"v1.7.a -> v1.7.b (a < b)": {"", ""},
		"v1.8.a -> v1.8.b (a < b)": {"", ""},
	}
	if len(Hops) != len(want) {
		t.Fatalf("the table has %d hops, want %d", len(Hops), len(want))
	}
	for _, h := range Hops {
		w, ok := want[h.String()]
		if !ok {
			t.Fatalf("unexpected hop %s", h)
		}
		if got := strings.Join(names(h.Cluster), " "); got != w[0] {
			t.Errorf("%s: cluster migrations %q, want %q", h, got, w[0])
		}
		if got := strings.Join(names(h.Node), " "); got != w[1] {
			t.Errorf("%s: node migrations %q, want %q", h, got, w[1])
		}
		if !h.accepted() {
			t.Errorf("%s waits for %v: every hop of the table is carried out", h, h.notPerformedNames())
		}
		if h.PreviousGuard != "" {
			if _, err := regexp.Compile(h.PreviousGuard); err != nil {
				t.Errorf("%s: guard %q: %v", h, h.PreviousGuard, err)
			}
		}
		if (len(h.Cluster)+len(h.Node) > 0) != (h.PreviousGuard != "") {
			t.Errorf("%s: a hop has a previous-version guard exactly when it has prev-guarded migrations", h)
		}
	}
}

func TestNodeMigrations(t *testing.T) {
	for _, tc := range []struct {
		previous, target, want string
	}{
		{"v1.6.1", "v1.7.1", "GenerateNetworkManagerConfig GenerateHostnameOverride BindNewerLibrariesForElemental"},
		{"v1.6.0", "v1.7.3", "GenerateNetworkManagerConfig GenerateHostnameOverride BindNewerLibrariesForElemental"},
		{"v1.7.1", "v1.8.1", ""},
		{"v1.7.0", "v1.7.1", ""},
		{"v1.6.10", "v1.7.1", ""}, // the release's guard does not match: CheckHop refuses it
		{"latest", "v1.7.1", ""},
	} {
		if got := strings.Join(NodeMigrations(tc.previous, tc.target), " "); got != tc.want {
			t.Errorf("NodeMigrations(%s, %s) = %q, want %q", tc.previous, tc.target, got, tc.want)
		}
	}
}

// FuzzCheckHop: no input panics; what CheckHop accepts is a formal target of a supported
// minor, over a formal previous version no newer than it, at most one minor behind.
func FuzzCheckHop(f *testing.F) {
	for _, s := range [][2]string{{"v1.7.1", "v1.8.1"}, {"v1.6.1", "v1.8.1"}, {"v1.7.1-rc2", "v1.8.1"}, {"v1.8.1", "v1.9.0-rc6"}, {"v1.7.01", "v1.8.1"}, {"v1.7.1+x", "v1.8.1"}, {"", ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, previous, target string) {
		err := CheckHop(previous, target)
		if err == nil {
			if CheckTarget(target) != nil {
				t.Fatalf("CheckHop accepted %q -> %q, a target CheckTarget refuses", previous, target)
			}
			if !formal.MatchString(previous) || Less(target, previous) {
				t.Fatalf("CheckHop accepted %q -> %q", previous, target)
			}
		}
	})
}
