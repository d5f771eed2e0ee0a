// Package hookclient calls runtime extension hooks over HTTPS the way Cluster API's
// runtime client does (its own client is internal to Cluster API): discovery first,
// then POSTs of typed request objects to /<group>/<version>/<hook>/<handler>, with the
// server verified against a given CA.
package hookclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// Client calls the hooks of one hook server.
type Client struct {
	baseURL string
	http    *http.Client
	catalog *runtimecatalog.Catalog
	token   string
}

// New returns a client of the hook server at baseURL (https://host:port) that knows the
// hooks of catalog (which must include Cluster API's Discovery hook).
func New(baseURL string, tlsConfig *tls.Config, catalog *runtimecatalog.Catalog) *Client {
	return &Client{
		baseURL: baseURL,
		http:    &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}},
		catalog: catalog,
	}
}

// WithBearerToken returns a copy of c that sends "Authorization: Bearer <token>" with
// every call, as a caller of the ExternalUpgradeRequest server with a token does.
func (c *Client) WithBearerToken(token string) *Client {
	out := *c
	out.token = token
	return &out
}

// Discover calls the Discovery hook.
func (c *Client) Discover(ctx context.Context) (*runtimehooksv1.DiscoveryResponse, error) {
	resp := &runtimehooksv1.DiscoveryResponse{}
	if err := c.Call(ctx, runtimehooksv1.Discovery, "", &runtimehooksv1.DiscoveryRequest{}, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// Call sends request to the handler name of hook and decodes the answer into response.
// An empty name calls the hook without a handler name (as Discovery is called).
func (c *Client) Call(ctx context.Context, hook runtimecatalog.Hook, name string, request runtime.Object, response runtime.Object) error {
	gvh, err := c.catalog.GroupVersionHook(hook)
	if err != nil {
		return err
	}
	gvk, err := c.catalog.Request(gvh)
	if err != nil {
		return err
	}
	request.GetObjectKind().SetGroupVersionKind(gvk)
	body, err := json.Marshal(request)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", gvh.Hook, err)
	}
	return c.Post(ctx, runtimecatalog.GVHToPath(gvh, name), body, response)
}

// Post sends a raw body to path and decodes the answer into response, for tests that
// send malformed requests on purpose.
func (c *Client) Post(ctx context.Context, path string, body []byte, response any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("call %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("read answer of %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("call %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	if err := json.Unmarshal(data, response); err != nil {
		return fmt.Errorf("decode answer of %s: %w: %s", path, err, data)
	}
	return nil
}
