package nodeupdater

import (
	"context"
	"errors"
	"net"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// IsUnreachable reports whether err says that a cluster could not be reached, or answered
// that it cannot serve now: a refused or reset connection, a network or request timeout,
// an API server that is unavailable or throttling. The NodeUpdate reconciler waits such an
// error out until the node's timeout instead of counting it against the step's attempts.
func IsUnreachable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, context.DeadlineExceeded),
		utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err),
		apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err):
		return true
	}
	return false
}
