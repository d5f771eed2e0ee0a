package harvesteradapter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
)

// dataEngineStep coordinates with Longhorn's v2 data engine on the node.
var dataEngineStep = step{
	name:    StepLonghornDataEngine,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return dur(t.DataEngineUpgrade, defaultDataEngineTimeout) },
	skip:    (*Updater).skipDataEngine,
	run:     (*Updater).runDataEngine,
}

func (u *Updater) skipDataEngine(ctx context.Context, r *nodeRun) (string, error) {
	if r.cfg.Spec.LonghornV2Swap == harvesterv1.LonghornV2SwapSkip {
		return "longhornV2Swap is Skip in the HarvesterUpgrader", nil
	}
	served, err := kindServed(r.wc, schema.GroupKind{Group: "longhorn.io", Kind: "Volume"}, "v1beta2")
	if err != nil {
		return "", err
	}
	if !served {
		return "Longhorn is not installed on the workload cluster", nil
	}
	state, err := readLonghorn(ctx, r.wc)
	if err != nil {
		return "", err
	}
	if len(state.attachedV2On(r.nu.Spec.NodeName)) == 0 {
		return "no attached Longhorn v2 volume has an engine or replica on node " + r.nu.Spec.NodeName, nil
	}
	return "", nil
}

func (u *Updater) runDataEngine(ctx context.Context, r *nodeRun) (bool, string, error) {
	swap, err := chooseDataEngineSwap(r.wc)
	if err != nil {
		return false, "", err
	}
	if swap == nil {
		state, err := readLonghorn(ctx, r.wc)
		if err != nil {
			return false, "", err
		}
		return false, fmt.Sprintf("holding: the cluster's Longhorn does not serve the live data engine upgrade API, and node %s holds attached v2 volumes (%s); detach them or set longhornV2Swap: Skip",
			r.nu.Spec.NodeName, strings.Join(state.attachedV2On(r.nu.Spec.NodeName), ", ")), nil
	}
	return swap.Ensure(ctx, r.wc, r.nu)
}
