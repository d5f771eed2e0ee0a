//go:build linux || darwin

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// ttySize asks the terminal on f for its columns and rows; zeros when f is not a terminal.
func ttySize(f *os.File) (cols, rows int) {
	var ws struct{ rows, cols, x, y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	if errno != 0 {
		return 0, 0
	}
	return int(ws.cols), int(ws.rows)
}
