package releases

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
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
		{name: "v1.6 to v1.7.0, its known issue: NIC names not pinned (issue #53)", previous: "v1.6.0", target: "v1.7.0", reason: RefusedKnownIssue,
			want: []string{"known issue of Harvester v1.7.0", "harvester/harvester#9815", "#9802", "without network", "upgrade to v1.7.1 or later"}},
		{name: "v1.6.1 to v1.7.0", previous: "v1.6.1", target: "v1.7.0", reason: RefusedKnownIssue},
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

// TestClusterMigrationRuns: every hop of the table, and the patch hops, run exactly the
// cluster migrations their target release's script runs for their previous version
// (fact 57): the v1.7 -> v1.8 migrations never on a v1.7.a -> v1.7.b hop, whose previous
// version their guard would match (issue #53).
func TestClusterMigrationRuns(t *testing.T) {
	all := []string{"MigrateLonghornV1beta1CRDs", "PreserveOvercommitConfig", "CleanCAPILegacyWebhooks"}
	tests := []struct {
		previous, target string
		runs             []string
	}{
		{"v1.6.1", "v1.7.1", []string{"MigrateLonghornV1beta1CRDs"}},
		{"v1.6.0", "v1.7.3", []string{"MigrateLonghornV1beta1CRDs"}},
		{"v1.7.0", "v1.8.1", []string{"PreserveOvercommitConfig", "CleanCAPILegacyWebhooks"}},
		{"v1.7.3", "v1.8.2", []string{"PreserveOvercommitConfig", "CleanCAPILegacyWebhooks"}},
		{"v1.7.0", "v1.7.2", nil}, // a patch hop: v1.7's scripts hold no v1.8 migration
		{"v1.7.1", "v1.7.3", nil},
		{"v1.8.0", "v1.8.2", nil},
		{"v1.7.1-rc2", "v1.8.1", nil}, // the guards match formal releases only (fact 2)
		{"v1.6.1-rc1", "v1.7.1", nil},
		{"v1.5.1", "v1.6.0", nil}, // no hop of the table
	}
	hops := map[string]bool{}
	for _, tt := range tests {
		p, t2 := version.MustParseSemantic(tt.previous), version.MustParseSemantic(tt.target)
		hops[minorOf(p)+"->"+minorOf(t2)] = true
		for _, name := range all {
			runs, why := ClusterMigrationRuns(tt.previous, tt.target, name)
			if want := slices.Contains(tt.runs, name); runs != want {
				t.Errorf("%s -> %s: %s runs %v, want %v (%s)", tt.previous, tt.target, name, runs, want, why)
			}
			if !runs && why == "" {
				t.Errorf("%s -> %s: %s does not run and says no why", tt.previous, tt.target, name)
			}
		}
	}
	for _, h := range Hops {
		if !hops[h.From+"->"+h.To] {
			t.Errorf("hop %s.x -> %s.x of the table has no case here", h.From, h.To)
		}
		for _, m := range h.Cluster {
			if !slices.Contains(all, m.Name) {
				t.Errorf("cluster migration %s of hop %s.x -> %s.x has no case here", m.Name, h.From, h.To)
			}
		}
	}
	if _, why := ClusterMigrationRuns("v1.7.0", "v1.7.2", "PreserveOvercommitConfig"); !strings.Contains(why, "not a hop v1.7.x -> v1.8.x") {
		t.Errorf("a patch hop's why: %q", why)
	}
	if _, why := ClusterMigrationRuns("v1.7.1-rc2", "v1.8.1", "PreserveOvercommitConfig"); why != `which does not match ^v1\.7\.[0-9]$` {
		t.Errorf("an RC's why: %q", why)
	}
}
