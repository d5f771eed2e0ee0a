package extension_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// FuzzHookBodies sends any body to each of the four hooks the way the runtime SDK server
// does (a body that does not decode into the hook's request type is answered by the
// server itself) and checks that every handler answers, within a bound, with Success or a
// Failure that says something, and never through its panic guard. The handlers' client
// points at an address that refuses connections, so every input explores the decoding and
// validation before any read and the answer when the API server cannot be reached; what
// they do with real objects is tested against a real API server in inplace_test.go and
// externalupgrade_test.go. (A fuzz worker process cannot start an API server of its own.)
func FuzzHookBodies(f *testing.F) {
	seeds := map[uint8]string{
		0: `{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"CanUpdateMachineSetRequest","settings":{"defaultUpdater":"ConfigMap/x"},"current":{"machineSet":{"metadata":{"name":"ms","namespace":"default"},"spec":{"clusterName":"c","template":{"spec":{"clusterName":"c","version":"v1.33.3+rke2r1"}}}},"infrastructureMachineTemplate":{"apiVersion":"x/v1","kind":"T","spec":{"template":{"spec":{"a":1}}}}},"desired":{"machineSet":{"metadata":{"name":"ms2","namespace":"default"},"spec":{"clusterName":"c","template":{"spec":{"clusterName":"c","version":"v1.34.1+rke2r1"}}}},"bootstrapConfigTemplate":[1,2]}}`,
		1: `{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"CanUpdateMachineRequest","current":{"machine":{"metadata":{"name":"m","namespace":"default"},"spec":{"clusterName":"c","version":"v1.35.2"}},"bootstrapConfig":{"kind":"KubeadmConfig","spec":{"clusterConfiguration":{"featureGates":{"ControlPlaneKubeletLocalMode":true}}}}},"desired":{"machine":{"metadata":{"name":"m","namespace":"default"},"spec":{"clusterName":"c","version":"v1.36.0"}},"bootstrapConfig":{"kind":"KubeadmConfig","spec":{}}}}`,
		2: `{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"UpdateMachineRequest","settings":{"defaultUpdater":"ConfigMap/"},"desired":{"machine":{"metadata":{"name":"m","namespace":"default"},"spec":{"clusterName":"c","version":"v1.34.1"}}}}`,
		3: `{"apiVersion":"hooks.inplace.cluster.x-k8s.io/v1alpha1","kind":"ExternalUpgradeRequestRequest","cluster":{"metadata":{"name":"c","namespace":"default"}},"machineDeploymentRef":{"name":"md"},"machinesRequiringUpgrade":["a","b"],"newMachineSpec":{"version":"v1.34.1"},"options":{"maxUnavailable":"50%"}}`,
	}
	for hook, body := range seeds {
		f.Add(hook, []byte(body))
	}
	f.Fuzz(func(t *testing.T, hook uint8, body []byte) {
		c := unreachableClient(t)
		reg := nodeupdater.NewRegistry()
		requester := &upgraderequest.Requester{Client: c, Registry: reg}
		inPlace := &extension.InPlaceHooks{Client: c, Requester: requester, Registry: reg}
		external := extension.NewExternalUpgradeHandler(requester)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		var resp runtimehooksv1.ResponseObject
		switch hook % 4 {
		case 0:
			req, r := &runtimehooksv1.CanUpdateMachineSetRequest{}, &runtimehooksv1.CanUpdateMachineSetResponse{}
			if json.Unmarshal(body, req) != nil {
				return
			}
			inPlace.CanUpdateMachineSet(ctx, req, r)
			resp = r
		case 1:
			req, r := &runtimehooksv1.CanUpdateMachineRequest{}, &runtimehooksv1.CanUpdateMachineResponse{}
			if json.Unmarshal(body, req) != nil {
				return
			}
			inPlace.CanUpdateMachine(ctx, req, r)
			resp = r
		case 2:
			req, r := &runtimehooksv1.UpdateMachineRequest{}, &runtimehooksv1.UpdateMachineResponse{}
			if json.Unmarshal(body, req) != nil {
				return
			}
			inPlace.UpdateMachine(ctx, req, r)
			resp = r
		default:
			req, r := &hooksv1.ExternalUpgradeRequestRequest{}, &hooksv1.ExternalUpgradeRequestResponse{}
			if json.Unmarshal(body, req) != nil {
				return
			}
			external.ExternalUpgradeRequest(ctx, req, r)
			resp = r
		}
		if ctx.Err() != nil {
			t.Fatalf("hook %d did not answer within its bound", hook%4)
		}
		switch resp.GetStatus() {
		case runtimehooksv1.ResponseStatusSuccess:
		case runtimehooksv1.ResponseStatusFailure:
			if strings.TrimSpace(resp.GetMessage()) == "" {
				t.Fatalf("hook %d answered Failure without a message", hook%4)
			}
			if strings.Contains(resp.GetMessage(), "internal error") {
				t.Fatalf("hook %d panicked: %s", hook%4, resp.GetMessage())
			}
		default:
			t.Fatalf("hook %d answered status %q", hook%4, resp.GetStatus())
		}
	})
}

var (
	unreachableOnce sync.Once
	unreachable     client.Client
	unreachableErr  error
)

// unreachableClient is a client of an API server that refuses every request at once: its
// transport fails before dialing, and the kinds are mapped statically, so that no
// discovery call waits either.
func unreachableClient(t *testing.T) client.Client {
	unreachableOnce.Do(func() {
		scheme, err := testenv.NewScheme()
		if err != nil {
			unreachableErr = err
			return
		}
		mapper := meta.NewDefaultRESTMapper(nil)
		for gvk := range scheme.AllKnownTypes() {
			mapper.Add(gvk, meta.RESTScopeNamespace)
		}
		cfg := &rest.Config{Host: "https://127.0.0.1:1", Transport: refusing{}, QPS: -1} // no client-side throttling between inputs
		unreachable, unreachableErr = client.New(cfg, client.Options{Scheme: scheme, Mapper: mapper})
	})
	if unreachableErr != nil {
		t.Fatalf("client: %v", unreachableErr)
	}
	return unreachable
}

// refusing answers every request with a connection error.
type refusing struct{}

func (refusing) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
}
