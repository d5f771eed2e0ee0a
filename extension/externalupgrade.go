package extension

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
)

// ExternalUpgradeHandler serves the ExternalUpgradeRequest hook: it hands the request to
// the shared request admission and answers Accept with the UpgradeTask's name or Decline
// with the reason. It only reads and writes a few objects; the upgrade itself is the
// UpgradeTask controller's.
type ExternalUpgradeHandler struct {
	requester *upgraderequest.Requester
}

var _ ExternalHooks = &ExternalUpgradeHandler{}

// NewExternalUpgradeHandler returns the ExternalUpgradeRequest handler admitting requests
// through requester.
func NewExternalUpgradeHandler(requester *upgraderequest.Requester) *ExternalUpgradeHandler {
	return &ExternalUpgradeHandler{requester: requester}
}

// ExternalUpgradeRequest implements ExternalHooks. A well-formed request is answered with
// Status Success and a Decision; Status Failure means the request could not be processed
// (the API server could not be asked), and the caller should retry.
func (h *ExternalUpgradeHandler) ExternalUpgradeRequest(ctx context.Context, req *hooksv1.ExternalUpgradeRequestRequest, resp *hooksv1.ExternalUpgradeRequestResponse) {
	call := startHook(ctx, "ExternalUpgradeRequest", resp)
	defer call.end()
	if call.failIfWrongKindOf(req.APIVersion, req.Kind, hooksv1.GroupVersion.String(), "ExternalUpgradeRequestRequest") {
		return
	}
	log := ctrl.LoggerFrom(ctx).WithValues("hook", "ExternalUpgradeRequest", "cluster", klog.KObj(&req.Cluster))
	ctx = ctrl.LoggerInto(ctx, log)

	var desired *inplacev1.DesiredMachine
	if req.NewMachineSpec.BootstrapConfig != nil || req.NewMachineSpec.InfrastructureMachine != nil {
		desired = &inplacev1.DesiredMachine{
			BootstrapConfig:       req.NewMachineSpec.BootstrapConfig,
			InfrastructureMachine: req.NewMachineSpec.InfrastructureMachine,
		}
	}
	decision, err := h.requester.Request(ctx, upgraderequest.Request{
		Namespace:   req.Cluster.Namespace,
		ClusterName: req.Cluster.Name,
		Target: upgraderequest.Target{
			ControlPlaneRef:      req.ControlPlaneRef,
			MachineDeploymentRef: req.MachineDeploymentRef,
		},
		Machines:       req.MachinesRequiringUpgrade,
		Version:        req.NewMachineSpec.Version,
		DesiredMachine: desired,
		UpdaterRef:     req.UpdaterRef,
		Pacing:         inplacev1.PacingExtension,
		MaxUnavailable: req.Options.MaxUnavailable,
		NodeOrder:      req.Options.NodeOrder,
		PauseNodes:     req.Options.PauseNodes,
		DryRun:         req.Options.DryRun,
	})
	if err != nil {
		log.Error(err, "could not process upgrade request")
		call.fail(HookReasonAPIError, fmt.Errorf("capi-inplace could not process the upgrade request: %w", err))
		return
	}
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
	if decision.Accepted {
		resp.Decision = hooksv1.DecisionAccept
		resp.UpgradeTaskName = decision.TaskName
		resp.SetMessage(fmt.Sprintf("UpgradeTask %s/%s carries out the upgrade", req.Cluster.Namespace, decision.TaskName))
		return
	}
	resp.Decision = hooksv1.DecisionDecline
	resp.Reason = decision.Reason
	call.declined(decision.Reason)
	resp.SetMessage(decision.Message)
}
