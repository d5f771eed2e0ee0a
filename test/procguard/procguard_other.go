//go:build !linux

package procguard

import "os/exec"

// Guard does nothing here: only Linux has a parent-death signal.
func Guard(*exec.Cmd) {}

// WrapperScript returns binary: only Linux has a parent-death signal.
func WrapperScript(_, binary string) (string, error) { return binary, nil }
