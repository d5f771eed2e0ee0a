//go:build !linux

package nodeprogram

import (
	"errors"
	"syscall"
)

var errNotLinux = errors.New("the node program runs on Linux nodes only")

func chrootAttr(string) *syscall.SysProcAttr { return nil }
func loopMount(string, string, string) error { return errNotLinux }
func unmount(string) error                   { return errNotLinux }
func bindMount(string, string) error         { return errNotLinux }
