package releases

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// The hops capi-inplace supports: into the two newest GA minors, v1.7 and v1.8 (v1.9.0 is
// only a release candidate, v1.9.0-rc6, fact 5), one minor at a time as every release's
// upgrade matrix allows (fact 3) and Longhorn insists (fact 4), plus patch upgrades inside
// each of those minors, which their upgrade matrices allow too (v1.7.x from >= v1.6.0,
// v1.8.x from >= v1.7.0, fact 3). Each hop lists the release-specific migrations the
// target release keys on the previous version (fact 57): a hop is accepted only when
// capi-inplace performs every one of them, since a migration that does not run leaves
// the cluster or a node broken after the upgrade (facts 10, 16, 19, 53).

// Migration is a release-specific migration of a hop: a step the target release runs
// only when the previous version is the hop's source minor (facts 1 and 2).
type Migration struct {
	// Name is the migration's name, as the cluster upgrade's sub-step or the node step
	// that performs it is named.
	Name string
	// Source is the fact of harvester-release-steps.md, and the release script's
	// function, that names the migration.
	Source string
	// Performed says whether capi-inplace performs the migration.
	Performed bool
	// IfSkipped says what breaks when the migration does not run.
	IfSkipped string
}

// Hop is an upgrade capi-inplace supports: from a release of minor From to a release of
// minor To (From == To for a patch upgrade, to a newer patch only).
type Hop struct {
	// From and To are the minors, as v1.7.
	From, To string
	// PreviousGuard is how the target release's prev-guarded migrations recognise the
	// previous version (fact 2): the exact-format regular expression of its scripts. Empty
	// when the hop has no prev-guarded migration.
	PreviousGuard string
	// Cluster are the migrations of the target's cluster step (upgrade_manifests.sh).
	Cluster []Migration
	// Node are the migrations of the target's node step (upgrade_node.sh).
	Node []Migration
	// Tracked names the issue where the migrations not performed yet are tracked.
	Tracked string
}

// Hops is the table of supported hops, in order (fact 57).
var Hops = []Hop{
	{
		From: "v1.6", To: "v1.7", PreviousGuard: `^v1\.6\.[0-9]$`,
		Cluster: []Migration{
			{Name: "MigrateLonghornV1beta1CRDs", Source: "fact 19, migrate_longhorn_v1beta1_crds", Performed: true,
				IfSkipped: "Longhorn 1.10 drops v1beta1 while old objects are still stored as v1beta1"},
		},
		Node: []Migration{
			{Name: "GenerateNetworkManagerConfig", Source: "fact 53, generate_networkmanager_config (nodeprogram hopmigrations.go)", Performed: true,
				IfSkipped: "the node reboots into SL Micro 6.1 without a NetworkManager configuration of its network and never rejoins"},
			{Name: "GenerateHostnameOverride", Source: "fact 53, generate_hostname_persistance (nodeprogram hopmigrations.go)", Performed: true, //nolint:misspell // the release script's own function name
				IfSkipped: "a node installed with an FQDN re-registers under a new name and never rejoins"},
			{Name: BindLibrariesMigration, Source: "fact 54.4, upgrade_os GLIBC workaround (nodeprogram osinstall.go releaseElemental)", Performed: true,
				IfSkipped: "the release's elemental, built for SL Micro 6.1, cannot run on the SLE Micro 5.5 host and the OS is never installed"},
		},
	},
	{
		From: "v1.7", To: "v1.8", PreviousGuard: `^v1\.7\.[0-9]$`,
		Cluster: []Migration{
			{Name: "PreserveOvercommitConfig", Source: "fact 10, preserve_overcommit_config", Performed: true,
				IfSkipped: "the effective overcommit silently drops to v1.8's lower defaults"},
			{Name: "CleanCAPILegacyWebhooks", Source: "fact 16.8, clean_capi_legacy_webhooks", Performed: true,
				IfSkipped: "the legacy CAPI webhook configurations stay in front of Rancher v2.14's CAPI"},
		},
		// No prev-guarded node migration (fact 57).
	},
	{From: "v1.7", To: "v1.7"},
	{From: "v1.8", To: "v1.8"},
}

// KnownIssue is a hop that its own target release gets wrong often enough that
// capi-inplace refuses it, rather than copy the release's bug: the reports, what breaks,
// and the release to go to instead.
type KnownIssue struct {
	// From is the minor of the previous version; Target the exact release.
	From, Target string
	// Reports are the upstream reports.
	Reports string
	// Why says what breaks.
	Why string
	// Instead is the release to upgrade to.
	Instead string
}

// KnownIssues are the refused hops.
var KnownIssues = []KnownIssue{{
	From: "v1.6", Target: "v1.7.0",
	Reports: "harvester/harvester#9815 (labels known-issue-v1.7.0, reproduce/often) and #9802; fixed in v1.7.1 by harvester/harvester PR #9877",
	Why: "v1.7.0 does not pin the nodes' interface names: a NIC driver of SL Micro 6.1 that names an interface differently (enp6s0f0 becoming enp6s0f0np0) " +
		"brings the node back from the OS reboot without network, and the upgrade stops there; a control plane node lost that way leaves etcd one failure from quorum loss. " +
		"From v1.7.1 the release adds ifname=<name>:<mac> kernel arguments before the reboot, and capi-inplace's os-upgrade does the same",
	Instead: "v1.7.1 or later (v1.7.2 or later on nodes with bonded interfaces, harvester/harvester#10397)",
}}

// BindLibrariesMigration is the node migration that runs the release's elemental with the
// release's newer C library bound over the host's (fact 54.4): the os Plan of a hop that
// has it runs in the release's upgrade image (suc.WithPreviousVersion).
const BindLibrariesMigration = "BindNewerLibrariesForElemental"

// Refusal is why CheckHop refuses a hop.
type Refusal string

// The kinds of refusal.
const (
	RefusedNotARelease  Refusal = "NotARelease"
	RefusedPreRelease   Refusal = "PreRelease"
	RefusedDowngrade    Refusal = "Downgrade"
	RefusedSkipsMinor   Refusal = "SkipsMinor"
	RefusedUnsupported  Refusal = "UnsupportedHop"
	RefusedUnrecognised Refusal = "PreviousNotRecognised"
	RefusedNotPerformed Refusal = "MigrationsNotPerformed"
	RefusedKnownIssue   Refusal = "KnownIssue"
)

// HopError is CheckHop's refusal: which hop, why, and the supported hops.
type HopError struct {
	Previous, Target string
	Reason           Refusal
	Why              string
}

func (e *HopError) Error() string {
	return fmt.Sprintf("Harvester %s -> %s is not an upgrade capi-inplace carries out: %s. %s", e.Previous, e.Target, e.Why, SupportedHops())
}

// formal is a formal GA release as Harvester tags it: vX.Y.Z, nothing else.
var formal = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// CheckHop says whether capi-inplace upgrades a cluster whose nodes run Harvester previous
// (the oldest of them) to target: nil when the hop is in the table and capi-inplace
// performs all its migrations, or when the cluster already runs target; otherwise a
// *HopError naming the hop, why it is refused and the supported hops. Nothing skips it,
// spec.force included: force lowers the release's minUpgradableVersion floor, but a hop
// the table does not hold would run without its migrations.
func CheckHop(previous, target string) error {
	refuse := func(reason Refusal, format string, args ...any) error {
		return &HopError{Previous: previous, Target: target, Reason: reason, Why: fmt.Sprintf(format, args...)}
	}
	t, err := version.ParseSemantic(target)
	if err != nil {
		return refuse(RefusedNotARelease, "the target %q is not a Harvester release vX.Y.Z", target)
	}
	if !formal.MatchString(target) {
		if t.PreRelease() != "" {
			return refuse(RefusedPreRelease, "the target %s is a pre-release; capi-inplace upgrades only to formal GA releases vX.Y.Z", target)
		}
		return refuse(RefusedNotARelease, "the target %q is not a formal release vX.Y.Z", target)
	}
	if !isTarget(t) {
		return refuse(RefusedUnsupported, "Harvester %s is not a release capi-inplace upgrades to", target)
	}
	p, err := version.ParseSemantic(previous)
	if err != nil {
		return refuse(RefusedNotARelease, "the nodes' version %q is not a Harvester release vX.Y.Z", previous)
	}
	if t.LessThan(p) {
		return refuse(RefusedDowngrade, "the nodes run Harvester %s, newer than %s: a downgrade is not possible", previous, target)
	}
	if !formal.MatchString(previous) {
		return refuse(RefusedPreRelease, "the nodes run %s, not a formal release vX.Y.Z: the release's prev-guarded migrations recognise only formal versions and would silently be skipped (fact 2); upgrade to a formal release first", previous)
	}
	if previous == target {
		return nil // already there: nothing moves
	}
	pm, tm := minorOf(p), minorOf(t)
	if p.Major() != t.Major() || t.Minor() > p.Minor()+1 {
		return refuse(RefusedSkipsMinor, "it skips a minor: each release installs only over the minor before it and Longhorn refuses to skip one (facts 3, 4); upgrade one minor at a time")
	}
	hop := findHop(pm, tm)
	if hop == nil {
		return refuse(RefusedUnsupported, "%s.x -> %s.x is not in the table of supported hops", pm, tm)
	}
	if hop.PreviousGuard != "" && !regexp.MustCompile(hop.PreviousGuard).MatchString(previous) {
		return refuse(RefusedUnrecognised, "the release keys its migrations on the previous version matching %s (fact 2), which %s does not: they would silently be skipped", hop.PreviousGuard, previous)
	}
	for _, ki := range KnownIssues {
		if ki.From == pm && ki.Target == target {
			return refuse(RefusedKnownIssue, "the hop is a known issue of Harvester %s (%s): %s; upgrade to %s instead", target, ki.Reports, ki.Why, ki.Instead)
		}
	}
	if missing := hop.notPerformed(); len(missing) > 0 {
		return refuse(RefusedNotPerformed, "the hop needs migrations capi-inplace does not perform yet (%s): %s", hop.Tracked, strings.Join(missing, "; "))
	}
	return nil
}

// CheckTarget says whether target is a release some accepted hop leads to: a formal
// release of a supported target minor. Admission refuses other HarvesterUpgraders with
// the same rule (the CEL rule of release.version).
func CheckTarget(target string) error {
	t, err := version.ParseSemantic(target)
	if err != nil || !formal.MatchString(target) || !isTarget(t) {
		return fmt.Errorf("release %q is not a Harvester release capi-inplace upgrades to: give a formal release of %s. %s", target, strings.Join(TargetMinors(), " or "), SupportedHops())
	}
	return nil
}

// TargetMinors are the minors some accepted hop leads to, as v1.8.x.
func TargetMinors() []string {
	var out []string
	seen := map[string]bool{}
	for _, h := range Hops {
		if h.accepted() && !seen[h.To] {
			seen[h.To] = true
			out = append(out, h.To+".x")
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return Less(strings.TrimSuffix(out[i], ".x")+".0", strings.TrimSuffix(out[j], ".x")+".0")
	})
	return out
}

// SupportedHops describes the accepted hops, and those in the table that wait for
// migrations not performed yet.
func SupportedHops() string {
	var ok, waiting []string
	for _, h := range Hops {
		if h.accepted() {
			ok = append(ok, h.String())
		} else {
			waiting = append(waiting, fmt.Sprintf("%s waits for %s (%s)", h.String(), strings.Join(h.notPerformedNames(), ", "), h.Tracked))
		}
	}
	s := "capi-inplace supports " + strings.Join(ok, ", ")
	if len(waiting) > 0 {
		s += "; " + strings.Join(waiting, "; ")
	}
	return s + " (docs/harvester.md, \"Supported hops\")"
}

// String is the hop as v1.7.x -> v1.8.x, or v1.8.a -> v1.8.b (a < b) for a patch hop.
func (h Hop) String() string {
	if h.From == h.To {
		return fmt.Sprintf("%s.a -> %s.b (a < b)", h.From, h.To)
	}
	return fmt.Sprintf("%s.x -> %s.x", h.From, h.To)
}

func (h Hop) accepted() bool { return len(h.notPerformed()) == 0 }

func (h Hop) notPerformed() []string {
	var out []string
	for _, m := range append(append([]Migration(nil), h.Cluster...), h.Node...) {
		if !m.Performed {
			out = append(out, fmt.Sprintf("%s (%s): without it %s", m.Name, m.Source, m.IfSkipped))
		}
	}
	return out
}

func (h Hop) notPerformedNames() []string {
	var out []string
	for _, m := range append(append([]Migration(nil), h.Cluster...), h.Node...) {
		if !m.Performed {
			out = append(out, m.Name)
		}
	}
	return out
}

// NodeMigrations are the names of the node migrations the hop from previous to target
// runs (none for a hop outside the table or versions that do not parse). They run inside
// the node's OS upgrade (nodeprogram os-upgrade), before the OS is installed, as the
// release's post-drain runs them before upgrade_os.
func NodeMigrations(previous, target string) []string {
	p, perr := version.ParseSemantic(previous)
	t, terr := version.ParseSemantic(target)
	if perr != nil || terr != nil {
		return nil
	}
	hop := findHop(minorOf(p), minorOf(t))
	if hop == nil || hop.PreviousGuard != "" && !regexp.MustCompile(hop.PreviousGuard).MatchString(previous) {
		return nil
	}
	var names []string
	for _, m := range hop.Node {
		names = append(names, m.Name)
	}
	return names
}

// ClusterMigrationRuns says whether the target release's cluster step runs the named
// migration on an upgrade from previous, as the releases key it (fact 57): the migration
// is in the target minor's script only (preserve_overcommit_config and
// clean_capi_legacy_webhooks first appear in v1.8.0's, migrate_longhorn_v1beta1_crds in
// v1.7.0's), and there it runs only when previous matches the script's exact-format guard
// of the source minor (fact 2). So a patch hop (v1.7.a -> v1.7.b) runs none of the
// v1.7 -> v1.8 migrations, whose guard previous would match. When it does not run, it
// says why, for the sub-step's message.
func ClusterMigrationRuns(previous, target, name string) (runs bool, why string) {
	for _, h := range Hops {
		if !slices.ContainsFunc(h.Cluster, func(m Migration) bool { return m.Name == name }) {
			continue
		}
		p, perr := version.ParseSemantic(previous)
		t, terr := version.ParseSemantic(target)
		if perr != nil || terr != nil || minorOf(t) != h.To || minorOf(p) != h.From {
			return false, fmt.Sprintf("not a hop %s.x -> %s.x, the only one whose release runs it (the scripts of %s.x hold it)", h.From, h.To, h.To)
		}
		if h.PreviousGuard != "" && !regexp.MustCompile(h.PreviousGuard).MatchString(previous) {
			return false, "which does not match " + h.PreviousGuard
		}
		return true, ""
	}
	return false, "no hop of the table runs it"
}

func findHop(from, to string) *Hop {
	for i := range Hops {
		if Hops[i].From == from && Hops[i].To == to {
			return &Hops[i]
		}
	}
	return nil
}

func isTarget(t *version.Version) bool {
	for _, h := range Hops {
		if h.accepted() && h.To == minorOf(t) {
			return true
		}
	}
	return false
}

func minorOf(v *version.Version) string {
	return fmt.Sprintf("v%d.%d", v.Major(), v.Minor())
}
