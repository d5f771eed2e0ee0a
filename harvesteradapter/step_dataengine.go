package harvesteradapter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
)

// dataEngineStep keeps the node from being taken down while that would break Longhorn
// v2 volumes: Longhorn's live upgrade of v2 instance managers is paused and idle, and no
// attached v2 volume has its engine on the node (see runDataEngine). It runs after the
// evacuation and the drain, which take the node's VMs and pods, and with them their
// volumes' engines, off the node (a VM's migration moves its volumes' attachment, LH
// fact 38; a pod evicted detaches the volume it alone used): before the drain, a pod's
// v2 volume would hold the node until the step timed out. Before RKE2 or the OS are
// touched. The pause is given back by cleanup, at Finish or when the node's update is
// aborted or fails.
var dataEngineStep = step{
	name: StepLonghornDataEngine,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.DataEngineUpgrade, harvesterv1.DefaultDataEngineTimeout)
	},
	skip: (*Updater).skipDataEngine,
	run:  (*Updater).runDataEngine,
}

// skipDataEngine skips the step when the HarvesterUpgrader accepts interrupting v2
// volumes, when the cluster has no Longhorn, and when the node has nothing to do with
// the v2 data engine (longhornState.v2Concerned): with the live upgrade served that is
// no attached v2 volume anywhere and no v2 engine or replica on the node; without it,
// no attached v2 volume with its engine on the node, the only thing the step waits for.
func (u *Updater) skipDataEngine(ctx context.Context, r *nodeRun) (string, error) {
	if r.cfg.Spec.LonghornV2Swap == harvesterv1.LonghornV2SwapSkip {
		return "longhornV2Swap is Skip in the HarvesterUpgrader", nil
	}
	served, err := kube.KindServed(r.wc, schema.GroupKind{Group: "longhorn.io", Kind: "Volume"}, "v1beta2")
	if err != nil {
		return "", err
	}
	if !served {
		return "Longhorn is not installed on the workload cluster", nil
	}
	state, err := longhorn.Read(ctx, r.wc)
	if err != nil {
		return "", err
	}
	live, err := longhorn.LiveUpgradeServed(r.wc)
	if err != nil {
		return "", err
	}
	node := r.nu.Spec.NodeName
	if live && !state.V2Concerned(node) {
		return "no Longhorn v2 volume is attached, and node " + node + " holds no v2 engine or replica", nil
	}
	if !live && len(state.V2EnginesOn(node)) == 0 {
		return "no attached Longhorn v2 volume has its engine on node " + node, nil
	}
	return "", nil
}

// runDataEngine is done when the node can be taken down without breaking v2 volumes:
//   - with Longhorn's live upgrade served, the NodeUpdate pauses it (the setting off, so
//     Longhorn starts no node while this one is down), and no upgrade of it runs: one
//     already running is let finish, since turning the setting off does not stop it
//     (facts 12, 36, 37);
//   - no attached v2 volume has its engine on the node (fact 38): the VM using it has
//     been live-migrated, or the volume detached.
//
// Until then the node is held, not failed, with what it waits for; the step's timeout
// (timeouts.dataEngineUpgrade) bounds the wait.
func (u *Updater) runDataEngine(ctx context.Context, r *nodeRun) (bool, string, error) {
	node := r.nu.Spec.NodeName
	live, paused, held, err := pauseLiveUpgrade(ctx, r, "taken down")
	if err != nil || held != "" {
		return false, held, err
	}
	state, err := longhorn.Read(ctx, r.wc)
	if err != nil {
		return false, "", err
	}
	if engines := state.V2EnginesOn(node); len(engines) > 0 {
		why := "Longhorn's live upgrade is idle, but"
		if !live.Served {
			why = "the cluster's Longhorn does not serve the live upgrade of v2 instance managers (instancemanagerupgradecontrols.longhorn.io), and"
		}
		return false, fmt.Sprintf("holding: %s attached v2 volumes have their engine on node %s: %s; live-migrate their VMs to another node or detach them, or set longhornV2Swap: Skip on the HarvesterUpgrader to accept interrupting them",
			why, node, strings.Join(engines, ", ")), nil
	}
	if !live.Served {
		return true, "no attached Longhorn v2 volume has its engine on node " + node, nil
	}
	return true, fmt.Sprintf("Longhorn's live upgrade of v2 instance managers is idle and no attached v2 volume has its engine on node %s. %s", node, pauseNote(paused)), nil
}

func pauseNote(paused bool) string {
	if paused {
		return "Longhorn's setting " + longhorn.SettingV2AutomaticUpgrade + " is off until this node is back in service"
	}
	return "Longhorn's setting " + longhorn.SettingV2AutomaticUpgrade + " was already off"
}
