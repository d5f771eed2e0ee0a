package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Default timeouts of the steps, when the HarvesterUpgrader gives none (the CRD defaults
// are the same).
const (
	DefaultRepositoryTimeout        = time.Hour
	DefaultImagePreloadTimeout      = 30 * time.Minute
	DefaultDrainTimeout             = time.Hour
	DefaultKubernetesUpgradeTimeout = time.Hour
	DefaultOSUpgradeTimeout         = 45 * time.Minute
	DefaultDataEngineTimeout        = 30 * time.Minute
	DefaultNodeTimeout              = 4 * time.Hour
	DefaultClusterUpgradeTimeout    = 3 * time.Hour
)

// DurationOr is d, or def when d is unset or not positive.
func DurationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d != nil && d.Duration > 0 {
		return d.Duration
	}
	return def
}
