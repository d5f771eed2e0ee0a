package main

import "testing"

// The node program is reached through the manager's binary: `capi-inplace node ...`.
func TestNodeProgramDispatch(t *testing.T) {
	if code := runNodeProgram([]string{"--help"}); code != 0 {
		t.Errorf("`node --help` exited %d, want 0", code)
	}
	if code := runNodeProgram([]string{"--termination-log=", "bogus"}); code != 2 {
		t.Errorf("`node bogus` exited %d, want 2 (bad usage)", code)
	}
	if code := runNodeProgram([]string{"--termination-log=", "repository", "download"}); code != 2 {
		t.Errorf("`node repository download` without flags exited %d, want 2 (bad usage)", code)
	}
}
