package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// The settings of the workload cluster that a Harvester upgrade changes for its node
// phase and gives back at its end (harvester-release-steps.md facts 13, 34 to 37, 9), as
// the SettingsWatch names them.
const (
	// SettingWorkloadUpdateMethods is the harvester ManagedChart's value
	// kubevirt.spec.workloadUpdateStrategy.workloadUpdateMethods, which Fleet renders
	// into KubeVirt's CR: emptied before the chart upgrade so that KubeVirt's upgrade
	// live-migrates no VM, given back at the end (facts 13, 37).
	SettingWorkloadUpdateMethods = "KubeVirt workloadUpdateMethods (harvester chart)"
	// SettingReplicaReplenishment is Longhorn's replica-replenishment-wait-interval,
	// raised to 1800 for the nodes and given back at the end (facts 35, 37).
	SettingReplicaReplenishment = "Longhorn replica-replenishment-wait-interval"
	// SettingDescheduler is whether Harvester's descheduler add-on kube-system/descheduler
	// is enabled: off for the nodes, on again at the end (facts 36, 37).
	SettingDescheduler = "descheduler add-on enabled"
	// SettingMultusFailurePolicy is the failurePolicy of the HelmChartConfig
	// kube-system/rke2-multus: abort from the cluster step on, kept for good as the
	// release keeps it (fact 9).
	SettingMultusFailurePolicy = "rke2-multus failurePolicy"
	// SettingMultusSkip counts the RKE2 servers that carry rke2-multus.yaml.skip (the SUC
	// simulator's record of the host): on every server for the nodes, off at the end
	// (fact 34).
	SettingMultusSkip = "rke2-multus.yaml.skip"
)

// RestoredSettings are the settings the upgrade changes for the roll and must give back
// on every end (fact 37; fact 34 for the skip file, checked by multusLeftAlone).
var RestoredSettings = []string{SettingWorkloadUpdateMethods, SettingReplicaReplenishment, SettingDescheduler}

// watchedSettings are the settings a SettingsWatch follows, in the order it shows them.
var watchedSettings = []string{SettingWorkloadUpdateMethods, SettingReplicaReplenishment, SettingDescheduler, SettingMultusFailurePolicy, SettingMultusSkip}

// absent is the value of a setting whose object does not exist, or that it does not set.
const absent = "(unset)"

// SettingChange is a value of a setting as the watch first saw it.
type SettingChange struct {
	Setting string
	Value   string
	At      time.Time
}

// SettingsWatch follows, on the workload cluster's informer cache and the SUC
// simulator's record of the hosts, the settings a Harvester upgrade changes for its
// node phase (watchedSettings), and records each value it sees, with when it first saw
// it. A value is seen at most SettingsWatchInterval plus the cache's delay after it was
// written. Safe for concurrent use.
type SettingsWatch struct {
	read func(ctx context.Context) (map[string]string, error)

	mu      sync.Mutex
	history []SettingChange
	last    map[string]string
}

// SettingsWatchInterval is how often the watch reads the cache.
const SettingsWatchInterval = 50 * time.Millisecond

// History returns every value seen, in the order seen; each setting's first is its value
// before the upgrade (the watch starts with the simulators).
func (w *SettingsWatch) History() []SettingChange {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]SettingChange(nil), w.history...)
}

// sample reads every setting once and records the values that changed.
func (w *SettingsWatch) sample(ctx context.Context) error {
	values, err := w.read(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[string]string{}
	}
	for _, name := range watchedSettings {
		v, ok := values[name]
		if !ok {
			continue
		}
		if prev, seen := w.last[name]; seen && prev == v {
			continue
		}
		w.last[name] = v
		w.history = append(w.history, SettingChange{Setting: name, Value: v, At: now})
	}
	return nil
}

func (w *SettingsWatch) run(ctx context.Context) {
	tick := time.NewTicker(SettingsWatchInterval)
	defer tick.Stop()
	for {
		_ = w.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// helmChartConfigGVK is RKE2's helm-controller's HelmChartConfig.
var helmChartConfigGVK = schema.GroupVersionKind{Group: "helm.cattle.io", Version: "v1", Kind: "HelmChartConfig"}

// readSettings reads the watched settings from c (the workload cluster, or its cache)
// and, for the skip file, from the SUC simulator's record of the hosts.
func (s *Scenario) readSettings(ctx context.Context, c client.Reader) (map[string]string, error) {
	out := map[string]string{}
	mc := &managementv3.ManagedChart{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.HarvesterChart}, mc); {
	case apierrors.IsNotFound(err):
		out[SettingWorkloadUpdateMethods] = absent
	case err != nil:
		return nil, err
	default:
		out[SettingWorkloadUpdateMethods] = chartWorkloadUpdateMethods(mc)
	}
	setting := &longhornv1.Setting{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: longhorn.Namespace, Name: "replica-replenishment-wait-interval"}, setting); {
	case apierrors.IsNotFound(err):
		out[SettingReplicaReplenishment] = absent
	case err != nil:
		return nil, err
	default:
		out[SettingReplicaReplenishment] = setting.Value
	}
	addon := &harvesterapi.Addon{}
	switch err := c.Get(ctx, upgradeplan.DeschedulerAddon, addon); {
	case apierrors.IsNotFound(err):
		out[SettingDescheduler] = absent
	case err != nil:
		return nil, err
	default:
		out[SettingDescheduler] = fmt.Sprint(addon.Spec.Enabled)
	}
	cfg := &unstructured.Unstructured{}
	cfg.SetGroupVersionKind(helmChartConfigGVK)
	switch err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "rke2-multus"}, cfg); {
	case apierrors.IsNotFound(err):
		out[SettingMultusFailurePolicy] = absent
	case err != nil:
		return nil, err
	default:
		policy, _, _ := unstructured.NestedString(cfg.Object, "spec", "failurePolicy")
		if policy == "" {
			policy = absent
		}
		out[SettingMultusFailurePolicy] = policy
	}
	if s.SUC != nil {
		servers, skipped := 0, 0
		for _, n := range s.Nodes {
			if n.ControlPlane { // the scenario's RKE2 servers (sim.ServerNode)
				servers++
				if s.SUC.ManifestSkipped(n.Name) {
					skipped++
				}
			}
		}
		out[SettingMultusSkip] = fmt.Sprintf("on %d of %d servers", skipped, servers)
	}
	return out, nil
}

// chartWorkloadUpdateMethods is the harvester chart's KubeVirt workloadUpdateMethods as
// compact JSON, or absent.
func chartWorkloadUpdateMethods(mc *managementv3.ManagedChart) string {
	if mc.Spec.Values == nil || len(mc.Spec.Values.Raw) == 0 {
		return absent
	}
	var values struct {
		KubeVirt struct {
			Spec struct {
				WorkloadUpdateStrategy struct {
					WorkloadUpdateMethods json.RawMessage `json:"workloadUpdateMethods"`
				} `json:"workloadUpdateStrategy"`
			} `json:"spec"`
		} `json:"kubevirt"`
	}
	if err := json.Unmarshal(mc.Spec.Values.Raw, &values); err != nil {
		return "(values not JSON)"
	}
	raw := values.KubeVirt.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods
	if len(raw) == 0 || string(raw) == "null" {
		return absent
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	compact, _ := json.Marshal(v)
	return string(compact)
}

// startSettingsWatch starts the watch on the cache, after one first sample (the values
// before the upgrade).
func (s *Scenario) startSettingsWatch(ctx context.Context, cache client.Reader) error {
	s.Settings = &SettingsWatch{read: func(ctx context.Context) (map[string]string, error) { return s.readSettings(ctx, cache) }}
	if err := s.Settings.sample(ctx); err != nil {
		return fmt.Errorf("read the settings the upgrade changes for the nodes: %w", err)
	}
	s.simsDone.Add(1)
	go func() { defer s.simsDone.Done(); s.Settings.run(ctx) }()
	return nil
}

// SettingStory is what became of one watched setting: its value before, the values it
// took during the run, and its value at the end.
type SettingStory struct {
	Setting string
	Before  string
	During  []string
	End     string
	// PlanRuns, when the UpgradePlan that gives the settings back has not ended, says
	// which plan and where it stands ("UpgradePlan demo/x is held in NodeUpgrading"): a
	// setting not back at its value before is then still at the roll's value, not lost.
	PlanRuns string
}

// Restored says whether the setting changed and is back to its value before.
func (st SettingStory) Restored() bool { return len(st.During) > 0 && st.End == st.Before }

// String is one line: before, during, at the end, and whether it was given back.
func (st SettingStory) String() string {
	switch {
	case len(st.During) == 0:
		return fmt.Sprintf("%s: %s, not changed", st.Setting, st.Before)
	case st.Restored():
		return fmt.Sprintf("%s: before %s, during the run %s, at the end %s (restored)", st.Setting, st.Before, strings.Join(st.During, ", "), st.End)
	case st.Setting == SettingMultusFailurePolicy:
		return fmt.Sprintf("%s: before %s, during the run %s, at the end %s (kept, as the release keeps it)", st.Setting, st.Before, strings.Join(st.During, ", "), st.End)
	case st.Before == absent:
		return fmt.Sprintf("%s: before %s, during the run %s, at the end %s (created by the upgrade)", st.Setting, st.Before, strings.Join(st.During, ", "), st.End)
	}
	if st.PlanRuns != "" {
		return fmt.Sprintf("%s: before %s, during the run %s, at the end %s (not restored yet: %s, and gives it back when it ends)", st.Setting, st.Before, strings.Join(st.During, ", "), st.End, st.PlanRuns)
	}
	return fmt.Sprintf("%s: before %s, during the run %s, at the end %s (not restored)", st.Setting, st.Before, strings.Join(st.During, ", "), st.End)
}

// SettingStories tell, per watched setting, what the watch saw, with its value at the
// end read now from the workload cluster itself (not the cache), and, while the
// cluster's UpgradePlan has not ended, that it has not (PlanRuns).
func (s *Scenario) SettingStories(ctx context.Context) []SettingStory {
	return s.SettingStoriesOf(ctx, s.UpgradePlan(ctx))
}

// SettingStoriesOf is SettingStories with the UpgradePlan as the caller read it (nil:
// none), so that what it says of the plan matches what the caller says of it from the
// same read.
func (s *Scenario) SettingStoriesOf(ctx context.Context, plan *harvesterv1.UpgradePlan) []SettingStory {
	if s.Settings == nil || s.Workload == nil {
		return nil
	}
	end, err := s.readSettings(ctx, s.Workload.Client)
	if err != nil {
		end = map[string]string{}
	}
	out := stories(s.Settings.History(), end)
	if plan != nil && !PlanEnded(plan) {
		for i := range out {
			out[i].PlanRuns = PlanStanding(plan)
		}
	}
	return out
}

// UpgradePlan is the cluster's UpgradePlan of the hop's release as the management
// cluster has it now; nil when there is none or it cannot be read.
func (s *Scenario) UpgradePlan(ctx context.Context) *harvesterv1.UpgradePlan {
	if s.Management == nil {
		return nil
	}
	plan := &harvesterv1.UpgradePlan{}
	key := client.ObjectKey{Namespace: s.Options.Namespace, Name: upgradeplan.Name(s.Options.ClusterName, s.Options.Hop.ToRelease)}
	if err := s.Management.Client.Get(ctx, key, plan); err != nil {
		return nil
	}
	return plan
}

// PlanEnded says whether an UpgradePlan has ended (Succeeded or Failed): every end gives
// back what it changed for the roll (fact 37).
func PlanEnded(plan *harvesterv1.UpgradePlan) bool {
	return plan.Status.Phase == harvesterv1.UpgradePlanSucceeded || plan.Status.Phase == harvesterv1.UpgradePlanFailed
}

// PlanHold is the message of a running UpgradePlan's Degraded condition, what holds it
// (the plan's own words: a failed node and the ways on); empty when nothing holds it.
func PlanHold(plan *harvesterv1.UpgradePlan) string {
	if PlanEnded(plan) {
		return ""
	}
	if c := meta.FindStatusCondition(plan.Status.Conditions, harvesterv1.UpgradePlanDegraded); c != nil && c.Status == metav1.ConditionTrue {
		return c.Message
	}
	return ""
}

// PlanStanding says where a running UpgradePlan stands, for a setting it has not given
// back yet: "UpgradePlan demo/x is held in NodeUpgrading" (or "is in" when nothing holds
// it).
func PlanStanding(plan *harvesterv1.UpgradePlan) string {
	how := "is in"
	if PlanHold(plan) != "" {
		how = "is held in"
	}
	phase := string(plan.Status.Phase)
	if phase == "" {
		phase = "its first phase"
	}
	return fmt.Sprintf("UpgradePlan %s/%s %s %s", plan.Namespace, plan.Name, how, phase)
}

// stories are SettingStories of a watch's history and the values at the end (a setting
// missing there ends at the last value seen).
func stories(history []SettingChange, end map[string]string) []SettingStory {
	byName := map[string]*SettingStory{}
	for _, ch := range history {
		st := byName[ch.Setting]
		if st == nil {
			byName[ch.Setting] = &SettingStory{Setting: ch.Setting, Before: ch.Value}
			continue
		}
		if ch.Value != st.Before && (len(st.During) == 0 || st.During[len(st.During)-1] != ch.Value) {
			st.During = append(st.During, ch.Value)
		}
	}
	var out []SettingStory
	for _, name := range watchedSettings {
		st := byName[name]
		if st == nil {
			continue
		}
		st.End = st.Before
		if v, ok := end[name]; ok {
			st.End = v
		} else if n := len(st.During); n > 0 {
			st.End = st.During[n-1]
		}
		// A value that changed back between two samples still ends as it ends.
		if st.End != st.Before && !contains(st.During, st.End) {
			st.During = append(st.During, st.End)
		}
		out = append(out, *st)
	}
	return out
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// valueAt is the setting's value as the watch had it at t, and whether it had one.
func valueAt(history []SettingChange, setting string, t time.Time) (string, bool) {
	v, ok := "", false
	for _, ch := range history {
		if ch.Setting != setting || ch.At.After(t) {
			continue
		}
		v, ok = ch.Value, true
	}
	return v, ok
}

// nodePhase is the window in which any node was being upgraded, from the simulators'
// records: the first and last moment of a disruptive Plan run (drain, RKE2, OS), of a
// Rancher restart of RKE2, of a node NotReady or of a reboot. Zero when none was.
func (s *Scenario) nodePhase() (first, last time.Time) {
	note := func(from, to time.Time) {
		if from.IsZero() {
			return
		}
		if to.IsZero() {
			to = time.Now()
		}
		if first.IsZero() || from.Before(first) {
			first = from
		}
		if to.After(last) {
			last = to
		}
	}
	for _, r := range s.Record.Runs() {
		if DisruptiveKind(planKind(r.Plan)) {
			note(r.Start, r.End)
		}
	}
	for _, e := range s.Record.DownLog() {
		note(e.At, e.At)
	}
	for _, rb := range s.Record.Reboots("") {
		note(rb.Start, rb.End)
	}
	if s.Planner != nil {
		for _, a := range s.Planner.Restarts() {
			note(a.Start, a.End)
		}
	}
	return first, last
}

// settingsHeldForNodes checks, from the settings watch and the simulators' records,
// that while any node was being upgraded (nodePhase) KubeVirt's workloadUpdateMethods in
// the harvester chart was empty, and, where the cluster had them before, Longhorn's
// replica replenishment wait was at least 1800 and the descheduler add-on was off
// (facts 13, 35, 36): each held from before the first node's work to after the last's.
// A value changed back within SettingsWatchInterval of the last node's end could go
// unseen.
func (s *Scenario) settingsHeldForNodes() Check {
	c := Check{Name: "while nodes were upgraded, KubeVirt's workloadUpdateMethods was [] in the harvester chart, Longhorn's replica replenishment wait 1800, the descheduler add-on off", OK: true}
	if s.Settings == nil {
		c.OK, c.Detail = false, "the settings were not watched"
		return c
	}
	first, last := s.nodePhase()
	if first.IsZero() {
		c.Name += " (no node was upgraded)"
		return c
	}
	problems := heldForNodes(s.Settings.History(), first, last)
	if len(problems) > 0 {
		sort.Strings(problems)
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// heldForNodes is settingsHeldForNodes on a watch's history and the window of the node
// phase: what broke it, one sentence each.
func heldForNodes(history []SettingChange, first, last time.Time) []string {
	want := map[string]func(before, v string) bool{
		SettingWorkloadUpdateMethods: func(_, v string) bool { return v == "[]" },
		SettingReplicaReplenishment: func(before, v string) bool {
			n, err := strconv.Atoi(v)
			return before == absent || (err == nil && n >= 1800)
		},
		SettingDescheduler: func(before, v string) bool { return before != "true" || v == "false" },
	}
	var problems []string
	for _, name := range RestoredSettings {
		before, ok := "", false
		for _, ch := range history {
			if ch.Setting == name {
				before, ok = ch.Value, true
				break
			}
		}
		if !ok {
			problems = append(problems, name+" was never read")
			continue
		}
		if v, _ := valueAt(history, name, first); !want[name](before, v) {
			problems = append(problems, fmt.Sprintf("%s was %s when the first node's work started at %s", name, v, first.Format("15:04:05.000")))
		}
		for _, ch := range history {
			if ch.Setting == name && ch.At.After(first) && !ch.At.After(last) && !want[name](before, ch.Value) {
				problems = append(problems, fmt.Sprintf("%s became %s at %s, before the last node's work ended at %s", name, ch.Value, ch.At.Format("15:04:05.000"), last.Format("15:04:05.000")))
			}
		}
	}
	return problems
}

// settingsRestored checks, once the cluster's UpgradePlan has ended, that every setting
// the upgrade changes for the roll (RestoredSettings) is back to its value before the
// upgrade, read from the workload cluster itself (fact 37: Harvester's cleanup gives
// them back on every end). Before the plan has ended it says so and judges nothing.
func (s *Scenario) settingsRestored(ctx context.Context) Check {
	c := Check{Name: "the settings changed for the nodes (" + strings.Join(RestoredSettings, ", ") + ") are back to their values before, once the UpgradePlan ended", OK: true}
	if s.Settings == nil || s.Management == nil {
		c.OK, c.Detail = false, "the settings were not watched"
		return c
	}
	if plan := s.UpgradePlan(ctx); plan == nil || !PlanEnded(plan) {
		c.Name += " (the plan has not ended: not judged)"
		return c
	}
	var problems []string
	for _, st := range s.SettingStories(ctx) {
		if contains(RestoredSettings, st.Setting) && changedForRoll(st.Setting, st.Before) && st.End != st.Before {
			problems = append(problems, fmt.Sprintf("%s is %s, it was %s", st.Setting, st.End, st.Before))
		}
	}
	if len(problems) > 0 {
		c.OK, c.Detail = false, strings.Join(problems, "; ")
	}
	return c
}

// changedForRoll says whether the upgrade changes setting for the roll when it had the
// value before, and so must give it back: KubeVirt's workload update methods always
// (unset is recorded as unset, fact 13), Longhorn's wait where the setting exists (fact
// 35), the descheduler add-on where it was enabled (fact 36). An add-on the upgrade
// creates from the release's files (upgrade_addons, fact 29: the release ships the
// descheduler disabled) was not there to give back.
func changedForRoll(setting, before string) bool {
	switch setting {
	case SettingReplicaReplenishment:
		return before != absent
	case SettingDescheduler:
		return before == "true"
	}
	return true
}

// seedRollSettings gives the workload cluster the settings Harvester's upgrade changes
// for the nodes, as a cluster has them before: Longhorn's replica-replenishment-wait-
// interval at Longhorn's default, 600 (longhorn-manager types/setting.go
// SettingDefinitionReplicaReplenishmentWaitInterval), and, on a release that has it
// (v1.7.0 on, fact 36), Harvester's descheduler add-on, enabled by its operator (the
// release ships it disabled: test/sim/harvester-upgrade/addons/descheduler.yaml).
func (s *Scenario) seedRollSettings(ctx context.Context, descheduler bool) error {
	wc := s.Workload.Client
	if err := sim.SetLonghornSetting(ctx, wc, longhorn.Namespace, "replica-replenishment-wait-interval", "600"); err != nil {
		return fmt.Errorf("seed Longhorn's replica-replenishment-wait-interval: %w", err)
	}
	if !descheduler {
		return nil
	}
	addon := &harvesterapi.Addon{}
	addon.Namespace, addon.Name = upgradeplan.DeschedulerAddon.Namespace, upgradeplan.DeschedulerAddon.Name
	addon.Spec = harvesterapi.AddonSpec{Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: "descheduler", Version: "0.34.0", Enabled: true}
	if err := wc.Create(ctx, addon); err != nil {
		return fmt.Errorf("create Harvester's descheduler add-on: %w", err)
	}
	return nil
}
