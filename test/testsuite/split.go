package testsuite

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/capi-inplace/capi-inplace/test/procguard"
)

const (
	// ProcessesEnv names the environment variable that overrides the number of processes
	// a suite asked for with Processes: an integer, 1 or more; 1 runs every suite in one
	// process (for a debugger, or to read one process's log).
	ProcessesEnv = "CAPI_INPLACE_SUITE_PROCESSES"

	// partEnv names, in a test binary a split suite started, the part of the suite it
	// runs: "k/n". Its specs are chosen by the -ginkgo.focus-file flags it is given.
	partEnv = "CAPI_INPLACE_SUITE_PART"

	// partTimeoutMargin is how much sooner than the parent's own deadline a part's
	// -test.timeout ends it: a part that hangs then prints its goroutines and its report
	// before the parent's timeout kills it with nothing said.
	partTimeoutMargin = 30 * time.Second

	// partPrefix starts each line of a part's output copied into the parent's, so that
	// test2json (go test -json) reads a part's "=== RUN" and "--- FAIL" as the parent
	// test's output, not as its own events.
	partPrefix = "part %d/%d | "
)

// Option changes how Run runs a suite.
type Option func(*options)

type options struct {
	processes int
}

// Processes runs the suite's specs in n test processes at once instead of one. A suite
// whose specs are independent and whose process uses well under the cores it has (its
// specs mostly wait for API servers and simulators) ends sooner: harvesteradapter's took
// 863 s in one process in make test on 2 cores, 512 s in two (docs/testing.md).
//
// The test binary starts itself again once per part, each part running its share of the
// specs (chosen with -ginkgo.focus-file) with its own BeforeSuite, hence its own API
// servers; the test that called Run runs no spec itself. Specs on one It line (a loop
// making specs) run in one part, and so do the specs of an Ordered container. The suite
// runs in this process as before when ProcessesEnv is 1, when the command line focuses
// specs (-ginkgo.focus, -ginkgo.focus-file) or names a report file, when a spec is
// focused in the code (FIt), or when its specs would all fall in one part.
func Processes(n int) Option {
	return func(o *options) { o.processes = n }
}

// processes is how many processes a suite runs in: ProcessesEnv when set, else what the
// suite asked for.
func processes(o options) (int, error) {
	env := strings.TrimSpace(os.Getenv(ProcessesEnv))
	if env == "" {
		return max(o.processes, 1), nil
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want an integer, 1 or more", ProcessesEnv, env)
	}
	return n, nil
}

// oneProcess says why a suite asked to run in several processes runs in this one, or "".
func oneProcess(suiteConfig types.SuiteConfig, reporterConfig types.ReporterConfig) string {
	switch {
	case len(suiteConfig.FocusStrings) > 0 || len(suiteConfig.FocusFiles) > 0:
		return "the command line focuses specs"
	case reporterConfig.WillGenerateReport():
		return "the command line names a report file, which each process would write over"
	case suiteConfig.ParallelTotal > 1:
		return "the ginkgo command runs it in parallel already"
	}
	return ""
}

// runPart runs, in a test binary a split suite started, the part of the suite its
// command line focuses on, writing its report as <package>__<test>@k-of-n.json.
func runPart(t *testing.T, description, part string, suiteConfig types.SuiteConfig, reporterConfig types.ReporterConfig) bool {
	t.Helper()
	k, n, err := parsePart(part)
	if err != nil {
		t.Fatalf("testsuite: %v", err)
	}
	return run(t, description, suiteConfig, reporterConfig, fmt.Sprintf("@%d-of-%d", k, n))
}

func parsePart(s string) (k, n int, err error) {
	a, b, ok := strings.Cut(s, "/")
	k, errK := strconv.Atoi(a)
	n, errN := strconv.Atoi(b)
	if !ok || errK != nil || errN != nil || k < 1 || k > n {
		return 0, 0, fmt.Errorf("%s=%q: want k/n, 1 <= k <= n", partEnv, s)
	}
	return k, n, nil
}

// runSplit runs the suite in n processes (Processes). cli is the suite's configuration as
// the command line gave it, before the scope's label filter: each part applies the scope
// itself.
func runSplit(t *testing.T, description string, n int, cli, suiteConfig types.SuiteConfig, reporterConfig types.ReporterConfig) bool {
	t.Helper()
	preview := ginkgo.PreviewSpecs(description, suiteConfig, reporterConfig)
	if preview.SuiteHasProgrammaticFocus {
		t.Logf("testsuite: %s runs in one process: a spec is focused in the code", t.Name())
		return run(t, description, suiteConfig, reporterConfig, "")
	}
	specs := willRun(preview.SpecReports)
	var parts [][]group
	for _, p := range deal(groupSpecs(specs), n) {
		if len(p) > 0 {
			parts = append(parts, p)
		}
	}
	if len(parts) < 2 {
		t.Logf("testsuite: %s runs in one process: its %d specs make %d group(s) that must run together", t.Name(), len(specs), len(parts))
		return run(t, description, suiteConfig, reporterConfig, "")
	}
	filters := make([][]string, len(parts))
	for i, p := range parts {
		f, err := focusFiles(p)
		if err != nil {
			t.Logf("testsuite: %s runs in one process: %v", t.Name(), err)
			return run(t, description, suiteConfig, reporterConfig, "")
		}
		filters[i] = f
	}
	checkParts(t, description, specs, suiteConfig, reporterConfig, filters)
	counts := make([]string, len(parts))
	for i, p := range parts {
		counts[i] = fmt.Sprintf("part %d/%d %d", i+1, len(parts), countSpecs(p))
	}
	t.Logf("testsuite: %s runs its %d specs in %d processes (%s); each part's output follows, its lines prefixed \"part k/%d | \"",
		t.Name(), len(specs), len(parts), strings.Join(counts, ", "), len(parts))
	return startParts(t, cli, reporterConfig, filters)
}

// willRun are the specs of a preview that would run: its It nodes the filters keep.
func willRun(reports types.SpecReports) []types.SpecReport {
	var specs []types.SpecReport
	for _, r := range reports {
		if r.LeafNodeType == types.NodeTypeIt && !r.State.Is(types.SpecStateSkipped|types.SpecStatePending) {
			specs = append(specs, r)
		}
	}
	return specs
}

// location is a node's place in the code, as Ginkgo's focus-file filter sees it.
type location struct {
	file string
	line int
}

// group is specs that run in the same part: those whose It node is at one of its
// locations (sorted by file and line).
type group struct {
	locations []location
	specs     int
}

// groupSpecs groups specs into what a part takes whole, sorted by their first location.
// A part is chosen by Ginkgo's -ginkgo.focus-file=file:line, which keeps every spec with
// a node on that line: specs on one It line (made in a loop) cannot be told apart, so
// they go together. The specs of an Ordered container go together too (its BeforeAll, and
// what each spec leaves to the next, hold only in one process); a spec's report tells
// whether it is in an Ordered container but not in which, so those specs are joined by
// their top-level container, which holds it. Only those are joined so: a key every spec
// shares (a top-level container of unordered specs, the suite itself) would put the whole
// suite in one part.
func groupSpecs(specs []types.SpecReport) []group {
	uf := unionFind{}
	leafOf := func(s types.SpecReport) location {
		return location{s.LeafNodeLocation.FileName, s.LeafNodeLocation.LineNumber}
	}
	for _, s := range specs {
		leaf := leafOf(s)
		uf.add(leaf)
		if s.IsInOrderedContainer && len(s.ContainerHierarchyLocations) > 0 {
			top := s.ContainerHierarchyLocations[0]
			// A key of its own, not the container's location: an It on a container's
			// line (a one-line Describe) must not join that container's specs to it.
			uf.union(leaf, location{"\x00ordered " + top.FileName, top.LineNumber})
		}
	}
	byRoot := map[location]*group{}
	seen := map[location]bool{}
	var groups []*group
	for _, s := range specs {
		leaf := leafOf(s)
		root := uf.find(leaf)
		g := byRoot[root]
		if g == nil {
			g = &group{}
			byRoot[root] = g
			groups = append(groups, g)
		}
		g.specs++
		if !seen[leaf] {
			seen[leaf] = true
			g.locations = append(g.locations, leaf)
		}
	}
	out := make([]group, len(groups))
	for i, g := range groups {
		slices.SortFunc(g.locations, compareLocations)
		out[i] = *g
	}
	slices.SortFunc(out, func(a, b group) int { return compareLocations(a.locations[0], b.locations[0]) })
	return out
}

func compareLocations(a, b location) int {
	if c := strings.Compare(a.file, b.file); c != 0 {
		return c
	}
	return a.line - b.line
}

// deal deals groups (sorted by file and line) round-robin into n parts: each part gets
// about as many groups, from every file, without knowing what each spec costs (a spec's
// cost is not known before it runs; the figures in docs/testing.md came from this).
func deal(groups []group, n int) [][]group {
	parts := make([][]group, n)
	for i, g := range groups {
		parts[i%n] = append(parts[i%n], g)
	}
	return parts
}

func countSpecs(part []group) int {
	n := 0
	for _, g := range part {
		n += g.specs
	}
	return n
}

// focusFiles are the -ginkgo.focus-file values that keep a part's specs: one per file,
// "^<file>$:line,line,...". Ginkgo matches the part before the colon as a regular
// expression anywhere in a node's file name (so "a_test.go" would match
// "/x/data_test.go"): the file is quoted and anchored. Ginkgo splits the value at its
// colons, so a file name holding one cannot be named.
func focusFiles(part []group) ([]string, error) {
	lines := map[string][]int{}
	var files []string
	for _, g := range part {
		for _, l := range g.locations {
			if strings.Contains(l.file, ":") {
				return nil, fmt.Errorf("the spec file %s has a colon in its name, which -ginkgo.focus-file cannot name", l.file)
			}
			if _, ok := lines[l.file]; !ok {
				files = append(files, l.file)
			}
			lines[l.file] = append(lines[l.file], l.line)
		}
	}
	slices.Sort(files)
	out := make([]string, 0, len(files))
	for _, f := range files {
		ls := lines[f]
		slices.Sort(ls)
		ls = slices.Compact(ls)
		nums := make([]string, len(ls))
		for i, l := range ls {
			nums[i] = strconv.Itoa(l)
		}
		out = append(out, "^"+regexp.QuoteMeta(f)+"$:"+strings.Join(nums, ","))
	}
	return out, nil
}

// checkParts previews each part with its focus-file filters and fails the test when a
// spec that would run would run in no part or in more than one: the filters are dealt
// from It lines, and Ginkgo keeps a spec when any of its nodes (containers, BeforeEach)
// is on a filter's line, so a node sharing a line with another part's It would run a
// spec twice. It guards the dealing against Ginkgo's matching as it is.
func checkParts(t *testing.T, description string, specs []types.SpecReport, suiteConfig types.SuiteConfig, reporterConfig types.ReporterConfig, filters [][]string) {
	t.Helper()
	want := map[string]int{}
	for _, s := range specs {
		want[specKey(s)]++
	}
	in := map[string][]int{} // the parts each spec would run in
	for i, f := range filters {
		cfg := suiteConfig
		cfg.FocusFiles = f
		for _, s := range willRun(ginkgo.PreviewSpecs(description, cfg, reporterConfig).SpecReports) {
			in[specKey(s)] = append(in[specKey(s)], i+1)
		}
	}
	if problems := partProblems(want, in, len(filters)); len(problems) > 0 {
		t.Fatalf("testsuite: %s cannot be split into %d processes as dealt (%s=1 runs it in one):\n%s",
			t.Name(), len(filters), ProcessesEnv, strings.Join(problems, "\n"))
	}
}

// partProblems compares how many times each spec would run in the whole suite (want)
// with the parts it would run in, one entry per run (in).
func partProblems(want map[string]int, in map[string][]int, n int) []string {
	var problems []string
	for key, w := range want {
		parts := slices.Compact(slices.Sorted(slices.Values(in[key])))
		switch {
		case len(in[key]) == 0:
			problems = append(problems, fmt.Sprintf("  %s would run in no part", key))
		case len(parts) > 1:
			problems = append(problems, fmt.Sprintf("  %s would run in parts %v of %d", key, parts, n))
		case len(in[key]) != w:
			problems = append(problems, fmt.Sprintf("  %s would run %d times in part %d, %d in the whole suite", key, len(in[key]), parts[0], w))
		}
	}
	for key := range in {
		if want[key] == 0 {
			problems = append(problems, fmt.Sprintf("  %s would run in a part but not in the whole suite", key))
		}
	}
	slices.Sort(problems)
	return problems
}

// specKey names a spec by its It's location and its full text; specs made in a loop with
// one text share it, and are counted.
func specKey(s types.SpecReport) string {
	return fmt.Sprintf("%q (%s:%d)", s.FullText(), s.LeafNodeLocation.FileName, s.LeafNodeLocation.LineNumber)
}

// startParts runs each part as the test binary started again, running only this test
// with the part's focus-file filters, and waits for them all. Each part's output is
// copied into this process's standard output, each line prefixed "part k/n | ". The
// test fails when a part does.
func startParts(t *testing.T, cli types.SuiteConfig, reporterConfig types.ReporterConfig, filters [][]string) bool {
	t.Helper()
	common := []string{"-test.run=" + runPattern(t.Name())}
	if testing.Verbose() {
		// Plain -test.v, even when go test -json gave this process -test.v=test2json:
		// the part's framing would be lost in the prefixed copy anyway.
		common = append(common, "-test.v=true")
	}
	if deadline, ok := t.Deadline(); ok {
		common = append(common, "-test.timeout="+max(time.Until(deadline)-partTimeoutMargin, time.Second).String())
	} else {
		common = append(common, "-test.timeout=0")
	}
	var (
		mu   sync.Mutex // one line at a time onto os.Stdout
		wg   sync.WaitGroup
		errs = make([]error, len(filters))
	)
	for i, f := range filters {
		k, n := i+1, len(filters)
		cfg := cli
		cfg.FocusFiles = f
		ginkgoArgs, err := ginkgoFlags(cfg, reporterConfig)
		if err != nil {
			t.Fatalf("testsuite: the Ginkgo flags of part %d/%d: %v", k, n, err)
		}
		cmd := exec.Command(os.Args[0], append(slices.Clone(common), ginkgoArgs...)...) //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d/%d", partEnv, k, n))
		out := &prefixWriter{prefix: fmt.Sprintf(partPrefix, k, n), out: os.Stdout, mu: &mu}
		cmd.Stdout, cmd.Stderr = out, out
		// A process the part started and left behind may hold its output open.
		cmd.WaitDelay = 10 * time.Second
		// The part dies with this process: a parent killed by its timeout leaves none.
		procguard.Guard(cmd)
		if err := cmd.Start(); err != nil {
			errs[i] = err
			continue
		}
		wg.Go(func() {
			errs[i] = cmd.Wait()
			out.flush()
		})
	}
	wg.Wait()
	passed := true
	for i, err := range errs {
		if err == nil {
			continue
		}
		passed = false
		// err is the exit code ("exit status 1"), the signal that killed the part, or
		// why it could not start.
		t.Errorf("testsuite: part %d/%d of %s failed: %v; its output is above, each line prefixed %q",
			i+1, len(filters), t.Name(), err, fmt.Sprintf(partPrefix, i+1, len(filters)))
	}
	return passed
}

// ginkgoFlags are the -ginkgo.* flags that give a part cfg and reporterConfig, as the
// ginkgo command passes them to a test binary.
func ginkgoFlags(cfg types.SuiteConfig, reporterConfig types.ReporterConfig) ([]string, error) {
	flags := types.SuiteConfigFlags.WithPrefix("ginkgo").CopyAppend(types.ReporterConfigFlags.WithPrefix("ginkgo")...)
	return types.GenerateFlagArgs(flags, map[string]any{"S": &cfg, "R": &reporterConfig})
}

// runPattern is the -test.run pattern of the test named name alone ("^Test$", a
// subtest's "^Test$/^sub$").
func runPattern(name string) string {
	levels := strings.Split(name, "/")
	for i, l := range levels {
		levels[i] = "^" + regexp.QuoteMeta(l) + "$"
	}
	return strings.Join(levels, "/")
}

// prefixWriter copies complete lines to out, each prefixed, holding a partial line until
// its end comes (or flush).
type prefixWriter struct {
	prefix string
	out    io.Writer
	mu     *sync.Mutex
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	var lines []byte
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		lines = append(append(lines, w.prefix...), w.buf[:i+1]...)
		w.buf = w.buf[i+1:]
	}
	if len(lines) > 0 {
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, err := w.out.Write(lines); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flush writes a last line that had no end.
func (w *prefixWriter) flush() {
	if len(w.buf) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf)
	w.buf = nil
}

// unionFind joins locations into sets.
type unionFind map[location]location

func (u unionFind) add(l location) {
	if _, ok := u[l]; !ok {
		u[l] = l
	}
}

func (u unionFind) find(l location) location {
	u.add(l)
	for u[l] != l {
		u[l] = u[u[l]] // halve the path
		l = u[l]
	}
	return l
}

func (u unionFind) union(a, b location) {
	ra, rb := u.find(a), u.find(b)
	if ra != rb {
		u[rb] = ra
	}
}
