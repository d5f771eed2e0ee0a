//go:build !linux

package procguard

import (
	"os/exec"
	"syscall"
)

// Guard does nothing here: only Linux has a parent-death signal.
func Guard(*exec.Cmd) {}

// WrapperScript returns binary: only Linux has a parent-death signal.
func WrapperScript(_, binary string) (string, error) { return binary, nil }

// StopWithParent does nothing outside Linux.
func StopWithParent(syscall.Signal) error { return nil }
