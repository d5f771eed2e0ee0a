package extension

import (
	"context"
	"fmt"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// Unimplemented answers Cluster API's hooks with a Failure that says the hook is not implemented
// in this build. It stands in for a hook until its handler lands, so that a caller gets a
// clear answer instead of a connection error or, worse, a silent success.
type Unimplemented struct{}

var _ CAPIHooks = Unimplemented{}

// CanUpdateMachineSet answers that the hook is not implemented.
func (Unimplemented) CanUpdateMachineSet(_ context.Context, _ *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) {
	notImplemented(resp, "CanUpdateMachineSet")
}

// CanUpdateMachine answers that the hook is not implemented.
func (Unimplemented) CanUpdateMachine(_ context.Context, _ *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) {
	notImplemented(resp, "CanUpdateMachine")
}

// UpdateMachine answers that the hook is not implemented.
func (Unimplemented) UpdateMachine(_ context.Context, _ *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) {
	notImplemented(resp, "UpdateMachine")
}

func notImplemented(resp runtimehooksv1.ResponseObject, hook string) {
	resp.SetStatus(runtimehooksv1.ResponseStatusFailure)
	resp.SetMessage(fmt.Sprintf("capi-inplace: the %s hook is not implemented in this build of the manager; upgrade capi-inplace to a release that serves it", hook))
}
