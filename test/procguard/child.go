package procguard

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ChildEnv names, in a test binary started by KillChild, the role it plays.
const ChildEnv = "CAPI_INPLACE_PROCGUARD_CHILD"

// Ready is the line a child prints once it started what it should.
const Ready = "procguard: ready"

// Child is a test binary started again to be killed (KillChild).
type Child struct {
	// Test is the test function it runs; the test plays the child when ChildEnv is set:
	// it starts processes, then prints ReadyText (Block prints Ready) and goes on or
	// blocks until it is killed.
	Test string
	// Role is the value of ChildEnv, for a test with more than one child.
	Role string
	// Env is added to the child's environment.
	Env []string
	// ReadyText is what the child prints once every process it starts runs (Ready if
	// empty).
	ReadyText string
	// Want are names (as /proc shows them) of processes the child must have started by
	// then: without them the check would pass on nothing.
	Want []string
	// ReadyWithin bounds the wait for ReadyText, GoneWithin the wait for the child's
	// processes to end after it was killed.
	ReadyWithin, GoneWithin time.Duration
}

// Killed is what KillChild saw.
type Killed struct {
	// Before are the child's descendants just before it was killed.
	Before []Proc
	// Left are those of Before still running after GoneWithin.
	Left []Proc
	// Output is the child's standard output and error.
	Output string
}

// KillChild is the check that nothing outlives a killed test binary. It starts the test
// binary again running only c.Test, with ChildEnv=c.Role, waits until it printed
// c.ReadyText, lists its descendants and checks that c.Want are among them, kills it with
// SIGKILL, then waits for the descendants to end. It ends those left with SIGKILL before it
// returns, so a failed check leaves nothing running either.
func KillChild(c Child) (*Killed, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+c.Test+"$", "-test.timeout=0", "-test.count=1") //nolint:gosec // the test binary itself
	cmd.Env = append(append(os.Environ(), c.Env...), ChildEnv+"="+c.Role)
	readyText := c.ReadyText
	if readyText == "" {
		readyText = Ready
	}
	out := &watchWriter{want: readyText, seen: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	// Processes the child left behind may hold its output open: Wait gives up on them.
	cmd.WaitDelay = 5 * time.Second
	// The child too ends with this process if it is killed before it kills the child.
	Guard(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the child: %w", err)
	}
	res := &Killed{}
	ready := out.seen
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	output := out.String
	kill := func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-waited
	}

	select {
	case <-ready:
	case <-waited:
		res.Output = output()
		return res, fmt.Errorf("the child ended before it was ready")
	case <-time.After(c.ReadyWithin):
		res.Before, _ = Descendants(cmd.Process.Pid)
		kill()
		KillAll(res.Before)
		res.Output = output()
		return res, fmt.Errorf("the child did not print %q within %s", readyText, c.ReadyWithin)
	}
	var err error
	res.Before, err = Descendants(cmd.Process.Pid)
	if err != nil {
		kill()
		return res, err
	}
	var names []string
	for _, p := range res.Before {
		names = append(names, p.Name)
	}
	for _, w := range c.Want {
		if !slices.Contains(names, w) {
			kill()
			KillAll(res.Before)
			res.Output = output()
			return res, fmt.Errorf("no %s among the child's processes %v: nothing to check", w, res.Before)
		}
	}
	kill()
	res.Left = WaitGone(res.Before, c.GoneWithin)
	KillAll(res.Left)
	res.Output = output()
	return res, nil
}

// Block prints Ready and sleeps until the parent kills the process (at most ten minutes).
// Before, it waits (at most a minute) until each of names runs below this process, for
// a child whose process changes its name (a script that execs a program).
func Block(names ...string) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		procs, _ := Descendants(os.Getpid())
		missing := false
		for _, n := range names {
			missing = missing || !slices.ContainsFunc(procs, func(p Proc) bool { return p.Name == n })
		}
		if !missing {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Println(Ready)
	time.Sleep(10 * time.Minute)
	os.Exit(3)
}

// watchWriter keeps what is written and closes seen once it holds want.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	done bool
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return n, err
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// ExpectNoneLeft runs KillChild and fails t when the child could not be run and killed,
// or when any process it started outlived it by c.GoneWithin (those are killed then).
func ExpectNoneLeft(t testing.TB, c Child) {
	t.Helper()
	res, err := KillChild(c)
	if err != nil {
		out := ""
		if res != nil {
			out = res.Output
		}
		t.Fatalf("%v; the child's output:\n%s", err, out)
	}
	t.Logf("the child's processes before it was killed: %v", res.Before)
	if len(res.Left) > 0 {
		t.Errorf("still running %s after the process that started them was killed: %v (killed now)", c.GoneWithin, res.Left)
	}
}
