//go:build linux

package procguard

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// Guard makes cmd's process get SIGKILL when the process starting it dies (keeping any
// other attribute already set, such as Setpgid). Call it before cmd.Start.
func Guard(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// WrapperScript writes into dir an executable of binary's base name that runs binary with
// the same arguments under `setpriv --pdeathsig KILL`, for a process someone else starts
// (envtest starts kube-apiserver and etcd from a path, with no hook on its exec.Cmd). The
// script execs setpriv, which sets the signal and execs binary: one process, one pid,
// whose parent stays the process that ran the script, so binary gets SIGKILL when that
// process dies. It returns the script's path; binary's own when setpriv is not installed
// (util-linux's; every Debian and Ubuntu has it), which leaves binary unguarded as before.
func WrapperScript(dir, binary string) (string, error) {
	setpriv, err := exec.LookPath("setpriv")
	if err == nil {
		setpriv, err = filepath.Abs(setpriv)
	}
	if err != nil {
		// No setpriv: binary runs as envtest would run it, unguarded.
		return binary, nil
	}
	abs, err := filepath.Abs(binary)
	if err != nil {
		return "", err
	}
	script := filepath.Join(dir, filepath.Base(binary))
	body := fmt.Sprintf("#!/bin/sh\n# %s, killed when the process that started it dies (test/procguard).\nexec %s --pdeathsig KILL -- %s \"$@\"\n",
		filepath.Base(binary), shellQuote(setpriv), shellQuote(abs))
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil { //nolint:gosec // an executable script
		return "", fmt.Errorf("write the wrapper of %s: %w", binary, err)
	}
	return script, nil
}

// StopWithParent asks the kernel to send sig to this process when the process that
// started it dies: for the demo, whose parent is make, so that a make killed on its own
// stops the demo, which then stops what it started.
func StopWithParent(sig syscall.Signal) error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(sig), 0); errno != 0 {
		return fmt.Errorf("prctl PR_SET_PDEATHSIG: %w", errno)
	}
	return nil
}
