package clusterupgrade

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
)

// waitFleetBundles is wait_for_fleet_bundles 9, the script's last step
// (harvester-release-steps.md fact 31; lib.sh at v1.8.2): a short settle for Fleet to
// write the charts' changes into its bundles (the script sleeps ten seconds, two polls
// here), then looks until no Bundle's Ready condition is False, at most
// Input.FleetBundlesWait. It never fails the upgrade, as the script does not: bundles
// still not ready are named in its message for someone to look at. A cluster that does
// not serve Fleet's Bundle kind has none to wait for (Skipped).
func (r *runner) waitFleetBundles(ctx context.Context) (StepState, string, error) {
	if r.prior[StepWaitFleetBundles].State == StateDone {
		return StateDone, r.prior[StepWaitFleetBundles].Message + " (done by an earlier run)", nil
	}
	select {
	case <-ctx.Done():
		return "", "", ctx.Err()
	case <-r.in.Clock.After(2 * r.in.PollInterval):
	}
	deadline := r.in.Clock.Now().Add(r.in.FleetBundlesWait)
	for {
		list := &fleetv1alpha1.BundleList{}
		err := r.c.List(ctx, list)
		switch {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			return StateSkipped, "Fleet's Bundle kind (bundles.fleet.cattle.io) is not served: no bundles to wait for", nil
		case err != nil:
			return "", "", fmt.Errorf("list Fleet's bundles: %w", err)
		}
		notReady := notReadyBundles(list.Items)
		if len(notReady) == 0 {
			return StateDone, fmt.Sprintf("all %d of Fleet's bundles are ready", len(list.Items)), nil
		}
		if !r.in.Clock.Now().Before(deadline) {
			return StateDone, fmt.Sprintf("gave up waiting for Fleet's bundles after %s, as the release's script does, without failing: not ready: %s; look at them (kubectl get bundles.fleet.cattle.io -A)",
				r.in.FleetBundlesWait, strings.Join(notReady, "; ")), nil
		}
		r.logf("waiting for Fleet's bundles to be ready: %s", strings.Join(notReady, "; "))
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-r.in.Clock.After(r.in.PollInterval):
		}
	}
}

// notReadyBundles names the bundles whose Ready condition is False (the script's test:
// a bundle without the condition does not hold it), with the condition's message.
func notReadyBundles(bundles []fleetv1alpha1.Bundle) []string {
	var out []string
	for _, b := range bundles {
		for _, c := range b.Status.Conditions {
			if c.Type == "Ready" && c.Status == "False" {
				out = append(out, fmt.Sprintf("%s/%s (%s)", b.Namespace, b.Name, c.Message))
			}
		}
	}
	sort.Strings(out)
	return out
}
