// Package procguard ties the processes the tests and the demo start (kube-apiserver, etcd,
// the manager, Cluster API's controllers) to the life of the process that started them:
// when a test binary or the demo is killed or times out, they get SIGKILL instead of
// running on (a `make demo` stopped by a timeout once left two kube-apiservers and two
// etcds running for 14 minutes).
//
// It uses Linux's parent-death signal (prctl PR_SET_PDEATHSIG): Guard sets it on an
// exec.Cmd, WrapperScript on a process someone else starts (envtest's kube-apiserver and
// etcd) through setpriv. Elsewhere both do nothing.
//
// The kernel sends the signal when the thread that forked the child ends, not the
// process. Go ends an OS thread only when a goroutine locked to it (runtime.LockOSThread)
// returns without unlocking; no code here, in envtest or in the demo forks from such a
// goroutine, so the thread lives as long as the process and the signal comes when the
// process dies. A parent that dies between the fork and the prctl (setpriv's, in
// WrapperScript) sends nothing: that window is a few milliseconds at a process's start.
package procguard

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Proc is a process as /proc shows it.
type Proc struct {
	Pid  int
	PPid int
	// Name is the kernel's name of the process (comm: its executable's base name, at
	// most 15 bytes).
	Name string
	// State is its state letter (R, S, Z for a zombie, ...).
	State string
	// Start is its start time in clock ticks since boot: with Pid, it names the process,
	// not a later one given the same pid.
	Start uint64
}

// String is "name[pid]".
func (p Proc) String() string { return fmt.Sprintf("%s[%d]", p.Name, p.Pid) }

// Read reads /proc/<pid>/stat.
func Read(pid int) (Proc, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Proc{}, err
	}
	// pid (comm) state ppid ... ; comm may hold spaces and parentheses: it ends at the
	// last ')'.
	s := string(data)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Proc{}, fmt.Errorf("unreadable /proc/%d/stat: %q", pid, s)
	}
	fields := strings.Fields(s[closing+1:])
	if len(fields) < 20 {
		return Proc{}, fmt.Errorf("unreadable /proc/%d/stat: %q", pid, s)
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return Proc{}, fmt.Errorf("unreadable /proc/%d/stat: %w", pid, err)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Proc{}, fmt.Errorf("unreadable /proc/%d/stat: %w", pid, err)
	}
	return Proc{Pid: pid, PPid: ppid, Name: s[open+1 : closing], State: fields[0], Start: start}, nil
}

// Descendants lists the live processes below pid (children, their children, ...), read
// from /proc.
func Descendants(pid int) ([]Proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]Proc{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		proc, err := Read(p)
		if err != nil {
			continue // ended meanwhile
		}
		children[proc.PPid] = append(children[proc.PPid], proc)
	}
	var out []Proc
	queue := []int{pid}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			if c.State != "Z" {
				out = append(out, c)
			}
			queue = append(queue, c.Pid)
		}
		queue = queue[1:]
	}
	return out, nil
}

// Alive says whether p still runs: its pid names the same process (same start time) and
// it is not a zombie (a killed process whose new parent has not reaped it yet).
func Alive(p Proc) bool {
	now, err := Read(p.Pid)
	return err == nil && now.Start == p.Start && now.State != "Z"
}

// WaitGone waits until none of procs runs, polling, at most timeout, and returns those
// still running then.
func WaitGone(procs []Proc, timeout time.Duration) []Proc {
	deadline := time.Now().Add(timeout)
	for {
		var alive []Proc
		for _, p := range procs {
			if Alive(p) {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// KillAll sends SIGKILL to each of procs still running: the clean-up of a check that
// found them left over, so they do not outlive it too.
func KillAll(procs []Proc) {
	for _, p := range procs {
		if Alive(p) {
			if proc, err := os.FindProcess(p.Pid); err == nil {
				_ = proc.Kill()
			}
		}
	}
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
