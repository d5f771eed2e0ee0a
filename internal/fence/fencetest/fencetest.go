// Package fencetest holds the servers the specs of fenced fetches share.
package fencetest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// SlowTLSServer starts an https server that never answers: each request waits until its
// caller gives up (or the test ends). It is closed when the test ends.
func SlowTLSServer(t testing.TB) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	return srv
}
