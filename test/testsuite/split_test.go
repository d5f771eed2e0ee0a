package testsuite

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
)

// spec is a preview's report of an It at file:line inside containers (their locations,
// outermost first).
func spec(text, file string, line int, ordered bool, containers ...types.CodeLocation) types.SpecReport {
	return types.SpecReport{
		LeafNodeType:                types.NodeTypeIt,
		LeafNodeText:                text,
		LeafNodeLocation:            types.CodeLocation{FileName: file, LineNumber: line},
		ContainerHierarchyLocations: containers,
		IsInOrderedContainer:        ordered,
		State:                       types.SpecStatePassed,
	}
}

func at(file string, line int) types.CodeLocation {
	return types.CodeLocation{FileName: file, LineNumber: line}
}

// suiteSpecs is a suite's specs as a preview reports them: specs made in a loop on one
// It line, two Ordered containers (one with a nested container), a top-level container
// of unordered specs and two Its outside any container.
func suiteSpecs() []types.SpecReport {
	return []types.SpecReport{
		spec("loop 1", "/s/a_test.go", 10, false, at("/s/a_test.go", 5)),
		spec("loop 2", "/s/a_test.go", 10, false, at("/s/a_test.go", 5)),
		spec("loop 3", "/s/a_test.go", 10, false, at("/s/a_test.go", 5)),
		spec("ordered b first", "/s/b_test.go", 20, true, at("/s/b_test.go", 15)),
		spec("ordered b nested", "/s/b_test.go", 30, true, at("/s/b_test.go", 15), at("/s/b_test.go", 25)),
		// The Ordered container calls a helper whose It is in another file.
		spec("ordered b helper", "/s/helpers_test.go", 7, true, at("/s/b_test.go", 15)),
		spec("ordered c first", "/s/c_test.go", 10, true, at("/s/c_test.go", 5)),
		spec("ordered c second", "/s/c_test.go", 12, true, at("/s/c_test.go", 5)),
		spec("d 1", "/s/d_test.go", 10, false, at("/s/d_test.go", 1)),
		spec("d 2", "/s/d_test.go", 20, false, at("/s/d_test.go", 1)),
		spec("d 3", "/s/d_test.go", 30, false, at("/s/d_test.go", 1), at("/s/d_test.go", 25)),
		spec("d 4", "/s/d_test.go", 40, false, at("/s/d_test.go", 1)),
		spec("top e 1", "/s/e_test.go", 3, false),
		spec("top e 2", "/s/e_test.go", 7, false),
	}
}

// groupOf finds the group holding file:line.
func groupOf(t *testing.T, groups []group, file string, line int) group {
	t.Helper()
	for _, g := range groups {
		if slices.Contains(g.locations, location{file, line}) {
			return g
		}
	}
	t.Fatalf("no group holds %s:%d: %+v", file, line, groups)
	return group{}
}

func TestGroupSpecs(t *testing.T) {
	groups := groupSpecs(suiteSpecs())

	if g := groupOf(t, groups, "/s/a_test.go", 10); len(g.locations) != 1 || g.specs != 3 {
		t.Errorf("the 3 specs made in a loop on one It line are one group of that line alone: %+v", g)
	}
	b := groupOf(t, groups, "/s/b_test.go", 20)
	want := []location{{"/s/b_test.go", 20}, {"/s/b_test.go", 30}, {"/s/helpers_test.go", 7}}
	if !slices.Equal(b.locations, want) || b.specs != 3 {
		t.Errorf("an Ordered container's specs, nested and in a helper's file too, are one group %v; got %+v", want, b)
	}
	if c := groupOf(t, groups, "/s/c_test.go", 10); len(c.locations) != 2 || c.specs != 2 {
		t.Errorf("the second Ordered container is a group of its own 2 specs: %+v", c)
	}
	for _, line := range []int{10, 20, 30, 40} {
		if g := groupOf(t, groups, "/s/d_test.go", line); len(g.locations) != 1 || g.specs != 1 {
			t.Errorf("the unordered specs of one top-level container are not joined: d_test.go:%d is in %+v", line, g)
		}
	}
	for _, line := range []int{3, 7} {
		if g := groupOf(t, groups, "/s/e_test.go", line); len(g.locations) != 1 {
			t.Errorf("Its outside any container are not joined: e_test.go:%d is in %+v", line, g)
		}
	}
	// loop, b, c, 4 of d, 2 of e.
	if len(groups) != 9 {
		t.Errorf("9 groups, got %d: %+v", len(groups), groups)
	}
	for i := 1; i < len(groups); i++ {
		if compareLocations(groups[i-1].locations[0], groups[i].locations[0]) >= 0 {
			t.Errorf("groups are sorted by file and line: %+v before %+v", groups[i-1], groups[i])
		}
	}
}

// TestDealEverySpecOnce checks, through Ginkgo's own parsing and matching of the
// focus-file filters, that every spec falls in exactly one part, for 1 to 4 parts.
func TestDealEverySpecOnce(t *testing.T) {
	specs := suiteSpecs()
	// A file whose name ends as another's: an unanchored filter would take its specs.
	specs = append(specs, spec("other file", "/s/xa_test.go", 10, false))
	for n := 1; n <= 4; n++ {
		parts := deal(groupSpecs(specs), n)
		if len(parts) != n {
			t.Fatalf("%d parts asked, %d dealt", n, len(parts))
		}
		total := 0
		for _, p := range parts {
			total += countSpecs(p)
			// Round-robin: the parts differ by one group at most.
			if len(p) < len(groupSpecs(specs))/n {
				t.Errorf("%d parts: a part of %d groups", n, len(p))
			}
		}
		if total != len(specs) {
			t.Errorf("%d parts: %d specs dealt, want %d", n, total, len(specs))
		}
		for _, s := range specs {
			var in []int
			for k, p := range parts {
				filters, err := focusFiles(p)
				if err != nil {
					t.Fatal(err)
				}
				ff, err := types.ParseFileFilters(filters)
				if err != nil {
					t.Fatalf("Ginkgo refuses %q: %v", filters, err)
				}
				locations := append(slices.Clone(s.ContainerHierarchyLocations), s.LeafNodeLocation)
				if ff.Matches(locations) {
					in = append(in, k+1)
				}
			}
			if len(in) != 1 {
				t.Errorf("%d parts: %s would run in parts %v, want exactly one", n, specKey(s), in)
			}
		}
	}
}

func TestFocusFiles(t *testing.T) {
	got, err := focusFiles([]group{
		{locations: []location{{"/s/a_test.go", 30}, {"/s/b.test.go", 4}}},
		{locations: []location{{"/s/a_test.go", 10}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`^/s/a_test\.go$:10,30`, `^/s/b\.test\.go$:4`}
	if !slices.Equal(got, want) {
		t.Errorf("focusFiles = %q, want %q", got, want)
	}
	if _, err := focusFiles([]group{{locations: []location{{"/s/c:d_test.go", 1}}}}); err == nil {
		t.Errorf("a file name with a colon cannot be a focus-file filter: want an error")
	}
}

func TestPartProblems(t *testing.T) {
	want := map[string]int{"a": 1, "loop": 3, "b": 1, "c": 1}
	in := map[string][]int{"a": {1}, "loop": {2, 2, 2}, "b": {1, 2}, "x": {2}}
	got := strings.Join(partProblems(want, in, 2), "\n")
	for _, w := range []string{"b would run in parts [1 2] of 2", "c would run in no part", "x would run in a part but not in the whole suite"} {
		if !strings.Contains(got, w) {
			t.Errorf("the problems lack %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "  a ") || strings.Contains(got, "loop") {
		t.Errorf("a spec in one part, as many times as in the whole suite, is no problem:\n%s", got)
	}
	if p := partProblems(map[string]int{"loop": 2}, map[string][]int{"loop": {1}}, 2); len(p) != 1 {
		t.Errorf("a spec made twice in a loop but run once is a problem: %q", p)
	}
}

func TestProcesses(t *testing.T) {
	t.Setenv(ProcessesEnv, "")
	if n, err := processes(options{processes: 2}); n != 2 || err != nil {
		t.Errorf("asked 2: %d, %v", n, err)
	}
	if n, err := processes(options{}); n != 1 || err != nil {
		t.Errorf("asked none: %d, %v", n, err)
	}
	t.Setenv(ProcessesEnv, "1")
	if n, err := processes(options{processes: 2}); n != 1 || err != nil {
		t.Errorf("%s=1 overrides: %d, %v", ProcessesEnv, n, err)
	}
	for _, bad := range []string{"0", "two", "-1"} {
		t.Setenv(ProcessesEnv, bad)
		if _, err := processes(options{processes: 2}); err == nil {
			t.Errorf("%s=%s: want an error", ProcessesEnv, bad)
		}
	}
}

func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	w := &prefixWriter{prefix: "part 1/2 | ", out: &out, mu: &sync.Mutex{}}
	for _, s := range []string{"=== RUN   Te", "stX\n--- PASS\n", "no end"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := out.String(), "part 1/2 | === RUN   TestX\npart 1/2 | --- PASS\n"; got != want {
		t.Errorf("complete lines only, prefixed: %q, want %q", got, want)
	}
	w.flush()
	if got := out.String(); !strings.HasSuffix(got, "part 1/2 | no end\n") {
		t.Errorf("flush writes the last line: %q", got)
	}
}

func TestRunPattern(t *testing.T) {
	if got := runPattern("TestA/sub.1"); got != `^TestA$/^sub\.1$` {
		t.Errorf("runPattern = %q", got)
	}
}

// The fixture suite: TestSplitFixture runs it (in a test binary of its own, started by the
// tests below), each spec recording that it ran (a file <spec>@<pid> in the directory
// recordEnv names) and failing when failEnv names it.
const (
	recordEnv = "CAPI_INPLACE_TESTSUITE_RECORD"
	failEnv   = "CAPI_INPLACE_TESTSUITE_FAIL"
)

func record(name string) {
	if err := os.WriteFile(filepath.Join(os.Getenv(recordEnv), fmt.Sprintf("%s@%d", name, os.Getpid())), nil, 0o600); err != nil {
		ginkgo.Fail(err.Error())
	}
	if os.Getenv(failEnv) == name {
		ginkgo.Fail("failed as " + failEnv + " asked")
	}
}

var _ = ginkgo.Describe("split fixture", func() {
	for i := range 3 {
		ginkgo.It(fmt.Sprintf("loop %d", i), func() { record(fmt.Sprintf("loop %d", i)) })
	}
	ginkgo.It("alone a", func() { record("alone a") })
	ginkgo.It("alone b", func() { record("alone b") })
	ginkgo.It("whole run", E2E, func() { record("whole run") })
})

var _ = ginkgo.Describe("ordered fixture", ginkgo.Ordered, ginkgo.Label("ordered-fixture"), func() {
	ginkgo.It("first", func() { record("ordered first") })
	ginkgo.Context("nested", func() {
		ginkgo.It("second", func() { record("ordered second") })
	})
	ginkgo.It("third", func() { record("ordered third") })
})

var _ = ginkgo.Describe("another fixture", func() {
	ginkgo.It("c", func() { record("c") })
	ginkgo.It("d", func() { record("d") })
})

// TestSplitFixture runs the fixture suite in 2 processes, when a test below started it.
func TestSplitFixture(t *testing.T) {
	if os.Getenv(recordEnv) == "" {
		t.Skip("the fixture suite of TestSplitSuite and the tests beside it")
	}
	Run(t, "split fixture", Processes(2))
}

// fixtureRun is what a run of TestSplitFixture did.
type fixtureRun struct {
	// pid is the process of TestSplitFixture, the one that split the suite.
	pid string
	// ran are the pids each spec ran in.
	ran map[string][]string
	// reports are the report files written, without their "<package>__".
	reports []string
	out     []byte
	err     error
}

// runFixture runs TestSplitFixture in the test binary started again, under make test's
// scope, with env added and args.
func runFixture(t *testing.T, env []string, args ...string) fixtureRun {
	t.Helper()
	records, reports := t.TempDir(), t.TempDir()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestSplitFixture$", "-test.v", "-ginkgo.no-color"}, args...)...)
	cmd.Env = append(append(os.Environ(), recordEnv+"="+records, ReportDirEnv+"="+reports, ScopeEnv+"="+ScopeUnit, ProcessesEnv+"="), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	r := fixtureRun{ran: map[string][]string{}}
	if r.err = cmd.Start(); r.err != nil {
		t.Fatal(r.err)
	}
	r.pid = fmt.Sprint(cmd.Process.Pid)
	r.err = cmd.Wait()
	r.out = out.Bytes()
	entries, err := os.ReadDir(records)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name, pid, _ := strings.Cut(e.Name(), "@")
		r.ran[name] = append(r.ran[name], pid)
	}
	// The package name before "__" is not this package's: Run's caller is found as the
	// first frame outside test/testsuite, here in the testing package.
	files, _ := filepath.Glob(filepath.Join(reports, "*.json"))
	for _, f := range files {
		_, name, _ := strings.Cut(filepath.Base(f), "__")
		r.reports = append(r.reports, name)
	}
	return r
}

// unitSpecs are the fixture's specs that run under make test's scope (not "whole run").
var unitSpecs = []string{"loop 0", "loop 1", "loop 2", "alone a", "alone b", "ordered first", "ordered second", "ordered third", "c", "d"}

// TestSplitSuite runs the fixture suite in two processes and checks that each of its specs
// ran exactly once, in the parts and not in the test that split the suite, the Ordered
// container's in one process, and that each part wrote its report.
func TestSplitSuite(t *testing.T) {
	r := runFixture(t, nil)
	if r.err != nil {
		t.Fatalf("the split suite failed: %v\n%s", r.err, r.out)
	}
	if !bytes.Contains(r.out, []byte("TestSplitFixture runs its 10 specs in 2 processes (part 1/2 ")) {
		t.Errorf("the test that split the suite says so:\n%s", r.out)
	}
	pids := map[string]bool{}
	for _, s := range unitSpecs {
		if len(r.ran[s]) != 1 {
			t.Errorf("%q ran %d times, want once: %v", s, len(r.ran[s]), r.ran)
		}
		for _, pid := range r.ran[s] {
			pids[pid] = true
		}
	}
	if len(r.ran["whole run"]) != 0 {
		t.Errorf("the spec labelled e2e ran under the unit scope")
	}
	if len(r.ran) != len(unitSpecs) {
		t.Errorf("specs ran: %v, want %q", r.ran, unitSpecs)
	}
	if pids[r.pid] || len(pids) != 2 {
		t.Errorf("the specs ran in the 2 parts, none in the test that split them: pids %v (that test's %s)", pids, r.pid)
	}
	if a, b, c := r.ran["ordered first"], r.ran["ordered second"], r.ran["ordered third"]; len(a) != 1 || !slices.Equal(a, b) || !slices.Equal(a, c) {
		t.Errorf("the Ordered container's specs ran in one process: %v %v %v", a, b, c)
	}
	if want := []string{"TestSplitFixture@1-of-2.json", "TestSplitFixture@2-of-2.json"}; !slices.Equal(r.reports, want) {
		t.Errorf("reports %q, want <package>__%q", r.reports, want)
	}
	for line := range strings.Lines(string(r.out)) {
		if strings.Contains(line, "Ran 5 of 11 Specs") && !strings.HasPrefix(line, "part ") {
			t.Errorf("a part's output is prefixed with its part: %q", line)
		}
	}
}

// TestSplitSuiteFails runs the fixture suite with one spec failing: the test that split
// the suite fails, naming the part, whose output comes prefixed.
func TestSplitSuiteFails(t *testing.T) {
	r := runFixture(t, []string{failEnv + "=alone b"})
	if r.err == nil {
		t.Fatalf("a part's failed spec must fail the test that split the suite:\n%s", r.out)
	}
	for _, want := range []string{"of TestSplitFixture failed: exit status 1", "--- FAIL: TestSplitFixture"} {
		if !bytes.Contains(r.out, []byte(want)) {
			t.Errorf("the output lacks %q:\n%s", want, r.out)
		}
	}
	prefixed := false
	for line := range strings.Lines(string(r.out)) {
		if strings.Contains(line, "failed as "+failEnv+" asked") && strings.HasPrefix(line, "part ") {
			prefixed = true
		}
	}
	if !prefixed {
		t.Errorf("the output lacks the failed spec's message, prefixed by its part:\n%s", r.out)
	}
}

// TestSplitSuiteInOneProcess checks the cases where a suite asking for processes runs in
// the one that called Run, as before.
func TestSplitSuiteInOneProcess(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{name: ProcessesEnv + "=1", env: []string{ProcessesEnv + "=1"}, want: unitSpecs},
		{name: "focus", args: []string{"-ginkgo.focus=alone"}, want: []string{"alone a", "alone b"}},
		{name: "focus-file", args: []string{"-ginkgo.focus-file=split_test.go"}, want: unitSpecs},
		// The Ordered container alone: one group, which previewed, runs here.
		{name: "one group", args: []string{"-ginkgo.label-filter=ordered-fixture"}, want: []string{"ordered first", "ordered second", "ordered third"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runFixture(t, c.env, c.args...)
			if r.err != nil {
				t.Fatalf("the suite failed: %v\n%s", r.err, r.out)
			}
			for _, s := range c.want {
				if !slices.Equal(r.ran[s], []string{r.pid}) {
					t.Errorf("%q ran in %v, want once in the test's own process %s", s, r.ran[s], r.pid)
				}
			}
			if len(r.ran) != len(c.want) {
				t.Errorf("specs ran: %v, want %q", r.ran, c.want)
			}
			if want := []string{"TestSplitFixture.json"}; !slices.Equal(r.reports, want) {
				t.Errorf("reports %q, want <package>__%q", r.reports, want)
			}
			if bytes.Contains(r.out, []byte("part 1/")) {
				t.Errorf("no part was started:\n%s", r.out)
			}
		})
	}
}
