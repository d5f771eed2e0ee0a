package testenv

import "testing"

// ForTest starts a test environment for a plain Go test and stops it when the test
// ends; with -short the test is skipped, since it starts an API server.
func ForTest(t testing.TB) *Environment {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a test API server")
	}
	env, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}
