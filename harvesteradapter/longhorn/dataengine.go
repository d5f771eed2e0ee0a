package longhorn

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhornlive"
)

// Longhorn's live upgrade of v2 instance managers (shared/facts/longhorn-v2-live-upgrade.md,
// section C) is Longhorn's own roll: it picks the node (the lexicographically smallest
// pending one, fact 13), starts by itself when a v2 instance manager's image differs from
// the default and a setting allows it (fact 11), and runs one node at a time. Nobody can
// ask it to upgrade a given node (fact 36). So the Harvester updater does not drive it: it
// keeps it from starting while the updater takes nodes down (the setting below, off while
// any NodeUpdate pauses it), and does not take a node down while it runs (fact 37).

const (
	// SettingV2AutomaticUpgrade is Longhorn's master switch of the live upgrade of v2
	// instance managers (fact 12). Off lets the node being upgraded finish and starts no
	// other (fact 36a).
	SettingV2AutomaticUpgrade = "allow-v2-instance-manager-automatic-upgrade"
	// AnnotationV2UpgradePausedBy is set on that Setting while NodeUpdates pause Longhorn's
	// live upgrade: the comma-separated UIDs of those NodeUpdates. The value comes back
	// when the last one releases it.
	AnnotationV2UpgradePausedBy = "harvester.inplace.cluster.x-k8s.io/v2-upgrade-paused-by"
	// AnnotationV2UpgradePausedValue is the Setting's value before the first NodeUpdate
	// paused it.
	AnnotationV2UpgradePausedValue = "harvester.inplace.cluster.x-k8s.io/v2-upgrade-paused-value"
)

var liveUpgradeControlKind = schema.GroupKind{Group: longhornlive.GroupVersion.Group, Kind: "InstanceManagerUpgradeControl"}

// liveUpgradeServed says whether the workload cluster's Longhorn has the live upgrade of
// v2 instance managers: it serves InstanceManagerUpgradeControl only from the release
// that carries it (v1.13.x, possibly v1.12.2+; facts 2 and 35).
func LiveUpgradeServed(c client.Client) (bool, error) {
	return kube.KindServed(c, liveUpgradeControlKind, longhornlive.GroupVersion.Version)
}

// liveUpgrade is what the preflight and the data engine step know of Longhorn's live
// upgrade: whether the cluster serves it and, if so, what of it runs now.
type LiveUpgrade struct {
	Served bool
	// running describes each upgrade that runs, for messages; empty when none does.
	Running []string
}

// readLiveUpgrade reads Longhorn's live upgrade: every InstanceManagerUpgrade in an
// active state (fact 9; see UpgradeState.Active) and the InstanceManagerUpgradeControl's
// in-progress node (fact 10). The control's node is listed only when no active upgrade
// already names it: between two states Longhorn can show the node in progress with its
// upgrade object not yet created or already ended.
func ReadLiveUpgrade(ctx context.Context, c client.Client) (LiveUpgrade, error) {
	served, err := LiveUpgradeServed(c)
	if err != nil || !served {
		return LiveUpgrade{}, err
	}
	live := LiveUpgrade{Served: true}
	imus := &longhornlive.InstanceManagerUpgradeList{}
	if err := c.List(ctx, imus, client.InNamespace(Namespace)); err != nil {
		return LiveUpgrade{}, fmt.Errorf("list Longhorn InstanceManagerUpgrades: %w", err)
	}
	activeOn := map[string]bool{}
	for _, imu := range imus.Items {
		if !imu.Status.State.Active() {
			continue
		}
		state := string(imu.Status.State)
		if state == "" {
			state = string(longhornlive.UpgradeStatePending)
		}
		activeOn[imu.Spec.NodeID] = true
		live.Running = append(live.Running, fmt.Sprintf("InstanceManagerUpgrade %s on node %s is %s", imu.Name, imu.Spec.NodeID, state))
	}
	control := &longhornlive.InstanceManagerUpgradeControl{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: longhornlive.ControlName}, control); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return LiveUpgrade{}, fmt.Errorf("get Longhorn InstanceManagerUpgradeControl %s: %w", longhornlive.ControlName, err)
	default:
		for node, info := range control.Status.Nodes {
			if info.State == longhornlive.NodeUpgradeStateInProgress && !activeOn[node] {
				live.Running = append(live.Running, fmt.Sprintf("node %s is in-progress in InstanceManagerUpgradeControl %s", node, control.Name))
			}
		}
	}
	sort.Strings(live.Running)
	return live, nil
}

// V2Concerned says whether a node's upgrade must look at Longhorn's v2 data engine at all:
// some v2 volume is attached anywhere, or the node holds an engine or replica of a v2
// volume. Every such node waits for Longhorn's live upgrade to be idle, not only nodes
// with v2 volumes of their own: an upgrade relocates engines to other nodes that hold a
// replica (cordoned ones too, fact 20), and once its volumes are healthy again Longhorn
// rebuilds or reuses replicas wherever it schedules them (fact 22), so which nodes a
// running upgrade leans on can change while this node is being taken down.
func (s *State) V2Concerned(node string) bool {
	for _, v := range s.volumes {
		if v.Spec.DataEngine == longhornv1.DataEngineTypeV2 && v.Status.State == longhornv1.VolumeStateAttached {
			return true
		}
	}
	for i := range s.engines {
		if s.engines[i].Spec.NodeID == node && s.engines[i].Spec.DataEngine == longhornv1.DataEngineTypeV2 {
			return true
		}
	}
	for i := range s.replicas {
		if s.replicas[i].Spec.NodeID == node && s.dataEngineOf(&s.replicas[i]) == longhornv1.DataEngineTypeV2 {
			return true
		}
	}
	return false
}

// V2EnginesOn lists the v2 volumes whose engine runs on node (engine spec.nodeID, fact 27)
// and that are not detached, each with its PVC when Longhorn knows it. Restarting the
// node's v2 instance manager stops their I/O (facts 35 and 38): the engine must have
// moved to another node first (a VM's live migration moves it) or the volume be
// detached. A stopped engine does not count.
func (s *State) V2EnginesOn(node string) []string {
	return s.V2EnginesStaying(node, nil)
}

// Leaving says whether the node's own steps take off the node what uses an attached
// volume, so that its engine leaves with it (a VM's evacuation moves the attachment with
// the live migration or detaches it with the stop, LH fact 38; the drain's eviction of a
// pod detaches the volume it alone used), and otherwise why not.
type Leaving func(v *longhornv1.Volume) (leaves bool, why string)

// V2EnginesStaying is V2EnginesOn without the volumes that leaving says leave the node,
// each named with why it stays; a nil leaving frees none.
func (s *State) V2EnginesStaying(node string, leaving Leaving) []string {
	var out []string
	seen := map[string]bool{}
	for i := range s.engines {
		e := &s.engines[i]
		if e.Spec.NodeID != node || e.Status.CurrentState == longhornv1.InstanceStateStopped {
			continue
		}
		v := s.volume(e.Spec.VolumeName)
		if v == nil || v.Status.State == longhornv1.VolumeStateDetached || seen[v.Name] {
			continue
		}
		engine := v.Spec.DataEngine
		if engine == "" {
			engine = e.Spec.DataEngine
		}
		if engine != longhornv1.DataEngineTypeV2 {
			continue
		}
		seen[v.Name] = true
		var notes []string
		if k := v.Status.KubernetesStatus; k.PVCName != "" {
			notes = append(notes, fmt.Sprintf("PVC %s/%s", k.Namespace, k.PVCName))
		}
		if leaving != nil {
			leaves, why := leaving(v)
			if leaves {
				continue
			}
			if why != "" {
				notes = append(notes, why)
			}
		}
		name := v.Name
		if len(notes) > 0 {
			name += " (" + strings.Join(notes, ", ") + ")"
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// pauseV2AutomaticUpgrade records that the NodeUpdate uid pauses Longhorn's live upgrade
// of v2 instance managers, and turns the setting off if it is on. Several NodeUpdates can
// pause it together; the first one records the value it found. It returns whether the
// NodeUpdate pauses it (false when the setting was off, or absent, and nobody paused it:
// there is then nothing to give back), and whether this call turned the setting off. All
// of it lives on the Setting, so a restarted manager finds it there; every write carries
// the resourceVersion read, and a conflicting writer makes it read again.
func PauseV2AutomaticUpgrade(ctx context.Context, c client.Client, uid types.UID) (paused, turnedOff bool, err error) {
	err = updateV2Setting(ctx, c, func(s *longhornv1.Setting) bool {
		pausers := pausersOf(s)
		paused, turnedOff = slices.Contains(pausers, string(uid)), s.Value != "false"
		switch {
		case paused && !turnedOff:
			return false
		case paused:
			// Someone turned it back on while this node is being taken down: off again
			// until the node releases it.
			s.Value = "false"
			return true
		case len(pausers) == 0 && s.Value != "true":
			turnedOff = false
			return false
		case len(pausers) == 0:
			s.Annotations[AnnotationV2UpgradePausedValue] = s.Value
		}
		s.Annotations[AnnotationV2UpgradePausedBy] = strings.Join(append(pausers, string(uid)), ",")
		s.Value = "false"
		paused = true
		return true
	})
	if err != nil {
		return false, false, fmt.Errorf("pause Longhorn's setting %s: %w", SettingV2AutomaticUpgrade, err)
	}
	return paused, turnedOff, nil
}

// releaseV2AutomaticUpgrade takes the NodeUpdate uid off the pausers of Longhorn's live
// upgrade. The last one to go puts back the value the first one found, unless someone
// has changed it since (then theirs stays).
func ReleaseV2AutomaticUpgrade(ctx context.Context, c client.Client, uid types.UID) error {
	err := updateV2Setting(ctx, c, func(s *longhornv1.Setting) bool {
		pausers := pausersOf(s)
		if !slices.Contains(pausers, string(uid)) {
			return false
		}
		pausers = slices.DeleteFunc(pausers, func(p string) bool { return p == string(uid) })
		if len(pausers) > 0 {
			s.Annotations[AnnotationV2UpgradePausedBy] = strings.Join(pausers, ",")
			return true
		}
		if original, ok := s.Annotations[AnnotationV2UpgradePausedValue]; ok && s.Value == "false" {
			s.Value = original
		}
		delete(s.Annotations, AnnotationV2UpgradePausedBy)
		delete(s.Annotations, AnnotationV2UpgradePausedValue)
		return true
	})
	if err != nil {
		return fmt.Errorf("release Longhorn's setting %s: %w", SettingV2AutomaticUpgrade, err)
	}
	return nil
}

// updateV2Setting reads the setting, lets change edit it, and writes it if change says
// it changed, reading again on a conflict. An absent setting (a Longhorn without the
// live upgrade, or not installed) is left alone.
func updateV2Setting(ctx context.Context, c client.Client, change func(*longhornv1.Setting) bool) error {
	served, err := kube.KindServed(c, schema.GroupKind{Group: longhornv1.SchemeGroupVersion.Group, Kind: "Setting"}, longhornv1.SchemeGroupVersion.Version)
	if err != nil || !served {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := &longhornv1.Setting{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: SettingV2AutomaticUpgrade}, s); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		if !change(s) {
			return nil
		}
		return c.Update(ctx, s)
	})
}

func pausersOf(s *longhornv1.Setting) []string {
	var out []string
	for p := range strings.SplitSeq(s.Annotations[AnnotationV2UpgradePausedBy], ",") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}
