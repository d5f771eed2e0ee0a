package main

import (
	"flag"
	"io"
	"testing"

	"github.com/capi-inplace/capi-inplace/internal/fence"
)

// The fence's flags: strict by default, each flag lifting its own rule and no other.
func TestFetchFlags(t *testing.T) {
	parse := func(args ...string) fence.Policy {
		t.Helper()
		var o fetchOptions
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.bind(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o.policy()
	}
	if p := parse(); p != (fence.Policy{}) {
		t.Errorf("defaults: %+v, want the strict zero Policy", p)
	}
	for flagName, want := range map[string]fence.Policy{
		fence.AllowHTTPFlag:      {AllowHTTP: true},
		fence.AllowLinkLocalFlag: {AllowLinkLocal: true},
		fence.AllowLoopbackFlag:  {AllowLoopback: true},
	} {
		if p := parse("--" + flagName); p != want {
			t.Errorf("--%s: %+v, want %+v", flagName, p, want)
		}
	}
}
