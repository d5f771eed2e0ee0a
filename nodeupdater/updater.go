// Package nodeupdater owns the generic lifecycle of a NodeUpdate: it dispatches each
// NodeUpdate to the Updater registered for its updaterRef kind and owns everything that
// is not specific to one updater (phases, steps, timeouts, retries, abort, conditions,
// events, metrics). Updaters, such as the Harvester adapter, implement Updater.
package nodeupdater

import (
	"context"
	"errors"
	"fmt"
	"time"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// Updater performs the node-level work of NodeUpdates whose updaterRef names its kind.
type Updater interface {
	// Reconcile advances one NodeUpdate by as much as it can without blocking, recording
	// its steps in nu.Status.Steps. It is idempotent: it is called again after a restart
	// with the status as last persisted. An error wrapped by Permanent fails the
	// NodeUpdate without a retry, once Abort has cleaned up; any other error is retried
	// with backoff. A SkipError puts the node back: the NodeUpdate ends Skipped once
	// Abort has cleaned up.
	Reconcile(ctx context.Context, nu *inplacev1.NodeUpdate) (Result, error)

	// Abort stops the work on the node at a safe point and removes what the updater
	// created for it. It is called until it reports done: after a failure (a permanent
	// error, retries exhausted), on timeout, on abort and before the NodeUpdate is
	// deleted, and the NodeUpdate is final only then.
	Abort(ctx context.Context, nu *inplacev1.NodeUpdate) (done bool, err error)

	// Preflight runs the updater's own checks of whether a node may be started now.
	Preflight(ctx context.Context, target PreflightTarget) []CheckResult
}

// Result is what one Reconcile call of an Updater achieved.
type Result struct {
	// Done is true when the node reached the target; the NodeUpdate then succeeds.
	Done bool
	// RequeueAfter is when to call Reconcile again while not done; zero means the
	// reconciler's default poll interval.
	RequeueAfter time.Duration
}

// PreflightTarget is the node an UpgradeTask considers starting.
type PreflightTarget struct {
	// Namespace is the namespace of the Cluster, its Machines and the updater configuration.
	Namespace string
	// ClusterName is the name of the CAPI Cluster.
	ClusterName string
	// MachineName is the name of the CAPI Machine.
	MachineName string
	// NodeName is the name of the Machine's Node in the workload cluster.
	NodeName string
	// Version is the target version.
	Version string
	// UpdaterRef names the updater configuration.
	UpdaterRef inplacev1.UpdaterReference
	// ControlPlane is true for a control plane machine.
	ControlPlane bool
	// Disrupted names the cluster's nodes, other than this one, that are down or going
	// down now: NotReady, being deleted, cordoned by someone else or in maintenance mode,
	// or upgraded by a NodeUpdate of any task that has not ended. Sorted.
	Disrupted []string
	// Picked names the nodes this round already picked to start together with this one.
	// Checks that protect something spread over nodes (storage replicas) judge it against
	// Disrupted, Picked and this node down at once. Sorted.
	Picked []string
}

// TargetJudge is implemented by an Updater that knows better than the kubelet version
// whether a node already runs the target: the Harvester updater also compares the
// operating system release. Selection, retries and UpdateMachine ask it about a machine
// whose kubelet already reports the target but that no NodeUpdate of this version
// finished well, so that a node whose kubelet was upgraded and whose OS step failed is
// upgraded again rather than counted as done.
type TargetJudge interface {
	// AtTarget reports whether the node of target runs target.Version as this updater
	// upgrades it; when it does not, why, in words an operator can check.
	AtTarget(ctx context.Context, target PreflightTarget) (atTarget bool, why string, err error)
}

// CheckResult is the outcome of one named preflight check for one node.
type CheckResult struct {
	// Name names the check, for example LonghornVolumesHealthy.
	Name string
	// Passed is true when the check does not hold the node back.
	Passed bool
	// Message says, when the check did not pass, what holds the node back.
	Message string
}

// PermanentError is an error that retrying cannot mend: a bad configuration, an
// ineligible version. It fails the NodeUpdate with Reason without a retry, once the
// updater's Abort has cleaned up.
type PermanentError struct {
	// Reason is a short CamelCase reason, for example IneligibleVersion.
	Reason string
	// Err is the underlying error, shown to the operator.
	Err error
}

func (e *PermanentError) Error() string { return e.Err.Error() }

func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent with the given reason.
func Permanent(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Reason: reason, Err: err}
}

// Permanentf builds a permanent error from a format.
func Permanentf(reason, format string, args ...any) error {
	return &PermanentError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// AsPermanent returns the PermanentError in err's chain, if any.
func AsPermanent(err error) (*PermanentError, bool) {
	var perm *PermanentError
	if errors.As(err, &perm) {
		return perm, true
	}
	return nil, false
}

// SkipError is what an Updater returns from Reconcile to put the node back instead of
// upgrading it (drainPolicy Skip: the drain stayed blocked for its grace period). The
// reconciler then calls Abort until it reports done, as after a failure, so that nothing
// the updater started keeps running on the node, and ends the NodeUpdate Skipped with
// the message: a skip is not a failure.
type SkipError struct {
	// Message names what blocked the node (the pods and their budgets).
	Message string
}

func (e *SkipError) Error() string { return e.Message }

// Skipf builds a SkipError from a format.
func Skipf(format string, args ...any) error {
	return &SkipError{Message: fmt.Sprintf(format, args...)}
}

// AsSkip returns the SkipError in err's chain, if any.
func AsSkip(err error) (*SkipError, bool) {
	var skip *SkipError
	if errors.As(err, &skip) {
		return skip, true
	}
	return nil, false
}

// DisruptionPreviewer is implemented by an Updater that can tell, without acting, what
// upgrading a node would disrupt: the VMs its evacuation would live-migrate or stop, the
// pods whose PodDisruptionBudget would block its drain now, the volumes that would lose
// their last healthy replica. UpgradePreview asks it, with target.Disrupted naming the
// nodes that would be down at the same time. It must decide with the same code its run
// uses, and change nothing.
type DisruptionPreviewer interface {
	PreviewDisruption(ctx context.Context, target PreflightTarget) (inplacev1.NodeDisruption, error)
}

// NodeDurationEstimator is implemented by an Updater that knows how long a node's upgrade
// typically takes when the cluster has no past NodeUpdates to tell: UpgradePreview shows
// it as the updater's default.
type NodeDurationEstimator interface {
	TypicalNodeDuration() time.Duration
}
