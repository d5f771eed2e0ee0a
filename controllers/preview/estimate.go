package preview

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// DefaultNodeDuration is how long one node is expected to take when the cluster has no
// past NodeUpdates and its updater gives no typical duration: a drain, an RKE2 upgrade and
// a reboot of a node with a few VMs to migrate.
const DefaultNodeDuration = 30 * time.Minute

// estimate sets each starting machine's expected duration and the total: the targets one
// after another, each in batches of maxUnavailable nodes at once.
func (r *Reconciler) estimate(_ context.Context, s *previewScope) error {
	perNode, source := r.nodeDuration(s)
	// A mean of NodeUpdates' second-precision times is rounded back to the second, so
	// that the status does not show 1m18.999999996s.
	perNode = perNode.Round(time.Second)
	var total time.Duration
	for _, t := range s.targets {
		starting := startingEntries(t)
		for _, e := range starting {
			e.status.EstimatedDuration = &metav1.Duration{Duration: perNode}
		}
		batches := (len(starting) + t.maxUnavailable - 1) / t.maxUnavailable
		total += time.Duration(batches) * perNode
	}
	s.total = &metav1.Duration{Duration: total}
	s.estimateSource = source
	return nil
}

// nodeDuration is the expected duration of one node and where it comes from: the mean of
// the cluster's Succeeded NodeUpdates (those of the same updater kind when there are any),
// else the updater's typical duration, else DefaultNodeDuration.
func (r *Reconciler) nodeDuration(s *previewScope) (time.Duration, string) {
	var same, all []time.Duration
	for i := range s.nodeUpdates {
		nu := &s.nodeUpdates[i]
		st := nu.Status
		if st.Phase != inplacev1.NodeUpdatePhaseSucceeded || st.StartTime == nil || st.CompletionTime == nil || !st.CompletionTime.After(st.StartTime.Time) {
			continue
		}
		d := st.CompletionTime.Sub(st.StartTime.Time)
		all = append(all, d)
		if nu.Spec.UpdaterRef.Kind == s.updaterRef.Kind {
			same = append(same, d)
		}
	}
	switch {
	case len(same) > 0:
		return mean(same), fmt.Sprintf("the cluster's %d past NodeUpdates", len(same))
	case len(all) > 0:
		return mean(all), fmt.Sprintf("the cluster's %d past NodeUpdates (of other updaters)", len(all))
	}
	if r.Registry != nil && s.updaterRef.Kind != "" {
		if reg, found, _ := r.Registry.Lookup(s.updaterRef); found {
			if est, ok := reg.Updater.(nodeupdater.NodeDurationEstimator); ok && est.TypicalNodeDuration() > 0 {
				return est.TypicalNodeDuration(), fmt.Sprintf("the updater's default (%s, %s per node)", s.updaterRef.Kind, human(est.TypicalNodeDuration()))
			}
		}
	}
	return DefaultNodeDuration, fmt.Sprintf("capi-inplace's fixed default of %s per node: the cluster has no past NodeUpdates and its updater gives no typical duration", human(DefaultNodeDuration))
}

func mean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// roundDuration rounds a duration for people: to the minute from ten minutes, to the
// second below.
func roundDuration(d time.Duration) time.Duration {
	if d >= 10*time.Minute {
		return d.Round(time.Minute)
	}
	return d.Round(time.Second)
}

// human renders a rounded duration without its zero tails: 42m, 1h30m, 45s.
func human(d time.Duration) string {
	s := roundDuration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
