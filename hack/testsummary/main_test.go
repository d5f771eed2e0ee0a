package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/capi-inplace/capi-inplace"

// events is a go test -json stream of two packages: one with a plain test that passed,
// one routed away and one that failed; one that ran a Ginkgo suite.
const events = `{"Action":"run","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestFast"}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestFast","Output":"quiet words\n"}
{"Action":"pass","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestFast","Elapsed":0.5}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestWhole","Output":"    a whole run: make test-e2e runs it\n"}
{"Action":"skip","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestWhole","Elapsed":0}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestBroken","Output":"the reason it broke\n"}
{"Action":"fail","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestBroken","Elapsed":3}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Output":"FAIL\tgithub.com/capi-inplace/capi-inplace/a\t4s\n"}
{"Action":"fail","Package":"github.com/capi-inplace/capi-inplace/a","Elapsed":4}
{"Action":"pass","Package":"github.com/capi-inplace/capi-inplace/b/c","Test":"TestSuite","Elapsed":90}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/b/c","Output":"a passing package's log line\n"}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/b/c","Output":"ok  \tgithub.com/capi-inplace/capi-inplace/b/c\t90s\n"}
{"Action":"pass","Package":"github.com/capi-inplace/capi-inplace/b/c","Elapsed":90}
`

// report is the Ginkgo JSON report of b/c's suite: a slow spec, a fast one, one the
// label filter left out and one that failed with a long message.
const report = `[{"SuitePath":"/x/b/c","SpecReports":[
{"ContainerHierarchyTexts":["Slow"],"LeafNodeType":"It","LeafNodeText":"takes long","LeafNodeLocation":{"FileName":"/x/b/c/slow_test.go","LineNumber":7},"State":"passed","RunTime":60000000000,"NumAttempts":1},
{"ContainerHierarchyTexts":["Fast"],"LeafNodeType":"It","LeafNodeText":"is quick","LeafNodeLocation":{"FileName":"/x/b/c/fast_test.go","LineNumber":9},"State":"passed","RunTime":1000000000,"NumAttempts":1},
{"ContainerHierarchyTexts":["Whole"],"LeafNodeType":"It","LeafNodeText":"runs elsewhere","LeafNodeLocation":{"FileName":"/x/b/c/whole_test.go","LineNumber":3},"State":"skipped","RunTime":0,"NumAttempts":0},
{"ContainerHierarchyTexts":["Broken"],"LeafNodeType":"It","LeafNodeText":"breaks","LeafNodeLocation":{"FileName":"/x/b/c/broken_test.go","LineNumber":5},"State":"failed","RunTime":500000000,"NumAttempts":1,
 "Failure":{"Message":"node n-2 cordoned\nline 2\nline 3\nline 4\nline 5\nline 6\nline 7\nline 8\nline 9\nline 10\nline 11\nline 12\nline 13 cut\nline 14 cut","Location":{"FileName":"/x/b/c/broken_test.go","LineNumber":12}}}]}]`

func TestSummary(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "b_c__TestSuite.json"), []byte(report), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	reqDir := t.TempDir()
	for name, counts := range map[string]string{
		"b_c__100-1.json": `{"LIST nodes": 300, "GET settings": 50}`,
		"b_c__100-2.json": `{"LIST nodes": 100, "PATCH nodes/status": 20}`,
		"a__200-1.json":   `{"GET pods": 10}`,
	} {
		if err := os.WriteFile(filepath.Join(reqDir, name), []byte(counts), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code := run(strings.NewReader(events), &out, dir, reqDir, module, 2)
	text := out.String()
	if code == 0 {
		t.Errorf("a failed test must fail the run; exit code 0:\n%s", text)
	}
	for _, want := range []string{
		"the reason it broke", // a failed test's output is shown
		"== The 2 slowest",    // the top asked for
		"60.0s  b/c  Slow takes long (slow_test.go:7)",
		"3.0s  a  TestBroken",
		"90.0s  pass  b/c", // every package's time
		"4.0s  fail  a",
		"2 specs and tests belong to the other target",
		"tests: 3 passed, 2 failed, 0 skipped",
		"  b/c  Broken breaks (broken_test.go:5)\n    failed at broken_test.go:12: node n-2 cordoned\n    line 2\n", // a failed spec's reason, at the end
		"    line 12\n    (2 more lines in the spec's output above)\n",
		"per package (480 in all)",
		"      470  b/c  (LIST nodes 400, GET settings 50, PATCH nodes/status 20)", // both of its API servers
		"       10  a  (GET pods 10)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the summary lacks %q:\n%s", want, text)
		}
	}
	for _, unwanted := range []string{"quiet words", "a passing package's log line", "TestSuite", "is quick", "line 13 cut"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("the summary shows %q (a passing test's output, the suite's own test, or a spec past the top 2):\n%s", unwanted, text)
		}
	}
	if strings.Index(text, "Slow takes long") > strings.Index(text, "TestBroken") {
		t.Errorf("the slowest come first:\n%s", text)
	}
	if strings.Index(text, "failed at broken_test.go") < strings.Index(text, "== Failed") {
		t.Errorf("a failed spec's reason comes under == Failed:\n%s", text)
	}
	if lines := strings.Split(strings.TrimSpace(text), "\n"); lines[len(lines)-1] != "tests: 3 passed, 2 failed, 0 skipped" {
		t.Errorf("the closing line is the counts, last: %q", lines[len(lines)-1])
	}
}

func TestSummaryNeedsInput(t *testing.T) {
	var out bytes.Buffer
	if code := run(strings.NewReader(""), &out, "", "", module, 15); code == 0 {
		t.Errorf("no go test result must fail the run:\n%s", out.String())
	}
}

// splitSpecs are the specs of b/c's suite: the state and attempts each part's report gives
// it, then the state the suite's report gives it when run in one process, and the spec's
// run time in each part. "skipped 0" is a spec a part left to the other one, or that the
// label filter left out.
var splitSpecs = []struct {
	leaf, text         string
	line               int
	part1, part2       string
	whole              string
	seconds1, seconds2 float64
}{
	{"It", "Slow takes long", 7, "passed 1", "skipped 0", "passed 1", 60, 0},
	{"It", "Fast is quick", 9, "skipped 0", "passed 1", "passed 1", 0, 1},
	{"It", "Whole runs elsewhere", 3, "skipped 0", "skipped 0", "skipped 0", 0, 0},
	{"It", "Broken breaks", 5, "failed 1", "skipped 0", "failed 1", 0.5, 0},
	// Made in a loop: one text, one line, in part 2.
	{"It", "Loop turns", 11, "skipped 0", "passed 1", "passed 1", 0, 2},
	{"It", "Loop turns", 11, "skipped 0", "passed 1", "passed 1", 0, 2},
	{"It", "Later not yet", 13, "pending 0", "pending 0", "pending 0", 0, 0},
	{"It", "Gone skips itself", 15, "skipped 0", "skipped 1", "skipped 1", 0, 0},
	// Each part runs its own.
	{"BeforeSuite", "", 20, "passed 1", "passed 1", "passed 1", 5, 8},
}

// splitReport is a Ginkgo JSON report of splitSpecs' states for one part (1, 2) or for the
// suite run in one process (0).
func splitReport(t *testing.T, part int) string {
	t.Helper()
	var specs []string
	for _, s := range splitSpecs {
		stateAttempts, seconds := s.whole, max(s.seconds1, s.seconds2)
		switch part {
		case 1:
			stateAttempts, seconds = s.part1, s.seconds1
		case 2:
			stateAttempts, seconds = s.part2, s.seconds2
		}
		state, attempts, _ := strings.Cut(stateAttempts, " ")
		if !strings.HasPrefix(state, "passed") && !strings.HasPrefix(state, "failed") {
			seconds = 0
		}
		var failure string
		if state == "failed" {
			failure = `,"Failure":{"Message":"node n-2 cordoned","Location":{"FileName":"/x/b/c/broken_test.go","LineNumber":12}}`
		}
		var containers []string
		if s.leaf == "It" {
			container, _, _ := strings.Cut(s.text, " ")
			containers = []string{`"` + container + `"`}
		}
		leafText := ""
		if s.text != "" {
			_, leafText, _ = strings.Cut(s.text, " ")
		}
		specs = append(specs, fmt.Sprintf(`{"ContainerHierarchyTexts":[%s],"LeafNodeType":%q,"LeafNodeText":%q,"LeafNodeLocation":{"FileName":"/x/b/c/c_test.go","LineNumber":%d},"State":%q,"RunTime":%d,"NumAttempts":%s%s}`,
			strings.Join(containers, ","), s.leaf, leafText, s.line, state, int64(seconds*1e9), attempts, failure))
	}
	return `[{"SuitePath":"/x/b/c","SpecReports":[` + strings.Join(specs, ",\n") + `]}]`
}

// TestSummarySplitSuite checks that a suite test/testsuite split into two processes
// (<pkg>__<test>@k-of-n.json, one report per part) is summed up as the same suite run in
// one process: each spec counted once, from the part that ran it.
func TestSummarySplitSuite(t *testing.T) {
	summary := func(files map[string]string) string {
		t.Helper()
		dir := t.TempDir()
		for name, report := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(report), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		var out bytes.Buffer
		run(strings.NewReader(events), &out, dir, "", module, 15)
		return out.String()
	}
	whole := summary(map[string]string{"b_c__TestSuite.json": splitReport(t, 0)})
	split := summary(map[string]string{
		"b_c__TestSuite@1-of-2.json": splitReport(t, 1),
		"b_c__TestSuite@2-of-2.json": splitReport(t, 2),
	})
	// The suite's own: Slow, Fast, the 2 loop specs, BeforeSuite passed; Broken failed;
	// Later (pending) and Gone (skipped itself) skipped; Whole left to the other target.
	// Beside TestFast passed, TestBroken failed, TestWhole left to the other target.
	for _, want := range []string{
		"tests: 6 passed, 2 failed, 2 skipped",
		"2 specs and tests belong to the other target",
		"60.0s  b/c  Slow takes long (c_test.go:7)",
		"8.0s  b/c  [BeforeSuite] (c_test.go:20)", // the longest of the parts'
		"  b/c  Broken breaks (c_test.go:5)\n    failed at broken_test.go:12: node n-2 cordoned\n",
	} {
		if !strings.Contains(whole, want) {
			t.Errorf("the suite in one process: the summary lacks %q:\n%s", want, whole)
		}
		if !strings.Contains(split, want) {
			t.Errorf("the suite in 2 parts: the summary lacks %q:\n%s", want, split)
		}
	}
	for _, once := range []string{"Slow takes long", "[BeforeSuite]", "failed at broken_test.go"} {
		if n := strings.Count(split, once); n != 1 {
			t.Errorf("%q is listed %d times, want once:\n%s", once, n, split)
		}
	}
	if strings.Contains(split, "TestSuite@") || strings.Contains(split, "  TestSuite") {
		t.Errorf("the parts are one suite, and the test that split it is not listed:\n%s", split)
	}
	slowest := func(s string) string {
		_, after, _ := strings.Cut(s, "== The")
		before, _, _ := strings.Cut(after, "== Packages")
		return before
	}
	if slowest(whole) != slowest(split) {
		t.Errorf("the slowest specs differ:\none process:%s\n2 parts:%s", slowest(whole), slowest(split))
	}
}
