package harvesteradapter

import (
	"context"
	"fmt"
	"strings"
	"time"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
)

// longhornPauseStep pauses Longhorn's live upgrade of v2 instance managers and waits
// until none runs, before the node is cordoned: a cordon already acts on Longhorn (its
// drain policy and replica eviction, shared/facts/longhorn-v2-live-upgrade.md, facts 30
// to 32), and the virtual machines' migrations that follow move v2 engines, while a
// running upgrade has engines on temporary nodes, cordoned ones included (facts 17, 20,
// 37). LonghornDataEngine, after the evacuation and the drain, checks again and holds for
// the engines left on the node. The pause is given back by cleanup.
var longhornPauseStep = step{
	name: StepLonghornPause,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.DataEngineUpgrade, harvesterv1.DefaultDataEngineTimeout)
	},
	skip: (*Updater).skipLonghornPause,
	run:  (*Updater).runLonghornPause,
}

// skipLonghornPause skips the step where LonghornDataEngine is skipped, and where
// Longhorn does not serve its live upgrade: there is nothing to pause.
func (u *Updater) skipLonghornPause(ctx context.Context, r *nodeRun) (string, error) {
	if why, err := u.skipDataEngine(ctx, r); err != nil || why != "" {
		return why, err
	}
	live, err := longhorn.LiveUpgradeServed(r.wc)
	if err != nil {
		return "", err
	}
	if !live {
		return "the cluster's Longhorn does not serve the live upgrade of v2 instance managers: nothing to pause", nil
	}
	return "", nil
}

// runLonghornPause is done when this NodeUpdate pauses Longhorn's live upgrade (or the
// setting was off already) and no upgrade of it runs.
func (u *Updater) runLonghornPause(ctx context.Context, r *nodeRun) (bool, string, error) {
	live, paused, held, err := pauseLiveUpgrade(ctx, r, "cordoned")
	if err != nil || held != "" {
		return false, held, err
	}
	if !live.Served {
		return true, "the cluster's Longhorn does not serve the live upgrade of v2 instance managers: nothing to pause", nil
	}
	return true, fmt.Sprintf("Longhorn's live upgrade of v2 instance managers is idle. %s", pauseNote(paused)), nil
}

// pauseLiveUpgrade pauses Longhorn's live upgrade of v2 instance managers for the
// NodeUpdate, where Longhorn serves it, and says what the node is held for: the pause just
// made (Longhorn decides from its informer cache, so a node it started on the old value
// shows only a moment later; what runs is looked at on the next poll), or an upgrade that
// runs. held is empty when neither holds; not is what is not done to the node meanwhile.
func pauseLiveUpgrade(ctx context.Context, r *nodeRun, not string) (live longhorn.LiveUpgrade, paused bool, held string, err error) {
	node := r.nu.Spec.NodeName
	if live, err = longhorn.ReadLiveUpgrade(ctx, r.wc); err != nil || !live.Served {
		return live, false, "", err
	}
	paused, turnedOff, err := longhorn.PauseV2AutomaticUpgrade(ctx, r.wc, r.nu.UID)
	if err != nil {
		return live, false, "", err
	}
	if turnedOff {
		return live, paused, fmt.Sprintf("turned Longhorn's setting %s off so that its live upgrade of v2 instance managers starts no node while node %s is out of service; looking at what runs next",
			longhorn.SettingV2AutomaticUpgrade, node), nil
	}
	if len(live.Running) > 0 {
		return live, paused, fmt.Sprintf("holding: Longhorn's live upgrade of v2 instance managers is running (%s); node %s is not %s until it ends. %s",
			strings.Join(live.Running, "; "), node, not, pauseNote(paused)), nil
	}
	return live, paused, "", nil
}
