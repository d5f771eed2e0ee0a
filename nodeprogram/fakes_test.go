package nodeprogram

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHost is a node made of a temporary directory: host files live under root, host
// commands are answered by the stand-ins in tools and recorded with their arguments,
// environment and standard input, and mounts are recorded instead of made.
type fakeHost struct {
	root string

	mu     sync.Mutex
	calls  []ranCommand
	tools  map[string]func(c Command, stdin []byte) ([]byte, error)
	mounts map[string]mountRecord // by target
	// mountHistory is every LoopMount call, in order.
	mountHistory []mountRecord
	// onMount, when set, fills a loop mount's target with the image's files (as this
	// program sees them once mounted).
	onMount func(image, target string) error
}

type ranCommand struct {
	Command
	stdin []byte
}

type mountRecord struct{ image, target, fstype string }

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	return &fakeHost{
		root:   t.TempDir(),
		tools:  map[string]func(Command, []byte) ([]byte, error){},
		mounts: map[string]mountRecord{},
	}
}

func (h *fakeHost) Path(p string) string { return filepath.Join(h.root, p) }

func (h *fakeHost) Run(_ context.Context, c Command) ([]byte, error) {
	var stdin []byte
	if c.Stdin != nil {
		var err error
		if stdin, err = io.ReadAll(c.Stdin); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	h.calls = append(h.calls, ranCommand{Command: c, stdin: stdin})
	tool := h.tools[c.Name]
	h.mu.Unlock()
	if tool == nil {
		return nil, fmt.Errorf("host command `%s`: exit status 127: %s: command not found", c, c.Name)
	}
	return tool(c, stdin)
}

func (h *fakeHost) LoopMount(image, target, fstype string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := os.Stat(image); err != nil {
		return fmt.Errorf("open the image to mount: %w", err)
	}
	r := mountRecord{image: image, target: target, fstype: fstype}
	h.mounts[target] = r
	h.mountHistory = append(h.mountHistory, r)
	if h.onMount != nil {
		return h.onMount(image, target)
	}
	return nil
}

// BindMount records a bind of this program's source over target; Unmount takes it away.
func (h *fakeHost) BindMount(source, target string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := os.Stat(target); err != nil {
		return fmt.Errorf("bind %s over %s: %w", source, target, err)
	}
	r := mountRecord{image: source, target: target, fstype: "bind"}
	h.mounts[target] = r
	h.mountHistory = append(h.mountHistory, r)
	return nil
}

func (h *fakeHost) Unmount(target string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.mounts[target]; !ok {
		return fmt.Errorf("unmount %s: not mounted", target)
	}
	delete(h.mounts, target)
	return nil
}

func (h *fakeHost) Mounted(target string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.mounts[target]
	return ok, nil
}

// commandLines are the recorded commands as "name arg arg ...".
func (h *fakeHost) commandLines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var lines []string
	for _, c := range h.calls {
		lines = append(lines, c.String())
	}
	return lines
}

// writeHostFile writes a file on the fake host.
func (h *fakeHost) write(t *testing.T, hostPath, content string) {
	t.Helper()
	p := h.Path(hostPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fileServer serves files by path and counts the requests for each; a status set for a
// path answers instead of the file.
type fileServer struct {
	*httptest.Server
	mu       sync.Mutex
	files    map[string][]byte
	statuses map[string]int
	requests map[string]int
	// before, when set, runs before each answer (to hold a download open).
	before func(path string)
}

func newFileServer(t *testing.T, files map[string][]byte) *fileServer {
	t.Helper()
	s := &fileServer{files: files, statuses: map[string]int{}, requests: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests[r.URL.Path]++
		data, ok := s.files[r.URL.Path]
		status := s.statuses[r.URL.Path]
		before := s.before
		s.mu.Unlock()
		if before != nil {
			before(r.URL.Path)
		}
		switch {
		case status != 0:
			http.Error(w, http.StatusText(status), status)
		case !ok:
			http.NotFound(w, r)
		default:
			_, _ = w.Write(data)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *fileServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[path]
}

func sha512Of(data []byte) string {
	sum := sha512.Sum512(data)
	return hex.EncodeToString(sum[:])
}

// result is what one run of the node program left behind.
type result struct {
	code        int
	stdout      string
	stderr      string
	termination string
}

// runNode runs `capi-inplace node <args>` on host with a termination log in a temporary
// directory. sleep, when set, replaces the clock's sleep (and the clock advances by each
// sleep's duration).
func runNode(t *testing.T, host Host, sleep func(ctx context.Context, d time.Duration) error, args ...string) result {
	t.Helper()
	termination := filepath.Join(t.TempDir(), "termination-log")
	var stdout, stderr bytes.Buffer
	now := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	env := &Env{
		Host: host, Stdout: &stdout, Stderr: &stderr, Identity: "pod-" + t.Name(),
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Sleep: func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			now = now.Add(d)
			mu.Unlock()
			if sleep != nil {
				return sleep(ctx, d)
			}
			return nil
		},
	}
	code := Main(context.Background(), append([]string{"--termination-log=" + termination}, args...), env)
	data, err := os.ReadFile(termination)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String(), termination: string(data)}
}

func (r result) expect(t *testing.T, code int, terminationParts ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\ntermination: %s\nstdout: %s\nstderr: %s", r.code, code, r.termination, r.stdout, r.stderr)
	}
	for _, part := range terminationParts {
		if !strings.Contains(r.termination, part) {
			t.Errorf("termination message %q does not contain %q", r.termination, part)
		}
	}
}
