package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DrainMode is what the updater does with a node whose drain is blocked.
// +kubebuilder:validation:Enum=Hold;Evict;Skip
type DrainMode string

const (
	// DrainModeHold keeps the node draining until its drain step times out (the default).
	DrainModeHold DrainMode = "Hold"
	// DrainModeEvict deletes the pods whose eviction a PodDisruptionBudget refuses, once
	// the drain has been blocked for gracePeriod: the budgets are ignored. Longhorn's pods
	// (in longhorn-system, or carrying longhorn.io/component) are never deleted: Longhorn
	// keeps an instance manager's budget exactly while deleting its pod would crash
	// attached volumes or lose a volume's only good copy, and the node holds for them.
	DrainModeEvict DrainMode = "Evict"
	// DrainModeSkip puts the node back once the drain has been blocked for gracePeriod:
	// the drain stops, the node is uncordoned and what its earlier steps stopped is
	// restored; the NodeUpdate ends Skipped naming the blocking pods, and an UpgradeTask
	// goes on with its other nodes and tries the skipped one once more at the end.
	DrainModeSkip DrainMode = "Skip"
)

// DefaultDrainGracePeriod is how long a blocked drain waits before the policy acts.
const DefaultDrainGracePeriod = "10m"

// DrainPolicy says what to do with a node whose drain is blocked: a pod whose eviction a
// PodDisruptionBudget refuses.
// +kubebuilder:validation:XValidation:rule="!has(self.gracePeriod) || duration(self.gracePeriod) > duration('0s')",message="drainPolicy.gracePeriod must be more than 0s, for example 10m"
type DrainPolicy struct {
	// mode is Hold (the default: the node waits until its drain step times out, and the
	// task fails there), Skip (after gracePeriod the node is put back: uncordoned, what
	// was stopped restored, its NodeUpdate Skipped naming the blocking pods; the task
	// goes on with the other nodes and tries it once more at the end, and fails if it is
	// skipped again) or Evict (after gracePeriod, the blocking pods are deleted, their
	// PodDisruptionBudgets ignored; only when asked. Evict never deletes Longhorn's pods
	// (namespace longhorn-system, or the label longhorn.io/component), whose budgets
	// Longhorn keeps while deleting them would crash attached volumes or lose a volume's
	// only healthy replica: the node holds for those, with Longhorn's reason, until
	// Longhorn lifts the budget; on the Harvester updater a VM whose live migration
	// failed is stopped). The Cluster API path
	// (UpdateMachine) has no other nodes to go on with: there Skip fails the machine's
	// update with the blocking pods named, after putting the node back.
	// +optional
	// +kubebuilder:default=Hold
	Mode DrainMode `json:"mode,omitempty"`

	// gracePeriod is how long the drain may be blocked before the mode acts, for
	// example 10m (the default).
	// +optional
	// +kubebuilder:default="10m"
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`
}

// DrainModeOrDefault is the policy's mode, Hold when unset.
func (p *DrainPolicy) DrainModeOrDefault() DrainMode {
	if p == nil || p.Mode == "" {
		return DrainModeHold
	}
	return p.Mode
}

// GracePeriodOrDefault is the policy's grace period, DefaultDrainGracePeriod when unset.
func (p *DrainPolicy) GracePeriodOrDefault() time.Duration {
	if p != nil && p.GracePeriod != nil {
		return p.GracePeriod.Duration
	}
	d, _ := time.ParseDuration(DefaultDrainGracePeriod)
	return d
}
