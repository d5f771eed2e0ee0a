// Package extension holds capi-inplace's runtime hook handlers: Cluster API's in-place
// update hooks (CanUpdateMachineSet, CanUpdateMachine, UpdateMachine), served on one
// server registered with Cluster API by an ExtensionConfig, and capi-inplace's own
// ExternalUpgradeRequest hook, served on a second server because Cluster API's discovery
// rejects hooks outside its own catalog.
package extension

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimeserver "sigs.k8s.io/cluster-api/exp/runtime/server"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
)

// Handler names, as they appear in discovery and in the hook URLs
// (/<group>/<version>/<hook>/<handler name>).
const (
	CanUpdateMachineSetHandlerName    = "can-update-machineset"
	CanUpdateMachineHandlerName       = "can-update-machine"
	UpdateMachineHandlerName          = "update-machine"
	ExternalUpgradeRequestHandlerName = "external-upgrade-request"
)

// ServerOptions are what both hook servers share.
type ServerOptions struct {
	// Port is the TCP port to serve on.
	Port int
	// CertDir holds tls.crt and tls.key.
	CertDir string
	// TLSOpts adjust the TLS configuration (minimum version, cipher suites).
	TLSOpts []func(*tls.Config)
	// Callers say who may call the server. For the Cluster API hook server, the zero
	// value lets every caller in; the ExternalUpgradeRequest server refuses every call
	// unless Callers name a client CA or a token, or AllowAnonymous is set.
	Callers Callers
	// AllowAnonymous lets every caller of the ExternalUpgradeRequest server in when Callers
	// name neither a client CA nor a token: a lab only.
	AllowAnonymous bool
}

// CAPIHooks are the handlers of Cluster API's in-place update hooks.
type CAPIHooks interface {
	CanUpdateMachineSet(ctx context.Context, req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse)
	CanUpdateMachine(ctx context.Context, req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse)
	UpdateMachine(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse)
}

// ExternalHooks are the handlers of capi-inplace's own hook catalog.
type ExternalHooks interface {
	ExternalUpgradeRequest(ctx context.Context, req *hooksv1.ExternalUpgradeRequestRequest, resp *hooksv1.ExternalUpgradeRequestResponse)
}

// NewCAPIHookServer returns the server of Cluster API's in-place update hooks. It also
// answers Cluster API's discovery call, listing exactly these three handlers.
func NewCAPIHookServer(opts ServerOptions, hooks CAPIHooks) (*runtimeserver.Server, error) {
	catalog := runtimecatalog.New()
	if err := runtimehooksv1.AddToCatalog(catalog); err != nil {
		return nil, fmt.Errorf("build Cluster API hook catalog: %w", err)
	}
	callers := opts.Callers
	callers.RefuseAnonymous = false
	srv, err := newServer(catalog, opts, newCallerGate(hookServerCAPI, callers, FlagHookClientCA, ""))
	if err != nil {
		return nil, err
	}
	handlers := []runtimeserver.ExtensionHandler{
		{Hook: runtimehooksv1.CanUpdateMachineSet, Name: CanUpdateMachineSetHandlerName, HandlerFunc: hooks.CanUpdateMachineSet},
		{Hook: runtimehooksv1.CanUpdateMachine, Name: CanUpdateMachineHandlerName, HandlerFunc: hooks.CanUpdateMachine},
		{Hook: runtimehooksv1.UpdateMachine, Name: UpdateMachineHandlerName, HandlerFunc: hooks.UpdateMachine},
	}
	return srv, addHandlers(srv, handlers)
}

// NewExternalHookServer returns the server of capi-inplace's own hooks. Its catalog also
// holds Cluster API's Discovery hook, so callers discover it the same way.
func NewExternalHookServer(opts ServerOptions, hooks ExternalHooks) (*runtimeserver.Server, error) {
	catalog := runtimecatalog.New()
	if err := runtimehooksv1.AddToCatalog(catalog); err != nil {
		return nil, fmt.Errorf("build Cluster API hook catalog: %w", err)
	}
	if err := hooksv1.AddToCatalog(catalog); err != nil {
		return nil, fmt.Errorf("build capi-inplace hook catalog: %w", err)
	}
	callers := opts.Callers
	callers.RefuseAnonymous = !opts.AllowAnonymous
	srv, err := newServer(catalog, opts, newCallerGate(hookServerExternalUpgradeRequest, callers, FlagExternalHookClientCA, FlagExternalHookTokenFile))
	if err != nil {
		return nil, err
	}
	handlers := []runtimeserver.ExtensionHandler{
		{Hook: hooksv1.ExternalUpgradeRequest, Name: ExternalUpgradeRequestHandlerName, HandlerFunc: hooks.ExternalUpgradeRequest},
	}
	return srv, addHandlers(srv, handlers)
}

func newServer(catalog *runtimecatalog.Catalog, opts ServerOptions, gate *callerGate) (*runtimeserver.Server, error) {
	tlsOpts := opts.TLSOpts
	if gate.callers.ClientCAFile != "" {
		tlsOpts = append(slices.Clone(tlsOpts), requestClientCertificates)
	}
	srv, err := runtimeserver.New(runtimeserver.Options{
		Catalog: catalog,
		Port:    opts.Port,
		CertDir: opts.CertDir,
		TLSOpts: tlsOpts,
	})
	if err != nil {
		return nil, fmt.Errorf("create hook server on port %d: %w", opts.Port, err)
	}
	// Every handler, discovery included, is registered when the server starts, through
	// the embedded webhook server's Register: the gate wraps them there.
	srv.Server = gatedServer{Server: srv.Server, gate: gate}
	return srv, nil
}

func addHandlers(srv *runtimeserver.Server, handlers []runtimeserver.ExtensionHandler) error {
	for _, h := range handlers {
		if err := srv.AddExtensionHandler(h); err != nil {
			return fmt.Errorf("register hook handler %s: %w", h.Name, err)
		}
	}
	return nil
}
